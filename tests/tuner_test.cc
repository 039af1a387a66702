#include "tune/tuner.h"

#include <gtest/gtest.h>

#include <chrono>

#include "stoker/loader.h"
#include "stoker/sources.h"

namespace stoker::detail {
namespace {

TuneWindow window(double wait, double busy, double cpu, std::size_t workers) {
  return {1.0, wait, busy, cpu, workers};
}

TEST(Tuner, KeepsTheCountWhileTheConsumerDoesNotWait) {
  const TuneLimits limits{2, 8};
  EXPECT_EQ(next_worker_count(window(0.0, 2.0, 0.1, 2), limits), 2u);
  EXPECT_EQ(next_worker_count(window(0.02, 2.0, 0.1, 2), limits), 2u);
}

TEST(Tuner, WaitingWorkersDoubleUpToTheMaximum) {
  const TuneLimits limits{2, 12};
  EXPECT_EQ(next_worker_count(window(0.5, 2.0, 0.2, 2), limits), 4u);
  EXPECT_EQ(next_worker_count(window(0.5, 4.0, 0.2, 4), limits), 8u);
  EXPECT_EQ(next_worker_count(window(0.5, 8.0, 0.2, 8), limits), 12u);  // not 16
  EXPECT_EQ(next_worker_count(window(0.5, 12.0, 0.2, 12), limits), 12u);
}

TEST(Tuner, ComputingWorkersGrowOneAtATimeUpToTheCores) {
  const TuneLimits limits{4, 16};
  EXPECT_EQ(next_worker_count(window(0.5, 2.0, 1.9, 2), limits), 3u);
  EXPECT_EQ(next_worker_count(window(0.5, 4.0, 3.9, 4), limits), 4u);
}

TEST(Tuner, WorkersWaitingForTheGilGetNoCompany) {
  const TuneLimits limits{2, 32};
  // A GIL-bound Python data set on two threads: off the CPU half the time, as sleepers are,
  // but because the GIL is busy all the time: a third thread would only wait too.
  TuneWindow w = window(0.5, 2.0, 0.9, 2);
  w.worker_lock_held_s = 0.9;
  EXPECT_EQ(next_worker_count(w, limits), 2u);
  w.worker_lock_held_s = 0.1;  // sleepers that hardly use the GIL are doubled as before
  EXPECT_EQ(next_worker_count(w, limits), 4u);
}

TEST(Tuner, InlineReadingIsLeftAlone) {
  EXPECT_EQ(next_worker_count(window(0.9, 0.0, 0.0, 0), {2, 8}), 0u);
}

TEST(Tuner, WindowsNeedTimeAndBatchesAndRestartWhenTheCountChanges) {
  WorkerTuner tuner({2, 8});
  Stats s;
  s.workers = 2;
  EXPECT_FALSE(tuner.observe(s));  // starts the window
  s.elapsed = std::chrono::milliseconds(50);
  s.batches = 10;
  s.consumer_wait = std::chrono::milliseconds(45);
  s.worker_busy = std::chrono::milliseconds(100);
  EXPECT_FALSE(tuner.observe(s));  // too short
  s.elapsed = std::chrono::milliseconds(400);
  s.consumer_wait = std::chrono::milliseconds(350);
  s.worker_busy = std::chrono::milliseconds(800);
  s.worker_cpu = std::chrono::milliseconds(10);
  EXPECT_EQ(tuner.observe(s), std::optional<std::size_t>(4));
  s.workers = 3;
  s.elapsed = std::chrono::milliseconds(900);
  EXPECT_FALSE(tuner.observe(s));  // a new count: a new window
}

// A data set whose reads wait (5 ms each, like I/O) and a consumer that only takes batches:
// starting from one worker, the tuner adds workers, and nothing is lost or reordered.
TEST(Tuner, LoaderAddsWorkersForWaitingReadsAndKeepsEveryBatch) {
  SyntheticDataset::Options so;
  so.samples = 400;
  so.fields = {{"x", DType::i32, {}}};
  so.latency = std::chrono::milliseconds(5);
  LoaderOptions o;
  o.dataset = std::make_shared<SyntheticDataset>(so);
  o.batch_size = 8;
  o.workers = 1;
  o.tune_workers = true;
  o.max_workers = 12;
  Loader loader(o);
  std::size_t batches = 0;
  std::size_t expected = 0;
  for (int epoch = 0; epoch < 2; ++epoch) {
    while (auto b = loader.next()) {
      for (std::size_t i : b->indices()) EXPECT_EQ(i, expected++ % 400);
      ++batches;
    }
  }
  EXPECT_EQ(batches, 100u);
  EXPECT_GT(loader.stats().workers, 1u);
  EXPECT_LE(loader.stats().workers, 12u);
}

}  // namespace
}  // namespace stoker::detail
