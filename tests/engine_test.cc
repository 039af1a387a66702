// The engine's failure paths that the public API cannot provoke on demand.
#include "exec/engine.h"

#include <gtest/gtest.h>

#include <atomic>
#include <new>

#include "test_datasets.h"

namespace stoker::detail {
namespace {

// Allows `budget` allocations, then throws std::bad_alloc until given more.
class RationedAllocator final : public HostAllocator {
 public:
  explicit RationedAllocator(int allowed) : budget(allowed) {}
  MemoryKind kind() const override { return MemoryKind::pageable; }
  std::byte* allocate(std::size_t bytes) override {
    if (budget.fetch_sub(1) <= 0) throw std::bad_alloc();
    return static_cast<std::byte*>(::operator new(bytes));
  }
  void deallocate(std::byte* memory, std::size_t) noexcept override { ::operator delete(memory); }
  std::atomic<int> budget;
};

TEST(Engine, OutOfMemoryForASlabIsReportedAndRetried) {
  for (std::size_t workers : {0, 2}) {
    auto ds = std::make_shared<testing::IndexDataset<>>(100);
    auto allocator = std::make_shared<RationedAllocator>(3);  // the up-front depth + 1
    SlabMemory memory;
    memory.pageable = allocator;
    auto pool = std::make_shared<SlabPool>(ds->fields(), 10, memory);
    EngineConfig config;
    config.dataset = ds;
    config.order = {100, false, 0, Shard{}};
    config.batch_size = 10;
    config.workers = workers;
    config.depth = 2;
    Engine engine(config, pool);

    // Hold every batch: once the three slabs are out, the next one cannot be allocated.
    std::vector<Batch> held;
    for (int i = 0; i < 3; ++i) {
      auto b = engine.next();
      ASSERT_TRUE(b);
      held.push_back(std::move(*b));
    }
    EXPECT_THROW(engine.next(), std::bad_alloc) << "workers " << workers;
    // Memory comes back: the loader goes on where it stopped, nothing lost.
    held.clear();
    auto b = engine.next();
    ASSERT_TRUE(b);
    EXPECT_EQ(b->indices()[0], 30u);
  }
}

}  // namespace
}  // namespace stoker::detail
