// Objects of object storage for a front end that reads them with its own library (the Python
// package's Parquet data set gives them to pyarrow), by ranges through the process's object
// cache (src/io/remote.h). Installed for front ends, unstable
// (include/stoker/frontend/README.md).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "stoker/object_storage.h"

namespace stoker::detail {

// One object, read by ranges. Thread safety: every member from any thread.
class ObjectFile {
 public:
  using Range = std::pair<std::uint64_t, std::size_t>;  // (offset, length)

  virtual ~ObjectFile() = default;
  virtual const std::string& url() const = 0;
  virtual std::uint64_t size() const = 0;       // the listing's
  virtual const std::string& etag() const = 0;  // the listing's; "" when the server sent none
  // Up to `n` bytes at `offset` into `dst` (fewer past the end), through the cache's chunks;
  // `exact`: by exactly this range, neither looked up in nor kept in the cache (a footer, read
  // once and kept by the reader). Throws std::runtime_error naming the URL (io::ObjectStoreError,
  // with the HTTP status, for a request that failed).
  virtual std::size_t read_at(std::uint64_t offset, std::byte* dst, std::size_t n,
                              bool exact) const = 0;
  // A hint that these ranges are read soon: their chunks are fetched ahead, neighbours together.
  virtual void will_read(const std::vector<Range>& ranges) const = 0;
  // The same object with its cache chunks starting at `starts` (sorted, the first 0): a reader
  // whose reads are known ranges (a Parquet file's column chunks) fetches each range whole
  // and nothing around it.
  virtual std::shared_ptr<ObjectFile> cut_at(std::vector<std::uint64_t> starts) const = 0;
  // The traffic of the object cache it reads through (shared by every reader of that cache).
  virtual ObjectStorageCounters counters() const = 0;
};

// The objects `urls` name (objects, or s3:// prefixes: the objects directly under one whose
// names end in `suffix`), resolved together (one listing per prefix, the node's processes in
// turn), in order, read through the object cache `options` names (its directory and size; its
// `known_objects`: what another process resolved, taken with no request). Throws
// std::runtime_error naming the URL and the reason. Blocks; any thread.
std::vector<std::shared_ptr<ObjectFile>> open_object_files(const std::vector<std::string>& urls,
                                                           const std::string& suffix,
                                                           const ObjectStorageOptions& options);

// This process reads its object caches beside other processes that read the same blocks (a
// worker given its data set by pickle): the blocks a windowed shuffle reads once go to the disk
// cache, where the others find them, not into this process's memory (src/io/remote.h,
// kHeldBytes). A forked process counts as one by itself.
void share_object_caches();

}  // namespace stoker::detail
