#include "memory/slab_pool.h"

#include <algorithm>
#include <string>

#include "stoker/frontend/log.h"

namespace stoker::detail {
namespace {

std::size_t round_up(std::size_t n, std::size_t to) { return (n + to - 1) / to * to; }

// Each field's array starts on a cache line, so rows written by different workers at a
// field boundary never share one, and vector loads in consumers are aligned.
constexpr std::size_t kFieldAlignment = 64;

std::string mib(std::size_t bytes) { return std::to_string(bytes >> 20) + " MiB"; }

}  // namespace

Slab::Slab(SlabPool& pool, std::byte* memory, HostAllocator& allocator,
           std::unique_ptr<ReleaseFence> fence)
    : pool_(pool),
      memory_(memory),
      allocator_(allocator),
      fence_(std::move(fence)),
      indices_(pool.layout().batch_size) {
  for (std::size_t offset : pool.layout().field_offsets) field_bases_.push_back(memory + offset);
}

void Slab::give_back() noexcept {
  if (fence_) fence_->record();
  pool_.release(this);
}
const SlabLayout& Slab::layout() const noexcept { return pool_.layout(); }

SlabPool::SlabPool(std::vector<FieldSpec> fields, std::size_t batch_size, SlabMemory memory)
    : SlabPool(batch_size, std::move(memory)) {
  set_fields(std::move(fields));
}

SlabPool::SlabPool(std::size_t batch_size, SlabMemory memory)
    : memory_(std::move(memory)),
      slabs_([this] { return make_slab(); }, [](Slab& slab) { slab.wait_released(); },
             [this](Slab& slab) { destroy(slab); }) {
  layout_.batch_size = batch_size;
}

void SlabPool::set_fields(std::vector<FieldSpec> fields) {
  layout_.fields = std::move(fields);
  std::size_t offset = 0;
  for (const auto& f : layout_.fields) {
    layout_.field_bytes.push_back(f.bytes());
    layout_.field_offsets.push_back(offset);
    offset = round_up(offset + f.bytes() * layout_.batch_size, kFieldAlignment);
  }
  layout_.slab_bytes = std::max<std::size_t>(offset, kFieldAlignment);
  has_layout_.store(true, std::memory_order_release);
}

std::byte* SlabPool::try_lock_slab() {
  if (!memory_.locked || lock_failed_.load()) return nullptr;
  if (!LockedBytes::try_take(layout_.slab_bytes, memory_.lock_limit)) {
    if (!budget_said_.exchange(true)) {
      log(LogLevel::warning, "page-locked memory budget of " + mib(memory_.lock_limit) +
                                 " reached (" + mib(LockedBytes::in_use()) +
                                 " locked in this process); further batch slabs are pageable");
    }
    return nullptr;
  }
  try {
    return memory_.locked->allocate(layout_.slab_bytes);
  } catch (const std::exception& e) {
    LockedBytes::give_back(layout_.slab_bytes);
    if (!lock_failed_.exchange(true)) {
      log(LogLevel::warning,
          "cannot allocate " + std::string(memory_kind_name(memory_.locked->kind())) +
              " memory for a batch slab (" + e.what() + "); batch slabs are pageable");
    }
    return nullptr;
  }
}

std::unique_ptr<Slab> SlabPool::make_slab() {
  std::byte* memory = try_lock_slab();
  HostAllocator* allocator = memory ? memory_.locked.get() : memory_.pageable.get();
  if (!memory) memory = memory_.pageable->allocate(layout_.slab_bytes);
  try {
    const bool locked = allocator == memory_.locked.get();
    return std::make_unique<Slab>(*this, memory, *allocator,
                                  locked && memory_.make_fence ? memory_.make_fence() : nullptr);
  } catch (...) {
    allocator->deallocate(memory, layout_.slab_bytes);
    if (allocator->kind() != MemoryKind::pageable) LockedBytes::give_back(layout_.slab_bytes);
    throw;
  }
}

void SlabPool::destroy(Slab& slab) noexcept {
  slab.wait_released();
  slab.allocator().deallocate(slab.host(), layout_.slab_bytes);
  if (slab.allocator().kind() != MemoryKind::pageable) LockedBytes::give_back(layout_.slab_bytes);
}

std::size_t SlabPool::locked_slabs() const {
  return slabs_.count_if(
      [](const Slab& s) { return s.allocator().kind() != MemoryKind::pageable; });
}

}  // namespace stoker::detail
