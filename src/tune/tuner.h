// The online tuner: instead of a grid search over num_workers (seed 000), the loader watches
// what its consumer and workers do and moves the worker count and the batches in flight
// (depth) both ways, within a CPU budget and a memory budget it never crosses.
//
// TunePolicy is the decision (pure: no clocks, no threads; tested with synthetic windows);
// WorkerTuner is the glue that turns a loader's cumulative Stats into windows.
#pragma once

#include <chrono>
#include <cstddef>
#include <optional>
#include <string>

#include "stoker/frontend/host_share.h"
#include "stoker/frontend/mutex.h"
#include "stoker/stats.h"

namespace stoker::detail {

// What happened over one observation window.
struct TuneWindow {
  double elapsed_s = 0;        // wall time of the window
  double consumer_wait_s = 0;  // of it, time next() blocked for data
  // CPU time of the training loop's thread between next()s; < 0: not measured.
  double consumer_cpu_s = -1;
  double worker_busy_s = 0;       // summed over workers: wall time inside read()
  double worker_cpu_s = 0;        // of that, time on a CPU of this process's threads
  double worker_lock_held_s = 0;  // of worker_cpu_s, time holding the GIL
  double worker_run_delay_s = 0;  // of worker_busy_s, time runnable but waiting for a core
  double samples = 0;             // handed out
  std::size_t workers = 0;
  std::size_t depth = 0;
  // The most workers that can read at once: the worker processes reads run in
  // (Engine::worker_limit: the executors' bound), 0 for threads. The threads only wait for the
  // processes, so their CPU time is not in worker_cpu_s: a busy process worker counts as a busy
  // core.
  std::size_t worker_limit = 0;
  // One slab's bytes; 0 while the data set's layout is not known yet (no memory to count).
  std::size_t slab_bytes = 0;
};

struct TuneLimits {
  // Cores this loader may use, the training loop's included: the machine's (its affinity),
  // divided among the ranks on this node.
  double cores = 1;
  std::size_t max_workers = 4;
  std::size_t max_depth = 64;  // past it, more batches in flight only hold memory
  // Slab bytes for batches in flight ((depth + 1) slabs); 0: no limit but max_depth.
  std::size_t memory_budget = 0;
};

// One decision: the configuration for the next window, and why.
struct TuneDecision {
  std::size_t workers = 0;
  std::size_t depth = 0;
  std::string reason;
};

// Hill climbing on two knobs with memory, so that it settles instead of oscillating:
//  - the consumer waits (> kWaitThreshold of the window): if the workers are busy, add
//    workers (2x to kMostGrowth x when they mostly wait inside read(): I/O, sleeps; one more
//    when they compute), within the CPU budget; if they sit idle, open more batches (double
//    the depth), within the memory budget;
//  - the consumer has not waited (< kCalmThreshold) for kCalmWindows windows: give back what
//    is not used, one step at a time: idle workers first, then depth (not below kMinDepth,
//    and not while the workers are busy nearly all the time: the batches ahead absorb their
//    jitter);
//  - in between, nothing (the dead band).
// Each change is checked on the window after next (the next one mixes in the switch-over:
// threads starting, batches cut for the old count). A step up after which the consumer still
// waits, with throughput up by less than kMinGain and the wait down by less than
// kMinWaitDrop, is undone and becomes a ceiling; a step down after which the consumer waits
// is undone and becomes a floor. So every level is left in each
// direction at most once and the search ends.
//
// CPU budget: TuneLimits::cores, the training loop's core (its time not waiting) included.
// Computing workers (on a CPU, or runnable and waiting for one, for most of a read; a process
// worker whenever it is busy) each count as a core: no more of them busy than the cores left
// next to the training loop, and a count that no longer fits (the loop got busier) loses a
// worker. Workers that wait (I/O, sleeps) count their CPU time, which must fit the same
// cores. kCpuSlack absorbs one window's noise. Memory budget: depth + 1 slabs within
// memory_budget, and depth never above max_depth.
class TunePolicy {
 public:
  explicit TunePolicy(TuneLimits limits) : limits_(limits) {}

  TuneDecision decide(const TuneWindow& window);
  const TuneLimits& limits() const { return limits_; }
  // The loader's memory cap moved the slab bytes allowed (TuneLimits::memory_budget).
  void set_memory_budget(std::size_t bytes) { limits_.memory_budget = bytes; }

 private:
  enum class Knob { workers, depth };
  struct Probe {
    Knob knob;
    std::size_t from = 0;
    bool up = false;
    double samples_per_s = 0;  // before the change
    double wait = 0;           // the training loop's share of time waiting, before
    bool settled = false;      // the window after the change has passed (it is not judged)
  };
  // A change of one knob; `judged` ones are checked on the next window (budget cuts are not:
  // they stand whatever happens).
  TuneDecision change(const TuneWindow& w, Knob knob, std::size_t to, std::string reason,
                      bool judged = true);

