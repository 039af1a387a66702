// A pool of items made up front and recycled: batch slabs (host memory) and device slots
// (device memory) are both one. What an item is and how its memory is made is the caller's
// (the `make` function, over an allocator); the pool only keeps them, hands free ones out, and
// runs a hook on an item before it is reused (a device slot waits for its last copy there).
//
// Bounded: the pool grows only when asked to (acquire with grow, reserve), and trim() frees
// what is free beyond a count; release() never allocates (the free list's capacity follows
// the number of items), so a steady state allocates nothing.
//
// Thread safety: every member may be called from any thread. `make`, `before_reuse` and
// `destroy` run outside the pool's lock.
#pragma once

#include <algorithm>
#include <cstddef>
#include <functional>
#include <memory>
#include <utility>
#include <vector>

#include "stoker/frontend/mutex.h"

namespace stoker::detail {

template <class T>
class RecyclingPool {
 public:
  using Make = std::function<std::unique_ptr<T>()>;
  using Hook = std::function<void(T&)>;

  explicit RecyclingPool(Make make, Hook before_reuse = {}, Hook destroy = {})
      : make_(std::move(make)),
        before_reuse_(std::move(before_reuse)),
        destroy_(std::move(destroy)) {}
  ~RecyclingPool() {
    MutexLock lock(mu_);
    for (auto& item : all_) {
      if (destroy_) destroy_(*item);
    }
  }
  RecyclingPool(const RecyclingPool&) = delete;
  RecyclingPool& operator=(const RecyclingPool&) = delete;

  // A free item (after the reuse hook), else a new one if `grow`, else null. Throws what
  // `make` throws.
  T* acquire(bool grow = true) STOKER_EXCLUDES(mu_) {
    T* item = nullptr;
    {
      MutexLock lock(mu_);
      if (!free_.empty()) {
        item = free_.back();
        free_.pop_back();
      }
    }
    if (item != nullptr) {
      if (before_reuse_) before_reuse_(*item);
      return item;
    }
    if (!grow) return nullptr;
    auto made = make_();  // outside the lock: allocation and page faults take a while
    MutexLock lock(mu_);
    all_.push_back(std::move(made));
    free_.reserve(all_.size());
    return all_.back().get();
  }

  void release(T* item) noexcept STOKER_EXCLUDES(mu_) {
    MutexLock lock(mu_);
    free_.push_back(item);  // never reallocates: capacity >= all_.size()
  }

  // Makes items until `count` exist.
  void reserve(std::size_t count) STOKER_EXCLUDES(mu_) {
    std::vector<T*> taken;
    while (size() < count) taken.push_back(acquire());
    for (T* item : taken) release(item);
  }

  // Frees free items until at most `keep` exist (items in use are never freed).
  void trim(std::size_t keep) STOKER_EXCLUDES(mu_) {
    std::vector<std::unique_ptr<T>> victims;
    {
      MutexLock lock(mu_);
      while (all_.size() > keep && !free_.empty()) {
        T* victim = free_.back();
        free_.pop_back();
        auto it =
            std::find_if(all_.begin(), all_.end(), [&](auto& s) { return s.get() == victim; });
        victims.push_back(std::move(*it));
        all_.erase(it);
      }
    }
    for (auto& item : victims) {
      if (destroy_) destroy_(*item);
    }
  }

  std::size_t size() const STOKER_EXCLUDES(mu_) {
    MutexLock lock(mu_);
    return all_.size();
  }
  template <class Predicate>
  std::size_t count_if(Predicate predicate) const STOKER_EXCLUDES(mu_) {
    MutexLock lock(mu_);
    return static_cast<std::size_t>(
        std::count_if(all_.begin(), all_.end(),
                      [&](const std::unique_ptr<T>& item) { return predicate(*item); }));
  }

 private:
  const Make make_;
  const Hook before_reuse_;
  const Hook destroy_;
  mutable Mutex mu_;
  std::vector<std::unique_ptr<T>> all_ STOKER_GUARDED_BY(mu_);
  std::vector<T*> free_ STOKER_GUARDED_BY(mu_);
};

}  // namespace stoker::detail
