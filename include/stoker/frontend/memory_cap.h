// The one memory cap (LoaderOptions::memory_limit): what counts against it, and how it is
// divided. Pure functions, tested alone (tests/memory_cap_test.cc); the loader measures and
// applies them (src/loader.cc), and the Python package's stream pipeline its stream's share
// (StreamMemoryCap). Implemented in src/tune/memory_cap.cc.
// Installed for front ends, unstable (include/stoker/frontend/README.md).
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
  // A stream's: what its data set holds for later in the training process (a shuffle buffer
  // read in-line or on threads; a worker process's counts in `workers`).
  std::size_t buffers = 0;
  // Not held: room kept below the cap for what the cache and the worker processes grow by
  // before the slabs in flight give theirs back (MemoryGuard::growth_reserve).
  std::size_t reserve = 0;
  std::size_t total() const { return slabs + device_slots + cache + workers + buffers; }
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

// --- streams ----------------------------------------------------------------------------------

// An iterable data set's batches (python/stoker/loader/stream_epochs.py) are not slabs: each
// worker fills a queue of `depth` batches and its producer holds one more while the queue is
// full; a worker process makes up to `depth` ahead in its arenas while its producer hands over
// the up to `depth` of its last reply. So a depth holds these many batches in flight (read
// in-line: none).
constexpr std::size_t stream_batches_in_flight(std::size_t workers, std::size_t depth,
                                               bool processes) {
  return workers * (processes ? 3 * depth : depth + 1);
}

// The deepest queue, at most `wanted`, whose batches in flight and the `held` ones the
// training loop holds fit in `cap` beside `taken` bytes held by the rest; 0 when not even
// depth 1 fits. `cap` 0 (no cap) or `batch_bytes` 0 (none seen yet): `wanted`.
std::size_t stream_memory_depth(std::size_t cap, std::size_t batch_bytes, std::size_t workers,
                                bool processes, std::size_t wanted, std::size_t taken,
                                std::size_t held = kHeldBatches);

// A stream's side of the one cap: the same guard (peak, period, growth reserve, one warning),
// and each worker's queue depth as the rest grows. The stream pipeline measures (the largest
// batch's bytes, the arenas its worker processes hand batches over in, their Pss_Anon, the
// shuffle buffers read in the training process) and applies the depth; tests call it alone.
// Thread safety: one thread (the training loop's).
class StreamMemoryCap {
 public:
  StreamMemoryCap(std::size_t limit, std::size_t depth) : guard_(limit, 0), wanted_(depth) {}
  std::size_t limit() const { return guard_.limit(); }
  std::size_t peak() const { return guard_.peak(); }
  bool due() const { return guard_.due(); }
  // The depth asked for from now on (a stream whose batches come in bursts: deeper_stream_depth).
  void want(std::size_t depth) { wanted_ = depth; }
  // The readers from now on (worker_type='auto' moves a stream from in-line to processes).
  void set_workers(std::size_t workers, bool processes) {
    workers_ = workers;
    processes_ = processes;
  }

  struct Look {
    std::size_t depth = 0;  // each worker's queue from now on
    MemoryUse use;          // bytes now, as given (the batches' in `slabs`), and the reserve
    std::size_t used = 0;
    bool too_small = false;  // not even depth 1 fits beside nothing: the caller refuses
    bool warn = false;       // the rest outgrew the cap for the first time: depth 1, said once
    std::string message;     // why, when too_small or warn
  };
  // `batch_bytes`: the largest batch seen (0: none yet), which the depth is divided by;
  // `batches`: what the stream's batches hold now (queued, being made, held; with worker
  // processes the arenas they came in, which a worker keeps while it lives); `workers`,
  // `buffers`: as MemoryUse's. The depth leaves room for the most a depth lets be in flight
  // (stream_batches_in_flight), whatever is in flight now.
  Look look(std::size_t batch_bytes, std::size_t batches, std::size_t workers, std::size_t buffers);
  // report()'s memory line of a look.
  std::string line(const Look& look) const;

 private:
  MemoryGuard guard_;
  std::size_t wanted_;  // prefetch_factor (or deeper): the depth asked for
  std::size_t workers_ = 0;
  bool processes_ = false;
};

// The error (or the warning) for a cap too small for one batch in flight per worker.
std::string stream_memory_too_small(std::size_t cap, std::size_t batch_bytes, std::size_t workers,
                                    bool processes, const MemoryUse& others,
                                    std::size_t held = kHeldBatches);

}  // namespace stoker::detail
