// The shuffle that knows where the bytes are (SampleOrder::blocks and window, sampler.h), its
// quality measure (shuffle_quality) and the rule that chooses it (tune/shuffle_choice.h).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <iterator>
#include <list>
#include <map>
#include <numeric>
#include <set>
#include <stdexcept>

#include "sampler/sampler.h"
#include "stoker/frontend/random.h"
#include "stoker/frontend/shuffle_choice.h"

namespace stoker::detail {
namespace {

// Blocks of `sizes[b]` samples, each sample `sample_bytes` long.
std::shared_ptr<StorageBlocks> blocks_of(const std::vector<std::size_t>& sizes,
                                         std::uint64_t sample_bytes = 1000) {
  auto b = std::make_shared<StorageBlocks>();
  std::size_t end = 0;
  for (const std::size_t s : sizes) {
    end += s;
    b->ends.push_back(end);
    b->bytes.push_back(s * sample_bytes);
  }
  return b;
}

// Blocks of 5 to 14 samples, as shards cut into blocks give them.
std::shared_ptr<StorageBlocks> uneven_blocks(std::size_t count, std::uint64_t seed = 3) {
  SplitMix64 rng(seed);
  std::vector<std::size_t> sizes(count);
  for (auto& s : sizes) s = 5 + static_cast<std::size_t>(rng.below(10));
  return blocks_of(sizes);
}

SampleOrder windowed(std::shared_ptr<const StorageBlocks> blocks, std::size_t window,
                     Shard shard = {}, std::uint64_t seed = 11) {
  SampleOrder o{blocks->ends.back(), true, seed, shard};
  o.blocks = std::move(blocks);
  o.window = window;
  return o;
}

// Bytes fetched reading `order` through an LRU cache of `cache_bytes` that fetches a sample's
// whole block on a miss (RemoteFiles over a data set's storage blocks, Parquet's row-group
// cache). With `lookahead`, the positions [p, p + lookahead) are being read at once (the
// batches the workers are reading): at each step the sample `lookahead` on is read as the one
// at p, the slowest read, is still using its block.
std::uint64_t fetched_through_lru(const std::vector<std::size_t>& order, const StorageBlocks& b,
                                  std::uint64_t cache_bytes, std::size_t lookahead = 0) {
  std::list<std::size_t> lru;  // most recent first
  std::map<std::size_t, std::list<std::size_t>::iterator> held;
  std::uint64_t held_bytes = 0, fetched = 0;
  const auto use = [&](std::size_t block) {
    if (auto it = held.find(block); it != held.end()) {
      lru.splice(lru.begin(), lru, it->second);
      return;
    }
    fetched += b.bytes[block];
    held_bytes += b.bytes[block];
    lru.push_front(block);
    held[block] = lru.begin();
    while (held_bytes > cache_bytes && lru.size() > 1) {
      held_bytes -= b.bytes[lru.back()];
      held.erase(lru.back());
      lru.pop_back();
    }
  };
  for (std::size_t p = 0; p < std::min(lookahead, order.size()); ++p) use(b.block_of(order[p]));
  for (std::size_t p = 0; p < order.size(); ++p) {
    if (p + lookahead < order.size()) use(b.block_of(order[p + lookahead]));
    use(b.block_of(order[p]));
  }
  return fetched;
}

TEST(WindowShuffle, IsAPermutationAPureFunctionOfSeedAndEpochAndDiffersByEpoch) {
  const auto blocks = uneven_blocks(300);
  const SampleOrder o = windowed(blocks, 20);
  const auto a = epoch_order(o, 4), again = epoch_order(o, 4), next = epoch_order(o, 5);
  EXPECT_EQ(a, again);
  EXPECT_NE(a, next);
  auto sorted = a;
  std::sort(sorted.begin(), sorted.end());
  std::vector<std::size_t> all(o.samples);
  std::iota(all.begin(), all.end(), std::size_t{0});
  EXPECT_EQ(sorted, all);
  // seed + epoch, as the global shuffle: seed 11 epoch 5 is seed 12 epoch 4.
  EXPECT_EQ(next, epoch_order(windowed(blocks, 20, {}, 12), 4));
}

TEST(WindowShuffle, ReadsEachBlockOnceThroughACacheThatHoldsTwiceTheWindow) {
  const auto blocks = uneven_blocks(2000);
  const std::uint64_t total = blocks->total_bytes();
  const std::uint64_t cache = total / 10;
  const auto choice = choose_shuffle(
      {ShuffleMode::automatic, blocks->ends.back(), blocks->ends.size(), total, cache});
  ASSERT_GT(choice.window, 0u) << choice.reason;
  for (std::uint64_t epoch = 0; epoch < 3; ++epoch) {
    const auto order = epoch_order(windowed(blocks, choice.window), epoch);
    EXPECT_EQ(fetched_through_lru(order, *blocks, cache), total) << epoch;
  }
  // The global permutation through the same cache fetches most blocks again and again.
  SampleOrder global{blocks->ends.back(), true, 11, {}};
  EXPECT_GT(fetched_through_lru(epoch_order(global, 0), *blocks, cache), 5 * total);
}

TEST(WindowShuffle, FourRanksAreDisjointEqualAndCoverTheDataSet) {
  const auto blocks = uneven_blocks(101);
  std::multiset<std::size_t> seen;
  std::size_t per_rank = 0;
  for (std::size_t r = 0; r < 4; ++r) {
    const auto o = epoch_order(windowed(blocks, 9, Shard{r, 4, false}), 2);
    if (r == 0) per_rank = o.size();
    EXPECT_EQ(o.size(), per_rank);
    seen.insert(o.begin(), o.end());
  }
  const std::size_t n = blocks->ends.back();
  EXPECT_EQ(per_rank, (n + 3) / 4);
  for (std::size_t i = 0; i < n; ++i) EXPECT_GE(seen.count(i), 1u) << i;
  EXPECT_EQ(seen.size(), per_rank * 4);  // the padding's repeats, as DistributedSampler pads
}

TEST(WindowShuffle, AResumedEpochOnAnotherTopologyReadsEachRemainingSampleOnce) {
  const auto blocks = uneven_blocks(120);
  const std::size_t n = blocks->ends.back();
  // 4 ranks took 10 batches of 8, then the epoch goes on over 3 ranks.
  const auto consumed = consumed_positions(n, {}, std::vector<std::size_t>(4, 80), false);
  std::multiset<std::size_t> seen;
  for (std::size_t r = 0; r < 4; ++r) {
    const auto o = epoch_order(windowed(blocks, 12, Shard{r, 4, false}), 1);
    seen.insert(o.begin(), o.begin() + 80);
  }
  for (std::size_t r = 0; r < 3; ++r) {
    std::vector<std::size_t> rest;
    resumed_order(windowed(blocks, 12, Shard{r, 3, true}), 1, consumed, rest);
    seen.insert(rest.begin(), rest.end());
  }
  for (std::size_t i = 0; i < n; ++i) EXPECT_LE(seen.count(i), 1u) << i;
  EXPECT_GE(seen.size(), n - 2);  // drop_last cuts at most world - 1 of the rest
}

// The blocks a node's ranks read in epoch `epoch` of `o` (o.shard.world_size ranks, node by node).
std::set<std::size_t> node_blocks(SampleOrder o, std::size_t node, std::uint64_t epoch) {
  std::set<std::size_t> blocks;
  for (std::size_t l = 0; l < o.nodes.ranks; ++l) {
    o.shard.rank = node * o.nodes.ranks + l;
    for (const std::size_t i : epoch_order(o, epoch)) blocks.insert(o.blocks->block_of(i));
  }
  return blocks;
}

TEST(WindowShuffle, OverTwoNodesEachNodesRanksReadTheirOwnBlocksAndTogetherEachSampleOnce) {
  const auto blocks = uneven_blocks(400);
  const std::size_t n = blocks->ends.back();
  SampleOrder o = windowed(blocks, 20, Shard{0, 4, true});
  o.nodes = node_layout(4, 2);
  ASSERT_EQ(o.nodes, (NodeLayout{2, 2}));
  std::multiset<std::size_t> seen;
  for (std::size_t r = 0; r < 4; ++r) {
    o.shard.rank = r;
    const auto mine = epoch_order(o, 3);
    EXPECT_EQ(mine.size(), n / 4);
    seen.insert(mine.begin(), mine.end());
  }
  EXPECT_EQ(seen.size(), n / 4 * 4);
  for (const std::size_t i : seen) EXPECT_EQ(seen.count(i), 1u) << i;
  // Each node reads about half the blocks; only the block where the two runs meet is read by
  // both (and a block of the 3 samples drop_last cuts may be read by neither).
  const auto first = node_blocks(o, 0, 3), second = node_blocks(o, 1, 3);
  std::vector<std::size_t> both;
  std::set_intersection(first.begin(), first.end(), second.begin(), second.end(),
                        std::back_inserter(both));
  EXPECT_LE(both.size(), 1u);
  EXPECT_GE(first.size() + second.size(), 399u);
  // Laid out for one node, ranks 0 and 1 of the 4 read from nearly every block.
  SampleOrder one = o;
  one.nodes = {};
  std::set<std::size_t> strided;
  for (std::size_t r = 0; r < 2; ++r) {
    one.shard.rank = r;
    for (const std::size_t i : epoch_order(one, 3)) strided.insert(blocks->block_of(i));
  }
  EXPECT_GT(strided.size(), 390u);
  // One node's layout is the order of before (the ranks a node has do not change it).
  std::vector<std::size_t> a, b;
  window_order(*blocks, 20, 7, a);
  window_order(*blocks, 20, 7, b, NodeLayout{1, 4});
  EXPECT_EQ(a, b);
}

TEST(WindowShuffle, ANodesRanksReadEachOfItsBlocksOnceThroughTheNodesCache) {
  const auto blocks = uneven_blocks(2000);
  const std::uint64_t total = blocks->total_bytes();
  const std::uint64_t cache = total / 20;  // a tenth of each node's half
  const auto choice = choose_shuffle(
      {ShuffleMode::automatic, blocks->ends.back(), blocks->ends.size(), total, cache});
  ASSERT_GT(choice.window, 0u) << choice.reason;
  SampleOrder o = windowed(blocks, choice.window, Shard{0, 8, false});
  o.nodes = node_layout(8, 4);
  // Node 1's reads in the order its four ranks read them together: its run of the order.
  std::vector<std::size_t> global;
  SampleOrder whole = o;
  whole.shard = {};
  epoch_order(whole, 0, global);
  std::vector<std::size_t> run;
  std::uint64_t bytes = 0;
  std::set<std::size_t> mine;
  for (std::size_t p = 0; p < global.size(); ++p) {
    if (p % 8 / 4 != 1) continue;
    run.push_back(global[p]);
    if (mine.insert(blocks->block_of(global[p])).second) {
      bytes += blocks->bytes[blocks->block_of(global[p])];
    }
  }
  EXPECT_LT(bytes, total / 2 + total / 500);  // half the data set, and a block where runs meet
  EXPECT_EQ(fetched_through_lru(run, *blocks, cache), bytes);
}

TEST(WindowShuffle, AnEpochBegunOverTwoNodesResumesOnThreeRanksReadingEachRemainingSampleOnce) {
  const auto blocks = uneven_blocks(120);
  const std::size_t n = blocks->ends.back();
  const auto consumed = consumed_positions(n, {}, std::vector<std::size_t>(4, 80), false);
  SampleOrder o = windowed(blocks, 12, Shard{0, 4, false});
  o.nodes = {2, 2};
  std::multiset<std::size_t> seen;
  for (std::size_t r = 0; r < 4; ++r) {
    o.shard.rank = r;
    const auto mine = epoch_order(o, 1);
    seen.insert(mine.begin(), mine.begin() + 80);
  }
  // The rest, on one node of 3 ranks, in the order the epoch began with (its layout saved).
  for (std::size_t r = 0; r < 3; ++r) {
    o.shard = {r, 3, true};
    std::vector<std::size_t> rest;
    resumed_order(o, 1, consumed, rest);
    seen.insert(rest.begin(), rest.end());
  }
  for (std::size_t i = 0; i < n; ++i) EXPECT_LE(seen.count(i), 1u) << i;
  EXPECT_GE(seen.size(), n - 2);
}

TEST(ShuffleChoice, TheNodeLayoutIsLocalWorldSizesNodesWhereTheyDivideTheRanks) {
  EXPECT_EQ(node_layout(8, 4), (NodeLayout{2, 4}));
  EXPECT_EQ(node_layout(16, 8), (NodeLayout{2, 8}));
  EXPECT_EQ(node_layout(4, 4), (NodeLayout{1, 1}));  // one node: the order of before
  EXPECT_EQ(node_layout(6, 4), (NodeLayout{1, 1}));  // uneven nodes: one layout for all
  EXPECT_EQ(node_layout(8, 0), (NodeLayout{1, 1}));  // LOCAL_WORLD_SIZE not set
  EXPECT_EQ(node_layout(8, 1), (NodeLayout{8, 1}));  // a rank a node
  EXPECT_EQ(node_layout(1, 1), (NodeLayout{1, 1}));
}

TEST(WindowShuffle, MixesNearlyAsWellAsAFullShuffleOnTheEntropyMeasure) {
  const auto blocks = uneven_blocks(5000);  // ~47,000 samples
  const std::size_t n = blocks->ends.back();
  SampleOrder global{n, true, 5, {}};
  const auto full = shuffle_quality(epoch_order(global, 0), blocks->ends, {}, 0);
  for (const std::size_t window : {64u, 256u}) {
    const auto q = shuffle_quality(epoch_order(windowed(blocks, window), 0), blocks->ends, {}, 0);
    EXPECT_GE(q.sample_entropy, 0.95 * full.sample_entropy) << window;
    EXPECT_GE(q.shard_entropy, 0.95 * full.shard_entropy) << window;
  }
  // In order, every step is 1: no entropy.
  const auto in_order =
      shuffle_quality(epoch_order(SampleOrder{n, false, 0, {}}, 0), blocks->ends, {}, 0);
  EXPECT_EQ(in_order.sample_entropy, 0.0);
}

TEST(WindowShuffle, BatchesOfALabelSortedDataSetHoldAsManyLabelsAsIidDraws) {
  const auto blocks = uneven_blocks(5000);
  const std::size_t n = blocks->ends.back();
  std::vector<std::int64_t> labels(n);  // sorted by label: 100 classes, each a run
  for (std::size_t i = 0; i < n; ++i) labels[i] = static_cast<std::int64_t>(i * 100 / n);
  // A window of kWindowBlocks, as the rule gives it, and the 143 blocks a cache of a few
  // megabytes gives: a block's samples lie about a window apart, so a batch of 32 comes from
  // about 32 blocks either way (uniform places within the span gave 25.1 labels at 143).
  for (const std::size_t window : {kWindowBlocks, std::size_t{143}}) {
    const auto q =
        shuffle_quality(epoch_order(windowed(blocks, window), 0), blocks->ends, labels, 32);
    EXPECT_NEAR(q.iid_labels_per_batch, 100.0 * (1.0 - std::pow(0.99, 32)), 0.05);
    EXPECT_GE(q.labels_per_batch, 0.97 * q.iid_labels_per_batch) << window;
  }
  // In order, a batch holds one or two labels.
  const auto in_order =
      shuffle_quality(epoch_order(SampleOrder{n, false, 0, {}}, 0), blocks->ends, labels, 32);
  EXPECT_LT(in_order.labels_per_batch, 2.0);
}

TEST(WindowShuffle, BadBlocksAndWindowsAreRefusedClearly) {
  std::vector<std::size_t> out;
  EXPECT_THROW(window_order(*blocks_of({3, 4}), 0, 1, out), std::invalid_argument);
  StorageBlocks empty_block;
  empty_block.ends = {3, 3, 5};
  EXPECT_THROW(window_order(empty_block, 2, 1, out), std::invalid_argument);
  SampleOrder short_blocks = windowed(blocks_of({3, 4}), 2);
  short_blocks.samples = 9;  // the blocks cover 7
  EXPECT_THROW(epoch_order(short_blocks, 0), std::invalid_argument);
}

// --- The choice -----------------------------------------------------------------------------

ShuffleEvidence evidence(std::uint64_t data, std::uint64_t cache, std::size_t blocks = 1000,
                         ShuffleMode asked = ShuffleMode::automatic) {
  return {asked, blocks * 10, blocks, data, cache};
}

TEST(ShuffleChoice, AWholeDataSetInTheCacheKeepsTheGlobalShuffle) {
  const auto c = choose_shuffle(evidence(8'000'000'000, 10'000'000'000));
  EXPECT_EQ(c.window, 0u);
  EXPECT_NE(c.reason.find("global"), std::string::npos) << c.reason;
  EXPECT_NE(c.reason.find("8 GB"), std::string::npos) << c.reason;
}

TEST(ShuffleChoice, ADataSetTenTimesTheCacheGetsAWindowOfHalfTheCache) {
  // 10,000 blocks of 1 MB; a cache of 1 GB: half of it is 500 blocks.
  const auto c = choose_shuffle(evidence(10'000'000'000, 1'000'000'000, 10'000));
  EXPECT_EQ(c.window, 500u);
  EXPECT_NE(c.reason.find("window of 500 blocks"), std::string::npos) << c.reason;
  EXPECT_NE(c.reason.find("cannot hold it"), std::string::npos) << c.reason;
  EXPECT_EQ(c.reason.find("would give"), std::string::npos) << c.reason;
}

TEST(ShuffleChoice, SamplesReadAheadShrinkTheWindowAndACacheTheyFillLeavesOne) {
  ShuffleEvidence e = evidence(10'000'000'000, 1'000'000'000, 10'000);  // 1 MB blocks
  e.lookahead_samples = 2'000;  // of 100 kB: 200 blocks' bytes
  EXPECT_EQ(choose_shuffle(e).window, 300u);
  e.lookahead_samples = 6'000;
  const auto c = choose_shuffle(e);
  EXPECT_EQ(c.window, 1u);
  EXPECT_NE(c.reason.find("would give a window of 512"), std::string::npos) << c.reason;
}

TEST(ShuffleChoice, SamplesReadAheadIntoAShareOfTheirOwnLeaveOneRanksWindowHalfTheCache) {
  // An object cache holds the fetches ahead to its other half until read (RemoteFiles):
  // however deep one loader reads ahead, the window keeps its half.
  ShuffleEvidence e = evidence(10'000'000'000, 1'000'000'000, 10'000);  // 1 MB blocks
  e.lookahead_samples = 6'000;
  e.ahead_apart = true;
  const auto c = choose_shuffle(e);
  EXPECT_EQ(c.window, 500u);
  EXPECT_EQ(c.reason.find("would give"), std::string::npos) << c.reason;
  // Ranks read at their own pace: theirs still count, for the spread between them.
  e.lookahead_samples = 500;
  e.sharded = true;
  EXPECT_EQ(choose_shuffle(e).window, 450u);
  e.node_ranks = 4;
  EXPECT_EQ(choose_shuffle(e).window, 300u);
}

TEST(ShuffleChoice, ACacheFilledOnlyByReadsKeepsRoomForTheBatchesBeingReadNotThoseOpenedAhead) {
  // A Parquet set of 100 kB images in row groups of 100 (10 MB), 2,000 of them, through the
  // default 256 MiB row-group cache, batches of 256 at the default depth: the row groups come
  // in only as the workers read from them, so the batches being read (two) hold blocks beside
  // the window, not the batches the loader has opened ahead.
  const auto blocks = blocks_of(std::vector<std::size_t>(2000, 100), 100'000);
  const std::uint64_t total = blocks->total_bytes(), cache = std::uint64_t{256} << 20;
  ShuffleEvidence e{ShuffleMode::automatic, blocks->ends.back(), blocks->ends.size(), total, cache};
  const std::size_t depth = LoaderOptions{}.depth;
  e.lookahead_samples = lookahead_samples(256, depth, false);
  EXPECT_EQ(e.lookahead_samples, 512u);
  const auto c = choose_shuffle(e);
  EXPECT_EQ(c.window, 8u) << c.reason;  // (134 MB - 51 MB) / 10 MB
  // Read so, each row group is decoded once an epoch through an LRU cache.
  const auto order = epoch_order(windowed(blocks, c.window), 0);
  EXPECT_EQ(fetched_through_lru(order, *blocks, cache, e.lookahead_samples), total);
  // Counted as if it fetched the opened batches ahead, the same set got a window of one.
  e.lookahead_samples = lookahead_samples(256, depth, true);
  EXPECT_EQ(choose_shuffle(e).window, 1u);
}

TEST(ShuffleChoice, TheNodesRanksReadingAheadThroughOneCacheShrinkTheWindowTogether) {
  ShuffleEvidence e = evidence(10'000'000'000, 1'000'000'000, 10'000);  // 1 MB blocks
  e.lookahead_samples = 500;  // of 100 kB: 50 blocks' bytes a rank
  EXPECT_EQ(choose_shuffle(e).window, 450u);
  e.node_ranks = 4;  // four ranks' samples read ahead: 200 blocks' bytes
  const auto c = choose_shuffle(e);
  EXPECT_EQ(c.window, 300u);
  EXPECT_NE(c.reason.find("shared by the node's 4 ranks"), std::string::npos) << c.reason;
}

TEST(ShuffleChoice, BlocksOfOneSampleKeepTheGlobalShuffle) {
  ShuffleEvidence e = evidence(10'000'000'000, 1'000'000'000, 10'000);
  e.samples = e.blocks;
  const auto c = choose_shuffle(e);
  EXPECT_EQ(c.window, 0u);
  EXPECT_NE(c.reason.find("each block is one sample"), std::string::npos) << c.reason;
}

TEST(ShuffleChoice, TheBlockLengthGivesAWindowOfFiveHundredBlocksWithinItsBounds) {
  EXPECT_EQ(storage_block_bytes(1ull << 30), (1ull << 30) / 2 / kWindowBlocks);  // 1 MiB
  EXPECT_EQ(storage_block_bytes(10ull << 30), kMaxBlockBytes);
  EXPECT_EQ(storage_block_bytes(10ull << 20), kMinBlockBytes);
  EXPECT_EQ(storage_block_bytes(0), kMinBlockBytes);
}

TEST(ShuffleChoice, ACacheOfAFewBlocksSaysWhatCacheWouldMixWell) {
  const auto c = choose_shuffle(evidence(10'000'000'000, 40'000'000));  // 2 blocks fit half
  EXPECT_EQ(c.window, 2u);
  EXPECT_NE(c.reason.find("object_cache_bytes=10.2 GB would give a window of 512"),
            std::string::npos)
      << c.reason;
  // Not even one block: a window of one, said.
  EXPECT_EQ(choose_shuffle(evidence(10'000'000'000, 1'000'000)).window, 1u);
}

TEST(ShuffleChoice, LocalDataAndNoCacheKeepTheGlobalShuffle) {
  EXPECT_EQ(choose_shuffle(evidence(0, 1'000'000, 0)).window, 0u);
  const auto no_cache = choose_shuffle(evidence(10'000'000'000, 0));
  EXPECT_EQ(no_cache.window, 0u);
  EXPECT_NE(no_cache.reason.find("object_cache_bytes=0"), std::string::npos) << no_cache.reason;
}

TEST(ShuffleChoice, TheChoiceNamesTheCacheItJudgesByAndItsOption) {
  ShuffleEvidence e = evidence(10'000'000'000, 40'000'000);
  e.cache = "row-group cache";
  e.cache_option = "cache_bytes";
  const auto c = choose_shuffle(e);
  EXPECT_NE(c.reason.find("the row-group cache of 40 MB cannot hold it"), std::string::npos)
      << c.reason;
  EXPECT_NE(c.reason.find("cache_bytes=10.2 GB would give"), std::string::npos) << c.reason;
  e.cache_bytes = 0;
  EXPECT_EQ(choose_shuffle(e).reason, "global: no row-group cache (cache_bytes=0)");
}

TEST(ShuffleChoice, WhatIsAskedForIsGivenOrRefusedWithTheReason) {
  EXPECT_EQ(
      choose_shuffle(evidence(10'000'000'000, 1'000'000'000, 1000, ShuffleMode::global)).window,
      0u);
  // A window asked of data that fits: as many blocks as half the cache holds, at most all.
  EXPECT_EQ(
      choose_shuffle(evidence(1'000'000'000, 10'000'000'000, 1000, ShuffleMode::window)).window,
      1000u);
  EXPECT_EQ(choose_shuffle(evidence(1'000'000'000, 100'000'000, 1000, ShuffleMode::window)).window,
            50u);
  EXPECT_THROW(choose_shuffle(evidence(0, 1'000'000, 0, ShuffleMode::window)),
               std::invalid_argument);
  EXPECT_THROW(choose_shuffle(evidence(1'000'000, 0, 10, ShuffleMode::window)),
               std::invalid_argument);
}

}  // namespace
}  // namespace stoker::detail
