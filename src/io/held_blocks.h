// The blocks of a windowed shuffle that RemoteFiles holds in memory from their GET to their
// last read (docs/storage.md, "Data larger than the cache"), in place of the disk cache: read
// once an epoch from a data set larger than the cache, a block's file would serve no later
// read, and creating, opening and removing it cost more of the loader's CPU than its GET.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <list>
#include <memory>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "stoker/frontend/mutex.h"

namespace stoker::detail {

// Thread safety: find(), release() and bytes() from any thread; hold() from one thread at a
// time (RemoteFiles' finisher).
class HeldBlocks {
 public:
  using Chunk = std::shared_ptr<const std::byte[]>;
  using Spill = std::function<void(const std::string& key, const std::byte* data, std::size_t)>;

  explicit HeldBlocks(std::uint64_t limit) : limit_(limit) {}

  // The block's bytes, or null when it is not held.
  Chunk find(const std::string& key) const {
    MutexLock lock(mu_);
    const auto it = blocks_.find(key);
    return it == blocks_.end() ? nullptr : it->second.data;
  }

  // Holds the block. Past the limit, the blocks held longest are handed to `spill` (which
  // stores them in the disk cache) while find() still finds them, then let go: a block whose
  // last read never came (an epoch cut short) leaves memory for the disk as the disk cache's
  // entries would have. False, and nothing held, for a block longer than the limit.
  bool hold(const std::string& key, Chunk data, std::size_t length, const Spill& spill) {
    if (length > limit_) return false;
    std::vector<std::pair<std::string, Block>> out;
    {
      MutexLock lock(mu_);
      std::uint64_t freed = 0;
      for (auto k = order_.begin(); k != order_.end() && bytes_ - freed + length > limit_; ++k) {
        const Block& b = blocks_.at(*k);
        out.emplace_back(*k, b);
        freed += b.length;
      }
    }
    for (const auto& [k, b] : out) spill(k, b.data.get(), b.length);
    MutexLock lock(mu_);
    for (const auto& [k, b] : out) erase(k);
    erase(key);
    order_.push_back(key);
    blocks_.emplace(key, Block{std::move(data), length, std::prev(order_.end())});
    bytes_ += length;
    return true;
  }

  // The block's last read was taken: let go, stored nowhere.
  void release(const std::string& key) {
    MutexLock lock(mu_);
    erase(key);
  }

  std::uint64_t bytes() const {
    MutexLock lock(mu_);
    return bytes_;
  }

 private:
  struct Block {
    Chunk data;
    std::size_t length = 0;
    std::list<std::string>::iterator order;
  };

  void erase(const std::string& key) STOKER_REQUIRES(mu_) {
    const auto it = blocks_.find(key);
    if (it == blocks_.end()) return;
    bytes_ -= it->second.length;
    order_.erase(it->second.order);
    blocks_.erase(it);
  }

  const std::uint64_t limit_;
  mutable Mutex mu_;
  std::unordered_map<std::string, Block> blocks_ STOKER_GUARDED_BY(mu_);
  std::list<std::string> order_ STOKER_GUARDED_BY(mu_);  // oldest first
  std::uint64_t bytes_ STOKER_GUARDED_BY(mu_) = 0;
};

}  // namespace stoker::detail
