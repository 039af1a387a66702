// Batch slabs: one allocation per batch buffer, holding one contiguous array per field, made
// up front and recycled. A slab is memory only: which batch it holds, how its rows are split
// into chunks and what failed is the engine's ticket (exec/engine.h). A slab's life: free ->
// filling (workers write samples into it) -> handed out (a Batch owns it) -> free.
#pragma once

#include <atomic>
#include <cstddef>
#include <functional>
#include <memory>
#include <span>
#include <vector>

#include "memory/batch_owner.h"
#include "memory/recycling_pool.h"
#include "stoker/frontend/host_allocator.h"

namespace stoker::detail {

// What may still read a slab after its batch was given back: a user's own non_blocking copy
// out of a page-locked batch (torch's x.to("cuda", non_blocking=True) returns before the DMA
// ran). Recorded when the batch gives its slab back, waited for before the slab is filled
// again, as PyTorch's pinned allocator does with its events.
//
// Thread safety: record() and wait() are ordered by the pool (give back, then reuse).
class ReleaseFence {
 public:
  virtual ~ReleaseFence() = default;
  virtual void record() noexcept = 0;
  virtual void wait() noexcept = 0;
};

// How a pool gets slab memory: page-locked from `locked` while the process-wide LockedBytes
// total stays within `lock_limit`, pageable otherwise (said once in the log).
struct SlabMemory {
  std::shared_ptr<HostAllocator> pageable = pageable_allocator();
  std::shared_ptr<HostAllocator> locked;  // null: never lock
  std::size_t lock_limit = 0;
  // A fence for each page-locked slab (null: none), for batches handed out on the host.
  std::function<std::unique_ptr<ReleaseFence>()> make_fence;
};

class SlabPool;

// One batch buffer, and the data set index of each row written into it.
class Slab final : public BatchOwner {
 public:
  Slab(SlabPool& pool, std::byte* memory, HostAllocator& allocator,
       std::unique_ptr<ReleaseFence> fence = nullptr);

  std::byte* field(std::size_t f) const noexcept { return field_bases_[f]; }
  std::byte* const* fields() const noexcept { return field_bases_.data(); }  // for SampleOut
  std::span<std::size_t> rows() noexcept { return indices_; }
  HostAllocator& allocator() const noexcept { return allocator_; }
  // Waits until nothing reads the slab any more (its fence, if it has one).
  void wait_released() const noexcept {
    if (fence_) fence_->wait();
  }

  void give_back() noexcept override;
  const SlabLayout& layout() const noexcept override;
  std::byte* host() const noexcept override { return memory_; }
  std::span<const std::size_t> indices() const noexcept override { return indices_; }

 private:
  SlabPool& pool_;
  std::byte* const memory_;
  HostAllocator& allocator_;
  const std::unique_ptr<ReleaseFence> fence_;
  std::vector<std::byte*> field_bases_;  // field f's array, batch_size rows
  std::vector<std::size_t> indices_;     // batch_size entries
};

// A pool of slabs for one batch layout.
//
// Thread safety: every member may be called from any thread, except that a pool made before
// its layout was known gets it from set_fields() once, before any slab is acquired or
// reserved and before anything reads the layout, which the caller orders (the engine does
// under its lock; has_layout() may be read at any time).
class SlabPool {
 public:
  SlabPool(std::vector<FieldSpec> fields, std::size_t batch_size, SlabMemory memory = {});
  // A pool whose layout a data set learns from its samples: no slabs until set_fields().
  SlabPool(std::size_t batch_size, SlabMemory memory);
  void set_fields(std::vector<FieldSpec> fields);
  bool has_layout() const { return has_layout_.load(std::memory_order_acquire); }
  SlabPool(const SlabPool&) = delete;
  SlabPool& operator=(const SlabPool&) = delete;

  // A free slab, or a newly allocated one if none is free. Throws std::bad_alloc.
  Slab* acquire() { return slabs_.acquire(); }
  void release(Slab* slab) noexcept { slabs_.release(slab); }
  // Frees free slabs until at most `keep` slabs exist (slabs in use are never freed).
  void trim(std::size_t keep) { slabs_.trim(keep); }
  void reserve(std::size_t slabs) { slabs_.reserve(slabs); }  // allocate up front

  const SlabLayout& layout() const { return layout_; }
  std::span<const FieldSpec> fields() const { return layout_.fields; }
  std::span<const std::size_t> field_bytes() const { return layout_.field_bytes; }
  std::size_t slab_bytes() const { return layout_.slab_bytes; }
  std::size_t slabs() const { return slabs_.size(); }
  std::size_t locked_slabs() const;

 private:
  std::unique_ptr<Slab> make_slab();
  // Page-locked memory for a slab if the budget allows and locking works, else null.
  std::byte* try_lock_slab();
  void destroy(Slab& slab) noexcept;

  SlabLayout layout_;
  std::atomic<bool> has_layout_{false};
  const SlabMemory memory_;
  std::atomic<bool> lock_failed_{false};  // locking failed once: stop trying
  std::atomic<bool> budget_said_{false};  // the budget log line was written
  RecyclingPool<Slab> slabs_;             // last: destroyed first, while memory_ lives
};

}  // namespace stoker::detail
