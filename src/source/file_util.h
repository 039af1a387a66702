// Small POSIX file helpers shared by the encoded sources.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "stoker/encoded.h"
#include "stoker/frontend/files.h"  // read_whole_file

namespace stoker::detail {

// Reads served from storage (files, mapped shards), counted for EncodedSource::counters().
// Thread safety: add() from any thread.
class StorageReads {
 public:
  void add(std::size_t bytes) noexcept {
    reads_.fetch_add(1, std::memory_order_relaxed);
    bytes_.fetch_add(bytes, std::memory_order_relaxed);
  }
  // Every read of such a source is a storage read.
  EncodedSource::Counters counters() const noexcept {
    EncodedSource::Counters c;
    c.reads = c.storage_reads = reads_.load(std::memory_order_relaxed);
    c.storage_bytes = bytes_.load(std::memory_order_relaxed);
    return c;
  }

 private:
  std::atomic<std::uint64_t> reads_{0};
  std::atomic<std::uint64_t> bytes_{0};
};

// EncodedSource::will_read for a source whose rows may be in object storage (`remote`):
// whether `at_hand(row)` holds for each of `rows` below `count` (the others are not the
// source's and are passed over). A hint: an error answers true, as each read fetches its own
// bytes and reports its error.
template <class AtHand>
bool rows_at_hand(std::span<const std::size_t> rows, bool remote, std::size_t count,
                  const AtHand& at_hand) noexcept {
  if (!remote) return true;
  try {
    for (const std::size_t row : rows) {
      if (row < count && !at_hand(row)) return false;
    }
  } catch (...) {
    // A hint only.
  }
  return true;
}

[[noreturn]] void throw_errno(const std::string& path, const std::string& what);

// Writes `data` as the file `path` at once for its readers: into a temporary name beside it
// (this process's pid and a random number), then renamed over it, its directory made first.
// For caches: false on any failure, which leaves no temporary file (the next reader makes the
// entry again).
bool replace_file(const std::string& path, std::string_view data) noexcept;

}  // namespace stoker::detail
