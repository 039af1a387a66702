#include "stoker/frontend/host_allocator.h"

#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <fstream>
#include <new>
#include <string>
#include <system_error>

namespace stoker::detail {
namespace {

constexpr std::size_t kHugePage = 2u << 20;

std::byte* map_anonymous(std::size_t bytes) {
  void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) throw std::bad_alloc();
  if (bytes >= kHugePage) madvise(p, bytes, MADV_HUGEPAGE);
  return static_cast<std::byte*>(p);
}

class PageableAllocator final : public HostAllocator {
 public:
  MemoryKind kind() const override { return MemoryKind::pageable; }
  std::byte* allocate(std::size_t bytes) override { return map_anonymous(bytes); }
  void deallocate(std::byte* memory, std::size_t bytes) noexcept override { munmap(memory, bytes); }
};

class LockedAllocator final : public HostAllocator {
 public:
  MemoryKind kind() const override { return MemoryKind::locked; }
  std::byte* allocate(std::size_t bytes) override {
    std::byte* memory = map_anonymous(bytes);
    if (mlock(memory, bytes) != 0) {
      const int error = errno;
      munmap(memory, bytes);
      throw std::system_error(error, std::generic_category(),
                              "mlock of " + std::to_string(bytes >> 20) + " MiB");
    }
    return memory;
  }
  void deallocate(std::byte* memory, std::size_t bytes) noexcept override {
    munlock(memory, bytes);
    munmap(memory, bytes);
  }
};

std::atomic<std::size_t> locked_total{0};

}  // namespace

std::string_view memory_kind_name(MemoryKind kind) {
  switch (kind) {
    case MemoryKind::pageable:
      return "pageable";
    case MemoryKind::locked:
      return "locked";
    case MemoryKind::pinned:
      return "pinned";
  }
  return "unknown";
}

std::shared_ptr<HostAllocator> pageable_allocator() {
  static const auto allocator = std::make_shared<PageableAllocator>();
  return allocator;
}

std::shared_ptr<HostAllocator> locked_allocator() {
  static const auto allocator = std::make_shared<LockedAllocator>();
  return allocator;
}

bool LockedBytes::try_take(std::size_t bytes, std::size_t limit) {
  std::size_t current = locked_total.load(std::memory_order_relaxed);
  do {
    if (current + bytes > limit) return false;
  } while (!locked_total.compare_exchange_weak(current, current + bytes));
  return true;
}

void LockedBytes::give_back(std::size_t bytes) { locked_total.fetch_sub(bytes); }

std::size_t LockedBytes::in_use() { return locked_total.load(); }

std::size_t mem_available() {
  std::ifstream meminfo("/proc/meminfo");
  std::string key;
  std::size_t kib = 0;
  std::string unit;
  while (meminfo >> key >> kib >> unit) {
    if (key == "MemAvailable:") return kib * 1024;
  }
  const long pages = sysconf(_SC_PHYS_PAGES);
  const long page = sysconf(_SC_PAGE_SIZE);
  return pages > 0 && page > 0 ? static_cast<std::size_t>(pages) * page : 0;
}

std::size_t default_pin_budget() { return mem_available() / 4; }

}  // namespace stoker::detail
