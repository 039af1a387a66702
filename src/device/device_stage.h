// The device stage: how batches reach the consumer. The host stage hands out the engine's
// host slabs as they are; the copy stage (cuda or sim backend) copies each batch on the
// backend's side stream into a recycled device buffer, up to device_depth batches ahead of
// the consumer, and hands it out with the consumer's stream waiting on the copy's event.
//
// Slot life (one device buffer, two events):
//   free -> copying (side stream waits for `released`, copies the fields, records `copied`)
//        -> queued -> handed out (consumer stream waits on `copied`)
//        -> released (consumer stream records `released`) -> free.
// The host slab it was copied from stays with the slot until `copied` has completed, so a
// slab never returns to the pool while the copy engine may still read it.
#pragma once

#include <cstddef>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "device/backend.h"
#include "exec/engine.h"
#include "memory/slab_pool.h"
#include "util/mutex.h"

namespace stoker::detail {

class DeviceStage {
 public:
  virtual ~DeviceStage() = default;
  virtual std::string name() const = 0;
  // Host memory to make slabs from so that copies need no staging; null if nothing is copied.
  virtual std::shared_ptr<HostAllocator> pinned_allocator() = 0;
  // The consumer's next batch, or nullopt at the end of an epoch. Consumer thread only.
  virtual std::optional<Batch> next(Engine& engine) = 0;
  // The consumer's position: the engine's, less what this stage took ahead of the consumer.
  virtual Position position(const Engine& engine) const = 0;
  // Drops what was taken ahead (before the engine restarts at `position`).
  virtual void reset(Position position) = 0;
  virtual void add_stats(Stats& stats) const = 0;
};

// Batches stay in their host slabs ("cpu").
std::unique_ptr<DeviceStage> make_host_stage();
// Copies to `backend`, `depth` batches ahead; `stream` is the consumer's stream.
std::unique_ptr<DeviceStage> make_copy_stage(std::unique_ptr<DeviceBackend> backend,
                                             std::shared_ptr<SlabPool> pool, std::size_t depth,
                                             DeviceBackend::Stream stream);

struct DeviceSlot {
  std::byte* memory = nullptr;  // device buffer, laid out like a slab
  std::unique_ptr<DeviceEvent> copied;
  std::unique_ptr<DeviceEvent> released;
  Batch host;                      // the host batch copied from, until `copied` completes
  DeviceBackend::Stream stream{};  // the consumer stream it was last handed to
  DeviceSlot* next = nullptr;      // free list
};

// The device buffers of one copy stage, shared with the batches handed out (a batch may
// outlive its loader, and then keeps the backend alive).
//
// Thread safety: release() may be called from any thread; the rest from the consumer's.
class DeviceSlots {
 public:
  DeviceSlots(std::unique_ptr<DeviceBackend> backend, std::size_t slot_bytes);
  ~DeviceSlots();
  DeviceSlots(const DeviceSlots&) = delete;
  DeviceSlots& operator=(const DeviceSlots&) = delete;

  DeviceBackend& backend() { return *backend_; }
  const std::string& name() const { return name_; }
  // A free slot (made if none is free and `grow`), its previous host batch returned; or null.
  DeviceSlot* acquire(bool grow) STOKER_EXCLUDES(mu_);
  // The consumer is done with it: recorded on `slot->stream` and back on the free list.
  void release(DeviceSlot* slot) noexcept STOKER_EXCLUDES(mu_);
  // Back on the free list without a consumer having seen it.
  void give_back(DeviceSlot* slot) noexcept STOKER_EXCLUDES(mu_);

 private:
  std::unique_ptr<DeviceBackend> backend_;
  const std::string name_;
  const std::size_t slot_bytes_;
  Mutex mu_;
  std::vector<std::unique_ptr<DeviceSlot>> all_ STOKER_GUARDED_BY(mu_);
  DeviceSlot* free_ STOKER_GUARDED_BY(mu_) = nullptr;
};

}  // namespace stoker::detail
