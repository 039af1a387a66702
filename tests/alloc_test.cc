// Proves the steady state allocates nothing per batch: every operator new in the process is
// counted while the switch is on.
#include <gtest/gtest.h>

#include "stoker/loader.h"
#include "stoker/sources.h"
#include "support/counting_new.h"
#include "support/steady_state.h"

namespace stoker {
namespace {

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
  const auto s = testing::steady_state_allocations(loader, 2, 3);
  EXPECT_EQ(s.batches, 3u * 32u);
  return s.allocations;
}

TEST(SteadyState, NoHeapAllocationPerBatch) {
  for (std::size_t workers : {0, 1, 3}) {
    EXPECT_EQ(count_steady_state_allocations(workers, true), 0u) << "workers " << workers;
  }
  EXPECT_EQ(count_steady_state_allocations(2, false), 0u);
}

}  // namespace
}  // namespace stoker
