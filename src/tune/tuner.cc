#include "tune/tuner.h"

#include <algorithm>

namespace stoker::detail {

std::size_t next_worker_count(const TuneWindow& w, const TuneLimits& limits) {
  const std::size_t n = w.workers;
  if (w.elapsed_s <= 0 || n == 0 || n >= limits.max_workers) return n;
  if (w.consumer_wait_s < kWaitThreshold * w.elapsed_s) return n;
  if (w.worker_lock_held_s > kLockSaturated * w.elapsed_s) return n;
  // Share of the workers' time spent on a CPU. Low: they wait inside read().
  const double on_cpu = w.worker_busy_s > 0 ? w.worker_cpu_s / w.worker_busy_s : 1.0;
  if (on_cpu < 0.5) return std::min(limits.max_workers, 2 * n);
  if (n < limits.cores) return n + 1;
  return n;
}

std::optional<std::size_t> WorkerTuner::observe(const Stats& now) {
  next_due_ = std::chrono::steady_clock::now() + kMinWindow / 4;
  if (!start_ || now.workers != start_->workers || now.batches < start_->batches) {
    start_ = now;  // first call, or someone else changed the count: start a fresh window
    return std::nullopt;
  }
  const Stats& s = *start_;
  if (now.elapsed - s.elapsed < kMinWindow || now.batches - s.batches < kMinBatches) {
    return std::nullopt;
  }
  const TuneWindow window{to_seconds(now.elapsed - s.elapsed),
                          to_seconds(now.consumer_wait - s.consumer_wait),
                          to_seconds(now.worker_busy - s.worker_busy),
                          to_seconds(now.worker_cpu - s.worker_cpu),
                          now.workers,
                          to_seconds(now.worker_lock_held - s.worker_lock_held)};
  start_ = now;
  const std::size_t next = next_worker_count(window, limits_);
  if (next == now.workers) return std::nullopt;
  return next;
}

}  // namespace stoker::detail
