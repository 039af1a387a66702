// The one on-disk format of the index caches (docs/storage.md): what a file or an object was
// found to hold (a tar shard's members, a record shard's header and index, a video's packets),
// kept so that the next process (another rank of the node, a later run) reads it instead of
// the file. An entry: an 8-byte magic (the kind of index), the size of the file it describes
// (u64), a stamp of its version (i64: its mtime in ns, or etag_stamp() of an object's ETag),
// the length of its name (u64: a path or URL) and the name, the body, then XXH3-64 of all of
// that. An entry for another kind, name, size or stamp, cut short or damaged is not used.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <optional>
#include <string>
#include <string_view>

namespace stoker::detail {

struct IndexKey {
  std::string_view name;  // the file's path or the object's URL
  std::uint64_t size = 0;
  std::int64_t stamp = 0;
};

// The stamp of an object's version: XXH3-64 of its ETag.
std::int64_t etag_stamp(std::string_view etag);

// The entry for `name` in the cache directory `dir`: DIR/<XXH3-64 of name, 16 hex digits>.EXT.
std::string index_cache_file(const std::string& dir, std::string_view name, std::string_view ext);

// The body of the entry in `file` when it is one of kind `magic` (8 bytes) for `key`; else
// nullopt (no file, another version, damaged).
std::optional<std::string> load_index_entry(const std::string& file, std::string_view magic,
                                            const IndexKey& key);
// Writes the entry at once for its readers (replace_file); a failure is ignored (the next
// process makes the entry again).
void save_index_entry(const std::string& file, std::string_view magic, const IndexKey& key,
                      std::string_view body);

// A body written as fixed-width values and byte strings, in the host's byte order.
struct IndexWriter {
  template <class T>
  void put(const T& v) {
    put_bytes(&v, sizeof v);
  }
  void put_bytes(const void* p, std::size_t n) { data.append(static_cast<const char*>(p), n); }
  std::string data;
};

// Reads what an IndexWriter wrote; each get is false past the end.
class IndexReader {
 public:
  explicit IndexReader(std::string_view d) : data_(d) {}
  template <class T>
  bool get(T& v) {
    if (sizeof v > data_.size() - at_) return false;
    std::memcpy(&v, data_.data() + at_, sizeof v);
    at_ += sizeof v;
    return true;
  }
  bool get_string(std::string& s, std::uint64_t n) {
    if (n > data_.size() - at_) return false;
    s.assign(data_.data() + at_, static_cast<std::size_t>(n));
    at_ += static_cast<std::size_t>(n);
    return true;
  }
  std::size_t left() const { return data_.size() - at_; }
  bool done() const { return at_ == data_.size(); }

 private:
  std::string_view data_;
  std::size_t at_ = 0;
};

}  // namespace stoker::detail
