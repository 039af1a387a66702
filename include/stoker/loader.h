// The loader: samples a data set into batches with a pool of worker threads, each sample
// written once, straight into its slot of a recycled batch slab, batches delivered in order.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <memory>
#include <optional>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include "stoker/dataset.h"

namespace stoker {

namespace detail {
class Engine;
struct Slab;
class SlabPool;
class CopyStage;
class DeviceStage;
struct DeviceSlot;
class DeviceSlots;
class WorkerTuner;
class HostAllocator;
}  // namespace detail

enum class ErrorPolicy : std::uint8_t {
  raise,  // a failed sample makes next() throw SampleError for its batch (default)
  skip,   // a failed sample is replaced by another one; the batch reports it
};

// Which ranks see which samples, with the rules of torch.utils.data.DistributedSampler:
// the epoch's order is padded by repetition to a multiple of world_size (or, with drop_last,
// cut to one), and rank r takes positions r, r + world_size, r + 2 * world_size, ...
struct Shard {
  std::size_t rank = 0;
  std::size_t world_size = 1;
  bool drop_last = false;  // cut the tail instead of padding (DistributedSampler's drop_last)
};

// Whether batch slabs are page-locked. Page-locked ("pinned") slabs let the device's copy
// engine read them directly (no staging copy, and the copy overlaps compute), but every locked
// byte is taken from the rest of the machine, so stoker never locks more than a budget.
enum class PinMemory : std::uint8_t {
  automatic,  // pinned when batches go to a device and the budget allows (default)
  on,         // pinned (by CUDA if a device answers, even for "cpu" delivery), else mlock'ed;
              // still within the budget
  off,        // ordinary pageable memory
};

// The simulated device ("sim"): a copy engine and streams with virtual clocks, for testing
// and benchmarking the device stage on machines without a GPU.
struct SimDevice {
  double bandwidth_gb_per_s = 25.0;       // host-to-device copy rate
  std::chrono::microseconds latency{10};  // per copy
  double time_scale = 0.0;                // real seconds slept per simulated second
};

struct LoaderOptions {
  std::shared_ptr<const Dataset> dataset;
  std::size_t batch_size = 1;
  bool shuffle = false;
  std::uint64_t seed = 0;  // the order of epoch e is a function of (seed + e), as in torch
  bool drop_last = false;  // drop the last batch of an epoch if it is short
  Shard shard;

  // Worker threads; 0 reads every sample inline on the thread that calls next().
  std::size_t workers = 2;
  // Batches in flight (being read or ready, not yet handed out). At least 1.
  std::size_t depth = 4;
  // Online tuning of `workers` (the starting count): while the consumer waits for data, add
  // workers, doubling them if they mostly wait themselves (I/O, sleeps, a GIL), one at a
  // time up to the core count if they compute; never past max_workers (0: 4 x cores). The
  // tuner runs inside next(), on the consumer's thread; see src/tune/tuner.h.
  bool tune_workers = false;
  std::size_t max_workers = 0;

  // Where batches are delivered: "cpu" (host slabs), "cuda" or "cuda:N" (copied on a side
  // stream into recycled device buffers, device_depth batches ahead), or "sim". If no CUDA
  // device answers, the loader says so once in the log and delivers on the CPU.
  std::string device = "cpu";
  std::size_t device_depth = 2;
  // The consumer's stream (a cudaStream_t, or a SimStream* for "sim"); null is the device's
  // default stream. next() makes it wait for the batch's copy; see Batch::wait.
  void* stream = nullptr;
  PinMemory pin_memory = PinMemory::automatic;
  // Page-locked slab bytes allowed in the whole process; 0: a quarter of MemAvailable. Past
  // it, further slabs are pageable (said once in the log).
  std::size_t pin_budget = 0;
  SimDevice sim;

  ErrorPolicy on_error = ErrorPolicy::raise;
  // With ErrorPolicy::skip: failed samples tolerated over the loader's life; the next one
  // raises SampleError as under ErrorPolicy::raise.
  std::size_t max_skipped = 1000;

  // Internal (the Python package's worker processes): where batch slabs come from instead of
  // pageable or page-locked memory. Null: chosen from pin_memory.
  std::shared_ptr<detail::HostAllocator> slab_allocator;
};

// A sample failed to read. what() names the sample index and the reason; the original
// exception, with its type, is kept in cause() (and rethrow_cause() throws it as it was).
class SampleError : public std::runtime_error {
 public:
  SampleError(std::size_t index, std::exception_ptr cause, const std::string& reason);
  std::size_t index() const noexcept { return index_; }
  std::exception_ptr cause() const noexcept { return cause_; }
  [[noreturn]] void rethrow_cause() const { std::rethrow_exception(cause_); }

 private:
  std::size_t index_;
  std::exception_ptr cause_;
};

struct SkippedSample {
  std::size_t index;   // the sample that failed
  std::string reason;  // its exception's what()
};

// A batch handed out by Loader::next(). One contiguous buffer per field, shaped
// [size(), field shape...]. Move-only; destroying it (or release()) recycles its slab, so keep
// it only as long as its data is needed. It may outlive the Loader.
//
// Thread safety: a Batch is used by one thread at a time.
class Batch {
 public:
  Batch() = default;
  Batch(Batch&& other) noexcept;
  Batch& operator=(Batch&& other) noexcept;
  Batch(const Batch&) = delete;
  Batch& operator=(const Batch&) = delete;
  ~Batch() { release(); }

  explicit operator bool() const noexcept { return slab_ != nullptr; }
  void release() noexcept;