  TuneLimits limits_;
  std::optional<Probe> probe_;  // the last change, judged on the next window
  std::size_t calm_windows_ = 0;
  std::size_t workers_floor_ = 1;
  std::size_t workers_ceiling_ = SIZE_MAX;
  std::size_t depth_floor_ = 1;
  std::size_t depth_ceiling_ = SIZE_MAX;
};

inline constexpr double kWaitThreshold = 0.03;
inline constexpr double kCalmThreshold = 0.005;
inline constexpr std::size_t kCalmWindows = 3;
inline constexpr double kMinGain = 0.05;
inline constexpr double kMinWaitDrop = 0.05;
inline constexpr double kCpuSlack = 0.25;
// Workers that wait inside read() grow by what the loop's waiting says is missing, at least
// twice and at most this many times over per step: waiting `wait` of its time, the loop
// would be fed by 1 / (1 - wait) times the reads. A loop that waits for 5 ms sleeps nearly
// all the time went 2, 4, 8, 16 workers a step (each two windows) at 2x, an epoch of seed
// 003's data set (256 samples) for each.
inline constexpr double kMostGrowth = 4;
inline constexpr std::size_t kMinDepth = 2;
// Workers busy for less than this share of the window while the consumer waits: they are
// starved of batches to read, not too few.
inline constexpr double kStarved = 0.6;
// Workers busy for less than this share while the consumer does not wait: some can go.
inline constexpr double kIdle = 0.5;
// Workers busy for more than this share keep the batches in flight they have.
inline constexpr double kBusy = 0.9;
// A pure-Python data set on two threads keeps it ~95% busy; sleepers keep it a few percent
// busy. Counted with the GIL's CPU time scaled for the run-queue delay (below).
inline constexpr double kLockSaturated = 0.35;
// The GIL's CPU time is scaled by the workers' (CPU time + run-queue delay) / CPU time, at
// most this much: unscaled, a pure-Python data set on two threads measured ~50% at a load
// average of 3.5 on 2 cores and 12-17% with 10-14 other sessions spinning (load 4-13); but
// sleepers wait for a core after each wake-up too, and the scale must not make their 1-5%
// look like a busy GIL. At 6, both stay on their side of 40% (worker_type='auto') down to
// and up to 6.7% unscaled. worker_type='auto' uses the same scale (worker_kind.h).
inline constexpr double kRunDelayScale = 6;

// The ranks torchrun started on this node: LOCAL_WORLD_SIZE when it is a positive number, else 1.
std::size_t local_ranks(const char* local_world_size);
// The cores a loader may use: `cores` (the process's affinity), divided among the ranks that
// torchrun started on this node (LOCAL_WORLD_SIZE), at least one.
double cpu_share(std::size_t cores, const char* local_world_size);

// Turns a loader's cumulative Stats into windows of at least kMinWindow and kMinBatches
// batches and asks the policy; restarts the window whenever the configuration changes. Each
// change is logged at debug level and kept for Stats::tuner.
//
// Advising (the user fixed the configuration): a fresh policy looks at each window, so it
// never probes and only ever says "more", and the first time it would change something the
// advice is logged once (info) and kept for Stats::tuner; after that it is never due again.
//
// Thread safety: observe() and due() belong to one thread (the loader's consumer);
// add_stats() may be called from any thread.
class WorkerTuner {
 public:
  static constexpr std::chrono::milliseconds kMinWindow{100};
  static constexpr std::uint64_t kMinBatches = 4;

  WorkerTuner(TuneLimits limits, bool advise_only) : policy_(limits), advise_only_(advise_only) {}
  // Whether it is time to observe (cheap: one clock read): stats() takes the engine's lock,
  // so the loader calls observe() only when this says so.
  bool due() const { return std::chrono::steady_clock::now() >= next_due_; }
  // The configuration to apply when a window ends and the policy changes it (never when
  // advising). `worker_limit` as TuneWindow::worker_limit.
  std::optional<TuneDecision> observe(const Stats& stats, std::size_t worker_limit)
      STOKER_EXCLUDES(mu_);
  // TunePolicy::set_memory_budget; the consumer's thread, as observe().
  void set_memory_budget(std::size_t bytes) { policy_.set_memory_budget(bytes); }
  // Fills Stats::cpu_cores, tuner_changes and tuner.
  void add_stats(Stats& stats) const STOKER_EXCLUDES(mu_);

 private:
  TunePolicy policy_;
  const bool advise_only_;
  std::optional<Stats> start_;  // the window's first observation
  std::chrono::steady_clock::time_point next_due_{};

  mutable Mutex mu_;
  std::uint64_t changes_ STOKER_GUARDED_BY(mu_) = 0;
  std::string last_ STOKER_GUARDED_BY(mu_);
};

}  // namespace stoker::detail
