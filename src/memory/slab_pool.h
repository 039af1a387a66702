// Batch slabs: one allocation per batch buffer, holding one contiguous array per field, made
// up front and recycled. A slab's life: free -> filling (workers write samples into it) ->
// ready -> in use (a Batch handed to the consumer) -> free.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "memory/host_allocator.h"
#include "stoker/loader.h"
#include "util/mutex.h"

namespace stoker::detail {

// How a pool gets slab memory: page-locked from `locked` while the process-wide LockedBytes
// total stays within `lock_limit`, pageable otherwise (said once in the log).
struct SlabMemory {
  std::shared_ptr<HostAllocator> pageable = pageable_allocator();
  std::shared_ptr<HostAllocator> locked;  // null: never lock
  std::size_t lock_limit = 0;
};

// A failed sample under ErrorPolicy::raise (or past the skip budget).
struct SampleFailure {
  std::size_t row = 0;
  std::size_t index = 0;
  std::exception_ptr cause;
  std::string reason;
};

// One batch buffer plus the bookkeeping of the batch it currently holds. The scheduling
// fields are owned by the Engine and guarded by its mutex; `cancelled` is read by workers
// without it; the failure fields are guarded by `failure_mu` (several workers may fail on
// the same batch).
struct Slab {
  std::byte* memory = nullptr;
  std::size_t memory_bytes = 0;
  HostAllocator* allocator = nullptr;   // the pool's, which made `memory`
  std::vector<std::byte*> field_bases;  // field f's array, batch_size rows
  std::vector<std::size_t> indices;     // data set index per row, capacity batch_size

  // The batch it holds.
  std::uint64_t epoch = 0;
  std::size_t number = 0;
  std::size_t size = 0;
  // Work split: rows [c * chunk_rows, (c + 1) * chunk_rows) form chunk c.
  std::size_t chunk_rows = 0;
  std::size_t chunks = 0;
  std::size_t next_chunk = 0;   // first unclaimed
  std::size_t chunks_done = 0;  // finished
  std::atomic<bool> cancelled{false};
  Slab* next = nullptr;  // intrusive link: the engine's in-flight queue or the free list

  std::mutex failure_mu;
  std::optional<SampleFailure> failure;  // the first failed row, if any
  std::vector<SkippedSample> skipped;

  bool ready() const { return chunks_done == chunks; }
  void reset(std::uint64_t epoch, std::size_t number, std::size_t size);
};

// A pool of slabs for one batch layout.
//
// Thread safety: acquire(), release() and the counters may be called from any thread.
class SlabPool {
 public:
  SlabPool(std::vector<FieldSpec> fields, std::size_t batch_size, SlabMemory memory = {});
  ~SlabPool();
  SlabPool(const SlabPool&) = delete;
  SlabPool& operator=(const SlabPool&) = delete;

  // A free slab, or a newly allocated one if none is free. Throws std::bad_alloc.
  Slab* acquire() STOKER_EXCLUDES(mu_);
  void release(Slab* slab) noexcept STOKER_EXCLUDES(mu_);
  // Frees free slabs until at most `keep` slabs exist (slabs in use are never freed).
  void trim(std::size_t keep) STOKER_EXCLUDES(mu_);
  void reserve(std::size_t slabs) STOKER_EXCLUDES(mu_);  // allocate up front

  std::span<const FieldSpec> fields() const { return fields_; }
  std::span<const std::size_t> field_bytes() const { return field_bytes_; }
  std::size_t batch_size() const { return batch_size_; }
  std::size_t slab_bytes() const { return slab_bytes_; }
  std::size_t slabs() const STOKER_EXCLUDES(mu_);
  std::size_t locked_slabs() const STOKER_EXCLUDES(mu_);

 private:
  std::unique_ptr<Slab> make_slab();
  // Page-locked memory for a slab if the budget allows and locking works, else null.
  std::byte* try_lock_slab();
  void destroy(std::unique_ptr<Slab> slab) noexcept;

  const std::vector<FieldSpec> fields_;
  std::vector<std::size_t> field_bytes_;    // per sample
  std::vector<std::size_t> field_offsets_;  // in the slab
  const std::size_t batch_size_;
  std::size_t slab_bytes_ = 0;
  const SlabMemory memory_;
  std::atomic<bool> lock_failed_{false};  // locking failed once: stop trying
  std::atomic<bool> budget_said_{false};  // the budget log line was written

  mutable Mutex mu_;
  std::vector<std::unique_ptr<Slab>> all_ STOKER_GUARDED_BY(mu_);
  Slab* free_ STOKER_GUARDED_BY(mu_) = nullptr;
};

}  // namespace stoker::detail
