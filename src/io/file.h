// The one way the sources read bytes (leveldb's RandomAccessFile, Arrow's io::RandomAccessFile):
// a File has a name for messages, a size fixed when it was opened, reads at any offset and hints
// of reads to come. What is behind it (a local file read with pread, an object in object
// storage read through the chunk cache of io/remote.h, or a range of another File: a tar
// member) is the File's business; a source never asks.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "io/remote.h"

namespace stoker::io {

class File {
 public:
  using Range = std::pair<std::uint64_t, std::size_t>;  // (offset, length)

  virtual ~File() = default;
  File(const File&) = delete;
  File& operator=(const File&) = delete;

  // A local path or a URL: what messages name.
  const std::string& name() const { return name_; }
  // Bytes, as they were when the file was opened (a listing's size for an object).
  std::uint64_t size() const { return size_; }

  // Reads up to `n` bytes at `offset` into `dst`; returns how many the file holds there (fewer
  // past its end, or once a local file was truncated under its reader). Throws
  // std::runtime_error naming the file on an I/O error (io::ObjectStoreError with the URL and
  // the HTTP status for an object). Thread safety: from any thread.
  virtual std::size_t read_at(std::uint64_t offset, std::byte* dst, std::size_t n) const = 0;

  // Bytes read once and kept elsewhere (a shard's header and index in the index cache): an
  // object larger than one cache chunk is read by exactly this range, neither looked up in nor
  // kept in the chunk cache; anything else as read_at. All `n` bytes or an error.
  virtual void read_once(std::uint64_t offset, std::byte* dst, std::size_t n) const;
  // Bytes by exactly this range, never through the chunk cache (a Parquet footer, read before
  // the object's chunks are cut to its column chunks); all `n` bytes or an error. A local file
  // as read_once.
  virtual void read_uncached(std::uint64_t offset, std::byte* dst, std::size_t n) const;

  // A hint that bytes [offset, offset + n) will be read soon (RemoteFiles::prefetch for an
  // object; nothing to do for a local file). False: the hint was dropped for want of room
  // ahead, and may be given again once reads made room.
  virtual bool will_read(std::uint64_t offset, std::size_t n) const;
  // The same for several ranges, neighbours fetched together (RemoteFiles::prefetch).
  virtual bool will_read(std::span<const Range> ranges) const;
  // A hint that the cache chunk holding byte `offset` will not be read again soon.
  virtual void done_with(std::uint64_t offset) const;

  // The object behind the file, or null for a local file.
  virtual const detail::RemoteObject* object() const { return nullptr; }

 protected:
  File(std::string name, std::uint64_t size) : name_(std::move(name)), size_(size) {}

 private:
  std::string name_;
  std::uint64_t size_ = 0;
};

using FilePtr = std::shared_ptr<const File>;

// A local file, read with pread (the one pread loop outside the disk cache), never mapped: a
// file truncated under its reader reads short (the caller's error names it) rather than
// raising SIGBUS. `keep_open`: the descriptor is held for the File's life; else each read
// opens and closes it (for sets of more files than descriptors). Opened with O_NONBLOCK (a
// FIFO named like a shard must not wait for a writer). Throws std::runtime_error naming the
// path when it cannot be opened or is not a regular file.
FilePtr open_local(const std::string& path, bool keep_open = true);

// The whole local file at `path` into `out` (resized; shorter when it shrank while being read),
// opened as open_local opens, with no File made (a read per sample allocates nothing once `out`
// has grown). Throws as open_local and read_at.
void read_local_file(const std::string& path, std::vector<std::byte>& out);

// An object read through the process's chunk cache (`files`, which a forked worker reaches as
// its own). Its size is the listing's.
FilePtr open_object(detail::RemoteObject object, detail::RemoteHandle files);

// Bytes [offset, offset + length) of `file` as a File of its own (a tar member), named `name`.
// Reads past its end read short; hints pass through to `file`. Throws std::invalid_argument when
// the range does not lie in `file`.
FilePtr slice(FilePtr file, std::uint64_t offset, std::uint64_t length, std::string name);

}  // namespace stoker::io
