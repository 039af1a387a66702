// A device that batches are copied to (cuda, or the simulated one), seen by the copy stage.
// Backends are split by file: cuda_backend.cc over the CUDA runtime found at run time
// (cuda_runtime.h), sim_backend.cc; callers never test for CUDA.
#pragma once

#include <cstddef>
#include <functional>
#include <memory>
#include <string>

#include "memory/slab_pool.h"
#include "stoker/frontend/host_allocator.h"
#include "stoker/options.h"

namespace stoker::detail {

// An event on a device stream, made by its backend and reused across batches.
class DeviceEvent {
 public:
  virtual ~DeviceEvent() = default;
};

// The backend owns one side stream that carries every host-to-device copy. `Stream` is a
// consumer's stream, opaque to stoker (cudaStream_t for cuda, SimStream* for sim; null is the
// device's default stream).
//
// Thread safety: the stream and event operations may be called from any thread, but the
// copy stage issues them from one thread at a time (the consumer's), in order.
class DeviceBackend {
 public:
  using Stream = void*;
  virtual ~DeviceBackend() = default;

  virtual std::string name() const = 0;  // "cuda:0", "sim"
  // Host memory the device copies from without staging; null if there is none.
  virtual std::shared_ptr<HostAllocator> pinned_allocator() = 0;
  // The same for memory `base` makes (shared slabs, which worker processes map): each
  // allocation page-locked and registered with the device (cudaHostRegister). Null if the
  // backend cannot register memory it did not allocate.
  virtual std::shared_ptr<HostAllocator> registered_allocator(std::shared_ptr<HostAllocator> base) {
    (void)base;
    return nullptr;
  }

  virtual std::byte* allocate(std::size_t bytes) = 0;  // device memory; throws on failure
  virtual void deallocate(std::byte* memory, std::size_t bytes) noexcept = 0;
  virtual std::unique_ptr<DeviceEvent> make_event() = 0;

  // The side stream, in issue order: wait for an event, copy host to device, record an event.
  virtual void copy_wait(DeviceEvent& event) = 0;
  virtual void copy(std::byte* device, const std::byte* host, std::size_t bytes) = 0;
  virtual void copy_record(DeviceEvent& event) = 0;

  // A consumer's stream.
  virtual void stream_wait(Stream stream, DeviceEvent& event) = 0;
  virtual void stream_record(Stream stream, DeviceEvent& event) = 0;

  // On the host: has the event's work completed (true for an event never recorded), and wait
  // for it.
  virtual bool query(DeviceEvent& event) = 0;
  virtual void synchronize(DeviceEvent& event) = 0;
};

// Fences for page-locked slabs whose batches are handed out on the host (pin_memory on, batches
// on the CPU) and copied to `backend` by the consumer itself: each records an event on the
// consumer's `stream` when its batch is given back, and the slab is not refilled before it
// completes. (Batches the copy stage delivers need none: a device slot returns its slab only
// after its own copy completed.)
std::function<std::unique_ptr<ReleaseFence>()> release_fences(
    std::shared_ptr<DeviceBackend> backend, DeviceBackend::Stream stream);

struct CudaRuntime;
// The CUDA device `ordinal` of the process-wide runtime, or null with the reason in `why` (no
// runtime found, no driver, no such device).
std::unique_ptr<DeviceBackend> open_cuda(int ordinal, std::string& why);
// The same over a given runtime (load_cuda_runtime), which the backend keeps loaded.
std::unique_ptr<DeviceBackend> open_cuda(std::shared_ptr<const CudaRuntime> runtime, int ordinal,
                                         std::string& why);
// The simulated device (sim_backend.h).
std::unique_ptr<DeviceBackend> open_sim(const SimDevice& options);

}  // namespace stoker::detail
