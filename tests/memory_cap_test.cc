// The one memory cap (LoaderOptions::memory_limit): the pure division of the cap
// (src/tune/memory_cap.h) and the loader obeying it.
#include "stoker/frontend/memory_cap.h"

#include <gtest/gtest.h>

#include <atomic>
#include <limits>
#include <memory>
#include <stdexcept>
#include <string>
#include <thread>

#include "stoker/loader.h"
#include "test_datasets.h"

namespace stoker {
namespace {

using detail::divide_memory_cap;
using detail::MemoryUse;
using testing::IndexDataset;

constexpr std::size_t kMiB = std::size_t{1} << 20;

TEST(MemoryCap, TheSlabsGetWhatTheOthersLeave) {
  MemoryUse others;
  others.device_slots = 20 * kMiB;
  others.cache = 30 * kMiB;
  others.workers = 50 * kMiB;
  EXPECT_EQ(others.total(), 100 * kMiB);
  // 200 MiB cap, 100 held by the others: 100 MiB of slabs of 10 MiB, 10 slabs, depth 9.
  const auto share = divide_memory_cap(200 * kMiB, 0, 10 * kMiB, others);
  EXPECT_EQ(share.slab_budget, 100 * kMiB);
  EXPECT_EQ(share.max_depth, 9u);
  EXPECT_EQ(share.depth_budget, 100 * kMiB);  // (depth + 1) slabs, as the engine counts
  // A training loop that holds two batches (Python's for loop, asking for the next): depth 8,
  // given to the engine as 9 slabs' bytes.
  const auto two = divide_memory_cap(200 * kMiB, 0, 10 * kMiB, others, 2);
  EXPECT_EQ(two.max_depth, 8u);
  EXPECT_EQ(two.depth_budget, 90 * kMiB);
}

TEST(MemoryCap, TheSlabBudgetNarrowsTheShareButNeverWidensIt) {
  const MemoryUse none;
  EXPECT_EQ(divide_memory_cap(200 * kMiB, 45 * kMiB, 10 * kMiB, none).max_depth, 3u);
  EXPECT_EQ(divide_memory_cap(30 * kMiB, 450 * kMiB, 10 * kMiB, none).max_depth, 2u);
  // No cap: the budget alone, or nothing at all.
  EXPECT_EQ(divide_memory_cap(0, 45 * kMiB, 10 * kMiB, none).slab_budget, 45 * kMiB);
  EXPECT_EQ(divide_memory_cap(0, 0, 10 * kMiB, none).slab_budget,
            std::numeric_limits<std::size_t>::max());
}

TEST(MemoryCap, NotEvenOneBatchInFlightIsDepthZero) {
  MemoryUse others;
  others.workers = 90 * kMiB;
  // 100 MiB cap, 90 held: 10 MiB left, one slab of 8 MiB, but one batch in flight needs two.
  EXPECT_EQ(divide_memory_cap(100 * kMiB, 0, 8 * kMiB, others).max_depth, 0u);
  // Others past the cap: nothing left at all.
  others.workers = 300 * kMiB;
  EXPECT_EQ(divide_memory_cap(100 * kMiB, 0, 8 * kMiB, others).slab_budget, 0u);
  EXPECT_EQ(detail::least_memory_cap(8 * kMiB, others), 316 * kMiB);
}

TEST(MemoryCap, TheGrowthReserveIsKeptButNeverTakesTheLastBatch) {
  MemoryUse others;
  others.workers = 50 * kMiB;
  others.reserve = 20 * kMiB;
  // 200 MiB cap, 50 held and 20 kept: 130 MiB for slabs of 10 MiB, depth 12 (was 14).
  EXPECT_EQ(divide_memory_cap(200 * kMiB, 0, 10 * kMiB, others).max_depth, 12u);
  // 80 MiB cap: 30 MiB left holds one batch in flight beside the one held only without the
  // reserve, which then is not kept.
  EXPECT_EQ(divide_memory_cap(80 * kMiB, 0, 10 * kMiB, others).max_depth, 2u);
  others.reserve = 0;
  EXPECT_EQ(divide_memory_cap(80 * kMiB, 0, 10 * kMiB, others).max_depth, 2u);
}

TEST(MemoryCap, TheGrowthReserveIsTheLargestRiseOverTheLastSecondOfLooks) {
  detail::MemoryGuard guard(0, 0);
  EXPECT_EQ(guard.growth_reserve(300 * kMiB), 0u);  // the first look: a base, not a rise
  EXPECT_EQ(guard.growth_reserve(310 * kMiB), 10 * kMiB);
  EXPECT_EQ(guard.growth_reserve(314 * kMiB), 10 * kMiB);  // the largest rise is kept
  EXPECT_EQ(guard.growth_reserve(200 * kMiB), 10 * kMiB);  // a fall is no rise
  for (std::size_t i = 0; i + 3 < detail::kGrowthLooks; ++i) guard.growth_reserve(200 * kMiB);
  EXPECT_EQ(guard.growth_reserve(200 * kMiB), 4 * kMiB);  // the 10 MiB rise has aged out
  EXPECT_EQ(guard.growth_reserve(200 * kMiB), 0u);
}

TEST(MemoryCap, BeforeTheLayoutIsKnownNothingIsDivided) {
  const auto share = divide_memory_cap(100 * kMiB, 0, 0, MemoryUse{});
  EXPECT_EQ(share.slab_budget, 100 * kMiB);
  EXPECT_EQ(share.max_depth, std::numeric_limits<std::size_t>::max());
}

TEST(MemoryCap, TheErrorSaysWhatHoldsWhatAndWhatWouldFit) {
  MemoryUse others;
  others.cache = 3 * kMiB;
  others.workers = 5 * kMiB;
  const std::string e = detail::memory_cap_too_small(10 * kMiB, 4 * kMiB, others);
  EXPECT_NE(e.find("memory_limit of 10.0 MiB is too small for one batch"), std::string::npos) << e;
  EXPECT_NE(e.find("two batch slabs of 4.0 MiB"), std::string::npos) << e;
  EXPECT_NE(e.find("3.0 MiB of RAM cache"), std::string::npos) << e;
  EXPECT_NE(e.find("5.0 MiB held by the worker processes"), std::string::npos) << e;
  EXPECT_NE(e.find("at least 16.0 MiB would fit"), std::string::npos) << e;
  EXPECT_EQ(e.find("device slots"), std::string::npos) << e;  // none held
  const std::string held = detail::memory_cap_too_small(10 * kMiB, 4 * kMiB, others, 2);
  EXPECT_NE(held.find("needs 3 batch slabs of 4.0 MiB (the batch being read and 2 the training "
                      "loop holds)"),
            std::string::npos)
      << held;
  EXPECT_NE(held.find("at least 20.0 MiB would fit"), std::string::npos) << held;
}

TEST(MemoryCap, TheDefaultIsHalfOfWhatIsAvailable) {
  EXPECT_EQ(detail::default_memory_limit(std::size_t{8} << 30), std::size_t{4} << 30);
}

LoaderOptions options(std::shared_ptr<const Dataset> ds, std::size_t depth) {
  LoaderOptions o;
  o.dataset = std::move(ds);
  o.batch_size = 16;
  o.workers = 2;
  o.depth = depth;
  return o;
}

// An IndexDataset that says it keeps `resident` bytes in a RAM cache.
class CachingDataset : public IndexDataset<> {
 public:
  CachingDataset(std::size_t n, std::size_t payload, std::size_t resident)
      : IndexDataset(n, payload), resident_(resident) {}
  std::size_t resident_bytes() const override { return resident_; }

