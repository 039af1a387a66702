#include "memory/host_allocator.h"

#include <sys/mman.h>

#include <new>

namespace stoker::detail {
namespace {

constexpr std::size_t kHugePage = 2u << 20;

class PageableAllocator final : public HostAllocator {
 public:
  std::byte* allocate(std::size_t bytes) override {
    void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) throw std::bad_alloc();
    // Pages are faulted in by the first write (for slabs: the workers' first fill, in
    // parallel and outside any lock). Huge pages cut TLB misses on large blocks.
    if (bytes >= kHugePage) madvise(p, bytes, MADV_HUGEPAGE);
    return static_cast<std::byte*>(p);
  }
  void deallocate(std::byte* memory, std::size_t bytes) noexcept override { munmap(memory, bytes); }
};

}  // namespace

std::shared_ptr<HostAllocator> pageable_allocator() {
  static const auto allocator = std::make_shared<PageableAllocator>();
  return allocator;
}

}  // namespace stoker::detail
