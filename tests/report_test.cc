#include "stoker/report.h"

#include <gtest/gtest.h>

#include <chrono>
#include <string>

#include "stoker/loader.h"
#include "stoker/sources.h"

namespace stoker {
namespace {

using std::chrono::milliseconds;

// Ten seconds of a run: `wait_ms` of them the training loop waited; `workers` were busy for
// `busy_ms` in all, `cpu_ms` of it on a CPU, `gil_ms` of that holding the GIL.
Stats run(int wait_ms, std::size_t workers, int busy_ms, int cpu_ms, int gil_ms = 0) {
  Stats s;
  s.elapsed = milliseconds(10000);
  s.batches = 100;
  s.samples = 6400;
  s.consumer_wait = milliseconds(wait_ms);
  s.workers = workers;
  s.worker_busy = milliseconds(busy_ms);
  s.worker_cpu = milliseconds(cpu_ms);
  s.worker_lock_held = milliseconds(gil_ms);
  s.cpu_cores = 2;
  return s;
}

bool has(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

TEST(Report, InputBoundWithTheCpuSaturated) {
  // An image folder's data set: what makes its reads cheaper comes from it.
  const Report r = diagnose(run(4300, 2, 19800, 19400), false,
                            {"record shards (stoker pack), if it reads many small files",
                             "a RAM cache of the encoded bytes"});
  EXPECT_EQ(r.verdict, "input-bound");
  EXPECT_NEAR(r.wait_fraction, 0.43, 1e-9);
  EXPECT_EQ(r.busiest, "reads");
  EXPECT_NEAR(r.busiest_load, 1.94, 1e-9);
  EXPECT_EQ(r.more_workers, "more workers would not help: CPU saturated");
  ASSERT_FALSE(r.suggestions.empty());
  EXPECT_TRUE(has(r.suggestions[0], "record shards"));
  const std::string text = r.text();
  EXPECT_TRUE(has(text, "input-bound: the training loop waited 43% of its time")) << text;
  EXPECT_TRUE(has(text, "reads are the busiest stage at 97% of 2 cores")) << text;
  EXPECT_TRUE(has(text, "try: record shards")) << text;
}

TEST(Report, ReadsThatFillTheCoresAreGivenTheDataSetsOwnRemedies) {
  // A video data set's reads fill the cores: its own remedies, none of the images'; a data
  // set that knows of none gets none.
  std::vector<std::string> video{"videos re-encoded with keyframes closer together"};
  Report r = diagnose(run(4300, 2, 19800, 19400), false, video);
  EXPECT_EQ(r.suggestions, video);
  EXPECT_TRUE(has(r.text(), "try: videos re-encoded with keyframes closer together"));
  r = diagnose(run(4300, 2, 19800, 19400));
  EXPECT_EQ(r.more_workers, "more workers would not help: CPU saturated");
  EXPECT_TRUE(r.suggestions.empty());
}

TEST(Report, InputBoundOnAMachineBusyWithOthers) {
  // Half a core's worth of CPU time, but the reads waited for a core as long again.
  Stats s = run(5000, 2, 19000, 5000);
  s.worker_run_delay = milliseconds(9000);
  const Report r = diagnose(s);
  EXPECT_NEAR(r.worker_run_delay, 9.0 / 19.0, 1e-9);
  EXPECT_EQ(r.more_workers,
            "more workers would not help: CPU saturated (reads waited for a core 47% of their "
            "time)");
}

TEST(Report, InputBoundWithIdleCores) {
  Stats s = run(6000, 1, 9500, 9300);
  s.cpu_cores = 8;
  const Report r = diagnose(s);
  EXPECT_EQ(r.verdict, "input-bound");
  EXPECT_TRUE(has(r.more_workers, "more workers would help")) << r.more_workers;
  EXPECT_TRUE(has(r.suggestions.at(0), "num_workers='auto'"));
}

TEST(Report, InputBoundOnWaitingReads) {
  const Report r = diagnose(run(5000, 4, 39000, 800));
  EXPECT_EQ(r.verdict, "input-bound");
  EXPECT_TRUE(has(r.more_workers, "the rest waits (I/O, sleeps)")) << r.more_workers;
}

TEST(Report, InputBoundOnTheGil) {
  const Report r = diagnose(run(5000, 2, 19000, 9500, 9000));
  EXPECT_EQ(r.busiest, "the GIL");
  EXPECT_NEAR(r.busiest_load, 0.9, 1e-9);
  EXPECT_TRUE(has(r.more_workers, "GIL is saturated"));
  EXPECT_EQ(r.suggestions.at(0), "worker_type='process'");
}

TEST(Report, InputBoundWithStarvedWorkers) {
  const Report r = diagnose(run(3000, 8, 20000, 1000));
  EXPECT_TRUE(has(r.more_workers, "waiting for batches")) << r.more_workers;
  EXPECT_TRUE(has(r.suggestions.at(0), "depth"));
}

TEST(Report, ProcessWorkersCountTheirBusyTimeAsCores) {
  // The threads only wait for the processes: little CPU time of their own.
  const Report r = diagnose(run(4000, 2, 19500, 100), true);
  EXPECT_NEAR(r.worker_cores, 1.95, 1e-9);
  EXPECT_EQ(r.more_workers, "more workers would not help: CPU saturated");
}

TEST(Report, APythonDataSetThatFillsTheCoresGetsPythonRemedies) {
  // Worker processes, or threads that hold the GIL below its saturation: the data set's own
  // Python is the work, so image remedies (shards, DCT scaling) would be beside the point.
  for (const bool processes : {true, false}) {
    const Report r =
        diagnose(run(4000, 2, 19500, processes ? 100 : 19000, processes ? 0 : 3000), processes);
    EXPECT_EQ(r.more_workers, "more workers would not help: CPU saturated");
    ASSERT_EQ(r.suggestions.size(), 3u);
    EXPECT_TRUE(has(r.suggestions[0], "remote=stoker.ray_workers")) << r.suggestions[0];
    EXPECT_TRUE(has(r.suggestions[1], "__getitems__")) << r.suggestions[1];
    for (const auto& suggestion : r.suggestions) {
      EXPECT_FALSE(has(suggestion, "record shards") || has(suggestion, "DCT")) << suggestion;
    }
  }
}

TEST(Report, InlineReads) {
  Stats s = run(0, 0, 0, 0);
  s.consumer_wait = milliseconds(0);
  s.inline_busy = milliseconds(6000);
  s.consumer_wait = milliseconds(6000);
  const Report r = diagnose(s);
  EXPECT_EQ(r.verdict, "input-bound");
  EXPECT_TRUE(has(r.more_workers, "workers would help"));
}

TEST(Report, ComputeBoundAndBalanced) {
  Report r = diagnose(run(100, 8, 16000, 15000));
  EXPECT_EQ(r.verdict, "compute-bound");
  EXPECT_EQ(r.busiest, "the training loop");
  EXPECT_NEAR(r.busiest_load, 0.99, 1e-9);
  EXPECT_TRUE(has(r.suggestions.at(0), "fewer workers would do: 8 are 20% busy"));
  r = diagnose(run(600, 2, 18000, 17000));
  EXPECT_EQ(r.verdict, "balanced");
  EXPECT_TRUE(r.suggestions.empty());
  EXPECT_TRUE(has(r.text(), "balanced: the training loop waited 6%")) << r.text();
}

// Ten seconds of one local worker and two remote workers (four engine threads waiting on
// them): the training loop waited 40%, the threads read for 49 s, 38.5 s of it waiting for 250
// replies of 600 KB (15 MB/s); the remote workers read `remote_read_ms` of the replies' time
// and idled `remote_idle_ms` before them.
Stats remote_run(int remote_read_ms, int remote_idle_ms) {
  Stats s = run(4000, 5, 49000, 9800);
  s.network_units = 250;
  s.network_bytes = 250 * 600'000;
  s.network_wait = milliseconds(38500);
  s.network_read = milliseconds(remote_read_ms);
  s.network_idle = milliseconds(remote_idle_ms);
  return s;
}

TEST(Report, NetworkBoundWhenRemoteWorkersIdleWhileTheirRowsTravel) {
  const Report r = diagnose(remote_run(5600, 13400));
  EXPECT_EQ(r.verdict, "network-bound");
  EXPECT_EQ(r.busiest, "the network");
  EXPECT_NEAR(r.network_wait, 38.5 / 49, 1e-9);
  EXPECT_NEAR(r.network_bytes_per_second, 15e6, 1e-3);
  EXPECT_NEAR(r.remote_busy, 5.6 / 19, 1e-9);
  EXPECT_EQ(r.more_workers,
            "more workers would not help: the remote workers idle 71% of their time while "
            "their rows travel");
  EXPECT_TRUE(has(r.suggestions.at(0), "smaller rows")) << r.suggestions.at(0);
  const std::string text = r.text();
  EXPECT_TRUE(has(text, "network-bound: the training loop waited 40% of its time")) << text;
  EXPECT_TRUE(has(text,
                  "the network is the busiest stage: reads waited for remote workers 79% of "
                  "their time (15 MB/s of rows received), and the remote workers read 29% of "
                  "theirs"))
      << text;
}

TEST(Report, InputBoundOnSaturatedRemoteWorkers) {
  const Report r = diagnose(remote_run(18600, 400));
  EXPECT_EQ(r.verdict, "input-bound");
  EXPECT_EQ(r.busiest, "remote reads");
  EXPECT_NEAR(r.busiest_load, 18.6 / 19, 1e-9);
  EXPECT_EQ(r.more_workers, "more remote workers would help: they are saturated");
  EXPECT_TRUE(has(r.suggestions.at(0), "stoker.ray_workers")) << r.suggestions.at(0);
}

TEST(Report, RemoteWaitsThatDoNotDominateLeaveTheLocalVerdict) {
  Stats s = remote_run(5600, 13400);
  s.network_wait = milliseconds(12000);
  s.worker_cpu = milliseconds(34000);
  const Report r = diagnose(s);
  EXPECT_EQ(r.verdict, "input-bound");
  EXPECT_EQ(r.busiest, "reads");
  EXPECT_NEAR(r.network_wait, 12.0 / 49, 1e-9);
}

// Ten seconds in which the loop waited 6 s and 2 workers read for 8 s in all, waiting
// `wait_ms` of that for object storage: 40 chunk GETs taking 2 s, 40 MiB, 3 retries, 7 reads
// from the local cache.
Stats storage_run(int wait_ms) {
  Stats s = run(6000, 2, 8000, 1000);
  s.storage_fetches = 40;
  s.storage_fetch_time = milliseconds(2000);
  s.storage_bytes = 40 << 20;
  s.storage_wait = milliseconds(wait_ms);
  s.storage_retries = 3;
  s.storage_cache_hits = 7;
  return s;
}

TEST(Report, NetworkBoundWhenReadsWaitForObjectStorage) {
  const Report local = diagnose(run(6000, 2, 8000, 1000));
  const Report r = diagnose(storage_run(6000));
  EXPECT_EQ(r.verdict, "network-bound");
  EXPECT_EQ(r.busiest, "the object store");
  EXPECT_DOUBLE_EQ(r.busiest_load, 0.75);
  EXPECT_DOUBLE_EQ(r.storage_wait, 0.75);
  EXPECT_DOUBLE_EQ(r.storage_fetch_latency, 0.05);
  EXPECT_DOUBLE_EQ(r.storage_bytes_per_second, (40 << 20) / 10.0);
  ASSERT_EQ(r.suggestions.size(), 3 + local.suggestions.size());
  EXPECT_EQ(r.suggestions.at(0),
            "more reads in flight: num_workers above 2 (a read waiting 50 ms for its chunk "
            "holds a worker thread and no CPU)");
  EXPECT_EQ(r.suggestions.back(), local.suggestions.back());  // the stages' remedies follow
  const std::string text = r.text();
  EXPECT_TRUE(has(text,
                  "network-bound: the training loop waited 60% of its time (640 "
                  "samples/s); the object store is the busiest stage: reads waited for it "
                  "75% of their time"))
      << text;
  EXPECT_TRUE(has(text,
                  "; object storage: 40 chunk GETs at 50 ms each, 4.2 MB/s fetched, 3 "
                  "retries, 7 reads from the local cache"))
      << text;
}

TEST(Report, StorageWaitsBelowTheShareOrACalmLoopKeepTheVerdict) {
  const Report below = diagnose(storage_run(3900));  // 49% of the reads' time
  EXPECT_EQ(below.verdict, "input-bound");
  EXPECT_EQ(below.busiest, "reads");
  EXPECT_TRUE(has(below.text(), "; object storage: 40 chunk GETs")) << below.text();
  Stats calm = storage_run(6000);
  calm.consumer_wait = milliseconds(100);
  const Report r = diagnose(calm);
  EXPECT_EQ(r.verdict, "compute-bound");
  EXPECT_DOUBLE_EQ(r.storage_wait, 0.75);
}

TEST(Report, TheStorageLineNamesTheShuffleChosenAndWhy) {
  Stats s = storage_run(1000);
  s.shuffle =
      "window of 312 blocks (11.2 MB): the data set's 256 MB in 7160 blocks, an object "
      "cache of 25.6 MB cannot hold it";
  const Report r = diagnose(s);
  EXPECT_TRUE(has(r.storage, "reads from the local cache; shuffle: window of 312 blocks"))
      << r.storage;
  EXPECT_TRUE(has(r.text(), "shuffle: window of 312 blocks (11.2 MB)")) << r.text();
}

TEST(Report, LocalDataHasNoStorageLine) {
  const Report r = diagnose(run(6000, 2, 8000, 1000));
  EXPECT_EQ(r.storage_wait, 0.0);
  EXPECT_EQ(r.storage_fetch_latency, 0.0);
  EXPECT_TRUE(r.storage.empty());
  EXPECT_FALSE(has(r.text(), "object storage")) << r.text();
}

TEST(Report, NoDataYet) { EXPECT_EQ(diagnose(Stats{}).verdict, "no data yet"); }

TEST(Report, FromALoader) {
  SyntheticDataset::Options so;
  so.samples = 64;
  so.fields = {{"x", DType::i32, {}}};
  LoaderOptions o;
  o.dataset = std::make_shared<SyntheticDataset>(so);
  o.batch_size = 8;
  Loader loader(o);
  EXPECT_EQ(loader.report().verdict, "no data yet");
  while (loader.next()) {
  }
  const Report r = loader.report();
  EXPECT_NE(r.verdict, "no data yet");
  EXPECT_GT(r.cpu_cores, 0);
  EXPECT_FALSE(r.text().empty());
}

}  // namespace
}  // namespace stoker