  std::uint64_t epoch() const noexcept;
  std::size_t number() const noexcept;  // position of this batch in its epoch, from 0
  std::size_t size() const noexcept;    // samples in this batch
  std::span<const FieldSpec> fields() const noexcept;
  std::size_t field_index(std::string_view name) const;  // throws std::out_of_range

  // The field's host bytes. For a batch on a device, fields other than host_only ones live in
  // device memory: use data() for those (bytes() then still holds the host copy it was made
  // from, valid while the batch lives).
  std::span<std::byte> bytes(std::size_t field) const noexcept;
  template <class T>
  std::span<T> as(std::size_t field) const noexcept {
    auto b = bytes(field);
    return {reinterpret_cast<T*>(b.data()), b.size() / sizeof(T)};
  }

  // Where the consumer reads the field: device memory for a batch on a device (unless the field
  // is host_only), else the host bytes.
  void* data(std::size_t field) const noexcept;
  bool on_device(std::size_t field) const noexcept;
  std::string_view device() const noexcept;  // "cpu", "cuda:0", "sim"
  // Makes `stream` wait (on the device, not the host) for this batch's copy; next() already did
  // it for LoaderOptions::stream. Releasing the batch marks its device memory free once the
  // work queued so far on the last stream passed here (or that one) is done.
  void wait(void* stream);
  void synchronize();  // blocks the calling thread until the batch's copy is done

  std::span<const std::size_t> indices() const noexcept;    // data set index of each row
  std::span<const SkippedSample> skipped() const noexcept;  // replaced rows (skip policy)

 private:
  friend class detail::Engine;
  friend class detail::CopyStage;
  Batch(std::shared_ptr<detail::SlabPool> pool, detail::Slab* slab) noexcept
      : pool_(std::move(pool)), slab_(slab) {}

  std::shared_ptr<detail::SlabPool> pool_;
  detail::Slab* slab_ = nullptr;  // owned unless on a device (then its slot owns it)
  std::shared_ptr<detail::DeviceSlots> device_;
  detail::DeviceSlot* slot_ = nullptr;
};

// Where a loader stands in its sample order: `batch` batches of epoch `epoch` have been handed
// out. Restoring it yields exactly the batches that were still to come.
struct Position {
  std::uint64_t epoch = 0;
  std::size_t batch = 0;
};

struct Stats {
  std::chrono::nanoseconds elapsed{0};  // since the first next()
  std::uint64_t batches = 0;            // handed out
  std::uint64_t samples = 0;
  std::uint64_t bytes = 0;                    // batch bytes handed out
  std::chrono::nanoseconds consumer_wait{0};  // time next() blocked waiting for data
  std::chrono::nanoseconds worker_busy{0};    // summed over workers: time spent in read()
  std::chrono::nanoseconds inline_busy{0};    // read() time on the consumer (workers = 0)
  std::chrono::nanoseconds worker_cpu{0};     // of worker_busy, time on a CPU (the rest waited)
  std::uint64_t skipped = 0;                  // rows replaced (skip policy) in batches handed out
  std::size_t workers = 0;
  std::size_t depth = 0;
  std::size_t in_flight = 0;        // batches being read or ready, now
  std::size_t ready = 0;            // of those, complete and waiting for the consumer
  double mean_ready_at_next = 0.0;  // ready batches seen by next(), averaged over calls
  std::size_t slabs = 0;            // batch buffers allocated
  std::size_t slab_bytes = 0;       // their total size
  std::size_t locked_slabs = 0;     // of those, page-locked (pinned or mlock'ed)
  std::string device;               // where batches are delivered: "cpu", "cuda:0", "sim"
  std::uint64_t copies = 0;         // host-to-device batch copies issued
  std::uint64_t copy_bytes = 0;
  // Of worker_cpu, time holding a lock that serializes reads (the GIL; Dataset::lock_held).
  std::chrono::nanoseconds worker_lock_held{0};

  double samples_per_second() const;
  double bytes_per_second() const;
  double wait_fraction() const;  // consumer_wait / elapsed
};

// Thread safety: next(), set_epoch(), restore() and position() belong to one consumer thread.
// set_workers(), set_depth(), stats() and the const accessors may be called from any thread,
// concurrently with next(). Destroying the loader with batches in flight is allowed: it stops
// the workers (each finishes at most the sample it is reading) and returns.
class Loader {
 public:
  // Throws std::invalid_argument for an impossible option (no dataset, batch size 0, rank
  // outside world size, ...), with the option named.
  explicit Loader(LoaderOptions options);
  ~Loader();
  Loader(const Loader&) = delete;
  Loader& operator=(const Loader&) = delete;

  // The next batch of the current epoch, or nullopt at its end; the call after that starts
  // the following epoch (already being prefetched). Throws SampleError for a failed sample
  // (see ErrorPolicy); the loader stays usable and the next call returns the next batch.
  std::optional<Batch> next();

  // Starts epoch `epoch` from its first batch. Batches already prefetched for it are kept;
  // anything else in flight is discarded.
  void set_epoch(std::uint64_t epoch);
  Position position() const;
  void restore(const Position& position);  // throws std::invalid_argument if out of range

  std::size_t batches_per_epoch() const;
  std::size_t samples_per_epoch() const;  // for this rank, before batching
  std::span<const FieldSpec> fields() const;

  void set_workers(std::size_t workers);
  void set_depth(std::size_t depth);  // clamped to at least 1
  Stats stats() const;

 private:
  void restart(Position position);

  std::unique_ptr<detail::Engine> engine_;
  std::unique_ptr<detail::DeviceStage> stage_;
  std::unique_ptr<detail::WorkerTuner> tuner_;  // with LoaderOptions::tune_workers
};

}  // namespace stoker
