#include "device/device_stage.h"

#include <atomic>
#include <exception>

namespace stoker::detail {
namespace {

class HostStage final : public DeviceStage {
 public:
  std::string name() const override { return "cpu"; }
  std::shared_ptr<HostAllocator> pinned_allocator() override { return nullptr; }
  std::optional<Batch> next(Engine& engine) override { return engine.next(); }
  Position position(const Engine& engine) const override { return engine.position(); }
  void reset(Position) override {}
  void add_stats(Stats& stats) const override { stats.device = "cpu"; }
};

}  // namespace

std::unique_ptr<DeviceStage> make_host_stage() { return std::make_unique<HostStage>(); }

// --- DeviceSlots ---------------------------------------------------------------------------

DeviceSlots::DeviceSlots(std::unique_ptr<DeviceBackend> backend, std::size_t slot_bytes)
    : backend_(std::move(backend)), name_(backend_->name()), slot_bytes_(slot_bytes) {}

DeviceSlots::~DeviceSlots() {
  MutexLock lock(mu_);
  for (auto& slot : all_) {
    // Nothing may still read the host slab or write the device buffer.
    backend_->synchronize(*slot->copied);
    backend_->synchronize(*slot->released);
    slot->host.release();
    backend_->deallocate(slot->memory, slot_bytes_);
  }
}

DeviceSlot* DeviceSlots::acquire(bool grow) {
  DeviceSlot* slot = nullptr;
  {
    MutexLock lock(mu_);
    if (free_ != nullptr) {
      slot = free_;
      free_ = slot->next;
      slot->next = nullptr;
    }
  }
  if (slot != nullptr) {
    if (slot->host) {
      // Released before its copy had completed (rare: the copy was long issued by now).
      backend_->synchronize(*slot->copied);
      slot->host.release();
    }
    return slot;
  }
  if (!grow) return nullptr;
  auto made = std::make_unique<DeviceSlot>();
  made->memory = backend_->allocate(slot_bytes_);
  made->copied = backend_->make_event();
  made->released = backend_->make_event();
  MutexLock lock(mu_);
  all_.push_back(std::move(made));
  return all_.back().get();
}

void DeviceSlots::release(DeviceSlot* slot) noexcept {
  try {
    backend_->stream_record(slot->stream, *slot->released);
    if (backend_->query(*slot->copied)) slot->host.release();
  } catch (...) {
    // A device error at release has nobody to go to; the next copy into this slot waits on
    // `released` and reports it there.
  }
  give_back(slot);
}

void DeviceSlots::give_back(DeviceSlot* slot) noexcept {
  MutexLock lock(mu_);
  slot->next = free_;
  free_ = slot;
}

// --- CopyStage -----------------------------------------------------------------------------

class CopyStage final : public DeviceStage {
 public:
  CopyStage(std::unique_ptr<DeviceBackend> backend, std::shared_ptr<SlabPool> pool,
            std::size_t depth, DeviceBackend::Stream stream, Position position)
      : pool_(std::move(pool)),
        slots_(std::make_shared<DeviceSlots>(std::move(backend), pool_->slab_bytes())),
        name_(slots_->name()),
        depth_(depth),
        stream_(stream),
        ring_(depth),
        position_(position) {
    // The window plus the batch the consumer holds; more are made if it holds more.
    std::vector<DeviceSlot*> made;
    for (std::size_t i = 0; i < depth_ + 1; ++i) made.push_back(slots_->acquire(true));
    for (DeviceSlot* slot : made) slots_->give_back(slot);
  }
  ~CopyStage() override { discard(); }

  Position position(const Engine&) const override { return position_; }
  void reset(Position position) override {
    discard();
    position_ = position;
  }

  std::string name() const override { return name_; }
  std::shared_ptr<HostAllocator> pinned_allocator() override {
    return slots_->backend().pinned_allocator();
  }

  std::optional<Batch> next(Engine& engine) override {
    top_up(engine);
    Entry entry = pop();
    position_ = entry.after;
    if (entry.error) std::rethrow_exception(entry.error);  // in its place in the order
    DeviceSlot* slot = entry.slot;
    if (slot == nullptr) return std::nullopt;  // end of the epoch
    slot->stream = stream_;
    slots_->backend().stream_wait(stream_, *slot->copied);
    Batch batch(pool_, slot->host.slab_);
    batch.device_ = slots_;
    batch.slot_ = slot;
    // Issue the next copies now, so they run while the consumer computes on this batch.
    top_up_without_waiting(engine);
    return batch;
  }

