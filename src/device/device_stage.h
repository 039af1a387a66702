// The device stage: how batches reach the consumer. The host stage hands out the engine's
// host slabs as they are; the copy stage (cuda or sim backend) copies each batch on the
// backend's side stream into a recycled device buffer, up to device_depth batches ahead of
// the consumer, and hands it out with the consumer's stream waiting on the copy's event.
//
// Slot life (one device buffer, two events):
//   free -> copying (side stream waits for `released`, copies the fields, records `copied`)
//        -> queued -> handed out (consumer stream waits on `copied`)
//        -> given back (consumer stream records `released`) -> free.
// The slot holds the host slab it was copied from until `copied` has completed and returns
// it to the slab pool itself (DeviceSlot::return_slab, the one place that rule lives), so a
// slab never returns to the pool while the copy engine may still read it.
#pragma once

#include <cstddef>
#include <memory>
#include <string>

#include "device/backend.h"
#include "exec/engine.h"
#include "memory/batch_owner.h"
#include "memory/recycling_pool.h"
#include "memory/slab_pool.h"
#include "stoker/batch.h"
#include "stoker/frontend/tracer.h"
#include "stoker/stats.h"

namespace stoker::detail {

class DeviceStage {
 public:
  virtual ~DeviceStage() = default;
  // The consumer's next batch, the end of an epoch, or nothing by the deadline. Consumer
  // thread only.
  virtual NextResult next(Engine& engine, Engine::Deadline deadline) = 0;
  // The consumer's position: the engine's, less what this stage took ahead of the consumer.
  virtual Position position(const Engine& engine) const = 0;
  // Drops what was taken ahead (before the engine restarts at `position`).
  virtual void reset(Position position) = 0;
  virtual void add_stats(Stats& stats) const = 0;
};

// Batches stay in their host slabs ("cpu").
std::unique_ptr<DeviceStage> make_host_stage();
// Copies to `backend`, `depth` batches ahead; `stream` is the consumer's stream. Issuing each
// copy is stamped into `tracer` (which outlives the stage) while it is on.
std::unique_ptr<DeviceStage> make_copy_stage(std::unique_ptr<DeviceBackend> backend,
                                             std::shared_ptr<SlabPool> pool, std::size_t depth,
                                             DeviceBackend::Stream stream, Tracer& tracer);

class DeviceSlots;

// One device buffer, laid out like a slab: the owner of a batch on a device.
class DeviceSlot final : public BatchOwner {
 public:
  DeviceSlot(DeviceSlots& slots, std::byte* memory);

  std::byte* memory() const noexcept { return memory_; }
  DeviceEvent& copied() noexcept { return *copied_; }
  DeviceEvent& released() noexcept { return *released_; }
  // The slab `copied` is reading from; the slot returns it.
  void hold(Slab* slab) noexcept { host_ = slab; }
  // Returns the held slab to its pool once `copied` has completed: now if it has, or after
  // waiting for it with `wait` (else it stays held). A CUDA event guarding a user's own
  // non_blocking copy out of the batch belongs here too.
  void return_slab(bool wait) noexcept;
  // Hands the batch to a consumer stream: it waits for the copy, and the slot's release is
  // recorded there.
  void hand_out(DeviceBackend::Stream stream);

  void give_back() noexcept override;
  const SlabLayout& layout() const noexcept override { return host_->layout(); }
  std::byte* host() const noexcept override { return host_->host(); }
  std::span<const std::size_t> indices() const noexcept override { return host_->indices(); }
  std::byte* device_memory() const noexcept override { return memory_; }
  std::string_view device() const noexcept override;
  void wait(void* stream) override;
  void synchronize() override;

 private:
  DeviceSlots& slots_;
  std::byte* const memory_;
  const std::unique_ptr<DeviceEvent> copied_;
  const std::unique_ptr<DeviceEvent> released_;
  Slab* host_ = nullptr;            // the slab copied from, until `copied` completes
  DeviceBackend::Stream stream_{};  // the consumer stream it was last handed to
};

// The device buffers of one copy stage, shared with the batches handed out (a batch may
// outlive its loader, and then keeps the backend and the slab pool alive).
//
// Thread safety: give_back() and put_back() may be called from any thread; the rest from the
// consumer's.
class DeviceSlots {
 public:
  DeviceSlots(std::unique_ptr<DeviceBackend> backend, std::shared_ptr<SlabPool> pool);
  DeviceSlots(const DeviceSlots&) = delete;
  DeviceSlots& operator=(const DeviceSlots&) = delete;

  DeviceBackend& backend() { return *backend_; }
  const std::string& name() const { return name_; }
  // A free slot (made if none is free and `grow`), its previous slab returned; or null.
  DeviceSlot* acquire(bool grow) { return slots_.acquire(grow); }
  // Back on the free list (the slot returns its slab when reused).
  void put_back(DeviceSlot* slot) noexcept { slots_.release(slot); }
  void reserve(std::size_t count) { slots_.reserve(count); }

 private:
  const std::unique_ptr<DeviceBackend> backend_;
  const std::shared_ptr<SlabPool> pool_;
  const std::string name_;
  RecyclingPool<DeviceSlot> slots_;  // last: destroyed first
};

}  // namespace stoker::detail
