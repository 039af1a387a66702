// A mutex and scoped lock that clang's -Wthread-safety can check (std::mutex in libstdc++ is
// not annotated). With other compilers the annotations compile to nothing.
//
// Installed for front ends, unstable (include/stoker/frontend/README.md).
#pragma once

#include <chrono>
#include <condition_variable>
#include <mutex>
#include <shared_mutex>

#if defined(__clang__)
#define STOKER_TSA(x) __attribute__((x))
#else
#define STOKER_TSA(x)
#endif

#define STOKER_CAPABILITY(x) STOKER_TSA(capability(x))
#define STOKER_SCOPED_CAPABILITY STOKER_TSA(scoped_lockable)
#define STOKER_GUARDED_BY(x) STOKER_TSA(guarded_by(x))
#define STOKER_REQUIRES(...) STOKER_TSA(requires_capability(__VA_ARGS__))
#define STOKER_ACQUIRE(...) STOKER_TSA(acquire_capability(__VA_ARGS__))
#define STOKER_RELEASE(...) STOKER_TSA(release_capability(__VA_ARGS__))
#define STOKER_EXCLUDES(...) STOKER_TSA(locks_excluded(__VA_ARGS__))
#define STOKER_TRY_ACQUIRE(...) STOKER_TSA(try_acquire_capability(__VA_ARGS__))
#define STOKER_ACQUIRE_SHARED(...) STOKER_TSA(acquire_shared_capability(__VA_ARGS__))
#define STOKER_RELEASE_SHARED(...) STOKER_TSA(release_shared_capability(__VA_ARGS__))
#define STOKER_TRY_ACQUIRE_SHARED(...) STOKER_TSA(try_acquire_shared_capability(__VA_ARGS__))

namespace stoker::detail {

class STOKER_CAPABILITY("mutex") Mutex {
 public:
  void lock() STOKER_ACQUIRE() { mu_.lock(); }
  void unlock() STOKER_RELEASE() { mu_.unlock(); }
  bool try_lock() STOKER_TRY_ACQUIRE(true) { return mu_.try_lock(); }

 private:
  friend class MutexLock;
  friend class MutexUnlock;
  std::mutex mu_;
};

// A reader-writer mutex (std::shared_mutex), annotated likewise.
class STOKER_CAPABILITY("mutex") SharedMutex {
 public:
  void lock() STOKER_ACQUIRE() { mu_.lock(); }
  void unlock() STOKER_RELEASE() { mu_.unlock(); }
  bool try_lock() STOKER_TRY_ACQUIRE(true) { return mu_.try_lock(); }
  void lock_shared() STOKER_ACQUIRE_SHARED() { mu_.lock_shared(); }
  void unlock_shared() STOKER_RELEASE_SHARED() { mu_.unlock_shared(); }
  bool try_lock_shared() STOKER_TRY_ACQUIRE_SHARED(true) { return mu_.try_lock_shared(); }

 private:
  std::shared_mutex mu_;
};

// Holds a Mutex for its scope and waits on condition variables.
class STOKER_SCOPED_CAPABILITY MutexLock {
 public:
  explicit MutexLock(Mutex& mu) STOKER_ACQUIRE(mu) : lock_(mu.mu_) {}
  ~MutexLock() STOKER_RELEASE() = default;
  MutexLock(const MutexLock&) = delete;
  MutexLock& operator=(const MutexLock&) = delete;

  // Callers loop on their own condition (predicates would hide guarded reads from the analysis).
  void wait(std::condition_variable& cv) { cv.wait(lock_); }
  template <class Clock, class Duration>
  void wait_until(std::condition_variable& cv,
                  const std::chrono::time_point<Clock, Duration>& deadline) {
    cv.wait_until(lock_, deadline);
  }

 private:
  std::unique_lock<std::mutex> lock_;
};

// Releases a held Mutex for its scope (to run work unlocked) and takes it back at the end.
class STOKER_SCOPED_CAPABILITY MutexUnlock {
 public:
  explicit MutexUnlock(Mutex& mu) STOKER_RELEASE(mu) : mu_(mu) { mu_.mu_.unlock(); }
  ~MutexUnlock() STOKER_RELEASE() { mu_.mu_.lock(); }
  MutexUnlock(const MutexUnlock&) = delete;
  MutexUnlock& operator=(const MutexUnlock&) = delete;

 private:
  Mutex& mu_;
};

}  // namespace stoker::detail
