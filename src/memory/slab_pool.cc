#include "memory/slab_pool.h"

#include <algorithm>
#include <string>

#include "util/log.h"

namespace stoker::detail {
namespace {

std::size_t round_up(std::size_t n, std::size_t to) { return (n + to - 1) / to * to; }

// Each field's array starts on a cache line, so rows written by different workers at a
// field boundary never share one, and vector loads in consumers are aligned.
constexpr std::size_t kFieldAlignment = 64;

std::string mib(std::size_t bytes) { return std::to_string(bytes >> 20) + " MiB"; }

}  // namespace

void Slab::reset(std::uint64_t new_epoch, std::size_t new_number, std::size_t new_size) {
  epoch = new_epoch;
  number = new_number;
  size = new_size;
  chunk_rows = 0;
  chunks = 0;
  next_chunk = 0;
  chunks_done = 0;
  cancelled.store(false, std::memory_order_relaxed);
  next = nullptr;
  failure.reset();
  skipped.clear();
}

SlabPool::SlabPool(std::vector<FieldSpec> fields, std::size_t batch_size, SlabMemory memory)
    : fields_(std::move(fields)), batch_size_(batch_size), memory_(std::move(memory)) {
  std::size_t offset = 0;
  for (const auto& f : fields_) {
    field_bytes_.push_back(f.bytes());
    field_offsets_.push_back(offset);
    offset = round_up(offset + f.bytes() * batch_size_, kFieldAlignment);
  }
  slab_bytes_ = std::max<std::size_t>(offset, kFieldAlignment);
}

SlabPool::~SlabPool() {
  MutexLock lock(mu_);
  for (auto& slab : all_) destroy(std::move(slab));
}

std::byte* SlabPool::try_lock_slab() {
  if (!memory_.locked || lock_failed_.load()) return nullptr;
  if (!LockedBytes::try_take(slab_bytes_, memory_.lock_limit)) {
    if (!budget_said_.exchange(true)) {
      log(LogLevel::warning, "page-locked memory budget of " + mib(memory_.lock_limit) +
                                 " reached (" + mib(LockedBytes::in_use()) +
                                 " locked in this process); further batch slabs are pageable");
    }
    return nullptr;
  }
  try {
    return memory_.locked->allocate(slab_bytes_);
  } catch (const std::exception& e) {
    LockedBytes::give_back(slab_bytes_);
    if (!lock_failed_.exchange(true)) {
      log(LogLevel::warning,
          "cannot allocate " + std::string(memory_kind_name(memory_.locked->kind())) +
              " memory for a batch slab (" + e.what() + "); batch slabs are pageable");
    }
    return nullptr;
  }
}

std::unique_ptr<Slab> SlabPool::make_slab() {
  auto slab = std::make_unique<Slab>();
  slab->memory = try_lock_slab();
  slab->allocator = slab->memory ? memory_.locked.get() : memory_.pageable.get();
  if (!slab->memory) slab->memory = memory_.pageable->allocate(slab_bytes_);
  slab->memory_bytes = slab_bytes_;
  for (std::size_t off : field_offsets_) slab->field_bases.push_back(slab->memory + off);
  slab->indices.resize(batch_size_);
  return slab;
}

void SlabPool::destroy(std::unique_ptr<Slab> slab) noexcept {
  if (!slab) return;
  slab->allocator->deallocate(slab->memory, slab->memory_bytes);
  if (slab->allocator->kind() != MemoryKind::pageable) LockedBytes::give_back(slab->memory_bytes);
}

Slab* SlabPool::acquire() {
  {
    MutexLock lock(mu_);
    if (free_ != nullptr) {
      Slab* slab = free_;
      free_ = slab->next;
      slab->next = nullptr;
      return slab;
    }
  }
  auto slab = make_slab();  // outside the lock: allocation and page faults take a while
  MutexLock lock(mu_);
  all_.push_back(std::move(slab));
  return all_.back().get();
}

void SlabPool::release(Slab* slab) noexcept {
  MutexLock lock(mu_);
  slab->next = free_;
  free_ = slab;
}

void SlabPool::reserve(std::size_t slabs) {
  std::vector<Slab*> taken;
  while (this->slabs() < slabs) taken.push_back(acquire());
  for (Slab* s : taken) release(s);
}

void SlabPool::trim(std::size_t keep) {
  MutexLock lock(mu_);
  while (all_.size() > keep && free_ != nullptr) {
    Slab* victim = free_;
    free_ = victim->next;
    auto it = std::find_if(all_.begin(), all_.end(), [&](auto& s) { return s.get() == victim; });
    destroy(std::move(*it));
    all_.erase(it);
  }
}

std::size_t SlabPool::slabs() const {
  MutexLock lock(mu_);
  return all_.size();
}

std::size_t SlabPool::locked_slabs() const {
  MutexLock lock(mu_);
  return static_cast<std::size_t>(std::count_if(all_.begin(), all_.end(), [](const auto& s) {
    return s->allocator->kind() != MemoryKind::pageable;
  }));
}

}  // namespace stoker::detail
