#include "tune/memory_cap.h"

#include <algorithm>
#include <cstdint>
#include <limits>

#include "util/format.h"

namespace stoker::detail {
namespace {

std::string mib(std::size_t bytes) { return format("%.1f MiB", bytes / 1048576.0); }

}  // namespace

MemoryShare divide_memory_cap(std::size_t cap, std::size_t slab_budget, std::size_t slab_bytes,
                              const MemoryUse& others) {
  std::size_t budget = slab_budget != 0 ? slab_budget : std::numeric_limits<std::size_t>::max();
  if (cap != 0) {
    const std::size_t held = others.device_slots + others.cache + others.workers;
    budget = std::min(budget, cap > held ? cap - held : 0);
  }
  MemoryShare share;
  share.slab_budget = budget;
  if (slab_bytes == 0) {
    share.max_depth = std::numeric_limits<std::size_t>::max();
  } else {
    const std::size_t slabs = budget / slab_bytes;
    share.max_depth = slabs >= 2 ? slabs - 1 : 0;
  }
  return share;
}

std::size_t least_memory_cap(std::size_t slab_bytes, const MemoryUse& others) {
  return 2 * slab_bytes + others.device_slots + others.cache + others.workers;
}

std::string memory_cap_too_small(std::size_t cap, std::size_t slab_bytes, const MemoryUse& others) {
  std::string out = "memory_limit of " + mib(cap) +
                    " is too small for one batch in flight: it needs " + "two batch slabs of " +
                    mib(slab_bytes) + " (the batch being read and the " +
                    "one the training loop holds)";
  if (others.device_slots) out += ", " + mib(others.device_slots) + " of device slots";
  if (others.cache) out += ", " + mib(others.cache) + " of RAM cache";
  if (others.workers) out += ", " + mib(others.workers) + " held by the worker processes";
  return out + "; a memory_limit of at least " + mib(least_memory_cap(slab_bytes, others)) +
         " would fit (or a smaller batch_size, fewer worker processes or a smaller cache)";
}

std::size_t default_memory_limit(std::size_t available) { return available / 2; }

}  // namespace stoker::detail
