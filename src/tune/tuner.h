// The online tuner: instead of a grid search over num_workers (seed 000), the loader watches
// what its consumer and workers do and adds workers while the consumer waits for data.
#pragma once

#include <chrono>
#include <cstddef>
#include <optional>

#include "stoker/stats.h"

namespace stoker::detail {

// What happened over one observation window.
struct TuneWindow {
  double elapsed_s = 0;        // wall time of the window
  double consumer_wait_s = 0;  // of it, time next() blocked for data
  double worker_busy_s = 0;    // summed over workers: wall time inside read()
  double worker_cpu_s = 0;     // of that, time on a CPU
  std::size_t workers = 0;
  double worker_lock_held_s = 0;  // of worker_cpu_s, time holding the GIL
};

struct TuneLimits {
  std::size_t cores = 1;
  std::size_t max_workers = 4;
};

// The worker count for the next window (pure: tested on its own). While the consumer waits
// for more than kWaitThreshold of the window:
//  - workers that are mostly off the CPU inside read() (waiting on I/O, sleeps or a GIL) are
//    doubled (more threads in flight hide the waiting; idle threads cost little);
//  - workers that compute get one more, up to one per core (past that they only share cores
//    with each other and the consumer).
// Otherwise the count stays: the workers keep up. Workers that keep the GIL busy for more than
// kLockSaturated of the window get no company: another thread would only wait for it.
std::size_t next_worker_count(const TuneWindow& window, const TuneLimits& limits);

inline constexpr double kWaitThreshold = 0.03;
// A pure-Python data set on two threads keeps it ~95% busy, down to ~35-60% when other
// processes compete for the cores; sleepers keep it a few percent busy.
inline constexpr double kLockSaturated = 0.35;

// Turns a loader's cumulative Stats into windows of at least kMinWindow and kMinBatches
// batches, and says when the worker count should change.
//
// Thread safety: one thread (the loader's consumer).
class WorkerTuner {
 public:
  static constexpr std::chrono::milliseconds kMinWindow{100};
  static constexpr std::uint64_t kMinBatches = 2;

  explicit WorkerTuner(TuneLimits limits) : limits_(limits) {}
  // Whether it is time to observe (cheap: one clock read): stats() takes the engine's lock,
  // so the loader calls observe() only when this says so.
  bool due() const { return std::chrono::steady_clock::now() >= next_due_; }
  // Returns the new worker count when a window ends and it differs from stats.workers.
  std::optional<std::size_t> observe(const Stats& stats);

 private:
  TuneLimits limits_;
  std::optional<Stats> start_;  // the window's first observation
  std::chrono::steady_clock::time_point next_due_{};
};

}  // namespace stoker::detail
