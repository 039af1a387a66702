#include "stoker/loader.h"

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <filesystem>
#include <map>
#include <mutex>
#include <numeric>
#include <random>
#include <set>
#include <span>
#include <thread>

#include "device/backend.h"
#include "exec/engine.h"
#include "sampler/sampler.h"
#include "stoker/frontend/loader_internals.h"
#include "stoker/frontend/log.h"
#include "stoker/log.h"
#include "support/loader_checks.h"
#include "test_datasets.h"

namespace stoker {
namespace {

using testing::IndexDataset;

// The indices of every batch until the end of the epoch, checking each row's content.
std::vector<std::vector<std::size_t>> drain(Loader& loader) {
  std::vector<std::vector<std::size_t>> out;
  std::size_t first = 0;
  while (auto batch = loader.next()) {
    std::vector<std::size_t> rows;
    auto index = batch->as<const std::int64_t>(0);
    auto data = batch->bytes(1);
    const std::size_t payload = data.size() / batch->size();
    for (std::size_t r = 0; r < batch->size(); ++r) {
      EXPECT_EQ(static_cast<std::size_t>(index[r]), batch->indices()[r]);
      EXPECT_EQ(data[r * payload], static_cast<std::byte>(index[r] & 255));
      EXPECT_EQ(data[(r + 1) * payload - 1], static_cast<std::byte>(index[r] & 255));
      rows.push_back(static_cast<std::size_t>(index[r]));
    }
    if (out.empty()) first = batch->number();
    EXPECT_EQ(batch->number(), first + out.size());
    out.push_back(rows);
  }
  return out;
}

std::vector<std::size_t> flat(const std::vector<std::vector<std::size_t>>& batches) {
  std::vector<std::size_t> out;
  for (const auto& b : batches) out.insert(out.end(), b.begin(), b.end());
  return out;
}

using testing::loader_options;

TEST(Loader, SequentialEpochInOrderWithShortLastBatch) {
  for (std::size_t workers : {0, 1, 3}) {
    Loader loader(loader_options(std::make_shared<IndexDataset<>>(10), 4, workers));
    EXPECT_EQ(loader.batches_per_epoch(), 3u);
    auto batches = drain(loader);
    ASSERT_EQ(batches.size(), 3u) << "workers " << workers;
    EXPECT_EQ(batches[0], (std::vector<std::size_t>{0, 1, 2, 3}));
    EXPECT_EQ(batches[2], (std::vector<std::size_t>{8, 9}));
  }
}

TEST(Loader, DropLastDropsTheShortBatch) {
  auto o = loader_options(std::make_shared<IndexDataset<>>(10), 4, 2);
  o.drop_last = true;
  Loader loader(o);
  EXPECT_EQ(loader.batches_per_epoch(), 2u);
  EXPECT_EQ(flat(drain(loader)), (std::vector<std::size_t>{0, 1, 2, 3, 4, 5, 6, 7}));
}

TEST(Loader, ShuffledEpochIsAPermutationAndDoesNotDependOnWorkers) {
  std::vector<std::size_t> reference;
  for (std::size_t workers : {0, 1, 2, 5}) {
    for (std::size_t depth : {1, 3, 8}) {
      auto o = loader_options(std::make_shared<IndexDataset<>>(1000), 32, workers);
      o.shuffle = true;
      o.seed = 11;
      o.depth = depth;
      Loader loader(o);
      auto order = flat(drain(loader));
      if (reference.empty()) {
        reference = order;
        auto sorted = order;
        std::sort(sorted.begin(), sorted.end());
        std::vector<std::size_t> all(1000);
        std::iota(all.begin(), all.end(), 0);
        EXPECT_EQ(sorted, all);
      }
      EXPECT_EQ(order, reference) << "workers " << workers << " depth " << depth;
    }
  }
}

TEST(Loader, EpochsFollowOneAnotherWithNewOrders) {
  auto o = loader_options(std::make_shared<IndexDataset<>>(100), 10, 2);
  o.shuffle = true;
  Loader loader(o);
  auto e0 = flat(drain(loader));
  EXPECT_EQ(loader.position().epoch, 1u);
  auto e1 = flat(drain(loader));
  EXPECT_NE(e0, e1);
  std::vector<std::size_t> expected;
  detail::permutation(100, 0 + 1, expected);
  EXPECT_EQ(e1, expected);
}

// Each sample is the epoch its read was for (SampleOut::epoch()).
class EpochDataset final : public Dataset {
 public:
  std::size_t size() const override { return 12; }
  std::vector<FieldSpec> fields() const override { return {{"epoch", DType::i64, {}}}; }
  void read(std::size_t, const SampleOut& out) const override {
    out.as<std::int64_t>(0)[0] = static_cast<std::int64_t>(out.epoch());
  }
};

TEST(Loader, AReadKnowsItsEpochAndThoseReadAheadAreForTheNext) {
  // 2 batches an epoch and a depth of 8: reads of the next epochs go on while one is delivered.
  auto o = loader_options(std::make_shared<EpochDataset>(), 6, 2);
  o.depth = 8;
  Loader loader(o);
  for (std::uint64_t epoch = 0; epoch < 4; ++epoch) {
    std::size_t rows = 0;
    while (auto batch = loader.next()) {
      for (auto e : batch->as<const std::int64_t>(0))
        EXPECT_EQ(e, static_cast<std::int64_t>(epoch));
      rows += batch->size();
    }
    EXPECT_EQ(rows, 12u);
  }
  loader.set_epoch(9);  // a jump: epoch 9's reads are for it
  while (auto batch = loader.next()) {
    for (auto e : batch->as<const std::int64_t>(0)) EXPECT_EQ(e, 9);
  }
}

TEST(Loader, SetEpochRestartsAnywhereAndKeepsPrefetchWhenAlreadyThere) {
  auto ds = std::make_shared<IndexDataset<>>(60);
  auto o = loader_options(ds, 6, 2);
  o.shuffle = true;
  Loader loader(o);
  loader.set_epoch(5);
  auto e5 = flat(drain(loader));
  std::vector<std::size_t> expected;
  detail::permutation(60, 5, expected);
  EXPECT_EQ(e5, expected);
  // Mid-epoch jump: in-flight batches are discarded, the new epoch starts from its beginning.
  loader.set_epoch(9);
  ASSERT_TRUE(loader.next());
  loader.set_epoch(2);
  detail::permutation(60, 2, expected);
  EXPECT_EQ(flat(drain(loader)), expected);
  // Now at the start of epoch 3, prefetched: set_epoch(3) keeps it.
  loader.set_epoch(3);
  detail::permutation(60, 3, expected);
  EXPECT_EQ(flat(drain(loader)), expected);
}

TEST(Loader, RestoredPositionYieldsExactlyTheRemainingBatches) {
  for (std::size_t workers : {0, 2}) {
    auto make = [&] {
      auto o = loader_options(std::make_shared<IndexDataset<>>(203), 8, workers);
      o.shuffle = true;
      o.seed = 3;
      o.depth = 5;
      return o;
    };
    Loader original(make());
    original.set_epoch(4);
    auto full = drain(original);

    Loader first(make());
    first.set_epoch(4);
    for (int i = 0; i < 7; ++i) ASSERT_TRUE(first.next());
    const Position saved = first.position();
    EXPECT_EQ(saved.epoch, 4u);
    EXPECT_EQ(saved.batch, 7u);

    Loader resumed(make());
    resumed.restore(saved);
    auto rest = drain(resumed);
    ASSERT_EQ(rest.size(), full.size() - 7);
    for (std::size_t i = 0; i < rest.size(); ++i) EXPECT_EQ(rest[i], full[i + 7]);
  }
}

TEST(Loader, RestoreRejectsAPositionPastTheEpoch) {
  Loader loader(loader_options(std::make_shared<IndexDataset<>>(10), 4, 1));
  EXPECT_THROW(loader.restore({0, 4}), std::invalid_argument);
  loader.restore({0, 3});  // the end of the epoch: next() ends it
  EXPECT_FALSE(loader.next());
  EXPECT_EQ(loader.position().epoch, 1u);
}

TEST(Loader, DistributedRanksSplitTheEpoch) {
  const std::size_t n = 103, world = 4;
  std::vector<std::size_t> all;
  std::vector<std::size_t> batches;
  for (std::size_t r = 0; r < world; ++r) {
    auto o = loader_options(std::make_shared<IndexDataset<>>(n), 5, 2);
    o.shuffle = true;
    o.seed = 9;
    o.shard = {r, world, false};
    Loader loader(o);
    EXPECT_EQ(loader.samples_per_epoch(), 26u);
    auto b = drain(loader);
    batches.push_back(b.size());
    auto f = flat(b);
    all.insert(all.end(), f.begin(), f.end());
  }
  EXPECT_EQ(std::set<std::size_t>(all.begin(), all.end()).size(), n);
  EXPECT_EQ(all.size(), 104u);
  for (auto b : batches) EXPECT_EQ(b, batches[0]);  // equal step counts on every rank
}

TEST(Loader, ACheckpointOfFourRanksResumesOnThreeEverySampleOnce) {
  // 4 ranks x batch 8 with 3, 2 and 0 workers stop after 5, 5, 6 and 4 batches; 3 ranks with
  // batch 6 finish the epoch, one of them checkpointed once more and resumed by a new loader;
  // the next epoch is a fresh one on 3 ranks.
  const std::size_t n = 331;
  auto make = [&](std::size_t rank, std::size_t world, std::size_t batch, std::size_t workers) {
    auto o = loader_options(std::make_shared<IndexDataset<>>(n), batch, workers);
    o.shuffle = true;
    o.seed = 11;
    o.shard = {rank, world, false};
    return o;
  };
  std::multiset<std::size_t> seen;
  std::vector<std::size_t> taken;
  const std::size_t stops[] = {5, 5, 6, 4};
  for (std::size_t r = 0; r < 4; ++r) {
    Loader loader(make(r, 4, 8, r % 3 + 1));
    loader.set_epoch(2);
    for (std::size_t b = 0; b < stops[r]; ++b) {
      auto batch = loader.next();
      ASSERT_TRUE(batch);
      for (std::size_t i : batch->indices()) seen.insert(i);
    }
    taken.push_back(std::min(loader.position().batch * 8, loader.samples_per_epoch()));
  }
  const PositionRanges consumed = consumed_positions(n, {}, taken, false);
  for (std::size_t r = 0; r < 3; ++r) {
    const auto o = make(r, 3, 6, r);
    std::vector<std::size_t> order;
    resumed_order(SampleOrder{n, true, 11, o.shard}, 2, consumed, order);
    Loader loader(o);
    loader.resume(2, order, 0);
    EXPECT_EQ(loader.batches_in(2), (order.size() + 5) / 6);
    std::size_t got = 0;
    if (r == 1) {  // checkpointed after 3 batches, resumed by another loader
      for (; got < 3; ++got) {
        auto batch = loader.next();
        ASSERT_TRUE(batch);
        for (std::size_t i : batch->indices()) seen.insert(i);
      }
      EXPECT_EQ(loader.position().batch, 3u);
      Loader again(make(r, 3, 6, 2));
      again.resume(2, order, 3);
      for (std::size_t i : flat(drain(again))) seen.insert(i);
      EXPECT_EQ(again.position().epoch, 3u);
    } else {
      for (std::size_t i : flat(drain(loader))) seen.insert(i);
      EXPECT_EQ(loader.position().epoch, 3u);
      // The next epoch is the loader's own.
      EXPECT_EQ(flat(drain(loader)), epoch_order(SampleOrder{n, true, 11, o.shard}, 3));
    }
  }
  EXPECT_EQ(std::set<std::size_t>(seen.begin(), seen.end()).size(), n);
  EXPECT_LE(seen.size() - n, 4u);  // the padding's repeats: 1 on 4 ranks, at most 2 on 3
}

TEST(Loader, AResumedEpochWithNothingLeftEndsAtOnce) {
  Loader loader(loader_options(std::make_shared<IndexDataset<>>(10), 4, 1));
  loader.resume(0, {}, 0);
  EXPECT_EQ(loader.batches_in(0), 0u);
  EXPECT_FALSE(loader.next());
  EXPECT_EQ(flat(drain(loader)), (std::vector<std::size_t>{0, 1, 2, 3, 4, 5, 6, 7, 8, 9}));
  EXPECT_THROW(loader.resume(1, {3, 10}, 0), std::out_of_range);
  EXPECT_THROW(loader.resume(1, {3, 4}, 2), std::invalid_argument);
}

TEST(Loader, AnOrderGivenAheadIsReadFromThatEpochOn) {
  // A front end that draws each epoch's order itself gives the next one while the current is
  // read: that epoch reads it, the batches prefetched across the boundary included, and so
  // does the one after it, given before the next opened.
  const std::size_t n = 40;
  auto o = loader_options(std::make_shared<IndexDataset<>>(n), 4, 2);
  o.depth = 4;
  o.shuffle = true;
  o.seed = 5;
  const SampleOrder own{n, true, 5, o.shard};
  Loader loader(o);
  std::vector<std::size_t> reversed(n);
  for (std::size_t i = 0; i < n; ++i) reversed[i] = n - 1 - i;
  auto begun = loader.next();  // epoch 0 has begun: too late for it
  ASSERT_TRUE(begun);
  EXPECT_FALSE(loader.order_ahead(0, reversed));
  EXPECT_TRUE(loader.order_ahead(1, reversed));
  // The one after it, given before epoch 1 opened: epoch 1's is kept.
  std::vector<std::size_t> rotated(n);
  for (std::size_t i = 0; i < n; ++i) rotated[i] = (i + 7) % n;
  EXPECT_TRUE(loader.order_ahead(2, rotated));
  std::vector<std::size_t> epoch0(begun->indices().begin(), begun->indices().end());
  for (std::size_t i : flat(drain(loader))) epoch0.push_back(i);
  EXPECT_EQ(epoch0, epoch_order(own, 0));
  // Epoch 1 begun: what it reads stays.
  auto first = loader.next();
  ASSERT_TRUE(first);
  EXPECT_FALSE(loader.order_ahead(1, epoch_order(own, 1)));
  std::vector<std::size_t> epoch1(first->indices().begin(), first->indices().end());
  for (std::size_t i : flat(drain(loader))) epoch1.push_back(i);
  EXPECT_EQ(epoch1, reversed);
  EXPECT_EQ(flat(drain(loader)), rotated);
  EXPECT_EQ(flat(drain(loader)), epoch_order(own, 3));  // the loader's own again
  EXPECT_THROW(loader.order_ahead(5, {1, 2}), std::invalid_argument);
  reversed[3] = n;
  EXPECT_THROW(loader.order_ahead(5, reversed), std::out_of_range);
}

// Records the loader's will_read hints, and how many had been given when each sample was
// first read; with refuse_every = k, every k-th hint finds no room (returns false).
class HintedDataset : public IndexDataset<> {
 public:
  using IndexDataset::IndexDataset;
  bool will_read(std::span<const std::size_t> rows) const noexcept override {
    std::lock_guard lock(mu);
    hints.emplace_back(rows.begin(), rows.end());
    const bool room = refuse_every == 0 || hints.size() % refuse_every != 0;
    if (room) taken.emplace_back(rows.begin(), rows.end());
    return room;
  }
  void read(std::size_t index, const SampleOut& out) const override {
    {
      std::lock_guard lock(mu);
      hints_at_first_read.emplace(index, hints.size());
    }
    IndexDataset::read(index, out);
  }
  std::size_t refuse_every = 0;
  mutable std::mutex mu;
  mutable std::vector<std::vector<std::size_t>> hints, taken;
  mutable std::map<std::size_t, std::size_t> hints_at_first_read;
};

TEST(Loader, EachBatchIsHintedOnceFourPrefetchDepthsBeforeItOpens) {
  // A batch opens only when the workers run out of chunks: a data set that fetches over a
  // network learns of a batch kHintLead * `depth` batches earlier, each batch once per epoch,
  // in order.
  const std::size_t batches = 30, depth = 3;
  auto ds = std::make_shared<HintedDataset>(batches * 4);
  auto o = loader_options(ds, 4, 2);
  o.depth = depth;
  o.shuffle = true;
  o.seed = 3;
  Loader loader(o);
  auto delivered = drain(loader);
  for (const auto& b : drain(loader)) delivered.push_back(b);
  ASSERT_EQ(delivered.size(), 2 * batches);
  std::lock_guard lock(ds->mu);
  ASSERT_GE(ds->hints.size(), delivered.size());  // and the next epoch's first, maybe
  for (std::size_t k = 0; k < delivered.size(); ++k) EXPECT_EQ(ds->hints[k], delivered[k]) << k;
  // Epoch 0's batch b (but the first, whose samples may be read to learn the layout) was read
  // only after batches up to b + kHintLead * depth - 1 were hinted.
  for (std::size_t b = 1; b < batches; ++b) {
    for (std::size_t index : delivered[b]) {
      EXPECT_GE(ds->hints_at_first_read.at(index), std::min(b + detail::kHintLead * depth, batches))
          << b;
    }
  }
}

TEST(Loader, ABatchTheDataSetHadNoRoomForIsHintedAgainBeforeTheNext) {
  // A data set that may fetch only so much ahead refuses a hint; the loader gives that batch
  // again as it opens the next one, and hints no later batch before it, so every batch is
  // taken once, in order.
  const std::size_t batches = 12;
  auto ds = std::make_shared<HintedDataset>(batches * 4);
  ds->refuse_every = 3;
  auto o = loader_options(ds, 4, 2);
  o.depth = 3;
  o.shuffle = true;
  o.seed = 5;
  Loader loader(o);
  const auto delivered = drain(loader);
  ASSERT_EQ(delivered.size(), batches);
  std::lock_guard lock(ds->mu);
  ASSERT_GE(ds->taken.size(), batches);
  for (std::size_t k = 0; k < batches; ++k) EXPECT_EQ(ds->taken[k], delivered[k]) << k;
  EXPECT_GT(ds->hints.size(), ds->taken.size());  // the refused ones came again
}

TEST(Loader, ChangingWorkersAndDepthMidEpochLosesAndReordersNothing) {
  auto o = loader_options(std::make_shared<IndexDataset<>>(3000, 8, std::set<std::size_t>{},
                                                           std::chrono::microseconds(20)),
                          16, 2);
  o.shuffle = true;
  Loader reference_loader(o);
  auto reference = flat(drain(reference_loader));

  Loader loader(o);
  std::vector<std::size_t> seen;
  std::size_t step = 0;
  const std::size_t workers[] = {4, 0, 1, 3, 0, 2, 6};
  const std::size_t depths[] = {1, 7, 2, 4, 1, 3, 9};
  while (auto batch = loader.next()) {
    auto idx = batch->indices();
    seen.insert(seen.end(), idx.begin(), idx.end());
    if (++step % 10 == 0) {
      loader.set_workers(workers[(step / 10) % 7]);
      loader.set_depth(depths[(step / 10) % 7]);
    }
  }
  EXPECT_EQ(seen, reference);
}

TEST(Loader, TuningFromAnotherThreadWhileConsuming) {
  auto o = loader_options(std::make_shared<IndexDataset<>>(4000, 8, std::set<std::size_t>{},
                                                           std::chrono::microseconds(5)),
                          8, 2);
  Loader loader(o);
  std::atomic<bool> done{false};
  std::thread tuner([&] {
    std::size_t i = 0;
    while (!done.load()) {
      loader.set_workers(i % 4);
      loader.set_depth(1 + i % 5);
      (void)loader.stats();
      ++i;
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
  });
  auto order = flat(drain(loader));
  done = true;
  tuner.join();
  std::vector<std::size_t> expected(4000);
  std::iota(expected.begin(), expected.end(), 0);
  EXPECT_EQ(order, expected);
}

TEST(Loader, RaisePolicyNamesTheSampleKeepsTheTypeAndGoesOn) {
  for (std::size_t workers : {0, 2}) {
    auto o = loader_options(
        std::make_shared<IndexDataset<std::domain_error>>(20, 4, std::set<size_t>{6}), 4, workers);
    Loader loader(o);
    ASSERT_TRUE(loader.next());  // rows 0..3
    try {
      loader.next();  // rows 4..7 hold sample 6
      FAIL() << "expected SampleError";
    } catch (const SampleError& e) {
      EXPECT_EQ(e.index(), 6u);
      EXPECT_NE(std::string(e.what()).find("sample 6"), std::string::npos);
      EXPECT_NE(std::string(e.what()).find("cannot read sample 6"), std::string::npos);
      EXPECT_THROW(e.rethrow_cause(), std::domain_error);
    }
    auto rest = drain(loader);  // nothing else is lost
    ASSERT_EQ(rest.size(), 3u);
    EXPECT_EQ(rest[0].front(), 8u);
  }
}

TEST(Loader, SkipPolicyReplacesAndReportsFailedSamples) {
  auto o =
      loader_options(std::make_shared<IndexDataset<>>(50, 4, std::set<size_t>{3, 17, 18}), 10, 2);
  o.on_error = ErrorPolicy::skip;
  Loader loader(o);
  std::vector<std::size_t> skipped;
  std::size_t rows = 0;
  while (auto batch = loader.next()) {
    EXPECT_EQ(batch->size(), 10u);  // the batch keeps its shape
    for (const auto& s : batch->skipped()) {
      skipped.push_back(s.index);
      EXPECT_NE(s.reason.find("cannot read"), std::string::npos);
    }
    for (std::size_t r = 0; r < batch->size(); ++r) {
      const auto idx = batch->indices()[r];
      EXPECT_EQ(static_cast<std::size_t>(batch->as<const std::int64_t>(0)[r]), idx);
      EXPECT_TRUE(idx != 3 && idx != 17 && idx != 18);
    }
    rows += batch->size();
  }
  EXPECT_EQ(rows, 50u);
  std::sort(skipped.begin(), skipped.end());
  // A replacement may itself be a failing sample, so it may be skipped more than once.
  EXPECT_GE(skipped.size(), 3u);
  EXPECT_EQ(std::set<std::size_t>(skipped.begin(), skipped.end()),
            (std::set<std::size_t>{3, 17, 18}));
  EXPECT_EQ(loader.stats().skipped, skipped.size());
  // The report lists each bad sample once, however often it failed.
  const auto report = loader.skipped_samples();
  ASSERT_EQ(report.size(), 3u);
  EXPECT_EQ(report[0].index, 3u);
  EXPECT_EQ(report[1].index, 17u);
  EXPECT_EQ(report[2].index, 18u);
  for (const auto& s : report) EXPECT_NE(s.reason.find("cannot read"), std::string::npos);
  EXPECT_EQ(loader.stats().bad_samples, 3u);
}

TEST(Loader, SkipBudgetRunsOut) {
  auto o =
      loader_options(std::make_shared<IndexDataset<>>(4000, 4, std::set<size_t>{1, 35}), 10, 1);
  o.on_error = ErrorPolicy::skip;
  o.max_skipped = 1;
  Loader loader(o);
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(loader.next());  // sample 1 skipped: budget used
  testing::expect_failed_sample(loader, 35, "skip budget of 1");
}

TEST(Loader, DestroyMidEpochWithBatchesInFlight) {
  // Slow samples, many workers, deep window: destruction must not wait for the epoch.
  auto ds = std::make_shared<IndexDataset<>>(100000, 64, std::set<std::size_t>{},
                                             std::chrono::microseconds(2000));
  for (int round = 0; round < 3; ++round) {
    auto o = loader_options(ds, 64, 4);
    o.depth = 8;
    auto loader = std::make_unique<Loader>(o);
    ASSERT_TRUE(loader->next());
    loader.reset();
  }
  // Every worker stopped at the next row: far fewer reads than the batches in flight hold.
  EXPECT_LT(ds->reads.load(), 3u * 64u * 8u);
}

// Fails one read in `one_in`, at random (each thread its own stream).
class FlakyDataset : public IndexDataset<> {
 public:
  FlakyDataset(std::size_t n, unsigned one_in) : IndexDataset(n, 64), one_in_(one_in) {}
  void read(std::size_t index, const SampleOut& out) const override {
    thread_local std::minstd_rand rng(std::hash<std::thread::id>{}(std::this_thread::get_id()));
    if (rng() % one_in_ == 0) throw std::runtime_error("flaky read of " + std::to_string(index));
    IndexDataset::read(index, out);
  }

 private:
  unsigned one_in_;
};

std::size_t thread_count() {
  return static_cast<std::size_t>(
      std::distance(std::filesystem::directory_iterator("/proc/self/task"),
                    std::filesystem::directory_iterator{}));
}

TEST(Loader, TwoHundredEpochsWithEarlyBreaksDestroyedLoadersAndFailingReads) {
  // tests/python/test_stress.py does the same through Python, with threads and processes.
  constexpr std::size_t kSamples = 384, kBatch = 16, kBatches = kSamples / kBatch;
  auto ds = std::make_shared<FlakyDataset>(kSamples, 500);
  // Sanitizer runtimes start a thread of their own with the first threads a test makes.
  Loader(loader_options(std::make_shared<IndexDataset<>>(64), kBatch, 2)).next();
  const std::size_t threads_before = thread_count();
  std::mt19937 rng(7);
  std::unique_ptr<Loader> loader;
  std::size_t failed = 0, finished = 0;
  for (std::uint64_t epoch = 0; epoch < 200; ++epoch) {
    if (epoch % 25 == 0) {  // the old loader goes mid-epoch, with batches in flight
      loader.reset();
      loader = std::make_unique<Loader>(loader_options(ds, kBatch, 1 + epoch / 25 % 3));
    }
    loader->set_epoch(epoch);
    const std::size_t stop = rng() % 2 ? kBatches : rng() % (kBatches + 1);
    for (std::size_t k = 0; k < stop; ++k) {
      try {
        auto b = loader->next();
        ASSERT_TRUE(b) << "epoch " << epoch << " batch " << k;
        ASSERT_EQ(b->size(), kBatch);
        for (std::size_t r = 0; r < kBatch; ++r) ASSERT_EQ(b->indices()[r], k * kBatch + r);
        for (std::size_t r = 0; r < kBatch; ++r) {
          ASSERT_EQ(b->as<const std::int64_t>(0)[r], static_cast<std::int64_t>(k * kBatch + r));
        }
      } catch (const SampleError& e) {  // costs its own batch; the epoch goes on
        ASSERT_GE(e.index(), k * kBatch);
        ASSERT_LT(e.index(), (k + 1) * kBatch);
        ++failed;
      }
    }
    if (stop == kBatches) {
      EXPECT_FALSE(loader->next());
      ++finished;
    }
  }
  loader.reset();
  EXPECT_GT(failed, 0u);
  EXPECT_GT(finished, 50u);
  EXPECT_EQ(thread_count(), threads_before);
}

TEST(Loader, ADepthAboveTheMemoryBudgetIsLoweredAndTheBudgetHolds) {
  std::vector<std::string> lines;
  std::mutex lines_mu;
  set_log_handler([&](LogLevel, std::string_view line) {
    std::lock_guard lock(lines_mu);
    lines.emplace_back(line);
  });
  auto ds = std::make_shared<IndexDataset<>>(2000, 4096);
  auto o = loader_options(ds, 16, 2);
  o.depth = 8;
  const std::size_t slab = Loader(o).stats().slab_bytes / (o.depth + 1);
  o.memory_budget = 4 * slab + slab / 2;  // 4 slabs: depth 3
  Loader loader(o);
  EXPECT_EQ(loader.stats().depth, 3u);
  loader.set_depth(10);  // asked again: still within the budget
  std::size_t rows = 0, most = 0;
  while (auto b = loader.next()) {
    rows += b->size();
    most = std::max(most, loader.stats().slab_bytes);
  }
  EXPECT_EQ(rows, 2000u);
  EXPECT_EQ(loader.stats().depth, 3u);
  EXPECT_LE(most, o.memory_budget);
  set_log_handler({});
  ASSERT_EQ(std::count_if(lines.begin(), lines.end(),
                          [](const std::string& l) {
                            return l.find("batches in flight lowered from 8 to 3") !=
                                   std::string::npos;
                          }),
            1);
  EXPECT_EQ(lines.size(), 1u);  // said once, not again for set_depth(10)
}

TEST(Log, AChildForkedWhileAnotherThreadLogsCanLogAtOnce) {
  // The handler runs under the log's lock: a thread logging slowly holds it most of the time.
  // Each child logs its own line and exits; one forked with the lock held by a thread that
  // does not exist in it would wait for good (a worker process hung so, forked by an engine
  // thread while another logged a worker's death).
  std::atomic<bool> in_parent{true};
  set_log_handler([&](LogLevel, std::string_view) {
    if (in_parent.load()) std::this_thread::sleep_for(std::chrono::microseconds(200));
  });
  std::atomic<bool> stop{false};
  std::thread logger([&] {
    while (!stop.load()) detail::log(LogLevel::warning, "a line from a parent thread");
  });
  std::vector<pid_t> children;
  for (int i = 0; i < 40; ++i) {
    std::this_thread::sleep_for(std::chrono::microseconds(150));
    const pid_t pid = fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
      in_parent.store(false);
      detail::log(LogLevel::warning, "a line from the child");
      _exit(0);
    }
    children.push_back(pid);
  }
  stop.store(true);
  logger.join();
  set_log_handler({});
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  std::size_t exited = 0;
  while (exited < children.size() && std::chrono::steady_clock::now() < deadline) {
    for (pid_t& pid : children) {
      int status = 0;
      if (pid > 0 && waitpid(pid, &status, WNOHANG) == pid) {
        EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
        pid = 0;
        ++exited;
      }
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  for (pid_t pid : children) {
    if (pid > 0) {
      kill(pid, SIGKILL);
      waitpid(pid, nullptr, 0);
    }
  }
  EXPECT_EQ(exited, children.size()) << "children stuck on the log's lock";
}

TEST(Loader, DestroyBeforeTheFirstBatchAndWhileStartingUp) {
  auto ds = std::make_shared<IndexDataset<>>(1000, 8, std::set<std::size_t>{},
                                             std::chrono::microseconds(100));
  for (std::size_t w : {0, 1, 8}) Loader loader(loader_options(ds, 16, w));
}

TEST(Loader, BatchMayOutliveTheLoader) {
  std::optional<Batch> kept;
  {
    Loader loader(loader_options(std::make_shared<IndexDataset<>>(10), 4, 2));
    kept = loader.next();
  }
  ASSERT_TRUE(kept);
  EXPECT_EQ(kept->as<const std::int64_t>(0)[3], 3);
  kept.reset();
}

TEST(Loader, SlabsAreRecycled) {
  auto o = loader_options(std::make_shared<IndexDataset<>>(1000), 10, 2);
  o.depth = 3;
  Loader loader(o);
  drain(loader);
  drain(loader);
  // depth + the one the consumer holds, plus at most one more while a batch is released.
  EXPECT_LE(loader.stats().slabs, 5u);
}

TEST(Loader, NextForTimesOutAndTheNextCallGetsThatBatch) {
  for (std::size_t workers : {1, 3}) {
    auto ds = std::make_shared<testing::GatedDataset>(40);
    Loader loader(loader_options(ds, 8, workers));
    NextResult r = loader.next_for(std::chrono::milliseconds(1));
    EXPECT_EQ(r.status, NextResult::Status::timed_out);
    EXPECT_FALSE(r.batch);
    EXPECT_EQ(loader.position().batch, 0u);  // nothing the consumer can see changed
    ds->open();
    std::vector<std::size_t> seen;
    for (;;) {
      r = loader.next_for(std::chrono::hours(1));
      if (r.status != NextResult::Status::batch) break;
      ASSERT_TRUE(r.batch);
      seen.insert(seen.end(), r.batch->indices().begin(), r.batch->indices().end());
    }
    EXPECT_EQ(r.status, NextResult::Status::end_of_epoch);
    std::vector<std::size_t> all(40);
    std::iota(all.begin(), all.end(), 0);
    EXPECT_EQ(seen, all) << "workers " << workers;
  }
}

TEST(Loader, NextForWithoutWorkersReadsInlineOnlyWhileTimeIsLeft) {
  auto ds = std::make_shared<IndexDataset<>>(20);
  Loader loader(loader_options(ds, 5, 0));
  EXPECT_EQ(loader.next_for(std::chrono::nanoseconds(0)).status, NextResult::Status::timed_out);
  EXPECT_EQ(ds->reads.load(), 0u);
  auto r = loader.next_for(std::chrono::hours(1));
  ASSERT_EQ(r.status, NextResult::Status::batch);
  EXPECT_EQ(r.batch->indices()[0], 0u);
  r = loader.next_for(std::chrono::nanoseconds::max());  // as next()
  ASSERT_EQ(r.status, NextResult::Status::batch);
  EXPECT_EQ(r.batch->indices()[0], 5u);
}

TEST(Loader, EpochOrderIsThePublicSamplersOrder) {
  auto o = loader_options(std::make_shared<IndexDataset<>>(103), 10, 2);
  o.shuffle = true;
  o.seed = 7;
  o.shard = {1, 3, false};
  Loader loader(o);
  loader.set_epoch(4);
  EXPECT_EQ(flat(drain(loader)), epoch_order(SampleOrder{103, true, 7, o.shard}, 4));
  EXPECT_EQ(loader.samples_per_epoch(), samples_per_rank(SampleOrder{103, true, 7, o.shard}));
}

// Counts the slabs made by a custom allocator (the internal option worker processes plug
// shared memory into).
class CountingAllocator final : public detail::HostAllocator {
 public:
  detail::MemoryKind kind() const override { return detail::MemoryKind::pageable; }
  std::byte* allocate(std::size_t bytes) override {
    ++made;
    return base_->allocate(bytes);
  }
  void deallocate(std::byte* memory, std::size_t bytes) noexcept override {
    --made;
    base_->deallocate(memory, bytes);
  }
  std::atomic<int> made{0};

 private:
  std::shared_ptr<HostAllocator> base_ = detail::pageable_allocator();
};

TEST(Loader, SlabsComeFromTheInternalSlabAllocator) {
  auto allocator = std::make_shared<CountingAllocator>();
  detail::LoaderInternals internals;
  internals.slab_allocator = allocator;
  {
    auto o = loader_options(std::make_shared<IndexDataset<>>(100), 10, 2);
    o.pin_memory = PinMemory::on;  // the custom allocator wins over mlock
    Loader loader(o, internals);
    EXPECT_EQ(drain(loader).size(), 10u);
    const Stats s = loader.stats();
    EXPECT_EQ(static_cast<std::size_t>(allocator->made.load()), s.slabs);
    // Only a CUDA device may lock them (by registering them); nothing is mlock'ed.
    std::string why;
    if (!detail::open_cuda(0, why)) {
      EXPECT_EQ(s.locked_slabs, 0u);
    }
  }
  EXPECT_EQ(allocator->made.load(), 0);  // every slab given back
}

TEST(Loader, EmptyDataSetAndTooFewSamplesForOneBatch) {
  Loader empty(loader_options(std::make_shared<IndexDataset<>>(0), 4, 2));
  EXPECT_FALSE(empty.next());
  EXPECT_FALSE(empty.next());
  auto o = loader_options(std::make_shared<IndexDataset<>>(3), 4, 2);
  o.drop_last = true;
  Loader dropped(o);
  EXPECT_FALSE(dropped.next());
}

TEST(Loader, StatsCountWhatWasDelivered) {
  Loader loader(loader_options(std::make_shared<IndexDataset<>>(100, 16), 10, 2));
  drain(loader);
  const Stats s = loader.stats();
  EXPECT_EQ(s.batches, 10u);
  EXPECT_EQ(s.samples, 100u);
  EXPECT_EQ(s.bytes, 100u * (8 + 16));
  EXPECT_EQ(s.workers, 2u);
  EXPECT_GT(s.worker_busy.count(), 0);
  EXPECT_GT(s.elapsed.count(), 0);
  EXPECT_LE(s.in_flight, s.depth);
}

TEST(Loader, ImpossibleOptionsAreNamed) {
  auto ds = std::make_shared<IndexDataset<>>(10);
  auto expect_error = [](LoaderOptions o, const std::string& words) {
    try {
      Loader loader(std::move(o));
      FAIL() << "expected an error about " << words;
    } catch (const std::invalid_argument& e) {
      EXPECT_NE(std::string(e.what()).find(words), std::string::npos) << e.what();
    }
  };
  expect_error(loader_options(nullptr, 4, 1), "dataset is null");
  expect_error(loader_options(ds, 0, 1), "batch_size");
  auto o = loader_options(ds, 4, 1);
  o.depth = 0;
  expect_error(o, "depth");
  o = loader_options(ds, 4, 1);
  o.shard = {3, 3, false};
  expect_error(o, "shard.rank = 3");
  o.shard = {0, 0, false};
  expect_error(o, "world_size");
  expect_error(loader_options(ds, 4, 100000), "workers");
}

}  // namespace
}  // namespace stoker

namespace stoker {
namespace {

TEST(Stats, PrintoutHasOneLinePerFieldOfTheTable) {
  Stats s;
  s.batches = 3;
  s.worker_cpu = std::chrono::milliseconds(1500);
  s.device = "cpu";
  const std::string text = to_string(s);
  EXPECT_NE(text.find("batches: 3\n"), std::string::npos);
  EXPECT_NE(text.find("worker_cpu_s: 1.5\n"), std::string::npos);
  EXPECT_NE(text.find("device: cpu\n"), std::string::npos);
  std::size_t fields = 0;
  for_each_stat(s, [&](const char*, const auto&) { ++fields; });
  EXPECT_EQ(static_cast<std::size_t>(std::count(text.begin(), text.end(), '\n')), fields);
}

}  // namespace
}  // namespace stoker
