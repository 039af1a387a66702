// The one memory cap (LoaderOptions::memory_limit): what counts against it, and how it is
// divided. Pure functions, tested alone (tests/memory_cap_test.cc); the loader measures and
// applies them (src/loader.cc).
#pragma once

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>

namespace stoker::detail {

// Bytes held now, by kind.
struct MemoryUse {
  std::size_t slabs = 0;         // host batch slabs allocated (in flight, ready, held)
  std::size_t device_slots = 0;  // batches on the device (device_depth slots)
  std::size_t cache = 0;         // the data set's RAM cache (Dataset::resident_bytes)
  std::size_t workers = 0;       // worker processes' own memory (their Pss_Anon)
  // Not held: room kept below the cap for what the cache and the worker processes grow by
  // before the slabs in flight give theirs back (MemoryGuard::growth_reserve).
  std::size_t reserve = 0;
  std::size_t total() const { return slabs + device_slots + cache + workers; }
};

// How the cap is divided. The RAM cache and the worker processes hold what they hold (a
// cache keeps what it has read, a process's heap does not shrink on request, and both cost
// work to rebuild), and the device slots are fixed by device_depth; the batches in flight are
// the part that can be given back at once and cheaply: past the first, a batch ahead only
// absorbs the jitter of reads, and the tuner measures whether it does. So the slabs get what
// the others leave, within `slab_budget` (LoaderOptions::memory_budget, 0: none), and the depth
// is what those bytes hold beside the batches the consumer holds: (depth + held) slabs. `held`
// is at least 1 (the batch being used); a Python `for x in loader` holds 2 while it asks for
// the next one (x is replaced only after), and the pool then makes a slab more rather than
// overwrite a batch in use: the loader measures it (slabs beyond the depth).
struct MemoryShare {
  std::size_t slab_budget = 0;  // bytes the slabs may take
  std::size_t max_depth = 0;    // batches in flight they hold; 0: not even one (too small)
  // For the engine and the tuner, which count (depth + 1) slabs: (max_depth + 1) slabs' bytes.
  std::size_t depth_budget = 0;
};

// Batches the training loop holds beside those in flight: the one it uses and, while it asks
// for the next, that one too (a Python `for x in loader` drops x only once the next batch is
// there; the pool makes a slab more rather than overwrite a batch in use).
inline constexpr std::size_t kHeldBatches = 2;

// `cap` 0 is no cap (the slabs get `slab_budget`, or everything when it is 0 too).
// `slab_bytes` 0 (layout not known yet): max_depth is SIZE_MAX. The reserve is kept only as
// far as it leaves one batch in flight: it guards against growth, it is not held.
MemoryShare divide_memory_cap(std::size_t cap, std::size_t slab_budget, std::size_t slab_bytes,
                              const MemoryUse& others, std::size_t held = 1);

// The least cap that holds one batch in flight beside `others` and the `held` batches.
std::size_t least_memory_cap(std::size_t slab_bytes, const MemoryUse& others, std::size_t held = 1);

// The error for a cap too small for one batch: what holds what, and what would fit.
std::string memory_cap_too_small(std::size_t cap, std::size_t slab_bytes, const MemoryUse& others,
                                 std::size_t held = 1);

// The default cap: half of MemAvailable (`available`), leaving the other half to the training
// process (model, optimizer state, its own tensors) and the rest of the machine; the pinned
// budget, a quarter, fits inside it.
std::size_t default_memory_limit(std::size_t available);

// How often the loader looks at what is held while next() is called: reading the worker
// processes' /proc entries and the engine's counters costs some microseconds per look, a
// negligible share of 50 ms, and a batch pipeline's memory moves by whole slabs and processes,
// not within milliseconds.
inline constexpr std::chrono::milliseconds kMemoryCheckPeriod{50};

// The rises of the cache and the worker processes over this many looks (a second) make the
// growth reserve.
inline constexpr std::size_t kGrowthLooks = 20;

// The loader's side of the cap: the limit, the peak seen, when to look next, the growth
// reserve.
// Thread safety: due() and saw() on the consumer's thread (or under the caller's lock);
// peak() from any thread.
class MemoryGuard {
 public:
  MemoryGuard(std::size_t limit, std::size_t slab_budget)
      : limit_(limit), slab_budget_(slab_budget) {}
  std::size_t limit() const { return limit_; }
  std::size_t slab_budget() const { return slab_budget_; }  // LoaderOptions::memory_budget
  bool due() const { return std::chrono::steady_clock::now() >= next_due_; }
  // Records a look at `used` bytes; the next is due a period later, or at once while the
  // layout is not known (the first look after it divides the cap, before a short epoch ends).
  void saw(std::size_t used, bool layout_known) {
    std::size_t peak = peak_.load(std::memory_order_relaxed);
    while (used > peak && !peak_.compare_exchange_weak(peak, used, std::memory_order_relaxed)) {
    }
    if (layout_known) next_due_ = std::chrono::steady_clock::now() + kMemoryCheckPeriod;
  }
  std::size_t peak() const { return peak_.load(std::memory_order_relaxed); }
  // True the first time the rest outgrows the cap (the loader says it once).
  bool first_overrun() { return !std::exchange(overrun_, true); }
  // Given what the cache and the worker processes hold at this look (`rest`), the room to
  // keep for their growth: the largest rise between two looks over the last kGrowthLooks.
  // When the rest grows the depth is lowered, but the slabs in flight above the new depth
  // are freed only as the training loop takes and returns their batches (a bursty loop may
  // pause with them ready): for that while the rest and the old slabs are both held. The
  // first look sets the base (a worker's start is not growth to keep room for).
  std::size_t growth_reserve(std::size_t rest) {
    if (looks_++ != 0) rises_[looks_ % kGrowthLooks] = rest > rest_ ? rest - rest_ : 0;
    rest_ = rest;
    std::size_t most = 0;
    for (const std::size_t r : rises_) most = std::max(most, r);
    return most;
  }

 private:
  const std::size_t limit_;
  const std::size_t slab_budget_;
  std::atomic<std::size_t> peak_{0};
  std::chrono::steady_clock::time_point next_due_{};
  bool overrun_ = false;
  std::size_t rest_ = 0;
  std::uint64_t looks_ = 0;
  std::array<std::size_t, kGrowthLooks> rises_{};
};

}  // namespace stoker::detail
