// A local disk cache of fetched byte ranges: a directory with a byte cap, the least recently
// used entries evicted first. ObjectStore uses it when ObjectStoreOptions::cache_dir is set.
#pragma once

#include <cstddef>
#include <cstdint>
#include <list>
#include <string>
#include <unordered_map>

#include "stoker/frontend/mutex.h"

namespace stoker::io {

// Each entry is one file, DIR/<16 hex digits of the key's FNV-1a hash>.bin, holding a header
// (magic, the key) and the bytes; a hit checks the key and the length, so a hash collision or a
// truncated file is a miss. Files are written to a temporary name and renamed, so a reader
// never sees half an entry. Entries already in the directory are indexed at construction
// (oldest modification time evicted first); the first hit of an entry in a process refreshes its
// file's time (later hits reorder it in memory only: no metadata write per read).
//
// Thread safety: every member from any thread. One DiskCache per directory and process: two
// processes sharing a directory stay correct (a file evicted by the other is a miss) but each
// counts only its own bytes against the cap.
class DiskCache {
 public:
  DiskCache(std::string dir, std::uint64_t max_bytes);

  // The key of bytes [offset, offset + length) of an object (with its ETag when known, so that
  // a replaced object misses).
  static std::string key(const std::string& url, std::uint64_t offset, std::size_t length,
                         const std::string& etag = "");

  // Copies the entry into dst when it holds exactly `length` bytes; false otherwise.
  bool get(const std::string& key, std::byte* dst, std::size_t length);
  // Copies bytes [offset, offset + n) of the entry into dst when the entry holds exactly
  // `length` bytes (one pread of the part asked for, not the whole entry); false otherwise.
  bool get_range(const std::string& key, std::size_t length, std::uint64_t offset, std::byte* dst,
                 std::size_t n);
  // Whether this process's index of the directory has the entry (no file is read: a hint,
  // e.g. for not fetching again what is there; get() still checks the file).
  bool contains(const std::string& key) const;
  // The entry is not needed again soon (a reader read all it wanted of it): it goes to the
  // back of the least recently used order, the first out when room is needed.
  void demote(const std::string& key);
  // Stores the bytes (replacing an entry of the same key), then evicts down to the cap. An
  // entry larger than the cap is not stored. I/O errors are ignored: a cache is optional.
  void put(const std::string& key, const std::byte* data, std::size_t length);

  struct Counters {
    std::uint64_t hits = 0;
    std::uint64_t misses = 0;
    std::uint64_t hit_bytes = 0;
    std::uint64_t stored_bytes = 0;
    std::uint64_t evictions = 0;
  };
  Counters counters() const;
  std::uint64_t bytes() const;  // on disk, headers included
  std::size_t entries() const;
  const std::string& dir() const { return dir_; }

 private:
  struct Entry {
    std::string name;
    std::uint64_t size = 0;
    bool touched = false;  // its file's time set by a hit of this process already
  };
  void evict_locked() STOKER_REQUIRES(mu_);
  void drop_locked(const std::string& name) STOKER_REQUIRES(mu_);

  const std::string dir_;
  const std::uint64_t max_bytes_;
  mutable detail::Mutex mu_;
  std::list<Entry> lru_ STOKER_GUARDED_BY(mu_);  // front: most recently used
  std::unordered_map<std::string, std::list<Entry>::iterator> index_ STOKER_GUARDED_BY(mu_);
  std::uint64_t bytes_ STOKER_GUARDED_BY(mu_) = 0;
  Counters counters_ STOKER_GUARDED_BY(mu_);
  std::uint64_t tmp_counter_ STOKER_GUARDED_BY(mu_) = 0;
};

}  // namespace stoker::io
