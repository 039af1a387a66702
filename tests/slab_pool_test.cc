#include "memory/slab_pool.h"

#include <gtest/gtest.h>

#include <cstdint>

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
