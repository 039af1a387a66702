#include "stoker/frontend/shared_memory.h"

#include <dirent.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>

#include "memory/slab_pool.h"
#include "stoker/frontend/loader_internals.h"
#include "stoker/loader.h"
#include "test_datasets.h"

namespace stoker::detail {
namespace {

std::size_t open_fds() {
  std::size_t n = 0;
  DIR* dir = opendir("/proc/self/fd");
  if (dir == nullptr) return 0;
  while (readdir(dir) != nullptr) ++n;
  closedir(dir);
  return n;
}

TEST(SharedMemory, RegistryNamesTheRegionOfAnyAddressInside) {
  auto allocator = shared_allocator();
  std::byte* a = allocator->allocate(1 << 16);
  std::byte* b = allocator->allocate(4096);
  std::size_t offset = 0;
  auto ra = find_shared_region(a + 1000, &offset);
  ASSERT_TRUE(ra.has_value());
  EXPECT_EQ(ra->base, a);
  EXPECT_EQ(ra->size, std::size_t{1} << 16);
  EXPECT_EQ(offset, 1000u);
  auto rb = find_shared_region(b, &offset);
  ASSERT_TRUE(rb.has_value());
  EXPECT_NE(ra->id, rb->id);
  EXPECT_NE(ra->fd, rb->fd);
  EXPECT_EQ(offset, 0u);
  EXPECT_FALSE(find_shared_region(a + (1 << 16)).has_value() &&
               find_shared_region(a + (1 << 16))->id == ra->id);
  int local = 0;
  EXPECT_FALSE(find_shared_region(&local).has_value());
  allocator->deallocate(a, 1 << 16);
  allocator->deallocate(b, 4096);
  EXPECT_FALSE(find_shared_region(a).has_value());
  EXPECT_FALSE(shared_region_alive(ra->id));
}

TEST(SharedMemory, AnotherMappingOfTheFdSeesTheSameBytes) {
  auto allocator = shared_allocator();
  std::byte* a = allocator->allocate(8192);
  auto region = find_shared_region(a);
  ASSERT_TRUE(region.has_value());
  EXPECT_TRUE(shared_region_alive(region->id));
  void* other = mmap(nullptr, 8192, PROT_READ | PROT_WRITE, MAP_SHARED, region->fd, 0);
  ASSERT_NE(other, MAP_FAILED);
  std::memset(static_cast<char*>(other) + 5000, 0x5a, 16);
  EXPECT_EQ(a[5000], std::byte{0x5a});
  EXPECT_EQ(a[5015], std::byte{0x5a});
  munmap(other, 8192);
  allocator->deallocate(a, 8192);
}

TEST(SharedMemory, AForkedChildWritesWhatTheParentReads) {
  auto allocator = shared_allocator();
  std::byte* a = allocator->allocate(4096);
  const pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    std::memcpy(a + 64, "from the child", 14);
    _exit(0);
  }
  int status = 0;
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  EXPECT_EQ(std::memcmp(a + 64, "from the child", 14), 0);
  allocator->deallocate(a, 4096);
}

TEST(SharedMemory, FreeingClosesTheFdAndLeavesNothingNamed) {
  const std::size_t before = open_fds();
  auto allocator = shared_allocator();
  std::byte* a = allocator->allocate(4096);
  const int fd = find_shared_region(a)->fd;
  EXPECT_EQ(open_fds(), before + 1);
  EXPECT_EQ(fcntl(fd, F_GETFD) & FD_CLOEXEC, FD_CLOEXEC);
  char link[256] = {};
  const std::string path = "/proc/self/fd/" + std::to_string(fd);
  ASSERT_GT(readlink(path.c_str(), link, sizeof link - 1), 0);
  EXPECT_EQ(std::string(link).rfind("/memfd:", 0), 0u) << link;  // not a file anyone can open
  allocator->deallocate(a, 4096);
  EXPECT_EQ(open_fds(), before);
}

TEST(SharedMemory, SlabPoolSlabsComeFromSharedRegions) {
  SlabMemory memory;
  memory.pageable = shared_allocator();
  {
    SlabPool pool({{"x", DType::f32, {16}}, {"y", DType::i64, {}}}, 8, memory);
    Slab* slab = pool.acquire();
    std::size_t offset = 0;
    auto region = find_shared_region(slab->field(1), &offset);
    ASSERT_TRUE(region.has_value());
    EXPECT_EQ(region->base, slab->host());
    EXPECT_EQ(offset, static_cast<std::size_t>(slab->field(1) - slab->host()));
    EXPECT_EQ(pool.locked_slabs(), 0u);
    EXPECT_EQ(shared_region_fds().size(), 1u);
    pool.release(slab);
  }
  EXPECT_TRUE(shared_region_fds().empty());
}

TEST(SharedMemory, SlabsForADeviceAreRegisteredWithinTheBudget) {
  for (std::size_t budget : {std::size_t{1} << 30, std::size_t{1}}) {
    LoaderOptions o;
    o.dataset = std::make_shared<testing::IndexDataset<>>(64);
    o.batch_size = 8;
    o.workers = 2;
    o.device = "sim";
    o.pin_budget = budget;
    LoaderInternals internals;
    internals.slab_allocator = shared_allocator();
    Loader loader(o, internals);
    auto batch = loader.next();
    ASSERT_TRUE(batch);
    EXPECT_TRUE(find_shared_region(batch->bytes(0).data()).has_value());
    const Stats stats = loader.stats();
    // Registered with the (simulated) device while the budget lasts, shared either way.
    if (budget > 1) {
      EXPECT_EQ(stats.locked_slabs, stats.slabs);
    } else {
      EXPECT_EQ(stats.locked_slabs, 0u);
    }
  }
}

}  // namespace
}  // namespace stoker::detail
