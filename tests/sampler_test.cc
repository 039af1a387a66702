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

// --- Elastic resume ----------------------------------------------------------------------------

namespace stoker::elastic {

// The samples ranks read in an epoch of `n` samples checkpointed on `world` ranks after each
// took taken[r], then finished on `world2` ranks: every sample once (plus the padding's
// repeats of the new topology), and what the first ranks took is what they read.
struct Checkpoint {
  std::multiset<std::size_t> seen;
  PositionRanges consumed;
};

Checkpoint checkpoint(std::size_t n, std::size_t world, const std::vector<std::size_t>& taken,
                      bool shuffle, bool drop_last, const PositionRanges& before = {}) {
  Checkpoint run;
  for (std::size_t r = 0; r < world; ++r) {
    std::vector<std::size_t> rank_order;
    resumed_order(SampleOrder{n, shuffle, 7, Shard{r, world, drop_last}}, 3, before, rank_order);
    for (std::size_t k = 0; k < taken[r]; ++k) run.seen.insert(rank_order[k]);
  }
  run.consumed = consumed_positions(n, before, taken, drop_last);
  return run;
}

std::multiset<std::size_t> finish(std::size_t n, std::size_t world, bool shuffle,
                                  const PositionRanges& consumed) {
  std::multiset<std::size_t> seen;
  for (std::size_t r = 0; r < world; ++r) {
    std::vector<std::size_t> rank_order;
    resumed_order(SampleOrder{n, shuffle, 7, Shard{r, world, false}}, 3, consumed, rank_order);
    seen.insert(rank_order.begin(), rank_order.end());
  }
  return seen;
}

TEST(ElasticResume, AnEmptyCheckpointIsTheEpochsOwnOrder) {
  for (std::size_t world : {1, 3, 4}) {
    for (std::size_t r = 0; r < world; ++r) {
      const SampleOrder o{103, true, 5, Shard{r, world, false}};
      std::vector<std::size_t> resumed;
      resumed_order(o, 2, {}, resumed);
      EXPECT_EQ(resumed, epoch_order(o, 2));
    }
  }
}

TEST(ElasticResume, RanksStoppedTogetherConsumedOnePrefix) {
  // 4 ranks, 96 samples: 24 each; all took 16 -> the first 64 positions.
  const std::vector<std::size_t> taken(4, 16);
  EXPECT_EQ(consumed_positions(96, {}, taken, false), (PositionRanges{{0, 64}}));
}

TEST(ElasticResume, EverySampleOnceFromFourRanksToThreeAndTwo) {
  const std::size_t n = 1000;
  for (bool shuffle : {false, true}) {
    // Ranks stopped a batch apart (8-sample batches): 4 ranks x 250 samples.
    const Checkpoint first = checkpoint(n, 4, {64, 72, 64, 56}, shuffle, false);
    EXPECT_LE(first.consumed.size(), 40u);  // a prefix and the ragged tails, not 256 points
    for (std::size_t world2 : {3, 2, 1}) {
      std::multiset<std::size_t> all = first.seen;
      const auto rest = finish(n, world2, shuffle, first.consumed);
      all.insert(rest.begin(), rest.end());
      std::set<std::size_t> distinct(all.begin(), all.end());
      EXPECT_EQ(distinct.size(), n) << world2;
      // Each sample once, plus at most world2 - 1 repeats of the new padding.
      EXPECT_LE(all.size() - n, world2 - 1) << world2;
      for (std::size_t s : first.seen) EXPECT_EQ(all.count(s), 1u) << s;
    }
  }
}

TEST(ElasticResume, ResumedTwiceOnThreeTopologies) {
  // 4 ranks -> 3 ranks (checkpointed again mid-way) -> 2 ranks: still every sample once.
  const std::size_t n = 500;
  const Checkpoint first = checkpoint(n, 4, {40, 40, 40, 40}, true, false);
  const Checkpoint second = checkpoint(n, 3, {30, 20, 25}, true, false, first.consumed);
  std::multiset<std::size_t> all = first.seen;
  all.insert(second.seen.begin(), second.seen.end());
  const auto rest = finish(n, 2, true, second.consumed);
  all.insert(rest.begin(), rest.end());
  EXPECT_EQ(std::set<std::size_t>(all.begin(), all.end()).size(), n);
  EXPECT_LE(all.size() - n, 1u);
}

TEST(ElasticResume, PaddingRepeatsAreConsumedOnce) {
  // 10 samples on 4 ranks: 3 each, positions 10 and 11 repeat samples 0 and 1. Everyone
  // finished: nothing remains, whatever the new topology.
  const auto consumed = consumed_positions(10, {}, std::vector<std::size_t>(4, 3), false);
  EXPECT_EQ(consumed, (PositionRanges{{0, 10}}));
  EXPECT_TRUE(finish(10, 3, false, consumed).empty());
}

TEST(ElasticResume, WithTheSameGlobalBatchTheRemainingBatchesAreTheUninterruptedRunsOnes) {
  // 4 ranks x batch 8 (global 32) checkpointed after 3 batches; resumed on 2 ranks x batch 16.
  const std::size_t n = 320;
  const auto consumed = consumed_positions(n, {}, std::vector<std::size_t>(4, 24), false);
  std::vector<std::vector<std::size_t>> old(4), now(2);
  for (std::size_t r = 0; r < 4; ++r) old[r] = epoch_order({n, true, 7, Shard{r, 4, false}}, 3);
  for (std::size_t r = 0; r < 2; ++r) {
    resumed_order({n, true, 7, Shard{r, 2, false}}, 3, consumed, now[r]);
  }
  for (std::size_t step = 3; step < 10; ++step) {
    std::set<std::size_t> uninterrupted, resumed;
    for (std::size_t r = 0; r < 4; ++r) {
      uninterrupted.insert(old[r].begin() + step * 8, old[r].begin() + step * 8 + 8);
    }
    const std::size_t k = step - 3;
    for (std::size_t r = 0; r < 2; ++r) {
      resumed.insert(now[r].begin() + k * 16, now[r].begin() + k * 16 + 16);
    }
    EXPECT_EQ(resumed, uninterrupted) << step;
  }
}

TEST(ElasticResume, BadCheckpointsAreRefusedClearly) {
  // 10 samples on 2 ranks give each 5.
  EXPECT_THROW(consumed_positions(10, {}, std::vector<std::size_t>{6, 0}, false),
               std::invalid_argument);
  std::vector<std::size_t> out;
  EXPECT_THROW(resumed_order({10, false, 0, {}}, 0, {{3, 5}, {1, 2}}, out), std::invalid_argument);
  EXPECT_THROW(resumed_order({10, false, 0, {}}, 0, {{3, 11}}, out), std::invalid_argument);
  EXPECT_THROW(resumed_order({10, false, 0, {}}, 0, {{3, 5}, {5, 6}}, out), std::invalid_argument);
}

}  // namespace stoker::elastic
