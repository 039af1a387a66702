#include "tune/memory_cap.h"

#include <algorithm>
#include <cstdint>
#include <limits>

#include "util/format.h"

namespace stoker::detail {
namespace {

std::string mib(std::size_t bytes) { return format("%.1f MiB", bytes / 1048576.0); }

// divide_memory_cap with `taken` bytes of the cap held (or kept) by the others.
MemoryShare divide(std::size_t cap, std::size_t slab_budget, std::size_t slab_bytes,
                   std::size_t taken, std::size_t held) {
  constexpr std::size_t kNone = std::numeric_limits<std::size_t>::max();
  held = std::max<std::size_t>(held, 1);
  const std::size_t from_cap = cap == 0 ? kNone : cap > taken ? cap - taken : 0;
  MemoryShare share;
  share.slab_budget = std::min(from_cap, slab_budget != 0 ? slab_budget : kNone);
  if (slab_bytes == 0) {
    share.max_depth = kNone;
    share.depth_budget = share.slab_budget;
    return share;
  }
  // The cap holds (depth + held) slabs; memory_budget, as before it, (depth + 1).
  std::size_t depth = kNone;
  if (from_cap != kNone) {
    const std::size_t slabs = from_cap / slab_bytes;
    depth = slabs > held ? slabs - held : 0;
  }
  if (slab_budget != 0) {
    const std::size_t slabs = slab_budget / slab_bytes;
    depth = std::min(depth, slabs > 1 ? slabs - 1 : 0);
  }
  share.max_depth = depth;
  share.depth_budget = depth == kNone ? kNone : (std::max<std::size_t>(depth, 1) + 1) * slab_bytes;
  return share;
}

}  // namespace

MemoryShare divide_memory_cap(std::size_t cap, std::size_t slab_budget, std::size_t slab_bytes,
                              const MemoryUse& others, std::size_t held) {
  const std::size_t taken = others.device_slots + others.cache + others.workers;
  const MemoryShare kept = divide(cap, slab_budget, slab_bytes, taken + others.reserve, held);
  return kept.max_depth != 0 || others.reserve == 0
             ? kept
             : divide(cap, slab_budget, slab_bytes, taken, held);
}

std::size_t least_memory_cap(std::size_t slab_bytes, const MemoryUse& others, std::size_t held) {
  return (std::max<std::size_t>(held, 1) + 1) * slab_bytes + others.device_slots + others.cache +
         others.workers;
}

std::string memory_cap_too_small(std::size_t cap, std::size_t slab_bytes, const MemoryUse& others,
                                 std::size_t held) {
  held = std::max<std::size_t>(held, 1);
  std::string out =
      "memory_limit of " + mib(cap) + " is too small for one batch in flight: it needs " +
      (held == 1 ? std::string("two") : std::to_string(held + 1)) + " batch slabs of " +
      mib(slab_bytes) + " (the batch being read and " +
      (held == 1 ? std::string("the one") : std::to_string(held)) + " the training loop holds)";
  if (others.device_slots) out += ", " + mib(others.device_slots) + " of device slots";
  if (others.cache) out += ", " + mib(others.cache) + " of RAM cache";
  if (others.workers) out += ", " + mib(others.workers) + " held by the worker processes";
  return out + "; a memory_limit of at least " + mib(least_memory_cap(slab_bytes, others, held)) +
         " would fit (or a smaller batch_size, fewer worker processes or a smaller cache)";
}

std::size_t default_memory_limit(std::size_t available) { return available / 2; }

}  // namespace stoker::detail
