#include "tune/worker_kind.h"

#include <algorithm>

#include "tune/tuner.h"
#include "util/format.h"

namespace stoker::detail {

GilVerdict gil_bound(double busy, double on_cpu, double delayed, bool whole_batches) {
  const double scale = on_cpu > 0 ? std::min(kRunDelayScale, (on_cpu + delayed) / on_cpu) : 1.0;
  const bool parallel = busy > kGilParallel && !whole_batches;
  return {.bound = kGilBusy <= scale * busy && !parallel, .scale = scale};
}

KindChoice choose_worker_kind(double busy, double on_cpu, double delayed, bool whole_batches,
                              std::size_t threads, std::size_t cores) {
  const GilVerdict v = gil_bound(busy, on_cpu, delayed, whole_batches);
  std::string measured =
      format("reads kept the GIL busy %.0f%% of the time on %zu threads, %zu cores", 100 * busy,
             threads, cores);
  if (v.scale > 1.05) {
    measured += format(" (%.0f%% counting their waits for a core)", 100 * v.scale * busy);
  }
  if (v.bound && cores >= 2 && threads >= 2) {
    const char* why = busy > kGilParallel ? "whole batches made in Python" : "GIL-bound";
    return {.processes = true, .reason = "auto: " + measured + ": " + why + ", so processes"};
  }
  const char* why = cores < 2                ? "fewer than 2 cores"
                    : threads < 2 && v.bound ? "fewer than 2 threads"
                    : busy > kGilParallel    ? "work that releases the GIL"
                                             : "not GIL-bound";
  return {.processes = false, .reason = "auto: " + measured + ": " + why + ", so threads"};
}

std::size_t next_remote_workers(std::size_t active, std::size_t count, double wait_fraction,
                                double local_load, std::optional<double> remote_busy) {
  const bool network_bound = remote_busy && *remote_busy < kRemoteSaturated;
  if (wait_fraction > kRemoteGrowWait && local_load >= kRemoteSaturated && active < count &&
      !network_bound) {
    return active + 1;
  }
  if (wait_fraction < kRemoteShrinkWait && active > 0) return active - 1;
  return active;
}

}  // namespace stoker::detail
