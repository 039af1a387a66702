// Host memory for slabs and in-memory arrays, and the process-wide budget for page-locked
// memory.
//
// Installed for front ends, unstable (include/stoker/frontend/README.md).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string_view>

namespace stoker::detail {

enum class MemoryKind : std::uint8_t {
  pageable,  // ordinary memory: the device copy goes through a driver staging buffer
  locked,    // mlock'ed: never swapped out, but unknown to the device driver
  pinned,    // page-locked and registered with the device: DMA straight from it
};

std::string_view memory_kind_name(MemoryKind kind);

// Where slab memory comes from.
//
// Thread safety: allocate() and deallocate() may be called from any thread.
class HostAllocator {
 public:
  virtual ~HostAllocator() = default;
  virtual MemoryKind kind() const = 0;
  // Page-aligned, not yet written. Throws std::bad_alloc or std::system_error (naming why).
  virtual std::byte* allocate(std::size_t bytes) = 0;
  virtual void deallocate(std::byte* memory, std::size_t bytes) noexcept = 0;
};

// Anonymous mmap; large blocks ask for transparent huge pages. Pages are faulted in by the
// first write (for slabs: the workers' first fill, in parallel and outside any lock).
std::shared_ptr<HostAllocator> pageable_allocator();
// mmap + mlock (fails under a low RLIMIT_MEMLOCK without CAP_IPC_LOCK).
std::shared_ptr<HostAllocator> locked_allocator();

// The page-locked (locked or pinned) slab bytes of the whole process. Locking too much starves
// the page cache and everything else on the machine, so every loader checks its budget
// against this total, not only its own slabs.
//
// Thread safety: all functions may be called from any thread.
class LockedBytes {
 public:
  // Adds `bytes` if the total stays within `limit`.
  static bool try_take(std::size_t bytes, std::size_t limit);
  static void give_back(std::size_t bytes);
  static std::size_t in_use();
};

// MemAvailable now (physical memory if unknown), in bytes.
std::size_t mem_available();
// The default budget: a quarter of mem_available().
std::size_t default_pin_budget();

}  // namespace stoker::detail
