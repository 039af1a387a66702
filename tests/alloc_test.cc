// Proves the steady state allocates nothing per batch: every operator new in the process is
// counted while the switch is on.
#include <gtest/gtest.h>

#include "counting_new.h"
#include "stoker/loader.h"
#include "stoker/sources.h"

namespace stoker {
namespace {

using alloc_count::allocations;
using alloc_count::counting;

std::size_t count_steady_state_allocations(std::size_t workers, bool shuffle) {
  SyntheticDataset::Options so;
  so.samples = 1000;
  so.fields = {{"x", DType::f32, {64}}, {"label", DType::i64, {}}};
  LoaderOptions o;
  o.dataset = ArrayDataset::materialize(SyntheticDataset(so));
  o.batch_size = 32;
  o.shuffle = shuffle;
  o.workers = workers;
  o.depth = 4;
  Loader loader(o);
  // Warm up over two epoch boundaries: both order buffers and every slab exist afterwards.
  for (int e = 0; e < 2; ++e) {
    while (loader.next()) {
    }
  }
  allocations = 0;
  counting = true;
  std::size_t batches = 0;
  for (int e = 0; e < 3; ++e) {
    while (auto batch = loader.next()) ++batches;
  }
  counting = false;
  EXPECT_EQ(batches, 3u * 32u);
  return allocations.load();
}

TEST(SteadyState, NoHeapAllocationPerBatch) {
  for (std::size_t workers : {0, 1, 3}) {
    EXPECT_EQ(count_steady_state_allocations(workers, true), 0u) << "workers " << workers;
  }
  EXPECT_EQ(count_steady_state_allocations(2, false), 0u);
}

}  // namespace
}  // namespace stoker
