#include "stoker/frontend/shared_memory.h"

#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <map>
#include <new>
#include <string>
#include <system_error>

#include "stoker/frontend/mutex.h"

namespace stoker::detail {
namespace {

class Registry {
 public:
  std::uint32_t add(int fd, std::byte* base, std::size_t size) STOKER_EXCLUDES(mu_) {
    MutexLock lock(mu_);
    const std::uint32_t id = next_id_++;
    regions_[reinterpret_cast<std::uintptr_t>(base)] = {id, fd, base, size};
    return id;
  }

  // Takes the region at `base` out of the registry; returns its fd, or -1.
  int remove(std::byte* base) STOKER_EXCLUDES(mu_) {
    MutexLock lock(mu_);
    auto it = regions_.find(reinterpret_cast<std::uintptr_t>(base));
    if (it == regions_.end()) return -1;
    const int fd = it->second.fd;
    regions_.erase(it);
    return fd;
  }

  std::optional<SharedRegion> find(const void* address, std::size_t* offset) STOKER_EXCLUDES(mu_) {
    const auto a = reinterpret_cast<std::uintptr_t>(address);
    MutexLock lock(mu_);
    auto it = regions_.upper_bound(a);
    if (it == regions_.begin()) return std::nullopt;
    --it;
    if (a >= it->first + it->second.size) return std::nullopt;
    if (offset != nullptr) *offset = a - it->first;
    return it->second;
  }

  bool alive(std::uint32_t id) STOKER_EXCLUDES(mu_) {
    MutexLock lock(mu_);
    for (const auto& [base, region] : regions_) {
      if (region.id == id) return true;
    }
    return false;
  }

  std::vector<int> fds() STOKER_EXCLUDES(mu_) {
    MutexLock lock(mu_);
    std::vector<int> out;
    for (const auto& [base, region] : regions_) out.push_back(region.fd);
    return out;
  }

 private:
  Mutex mu_;
  std::map<std::uintptr_t, SharedRegion> regions_ STOKER_GUARDED_BY(mu_);
  std::uint32_t next_id_ STOKER_GUARDED_BY(mu_) = 1;
};

Registry& registry() {
  static auto* r = new Registry();  // never destroyed: slabs may be freed during exit
  return *r;
}

class SharedAllocator final : public HostAllocator {
 public:
  MemoryKind kind() const override { return MemoryKind::pageable; }

  std::byte* allocate(std::size_t bytes) override {
    // Close-on-exec: a worker gets the fd it needs sent, never inherited through exec.
    const int fd = memfd_create("stoker-slab", MFD_CLOEXEC);
    if (fd < 0) {
      throw std::system_error(errno, std::generic_category(), "memfd_create for a batch slab");
    }
    if (ftruncate(fd, static_cast<off_t>(bytes)) != 0) {
      const int error = errno;
      close(fd);
      throw std::system_error(error, std::generic_category(),
                              "ftruncate of a " + std::to_string(bytes >> 20) + " MiB memfd");
    }
    void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED) {
      close(fd);
      throw std::bad_alloc();
    }
    auto* base = static_cast<std::byte*>(p);
    registry().add(fd, base, bytes);
    return base;
  }

  void deallocate(std::byte* memory, std::size_t bytes) noexcept override {
    const int fd = registry().remove(memory);
    munmap(memory, bytes);
    if (fd >= 0) close(fd);
  }
};

}  // namespace

std::optional<SharedRegion> find_shared_region(const void* address, std::size_t* offset) {
  return registry().find(address, offset);
}

bool shared_region_alive(std::uint32_t id) { return registry().alive(id); }

std::vector<int> shared_region_fds() { return registry().fds(); }

std::shared_ptr<HostAllocator> shared_allocator() {
  static const auto allocator = std::make_shared<SharedAllocator>();
  return allocator;
}

}  // namespace stoker::detail
