#include "device/device_stage.h"

#include <atomic>
#include <exception>
#include <utility>
#include <vector>

namespace stoker::detail {
namespace {

class HostStage final : public DeviceStage {
 public:
  NextResult next(Engine& engine, Engine::Deadline deadline) override {
    Engine::Taken taken = engine.take(deadline);
    if (!taken.slab) {
      return {taken.end_of_epoch ? NextResult::Status::end_of_epoch : NextResult::Status::timed_out,
              std::nullopt};
    }
    return {NextResult::Status::batch,
            Batch(std::shared_ptr<BatchOwner>(engine.pool(), taken.slab.release()),
                  std::move(taken.info))};
  }
  Position position(const Engine& engine) const override { return engine.position(); }
  void reset(Position) override {}
  void add_stats(Stats& stats) const override { stats.device = "cpu"; }
};

}  // namespace

std::unique_ptr<DeviceStage> make_host_stage() { return std::make_unique<HostStage>(); }

// --- DeviceSlot ----------------------------------------------------------------------------

DeviceSlot::DeviceSlot(DeviceSlots& slots, std::byte* memory)
    : slots_(slots),
      memory_(memory),
      copied_(slots.backend().make_event()),
      released_(slots.backend().make_event()) {}

void DeviceSlot::return_slab(bool wait) noexcept {
  if (host_ == nullptr) return;
  try {
    if (wait) {
      slots_.backend().synchronize(*copied_);
    } else if (!slots_.backend().query(*copied_)) {
      return;  // still copying: returned when the slot is reused
    }
  } catch (...) {
    // A device error leaves nothing reading the slab any more; it is reported by the next
    // operation on the stream.
  }
  std::exchange(host_, nullptr)->give_back();
}

void DeviceSlot::hand_out(DeviceBackend::Stream stream) {
  stream_ = stream;
  slots_.backend().stream_wait(stream, *copied_);
}

void DeviceSlot::give_back() noexcept {
  try {
    slots_.backend().stream_record(stream_, *released_);
  } catch (...) {
    // A device error at release has nobody to go to; the next copy into this slot waits on
    // `released` and reports it there.
  }
  return_slab(/*wait=*/false);
  slots_.put_back(this);
}

std::string_view DeviceSlot::device() const noexcept { return slots_.name(); }

void DeviceSlot::wait(void* stream) {
  slots_.backend().stream_wait(stream, *copied_);
  stream_ = stream;
}

void DeviceSlot::synchronize() { slots_.backend().synchronize(*copied_); }

// --- DeviceSlots ---------------------------------------------------------------------------

DeviceSlots::DeviceSlots(std::unique_ptr<DeviceBackend> backend, std::shared_ptr<SlabPool> pool)
    : backend_(std::move(backend)),
      pool_(std::move(pool)),
      name_(backend_->name()),
      slots_(
          [this] {
            std::byte* memory = backend_->allocate(pool_->slab_bytes());
            try {
              return std::make_unique<DeviceSlot>(*this, memory);
            } catch (...) {
              backend_->deallocate(memory, pool_->slab_bytes());
              throw;
            }
          },
          [](DeviceSlot& slot) { slot.return_slab(/*wait=*/true); },
          [this](DeviceSlot& slot) {
            // Nothing may still read the host slab or write the device buffer.
            slot.return_slab(/*wait=*/true);
            try {
              backend_->synchronize(slot.released());
            } catch (...) {
            }
            backend_->deallocate(slot.memory(), pool_->slab_bytes());
          }) {}

// --- CopyStage -----------------------------------------------------------------------------

class CopyStage final : public DeviceStage {
 public:
  CopyStage(std::unique_ptr<DeviceBackend> backend, std::shared_ptr<SlabPool> pool,
            std::size_t depth, DeviceBackend::Stream stream, Tracer& tracer)
      : pool_(pool),
        slots_(std::make_shared<DeviceSlots>(std::move(backend), std::move(pool))),
        depth_(depth),
        stream_(stream),
        tracer_(tracer),
        ring_(depth) {
    // The window plus the batch the consumer holds; more are made if it holds more. A pool
    // whose layout is learned from the samples gets its slots with its first batch.
    if (pool_->has_layout()) slots_->reserve(depth_ + 1);
  }
  ~CopyStage() override { discard(); }

  Position position(const Engine&) const override { return position_; }
  void reset(Position position) override {
    discard();
    position_ = position;
  }

  NextResult next(Engine& engine, Engine::Deadline deadline) override {
    if (count_ == 0 && !pull(engine, deadline)) return {NextResult::Status::timed_out, {}};
    top_up_without_waiting(engine);
    Entry entry = pop();
    position_ = entry.after;
    if (entry.error) std::rethrow_exception(entry.error);  // in its place in the order
    DeviceSlot* slot = entry.slot;
    if (slot == nullptr) return {NextResult::Status::end_of_epoch, {}};
    slot->hand_out(stream_);
    Batch batch(std::shared_ptr<BatchOwner>(slots_, slot), std::move(entry.info));
    // Issue the next copies now, so they run while the consumer computes on this batch.
    top_up_without_waiting(engine);
    return {NextResult::Status::batch, std::move(batch)};
  }

