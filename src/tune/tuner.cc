#include "tune/tuner.h"

#include <sched.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <thread>

#include "stoker/frontend/environment.h"
#include "stoker/frontend/log.h"
#include "util/format.h"

namespace stoker::detail {

TuneDecision TunePolicy::change(const TuneWindow& w, Knob knob, std::size_t to, std::string reason,
                                bool judged) {
  const bool workers = knob == Knob::workers;
  const std::size_t from = workers ? w.workers : w.depth;
  if (judged) {
    probe_ = Probe{knob, from, to > from, w.samples / w.elapsed_s, w.consumer_wait_s / w.elapsed_s};
  }
  calm_windows_ = 0;
  return {workers ? to : w.workers, workers ? w.depth : to,
          format("%s %zu -> %zu: %s", workers ? "workers" : "depth", from, to, reason.c_str())};
}

TuneDecision TunePolicy::decide(const TuneWindow& w) {
  TuneDecision keep{w.workers, w.depth, {}};
  if (w.elapsed_s <= 0 || w.workers == 0) {
    keep.reason = "inline reads (workers = 0) are left alone";
    return keep;
  }
  const double n = static_cast<double>(w.workers);
  const double wait = w.consumer_wait_s / w.elapsed_s;
  const double samples_per_s = w.samples / w.elapsed_s;
  // Per worker. Busy time is counted when a chunk ends, so a window can hold more than its
  // length of it: at most all of it was.
  const double busy = std::min(1.0, w.worker_busy_s / (n * w.elapsed_s));
  const bool processes = w.worker_limit != 0;
  const double worker_cores =
      (processes ? std::max(w.worker_cpu_s, w.worker_busy_s) : w.worker_cpu_s) / w.elapsed_s;
  // The training loop's thread computes at most when it does not wait; its CPU time says how
  // much it did (a loop that had batches ready at the start of a window, or that waits for a
  // GPU, takes less than a core).
  const double loop_cores = std::clamp(
      w.consumer_cpu_s >= 0 ? std::min(1.0 - wait, w.consumer_cpu_s / w.elapsed_s) : 1.0 - wait,
      0.0, 1.0);
  const double cpu_budget = limits_.cores - loop_cores + kCpuSlack;  // for the workers
  // Workers that compute each want a core: on one, or runnable and waiting for one (an
  // oversubscribed machine, which more workers would make worse). Off the CPU otherwise,
  // they wait for I/O or sleeps.
  const bool computing =
      processes || w.worker_cpu_s + w.worker_run_delay_s >= 0.5 * w.worker_busy_s;
  // Busy computing workers that fit next to the training loop (at least one).
  const double cpu_workers = std::max(1.0, std::floor(cpu_budget + 0.5));
  // Other processes taking the cores slow the GIL's holder down, not the GIL: while the holder
  // waits for a core the other threads still wait for the GIL. So its CPU time is scaled by
  // how much of their runnable time the workers got a core (worker_type='auto' measures it so).
  const double lock_scale =
      w.worker_cpu_s > 0
          ? std::min(kRunDelayScale, (w.worker_cpu_s + w.worker_run_delay_s) / w.worker_cpu_s)
          : 1.0;
  const double lock_busy = lock_scale * w.worker_lock_held_s / w.elapsed_s;
  const std::string measured = format("waited %.0f%%, workers %.0f%% busy on %.2f of %.2f cores",
                                      100 * wait, 100 * busy, worker_cores, limits_.cores);

  // The last change: keep it, or undo it and remember the level as a bound.
  if (probe_ && !probe_->settled) {
    probe_->settled = true;
    keep.reason = "settling after the last change, " + measured;
    return keep;
  }
  if (probe_) {
    const Probe p = *probe_;
    probe_.reset();
    const bool workers = p.knob == Knob::workers;
    auto undo = [&](std::string why) {
      calm_windows_ = 0;
      return TuneDecision{
          workers ? p.from : w.workers, workers ? w.depth : p.from,
          format("%s %zu -> %zu: undone, %s (%s)", workers ? "workers" : "depth",
                 workers ? w.workers : w.depth, p.from, why.c_str(), measured.c_str())};
    };
    if (p.up && wait > kWaitThreshold && samples_per_s < p.samples_per_s * (1 + kMinGain) &&
        wait > p.wait - kMinWaitDrop) {
      (workers ? workers_ceiling_ : depth_ceiling_) = p.from;
      return undo(format("throughput %.0f samples/s did not rise from %.0f", samples_per_s,
                         p.samples_per_s));
    }
    if (!p.up && wait > kWaitThreshold) {
      (workers ? workers_floor_ : depth_floor_) = p.from;
      return undo("the training loop waited with fewer");
    }
  }

  // The budgets come first: never above them.
  std::size_t max_depth = limits_.max_depth;
  if (limits_.memory_budget != 0 && w.slab_bytes != 0) {
    const std::size_t slabs = limits_.memory_budget / w.slab_bytes;
    max_depth = std::clamp<std::size_t>(slabs > 0 ? slabs - 1 : 1, 1, max_depth);
  }
  if (w.depth > max_depth) {
    depth_ceiling_ = max_depth;
    return change(w, Knob::depth, max_depth, "the memory budget holds no more slabs", false);
  }
  const std::size_t cap =
      std::min({limits_.max_workers, workers_ceiling_, processes ? w.worker_limit : SIZE_MAX});
  if (w.workers > 1 && computing && n * busy > cpu_workers + 0.5) {
    workers_ceiling_ = w.workers - 1;
    return change(w, Knob::workers, w.workers - 1, "over the CPU budget, " + measured, false);
  }

  if (wait > kWaitThreshold) {
    calm_windows_ = 0;
    if (busy < kStarved) {  // the workers wait for batches to open, not the other way round
      const std::size_t depth_cap = std::min(max_depth, depth_ceiling_);
      if (w.depth < depth_cap) {
        return change(w, Knob::depth, std::min(2 * w.depth, depth_cap),
                      "workers starved of batches, " + measured);
      }
      keep.reason = "workers starved but depth at the memory budget, " + measured;
      return keep;
    }
    if (lock_busy > kLockSaturated) {
      keep.reason = format("the GIL is saturated (%.0f%% busy): more threads would wait for it, ",
                           100 * lock_busy) +
                    measured;
      return keep;
    }
    if (w.workers >= cap) {
      keep.reason = "at the most workers, " + measured;
      return keep;
    }
    // Workers that wait inside read() are multiplied by what the loop's waiting says is
    // missing (kMostGrowth): more in flight hide the waiting and cost little CPU, as many as
    // what they do use fits. Computing workers get one more.
    std::size_t to = w.workers + 1;
    if (!computing) {
      const double growth = std::clamp(1.0 / (1.0 - std::min(wait, 0.99)), 2.0, kMostGrowth);
      to = static_cast<std::size_t>(std::ceil(n * growth));
      if (worker_cores > 0) {  // as many as their CPU time fits in the budget
        to = std::min(to, static_cast<std::size_t>(std::floor(n * cpu_budget / worker_cores)));
      }
    }
    to = std::min(cap, to);
    if (computing ? static_cast<double>(to) > cpu_workers : to <= w.workers) {
      keep.reason = "CPU saturated: no budget for another worker, " + measured;
      return keep;
    }
    return change(w, Knob::workers, to, "the training loop waits, " + measured);
  }

  if (wait < kCalmThreshold) {
    if (++calm_windows_ < kCalmWindows) {
      keep.reason = "the training loop does not wait, " + measured;
      return keep;
    }
    if (busy < kIdle && w.workers > workers_floor_) {
      // Keep the remaining workers about 3/4 busy.
      const auto enough = static_cast<std::size_t>(std::ceil(n * busy / 0.75));
      const std::size_t to = std::max(workers_floor_, std::min(w.workers - 1, enough));
      return change(w, Knob::workers, to, "idle workers, " + measured);
    }
    // Workers busy all the time only just keep up: the batches ahead absorb their jitter.
    if (busy < kBusy && w.depth > std::max(kMinDepth, depth_floor_)) {
      return change(w, Knob::depth, w.depth - 1, "batches ready ahead, " + measured);
    }
    keep.reason = "settled, " + measured;
    return keep;
  }
  calm_windows_ = 0;
  keep.reason = "in the dead band, " + measured;
  return keep;
}

HostShare host_share() {
  HostShare h;
  cpu_set_t set;
  h.cores = sched_getaffinity(0, sizeof set, &set) == 0
                ? static_cast<std::size_t>(std::max(1, CPU_COUNT(&set)))
                : std::max(1u, std::thread::hardware_concurrency());
  const std::optional<std::string> local_world = env_var("LOCAL_WORLD_SIZE");
  h.local_ranks = local_ranks(local_world ? local_world->c_str() : nullptr);
  h.cpu_share = cpu_share(h.cores, local_world ? local_world->c_str() : nullptr);
  return h;
}

std::size_t default_max_workers(double cpu_share, bool python_reads) {
  if (python_reads) return std::max<std::size_t>(32, static_cast<std::size_t>(cpu_share));
  return std::max<std::size_t>(16, static_cast<std::size_t>(std::ceil(8 * cpu_share)));
}

std::size_t local_ranks(const char* local_world_size) {
  if (local_world_size == nullptr) return 1;
  const char* end = local_world_size + std::strlen(local_world_size);
  std::size_t parsed = 0;
  return std::from_chars(local_world_size, end, parsed).ptr == end && parsed > 0 ? parsed : 1;
}

double cpu_share(std::size_t cores, const char* local_world_size) {
  return std::max(1.0,
                  static_cast<double>(cores) / static_cast<double>(local_ranks(local_world_size)));
}

std::optional<TuneDecision> WorkerTuner::observe(const Stats& now, std::size_t worker_limit) {
  next_due_ = std::chrono::steady_clock::now() + kMinWindow / 4;
  // A window starts once a batch was delivered: before it, the workers start (processes
  // fork, the layout is probed) and the loop waits for the first batch, which says nothing of
  // the steady state (it read as "workers starved of batches" and asked for more depth).
  if (!start_ || now.workers != start_->workers || now.depth != start_->depth ||
      now.batches < start_->batches || start_->batches == 0) {
    start_ = now;  // first call, or a new configuration: start a fresh window
    return std::nullopt;
  }
  const Stats& s = *start_;
  if (now.elapsed - s.elapsed < kMinWindow || now.batches - s.batches < kMinBatches) {
    return std::nullopt;
  }
  TuneWindow window;
  window.elapsed_s = to_seconds(now.elapsed - s.elapsed);
  window.consumer_wait_s = to_seconds(now.consumer_wait - s.consumer_wait);
  window.consumer_cpu_s = to_seconds(now.consumer_cpu - s.consumer_cpu);
  window.worker_busy_s = to_seconds(now.worker_busy - s.worker_busy);
  window.worker_cpu_s = to_seconds(now.worker_cpu - s.worker_cpu);
  window.worker_lock_held_s = to_seconds(now.worker_lock_held - s.worker_lock_held);
  window.worker_run_delay_s = to_seconds(now.worker_run_delay - s.worker_run_delay);
  window.samples = static_cast<double>(now.samples - s.samples);
  window.workers = now.workers;
  window.depth = now.depth;
  window.worker_limit = worker_limit;
  window.slab_bytes = now.slabs != 0 ? now.slab_bytes / now.slabs : 0;
  start_ = now;
  TuneDecision d =
      advise_only_ ? TunePolicy(policy_.limits()).decide(window) : policy_.decide(window);
  if (d.workers == now.workers && d.depth == now.depth) return std::nullopt;
  if (advise_only_) {
    d.reason = format(
        "with workers = %zu and depth = %zu fixed, the training loop waits; "
        "tune_workers (num_workers='auto') would change %s",
        now.workers, now.depth, d.reason.c_str());
    log(LogLevel::info, d.reason);
    next_due_ = std::chrono::steady_clock::time_point::max();
    MutexLock lock(mu_);
    last_ = std::move(d.reason);
    return std::nullopt;
  }
  log(LogLevel::debug, "tuner: " + d.reason);
  MutexLock lock(mu_);
  ++changes_;
  last_ = d.reason;
  return d;
}

void WorkerTuner::add_stats(Stats& stats) const {
  stats.cpu_cores = policy_.limits().cores;
  MutexLock lock(mu_);
  stats.tuner_changes = changes_;
  stats.tuner = last_;
}

}  // namespace stoker::detail
