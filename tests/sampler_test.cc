#include "sampler/sampler.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>
#include <set>

namespace stoker::detail {
namespace {

std::vector<std::size_t> order(std::size_t n, std::size_t rank, std::size_t world, bool drop_last,
                               bool shuffle = false, std::uint64_t seed = 0,
                               std::uint64_t epoch = 0) {
  SampleOrder spec{n, shuffle, seed, Shard{rank, world, drop_last}};
  std::vector<std::size_t> out;
  epoch_order(spec, epoch, out);
  return out;
}

using V = std::vector<std::size_t>;

// Expected values computed by hand from torch.utils.data.DistributedSampler's rules.
TEST(DistributedOrder, PadsByRepetition) {
  // n = 10, 3 ranks: num_samples = ceil(10 / 3) = 4, total 12, order 0..9 then 0, 1.
  EXPECT_EQ(order(10, 0, 3, false), (V{0, 3, 6, 9}));
  EXPECT_EQ(order(10, 1, 3, false), (V{1, 4, 7, 0}));
  EXPECT_EQ(order(10, 2, 3, false), (V{2, 5, 8, 1}));
}

TEST(DistributedOrder, DropLastCutsTheTail) {
  // num_samples = ceil((10 - 3) / 3) = 3, total 9.
  EXPECT_EQ(order(10, 0, 3, true), (V{0, 3, 6}));
  EXPECT_EQ(order(10, 1, 3, true), (V{1, 4, 7}));
  EXPECT_EQ(order(10, 2, 3, true), (V{2, 5, 8}));
}

TEST(DistributedOrder, PaddingLongerThanTheDataSetRepeatsItWhole) {
  // n = 2, 5 ranks: total 5, order [0, 1] + ([0, 1] * 2)[:3] = [0, 1, 0, 1, 0].
  const V expected{0, 1, 0, 1, 0};
  for (std::size_t r = 0; r < 5; ++r) EXPECT_EQ(order(2, r, 5, false), V{expected[r]});
  // With drop_last no rank gets anything: ceil((2 - 5) / 5) = 0.
  for (std::size_t r = 0; r < 5; ++r) EXPECT_TRUE(order(2, r, 5, true).empty());
}

TEST(DistributedOrder, EvenSplitNeedsNoPadding) {
  EXPECT_EQ(order(8, 0, 4, false), (V{0, 4}));
  EXPECT_EQ(order(8, 3, 4, false), (V{3, 7}));
  EXPECT_EQ(order(8, 3, 4, true), (V{3, 7}));
}

TEST(DistributedOrder, ShuffledRanksAreDisjointAndCoverTheDataSet) {
  const std::size_t n = 1001, world = 4;
  std::vector<std::size_t> all;
  for (std::size_t r = 0; r < world; ++r) {
    auto o = order(n, r, world, false, true, 7, 3);
    EXPECT_EQ(o.size(), 251u);
    all.insert(all.end(), o.begin(), o.end());
  }
  // 1004 positions: every sample once plus 3 padding repeats of the permutation's head.
  std::set<std::size_t> unique(all.begin(), all.end());
  EXPECT_EQ(unique.size(), n);
  EXPECT_EQ(all.size(), 1004u);
  // The padding repeats the first entries of the same permutation.
  std::vector<std::size_t> perm;
  permutation(n, 7 + 3, perm);
  EXPECT_EQ(order(n, 1, world, false, true, 7, 3).back(), perm[(1 + 250 * world) % n]);
}

TEST(DistributedOrder, ShuffleDependsOnSeedPlusEpoch) {
  EXPECT_EQ(order(100, 0, 2, false, true, 5, 1), order(100, 0, 2, false, true, 4, 2));
  EXPECT_NE(order(100, 0, 2, false, true, 5, 1), order(100, 0, 2, false, true, 5, 2));
}

TEST(Permutation, IsAPermutationAndDeterministic) {
  std::vector<std::size_t> a, b;
  permutation(5000, 42, a);
  permutation(5000, 42, b);
  EXPECT_EQ(a, b);
  std::vector<std::size_t> sorted = a;
  std::sort(sorted.begin(), sorted.end());
  for (std::size_t i = 0; i < sorted.size(); ++i) ASSERT_EQ(sorted[i], i);
  std::vector<std::size_t> identity(5000);
  std::iota(identity.begin(), identity.end(), 0);
  EXPECT_NE(a, identity);
}

TEST(Permutation, FirstPositionIsRoughlyUniform) {
  // 20000 permutations of 4: each value should land first about 5000 times.
  std::array<int, 4> counts{};
  std::vector<std::size_t> p;
  for (std::uint64_t s = 0; s < 20000; ++s) {
    permutation(4, s, p);
    ++counts[p[0]];
  }
  for (int c : counts) {
    EXPECT_GT(c, 4600);
    EXPECT_LT(c, 5400);
  }
}

TEST(BatchCount, DropLast) {
  EXPECT_EQ(batch_count(10, 3, false), 4u);
  EXPECT_EQ(batch_count(10, 3, true), 3u);
  EXPECT_EQ(batch_count(9, 3, false), 3u);
  EXPECT_EQ(batch_count(2, 3, true), 0u);
  EXPECT_EQ(batch_count(0, 3, false), 0u);
}

TEST(SingleRank, SequentialAndShuffled) {
  EXPECT_EQ(order(4, 0, 1, false), (V{0, 1, 2, 3}));
  auto s = order(50, 0, 1, false, true, 1, 0);
  std::vector<std::size_t> perm;
  permutation(50, 1, perm);
  EXPECT_EQ(s, perm);
}

}  // namespace
}  // namespace stoker::detail