  void add_stats(Stats& stats) const override {
    stats.device = slots_->name();
    stats.copies = copies_.load(std::memory_order_relaxed);
    stats.copy_bytes = copy_bytes_.load(std::memory_order_relaxed);
  }

 private:
  void discard() {
    while (count_ > 0) {
      if (DeviceSlot* slot = pop().slot) slots_->put_back(slot);
    }
  }

  // What the consumer gets next: a batch being copied, the end of an epoch (no slot), or the
  // error the engine raised for that batch.
  struct Entry {
    DeviceSlot* slot = nullptr;
    Batch::Info info;
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

  void top_up_without_waiting(Engine& engine) {
    while (count_ < depth_ && pull(engine, Engine::kNoWait)) {
    }
  }

  // Takes one batch (or the end of an epoch) from the engine and starts its copy. Returns
  // false if nothing was taken.
  bool pull(Engine& engine, Engine::Deadline deadline) {
    // Without waiting, only a free slot is used: the consumer holding many batches must not
    // make us allocate device memory for prefetching.
    const bool waits = !deadline || *deadline != Engine::kNoWait;
    // Until the engine has learned the layout (from its first batch), slots have no size: the
    // first batch is taken before its slot is made.
    const bool sized = pool_->has_layout();
    DeviceSlot* slot = sized ? slots_->acquire(/*grow=*/waits) : nullptr;
    if (sized && slot == nullptr) return false;
    auto put_back = [&] {
      if (slot != nullptr) slots_->put_back(slot);
    };
    Engine::Taken taken;
    try {
      taken = engine.take(deadline);
    } catch (...) {
      put_back();
      push({nullptr, {}, std::current_exception(), engine.position()});
      return true;
    }
    if (!taken.slab) {
      put_back();
      if (!taken.end_of_epoch) return false;
      push({nullptr, {}, nullptr, engine.position()});
      return true;
    }
    if (slot == nullptr) {
      try {
        slots_->reserve(depth_ + 1);
        slot = slots_->acquire(/*grow=*/true);
      } catch (...) {
        push({nullptr, {}, std::current_exception(), engine.position()});
        return true;
      }
    }
    try {
      const bool traced = tracer_.on();
      const std::int64_t start = traced ? Tracer::now_ns() : 0;
      const std::size_t bytes = copy(*taken.slab, taken.info.size, *slot);
      if (traced) {
        tracer_.record({.start_ns = start,
                        .end_ns = Tracer::now_ns(),
                        .a = bytes,
                        .b = taken.info.epoch,
                        .c = taken.info.number,
                        .name = TraceName::copy});
      }
    } catch (...) {
      slots_->put_back(slot);
      push({nullptr, {}, std::current_exception(), engine.position()});
      return true;
    }
    slot->hold(taken.slab.release());
    push({slot, std::move(taken.info), nullptr, engine.position()});
    return true;
  }

  // Issues the copy of a batch's device fields; returns their bytes.
  std::size_t copy(const Slab& host, std::size_t rows, DeviceSlot& slot) {
    DeviceBackend& backend = slots_->backend();
    std::size_t copied = 0;
    backend.copy_wait(slot.released());  // the consumer's kernels are done with the buffer
    const auto fields = pool_->fields();
    const auto field_bytes = pool_->field_bytes();
    for (std::size_t f = 0; f < fields.size(); ++f) {
      if (fields[f].host_only) continue;
      const std::byte* src = host.field(f);
      const std::size_t bytes = field_bytes[f] * rows;
      backend.copy(slot.memory() + (src - host.host()), src, bytes);
      copied += bytes;
    }
    backend.copy_record(slot.copied());
    copy_bytes_.fetch_add(copied, std::memory_order_relaxed);
    copies_.fetch_add(1, std::memory_order_relaxed);
    return copied;
  }

  const std::shared_ptr<SlabPool> pool_;
  const std::shared_ptr<DeviceSlots> slots_;
  const std::size_t depth_;
  const DeviceBackend::Stream stream_;
  Tracer& tracer_;
  std::vector<Entry> ring_;
  Position position_;
  std::size_t head_ = 0;
  std::size_t count_ = 0;
  std::atomic<std::uint64_t> copies_{0};
  std::atomic<std::uint64_t> copy_bytes_{0};
};

std::unique_ptr<DeviceStage> make_copy_stage(std::unique_ptr<DeviceBackend> backend,
                                             std::shared_ptr<SlabPool> pool, std::size_t depth,
                                             DeviceBackend::Stream stream, Tracer& tracer) {
  return std::make_unique<CopyStage>(std::move(backend), std::move(pool), depth, stream, tracer);
}

}  // namespace stoker::detail