  void add_stats(Stats& stats) const override {
    stats.device = name_;
    stats.copies = copies_.load(std::memory_order_relaxed);
    stats.copy_bytes = copy_bytes_.load(std::memory_order_relaxed);
  }

 private:
  void discard() {
    while (count_ > 0) {
      if (DeviceSlot* slot = pop().slot) slots_->give_back(slot);
    }
  }

  // What the consumer gets next: a batch being copied, the end of an epoch (no slot), or the
  // error the engine raised for that batch.
  struct Entry {
    DeviceSlot* slot = nullptr;
    std::exception_ptr error;
    Position after;  // the consumer's position once it has this entry
  };
  // In order, in a ring of depth_ entries (no allocation per batch).
  void push(Entry entry) { ring_[(head_ + count_++) % ring_.size()] = std::move(entry); }
  Entry pop() {
    Entry entry = std::move(ring_[head_]);
    head_ = (head_ + 1) % ring_.size();
    --count_;
    return entry;
  }

  // Fills the window; waits for the engine only while nothing at all is queued.
  void top_up(Engine& engine) {
    if (count_ == 0) pull(engine, /*wait=*/true);  // a waiting take always yields something
    top_up_without_waiting(engine);
  }

  void top_up_without_waiting(Engine& engine) {
    while (count_ < depth_ && pull(engine, /*wait=*/false)) {
    }
  }

  // Takes one batch (or the end of an epoch) from the engine and starts its copy. Returns
  // false if nothing was taken.
  bool pull(Engine& engine, bool wait) {
    // Without waiting, only a free slot is used: the consumer holding many batches must not
    // make us allocate device memory for prefetching.
    DeviceSlot* slot = slots_->acquire(/*grow=*/wait);
    if (slot == nullptr) return false;
    Engine::Taken taken;
    try {
      taken = engine.take(wait);
    } catch (...) {
      slots_->give_back(slot);
      push({nullptr, std::current_exception(), engine.position()});
      return true;
    }
    if (!taken.batch) {
      slots_->give_back(slot);
      if (!taken.end_of_epoch) return false;
      push({nullptr, nullptr, engine.position()});
      return true;
    }
    try {
      copy(*taken.batch, *slot);
    } catch (...) {
      slots_->give_back(slot);
      push({nullptr, std::current_exception(), engine.position()});
      return true;
    }
    slot->host = std::move(*taken.batch);
    push({slot, nullptr, engine.position()});
    return true;
  }

  void copy(const Batch& host, DeviceSlot& slot) {
    DeviceBackend& backend = slots_->backend();
    backend.copy_wait(*slot.released);  // the consumer's kernels are done with the buffer
    const auto fields = pool_->fields();
    const auto field_bytes = pool_->field_bytes();
    for (std::size_t f = 0; f < fields.size(); ++f) {
      if (fields[f].host_only) continue;
      const std::byte* src = host.slab_->field_bases[f];
      const std::size_t bytes = field_bytes[f] * host.size();
      backend.copy(slot.memory + (src - host.slab_->memory), src, bytes);
      copy_bytes_.fetch_add(bytes, std::memory_order_relaxed);
    }
    backend.copy_record(*slot.copied);
    copies_.fetch_add(1, std::memory_order_relaxed);
  }

  const std::shared_ptr<SlabPool> pool_;
  const std::shared_ptr<DeviceSlots> slots_;
  const std::string name_;
  const std::size_t depth_;
  const DeviceBackend::Stream stream_;
  std::vector<Entry> ring_;
  Position position_;
  std::size_t head_ = 0;
  std::size_t count_ = 0;
  std::atomic<std::uint64_t> copies_{0};
  std::atomic<std::uint64_t> copy_bytes_{0};
};

std::unique_ptr<DeviceStage> make_copy_stage(std::unique_ptr<DeviceBackend> backend,
                                             std::shared_ptr<SlabPool> pool, std::size_t depth,
                                             DeviceBackend::Stream stream) {
  return std::make_unique<CopyStage>(std::move(backend), std::move(pool), depth, stream,
                                     Position{});
}

}  // namespace stoker::detail
