// Host memory for slabs and in-memory arrays.
#pragma once

#include <cstddef>
#include <memory>

namespace stoker::detail {

// Where slab memory comes from. The pageable allocator is the default; locked and pinned ones
// plug in here.
//
// Thread safety: allocate() and deallocate() may be called from any thread.
class HostAllocator {
 public:
  virtual ~HostAllocator() = default;
  virtual std::byte* allocate(std::size_t bytes) = 0;  // throws std::bad_alloc
  virtual void deallocate(std::byte* memory, std::size_t bytes) noexcept = 0;
};

// Page-aligned anonymous memory (mmap), not yet faulted in; large blocks ask for transparent
// huge pages.
std::shared_ptr<HostAllocator> pageable_allocator();

}  // namespace stoker::detail