 private:
  std::size_t resident_;
};

// A RAM cache that grows while the loader runs (set_resident from the test).
class GrowingCacheDataset : public IndexDataset<> {
 public:
  GrowingCacheDataset(std::size_t n, std::size_t payload) : IndexDataset(n, payload) {}
  std::size_t resident_bytes() const override { return resident_.load(); }
  void set_resident(std::size_t bytes) { resident_.store(bytes); }

 private:
  std::atomic<std::size_t> resident_{0};
};

std::size_t slab_bytes_of(LoaderOptions o) {
  o.depth = 1;
  const Stats s = Loader(o).stats();
  return s.slab_bytes / s.slabs;
}

TEST(MemoryCapLoader, TheCapLowersTheDepthCountsTheCacheAndHolds) {
  const std::size_t slab = slab_bytes_of(options(std::make_shared<IndexDataset<>>(800, 4096), 1));
  // A cache of 2 slabs' bytes and a cap of 6.5 slabs: 4.5 slabs left, 2 for the batches the
  // training loop holds (kHeldBatches), depth 2.
  auto ds = std::make_shared<CachingDataset>(800, 4096, 2 * slab);
  auto o = options(ds, 8);
  o.memory_limit = 6 * slab + slab / 2;
  Loader loader(o);
  EXPECT_EQ(loader.stats().depth, 2u);
  loader.set_depth(10);  // asked again: still within the cap
  std::size_t rows = 0;
  while (auto b = loader.next()) rows += b->size();
  EXPECT_EQ(rows, 800u);
  const Stats s = loader.stats();
  EXPECT_EQ(s.depth, 2u);
  EXPECT_EQ(s.memory_limit, o.memory_limit);
  EXPECT_EQ(s.memory_cache, 2 * slab);
  EXPECT_EQ(s.memory_workers, 0u);  // threads
  EXPECT_EQ(s.memory_used, s.memory_slabs + s.memory_cache);
  EXPECT_GE(s.memory_peak, s.memory_used);
  EXPECT_LE(s.memory_peak, o.memory_limit);
  const Report r = loader.report();
  EXPECT_EQ(r.memory_peak, s.memory_peak);
  EXPECT_NE(r.text().find("memory: "), std::string::npos) << r.text();
  EXPECT_NE(r.memory.find("RAM cache"), std::string::npos) << r.memory;
}

TEST(MemoryCapLoader, ACapTooSmallForOneBatchIsRefusedSayingWhatWouldFit) {
  const std::size_t slab = slab_bytes_of(options(std::make_shared<IndexDataset<>>(100, 4096), 1));
  auto o = options(std::make_shared<IndexDataset<>>(100, 4096), 4);
  o.memory_limit = slab + slab / 2;
  try {
    Loader loader(o);
    FAIL() << "a cap of 1.5 slabs was accepted";
  } catch (const std::invalid_argument& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("too small for one batch"), std::string::npos) << what;
    EXPECT_NE(what.find("would fit"), std::string::npos) << what;
  }
  o.memory_limit = 3 * slab;  // exactly one batch in flight and the two held
  Loader loader(o);
  EXPECT_EQ(loader.stats().depth, 1u);
  std::size_t rows = 0;
  while (auto b = loader.next()) rows += b->size();
  EXPECT_EQ(rows, 100u);
}

// --- streams (python/stoker/loader/stream_epochs.py; the pipeline applies the depth) ---------

TEST(StreamMemoryCap, ADepthHoldsAQueueAndOneMorePerThreadThreeQueuesPerProcess) {
  EXPECT_EQ(detail::stream_batches_in_flight(0, 8, false), 0u);  // in-line: none
  EXPECT_EQ(detail::stream_batches_in_flight(2, 4, false), 10u);
  EXPECT_EQ(detail::stream_batches_in_flight(2, 4, true), 24u);
}

TEST(StreamMemoryCap, TheDepthIsTheDeepestThatFitsBesideTheRestAtMostTheOneAsked) {
  using detail::stream_memory_depth;
  // 2 threads, 10 MiB batches, 2 held: depth d holds 2 (d + 1) + 2 batches.
  EXPECT_EQ(stream_memory_depth(0, 10 * kMiB, 2, false, 4, 0), 4u);   // no cap
  EXPECT_EQ(stream_memory_depth(100 * kMiB, 0, 2, false, 4, 0), 4u);  // no batch seen yet
  EXPECT_EQ(stream_memory_depth(1000 * kMiB, 10 * kMiB, 2, false, 4, 0), 4u);
  EXPECT_EQ(stream_memory_depth(100 * kMiB, 10 * kMiB, 2, false, 8, 0), 3u);  // 10 batches
  EXPECT_EQ(stream_memory_depth(100 * kMiB, 10 * kMiB, 2, false, 8, 40 * kMiB), 1u);
  EXPECT_EQ(stream_memory_depth(100 * kMiB, 10 * kMiB, 2, false, 8, 50 * kMiB), 0u);
  // 2 processes: d holds 6 d + 2.
  EXPECT_EQ(stream_memory_depth(200 * kMiB, 10 * kMiB, 2, true, 8, 0), 3u);
  EXPECT_EQ(stream_memory_depth(70 * kMiB, 10 * kMiB, 2, true, 8, 0), 0u);
  // In-line: only the held batches.
  EXPECT_EQ(stream_memory_depth(20 * kMiB, 10 * kMiB, 0, false, 2, 0), 2u);
  EXPECT_EQ(stream_memory_depth(19 * kMiB, 10 * kMiB, 0, false, 2, 0), 0u);
}

TEST(StreamMemoryCap, AsTheWorkersGrowTheDepthFallsAndThePeakIsKept) {
  detail::StreamMemoryCap cap(200 * kMiB, 8);
  cap.set_workers(2, false);
  auto look = cap.look(10 * kMiB, 40 * kMiB, 0, 0);
  EXPECT_EQ(look.depth, 8u);        // 2 (8 + 1) + 2 = 20 batches: exactly the cap
  EXPECT_EQ(look.used, 40 * kMiB);  // what is held now, not what the depth allows
  look = cap.look(10 * kMiB, 180 * kMiB, 0, 0);
  look = cap.look(10 * kMiB, 80 * kMiB, 50 * kMiB, 10 * kMiB);
  // 60 MiB held, and as much kept for the same rise again: 80 MiB left, 8 batches, depth 2.
  EXPECT_EQ(look.use.reserve, 60 * kMiB);
  EXPECT_EQ(look.depth, 2u);
  EXPECT_EQ(look.used, 80 * kMiB + 60 * kMiB);
  EXPECT_FALSE(look.too_small);
  EXPECT_FALSE(look.warn);
  EXPECT_EQ(cap.peak(), 180 * kMiB);
  EXPECT_NE(cap.line(look).find("(batches 80, worker processes 50, shuffle buffers 10)"),
            std::string::npos)
      << cap.line(look);
  EXPECT_NE(cap.line(look).find("of the 200 MiB cap"), std::string::npos) << cap.line(look);
  EXPECT_NE(cap.line(look).find("peak 180 MiB"), std::string::npos) << cap.line(look);
}

TEST(StreamMemoryCap, TooSmallForOneBatchIsRefusedOutgrownMidRunIsSaidOnce) {
  detail::StreamMemoryCap tiny(30 * kMiB, 2);
  tiny.set_workers(1, true);  // 3 in flight + 2 held
  const auto refused = tiny.look(10 * kMiB, 10 * kMiB, 0, 0);
  EXPECT_TRUE(refused.too_small);
  EXPECT_NE(refused.message.find("memory_limit of 30.0 MiB is too small"), std::string::npos)
      << refused.message;
  EXPECT_NE(refused.message.find("it needs 5 batches of 10.0 MiB (3 in flight from 1 worker "
                                 "process(es) and 2 the training loop holds)"),
            std::string::npos)
      << refused.message;
  EXPECT_NE(refused.message.find("at least 50.0 MiB would fit"), std::string::npos)
      << refused.message;

  detail::StreamMemoryCap cap(100 * kMiB, 2);
  cap.set_workers(1, true);
  EXPECT_EQ(cap.look(10 * kMiB, 0, 0, 0).depth, 2u);
  auto outgrown = cap.look(10 * kMiB, 0, 0, 80 * kMiB);  // a shuffle buffer grew past it
  EXPECT_FALSE(outgrown.too_small);
  EXPECT_TRUE(outgrown.warn);
  EXPECT_EQ(outgrown.depth, 1u);
  EXPECT_NE(outgrown.message.find("80.0 MiB of shuffle buffers"), std::string::npos)
      << outgrown.message;
  outgrown = cap.look(10 * kMiB, 0, 0, 80 * kMiB);
  EXPECT_FALSE(outgrown.warn);  // once
  EXPECT_EQ(outgrown.depth, 1u);
}

TEST(MemoryCapLoader, ACacheThatOutgrowsTheCapMidRunLeavesOneBatchInFlightNotAnError) {
  const std::size_t slab = slab_bytes_of(options(std::make_shared<IndexDataset<>>(800, 4096), 1));
  auto ds = std::make_shared<GrowingCacheDataset>(800, 4096);
  auto o = options(ds, 4);
  o.memory_limit = 8 * slab;
  Loader loader(o);
  std::size_t rows = 0;
  auto first = loader.next();
  ASSERT_TRUE(first);
  rows += first->size();
  first.reset();
  ds->set_resident(20 * slab);  // the cache alone is now past the cap
  std::this_thread::sleep_for(2 * detail::kMemoryCheckPeriod);  // the next look is due
  while (auto b = loader.next()) rows += b->size();
  EXPECT_EQ(rows, 800u);  // the epoch completes
  EXPECT_EQ(loader.stats().depth, 1u);
  EXPECT_GT(loader.stats().memory_peak, o.memory_limit);  // and says it went past
}

TEST(MemoryCapLoader, ByDefaultTheCapIsDerivedFromTheMachine) {
  Loader loader(options(std::make_shared<IndexDataset<>>(64, 16), 2));
  const Stats s = loader.stats();
  EXPECT_GT(s.memory_limit, 0u);
  EXPECT_GT(s.memory_used, 0u);  // the slabs made up front
  EXPECT_EQ(s.memory_used, s.memory_slabs);
}

}  // namespace
}  // namespace stoker
