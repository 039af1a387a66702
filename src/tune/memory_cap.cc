#include "stoker/frontend/memory_cap.h"

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
  const std::size_t taken = others.device_slots + others.cache + others.workers + others.buffers;
  const MemoryShare kept = divide(cap, slab_budget, slab_bytes, taken + others.reserve, held);
  return kept.max_depth != 0 || others.reserve == 0
             ? kept
             : divide(cap, slab_budget, slab_bytes, taken, held);
}

std::size_t least_memory_cap(std::size_t slab_bytes, const MemoryUse& others, std::size_t held) {
  return (std::max<std::size_t>(held, 1) + 1) * slab_bytes + others.device_slots + others.cache +
         others.workers + others.buffers;
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

std::size_t stream_memory_depth(std::size_t cap, std::size_t batch_bytes, std::size_t workers,
                                bool processes, std::size_t wanted, std::size_t taken,
                                std::size_t held) {
  wanted = std::max<std::size_t>(wanted, 1);
  if (cap == 0 || batch_bytes == 0) return wanted;
  const auto fits = [&](std::size_t depth) {
    const std::size_t batches = stream_batches_in_flight(workers, depth, processes) + held;
    return taken <= cap && batches <= (cap - taken) / batch_bytes;
  };
  if (!fits(1)) return 0;
  std::size_t depth = 1;  // fits; the batches grow with the depth, so search up to `wanted`
  while (depth < wanted && fits(depth + 1)) ++depth;
  return depth;
}

std::string stream_memory_too_small(std::size_t cap, std::size_t batch_bytes, std::size_t workers,
                                    bool processes, const MemoryUse& others, std::size_t held) {
  const std::size_t in_flight = stream_batches_in_flight(workers, 1, processes);
  std::string out = "memory_limit of " + mib(cap) + " is too small for one batch in flight per " +
                    "worker: it needs " + std::to_string(in_flight + held) + " batches of " +
                    mib(batch_bytes) + " (";
  if (in_flight != 0) {
    out += std::to_string(in_flight) + " in flight from " + std::to_string(workers) +
           (processes ? " worker process(es)" : " worker thread(s)") + " and ";
  }
  out += std::to_string(held) + " the training loop holds)";
  if (others.workers) out += ", " + mib(others.workers) + " held by the worker processes";
  if (others.buffers) out += ", " + mib(others.buffers) + " of shuffle buffers";
  const std::size_t least = (in_flight + held) * batch_bytes + others.workers + others.buffers;
  return out + "; a memory_limit of at least " + mib(least) +
         " would fit (or a smaller batch_size, fewer workers or a smaller shuffle buffer)";
}

StreamMemoryCap::Look StreamMemoryCap::look(std::size_t batch_bytes, std::size_t batches,
                                            std::size_t workers, std::size_t buffers) {
  Look look;
  look.use.slabs = batches;
  look.use.workers = workers;
  look.use.buffers = buffers;
  const std::size_t rest = workers + buffers;
  const std::size_t reserve = guard_.growth_reserve(rest);
  const std::size_t cap = guard_.limit();
  look.depth = stream_memory_depth(cap, batch_bytes, workers_, processes_, wanted_, rest + reserve);
  if (look.depth == 0 && reserve != 0) {  // the reserve guards growth; it never takes the last
    look.depth = stream_memory_depth(cap, batch_bytes, workers_, processes_, wanted_, rest);
  }
  if (look.depth == 0) {
    look.message = stream_memory_too_small(cap, batch_bytes, workers_, processes_, look.use);
    // Beside nothing it never fits: refused. Outgrown by the worker processes or the shuffle
    // buffers, which cannot give memory back at once: one batch per worker, said once.
    look.too_small = stream_memory_depth(cap, batch_bytes, workers_, processes_, 1, 0) == 0;
    look.warn = !look.too_small && guard_.first_overrun();
    look.depth = 1;
  }
  look.use.reserve = reserve;
  look.used = look.use.total();
  guard_.saw(look.used, batch_bytes != 0);
  return look;
}

std::string StreamMemoryCap::line(const Look& look) const {
  const auto whole = [](std::size_t bytes) { return format("%.0f", bytes / 1048576.0); };
  std::string parts;
  const auto part = [&](const char* what, std::size_t bytes) {
    if (bytes == 0) return;
    parts += (parts.empty() ? "" : ", ") + std::string(what) + " " + whole(bytes);
  };
  part("batches", look.use.slabs);
  part("worker processes", look.use.workers);
  part("shuffle buffers", look.use.buffers);
  return "memory: " + whole(look.used) + " MiB of the " + whole(limit()) + " MiB cap" +
         (parts.empty() ? "" : " (" + parts + ")") + ", peak " +
         whole(std::max(peak(), look.used)) + " MiB";
}

}  // namespace stoker::detail
