// Slab memory that worker processes can write into: every allocation is its own memfd,
// mapped MAP_SHARED here and, by a worker that was sent the fd (SCM_RIGHTS), in the worker.
//
// A memfd has no name in the file system, so nothing can leak: the memory goes when the last
// fd and the last mapping of it go, including when the process that made it is SIGKILLed
// (there is no /dev/shm entry to unlink, and no unlink to forget). One fd per allocation keeps
// freeing simple (close + munmap) and lets a worker map exactly the slabs it is sent.
//
// The registry maps any address inside a live allocation to its region (id, fd, offset), so
// the code that sends a worker a job can name "row r of field f of this slab" as (region id,
// byte offset) without the slab pool knowing about processes.
//
// Installed for front ends, unstable (include/stoker/frontend/README.md).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include "stoker/frontend/host_allocator.h"

namespace stoker::detail {

// A shared allocation, as the registry knows it. `fd` belongs to the allocator: valid until
// the allocation is freed (callers that keep using it must dup it).
struct SharedRegion {
  std::uint32_t id = 0;  // unique in this process, never reused
  int fd = -1;
  std::byte* base = nullptr;
  std::size_t size = 0;
};

// The region holding `address`, with `offset` set to the address's distance from the region's
// base; empty if the address is not inside a live shared allocation.
// Thread safety: any thread.
std::optional<SharedRegion> find_shared_region(const void* address, std::size_t* offset = nullptr);
// Whether region `id` is still allocated. Thread safety: any thread.
bool shared_region_alive(std::uint32_t id);
// The fds of every live region (for a forked child to close the ones it inherited but does
// not use). Thread safety: any thread.
std::vector<int> shared_region_fds();

// memfd_create + ftruncate + mmap(MAP_SHARED). kind() is pageable: the pages are ordinary
// shmem, swappable and not page-locked. (Page-locking shared slabs for CUDA would be a
// cudaHostRegister of the mapping; see docs/python.md.)
//
// Thread safety: allocate() and deallocate() may be called from any thread.
std::shared_ptr<HostAllocator> shared_allocator();

}  // namespace stoker::detail
