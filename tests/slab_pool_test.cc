#include "memory/slab_pool.h"

#include <gtest/gtest.h>

#include <cstdint>

#include "memory/recycling_pool.h"

namespace stoker::detail {
namespace {

std::vector<FieldSpec> fields() {
  return {{"image", DType::u8, {3, 5, 7}}, {"label", DType::i64, {}}};
}

TEST(SlabPool, LaysOutOneAlignedArrayPerField) {
  SlabPool pool(fields(), 10);
  Slab* slab = pool.acquire();
  ASSERT_EQ(pool.layout().field_offsets.size(), 2u);
  EXPECT_EQ(reinterpret_cast<std::uintptr_t>(slab->host()) % 4096, 0u);
  EXPECT_EQ(reinterpret_cast<std::uintptr_t>(slab->field(1)) % 64, 0u);
  EXPECT_GE(slab->field(1) - slab->field(0), 105 * 10);
  EXPECT_LE(static_cast<std::size_t>(slab->field(1) - slab->host()) + 8 * 10, pool.slab_bytes());
  EXPECT_EQ(slab->indices().size(), 10u);
  pool.release(slab);
}

TEST(SlabPool, RecyclesBeforeAllocating) {
  SlabPool pool(fields(), 4);
  pool.reserve(3);
  EXPECT_EQ(pool.slabs(), 3u);
  Slab* a = pool.acquire();
  pool.release(a);
  EXPECT_EQ(pool.acquire(), a);  // the free list is LIFO: the warmest slab first
  Slab* b = pool.acquire();
  Slab* c = pool.acquire();
  Slab* d = pool.acquire();  // beyond the reserve: allocated on demand
  EXPECT_EQ(pool.slabs(), 4u);
  for (Slab* s : {a, b, c, d}) pool.release(s);
  pool.trim(2);
  EXPECT_EQ(pool.slabs(), 2u);
}

TEST(SlabPool, TrimNeverFreesSlabsInUse) {
  SlabPool pool(fields(), 4);
  Slab* a = pool.acquire();
  Slab* b = pool.acquire();
  pool.trim(0);
  EXPECT_EQ(pool.slabs(), 2u);
  a->host()[0] = std::byte{1};  // still mapped
  pool.release(a);
  pool.release(b);
  pool.trim(0);
  EXPECT_EQ(pool.slabs(), 0u);
}

}  // namespace
}  // namespace stoker::detail

namespace stoker::detail {
namespace {

TEST(RecyclingPool, RunsTheHookBeforeReuseAndGrowsOnlyWhenAsked) {
  int made = 0, reused = 0, destroyed = 0;
  {
    RecyclingPool<int> pool([&] { return std::make_unique<int>(made++); }, [&](int&) { ++reused; },
                            [&](int&) { ++destroyed; });
    pool.reserve(2);
    EXPECT_EQ(pool.size(), 2u);
    int* a = pool.acquire(/*grow=*/false);
    int* b = pool.acquire(/*grow=*/false);
    ASSERT_NE(a, nullptr);
    ASSERT_NE(b, nullptr);
    EXPECT_EQ(reused, 2);  // reserve() leaves its items free: taking them is a reuse
    EXPECT_EQ(pool.acquire(/*grow=*/false), nullptr);
    int* c = pool.acquire();  // grows
    EXPECT_EQ(made, 3);
    pool.release(b);
    EXPECT_EQ(pool.acquire(), b);  // LIFO
    for (int* item : {a, b, c}) pool.release(item);
    pool.trim(1);
    EXPECT_EQ(pool.size(), 1u);
    EXPECT_EQ(destroyed, 2);
  }
  EXPECT_EQ(destroyed, 3);
}

}  // namespace
}  // namespace stoker::detail
