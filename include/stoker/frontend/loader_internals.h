// Loader options for stoker's own components, not for users: they name internal types.
//
// Installed for front ends, unstable (include/stoker/frontend/README.md).
#pragma once

#include <memory>

#include "stoker/frontend/executor.h"
#include "stoker/frontend/host_allocator.h"

namespace stoker::detail {

class DeviceBackend;

struct LoaderInternals {
  // Where every batch slab comes from, instead of the pageable/page-locked choice that
  // LoaderOptions::pin_memory makes (null: that choice). Slabs other processes must see
  // (shared memory for worker processes) are one more HostAllocator plugged in here.
  std::shared_ptr<HostAllocator> slab_allocator;
  // The device that, with PinMemory::on and batches on the host, the consumer copies batches
  // to itself: it pins the slabs and fences their reuse (null: the first CUDA device, if one
  // answers). Tests put the simulated device here.
  std::shared_ptr<DeviceBackend> host_device;
  // The kinds of worker other than the engine's threads that read chunks (worker processes,
  // remote workers: executor.h), which the front end may add to while the loader runs
  // (null: threads only).
  std::shared_ptr<Executors> executors;
};

}  // namespace stoker::detail
