#include "tune/tuner.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <mutex>
#include <string>
#include <vector>

#include "stoker/loader.h"
#include "stoker/log.h"
#include "stoker/sources.h"
#include "support/log_capture.h"

namespace stoker::detail {
namespace {

// A synthetic pipeline that answers a configuration with the window it would measure, so the
// policy can be driven through whole runs without clocks. Each worker reads a sample in
// `read_s` of wall time, `on_cpu` of it on a CPU; the workers share `cores` cores (past them
// reads stretch, waiting for a core); batches in flight below `depth_needed` starve them; the
// training loop consumes a sample every `loop_s`. A stretched read waits for a core: the
// window shows it as run-queue delay, not CPU time.
struct Pipeline {
  double read_s = 0.005;
  double on_cpu = 0.02;
  double cores = 2;
  double loop_s = 0.001;
  std::size_t depth_needed = 1;
  bool gil = false;  // reads hold one lock: at most one on a CPU at a time
  std::size_t worker_limit = 0;

  TuneWindow measure(std::size_t workers, std::size_t depth) const {
    const double n = static_cast<double>(workers);
    // Under the GIL, reads take turns on at most one core, and less than one when other
    // processes take the machine (cores < 1).
    const double stretch = std::max(1.0, n * on_cpu / (gil ? std::min(1.0, cores) : cores));
    double capacity = n / (read_s * stretch);
    capacity *= std::min(1.0, static_cast<double>(depth) / static_cast<double>(depth_needed));
    const double demand = 1.0 / loop_s;
    const double rate = std::min(capacity, demand);
    TuneWindow w;
    w.elapsed_s = 0.2;
    w.consumer_wait_s = w.elapsed_s * (1.0 - rate / demand);
    w.samples = rate * w.elapsed_s;
    w.worker_busy_s = std::min(n * w.elapsed_s, w.samples * read_s * stretch);
    w.worker_cpu_s = w.samples * read_s * on_cpu;
    // Stretched reads waited for a core as long as they were on one, (stretch - 1) times over;
    // under the GIL only the holder waits for a core (the others wait for the GIL, blocked).
    w.worker_run_delay_s = w.worker_cpu_s * ((gil ? std::max(1.0, 1.0 / cores) : stretch) - 1.0);
    if (gil) w.worker_lock_held_s = w.worker_cpu_s;
    w.workers = workers;
    w.depth = depth;
    w.worker_limit = worker_limit;
    return w;
  }
};

struct TuneRun {
  std::vector<TuneDecision> decisions;  // one per window
  std::size_t changes = 0;
  std::size_t last_change = 0;  // window of the last change
  std::size_t max_workers = 0;
  std::size_t max_depth = 0;
  TuneWindow last;
};

TuneRun drive(const Pipeline& p, TuneLimits limits, std::size_t workers, std::size_t depth,
              std::size_t windows = 200) {
  TunePolicy policy(limits);
  TuneRun run;
  for (std::size_t i = 0; i < windows; ++i) {
    run.last = p.measure(workers, depth);
    const TuneDecision d = policy.decide(run.last);
    EXPECT_FALSE(d.reason.empty());
    if (d.workers != workers || d.depth != depth) {
      ++run.changes;
      run.last_change = i;
    }
    workers = d.workers;
    depth = d.depth;
    run.max_workers = std::max(run.max_workers, workers);
    run.max_depth = std::max(run.max_depth, depth);
    run.decisions.push_back(d);
  }
  return run;
}

double wait_fraction(const TuneWindow& w) { return w.consumer_wait_s / w.elapsed_s; }

std::string history(const TuneRun& run) {
  std::string out;
  for (const auto& d : run.decisions) {
    if (!d.reason.empty() && d.reason.find(" -> ") != std::string::npos) out += d.reason + "\n";
  }
  return out;
}

TEST(TunePolicy, LatencyBoundReadsAreDoubledUntilTheLoopStopsWaiting) {
  // 5 ms sleeps, a sample every 0.8 ms: about 7 workers needed
  const Pipeline sleeper{.loop_s = 0.0008};
  const TuneRun run = drive(sleeper, {2, 64, 64}, 1, 4);
  EXPECT_LT(wait_fraction(run.last), kWaitThreshold) << history(run);
  EXPECT_GE(run.last.workers, 7u) << history(run);
  EXPECT_LE(run.last.workers, 16u) << history(run);
  EXPECT_LT(run.last_change, 40u) << history(run);  // settled, and stayed
}

TEST(TunePolicy, ALoopStarvedBySleepingReadsGrowsThemFourfoldAStep) {
  // 5 ms sleeps and a loop that takes nothing: it waits all the time
  const Pipeline sleeper{.loop_s = 1e-6};
  const TuneRun run = drive(sleeper, {2, 32, 64}, 2, 4, 8);
  std::vector<std::size_t> steps;
  for (const auto& d : run.decisions) {
    if (steps.empty() || d.workers != steps.back()) steps.push_back(d.workers);
  }
  EXPECT_EQ(steps, (std::vector<std::size_t>{8, 32})) << history(run);  // each judged first
}

TEST(TunePolicy, SleepingReadsGrowOnlyAsFarAsTheirCpuTimeFits) {
  // Reads 60% off the CPU: the budget of 2 cores fits about 6 of them
  const Pipeline sleeper{.on_cpu = 0.3, .loop_s = 1e-6};
  const TuneRun run = drive(sleeper, {2, 64, 64}, 2, 4);
  EXPECT_GT(run.max_workers, 2u) << history(run);
  const double cores = run.last.worker_cpu_s / run.last.elapsed_s;
  EXPECT_LE(cores, 2 + kCpuSlack) << history(run);
}

TEST(TunePolicy, OverProvisionedWorkersAndDepthAreGivenBackAndItSettles) {
  Pipeline sleeper;
  sleeper.loop_s = 0.002;  // about 3 workers needed
  const TuneRun run = drive(sleeper, {2, 64, 64}, 32, 16);
  EXPECT_LT(wait_fraction(run.last), kWaitThreshold) << history(run);
  EXPECT_LE(run.last.workers, 6u) << history(run);
  EXPECT_GE(run.last.workers, 3u) << history(run);
  EXPECT_LE(run.last.depth, 4u) << history(run);
  EXPECT_GE(run.last.depth, kMinDepth);
  EXPECT_LT(run.last_change, 150u) << history(run);
}

TEST(TunePolicy, KeepsTheBatchesAheadOfWorkersThatOnlyJustKeepUp) {
  // Five workers deliver exactly what the loop takes: busy all the time
  const Pipeline sleeper{.loop_s = 0.001};
  const TuneRun run = drive(sleeper, {2, 64, 64}, 5, 8, 50);
  EXPECT_EQ(run.changes, 0u) << history(run);
  EXPECT_NE(run.decisions.back().reason.find("settled"), std::string::npos)
      << run.decisions.back().reason;
}

TEST(TunePolicy, DoesNotOscillate) {
  // Pipelines whose best count sits between two steps, or just at the dead band's edges: each
  // level is left in each direction at most once, so the changes are few and then stop.
  for (double loop_s : {0.0005, 0.0007, 0.001, 0.0013, 0.002, 0.004}) {
    for (std::size_t start : {1u, 3u, 24u}) {
      Pipeline sleeper;
      sleeper.loop_s = loop_s;
      const TuneRun run = drive(sleeper, {2, 64, 64}, start, 4, 400);
      EXPECT_LE(run.changes, 16u) << loop_s << " from " << start << "\n" << history(run);
      EXPECT_LT(run.last_change, 200u) << loop_s << " from " << start << "\n" << history(run);
    }
  }
}

TEST(TunePolicy, ComputingWorkersStopAtTheCpuBudget) {
  // 10 ms of CPU per sample, a training loop that hardly computes
  const Pipeline decode{.read_s = 0.01, .on_cpu = 1.0, .loop_s = 0.0001};
  const TuneRun run = drive(decode, {2, 64, 64}, 1, 4);
  EXPECT_EQ(run.max_workers, 2u) << history(run);
  EXPECT_EQ(run.last.workers, 2u);
  EXPECT_NE(run.decisions.back().reason.find("CPU saturated"), std::string::npos)
      << run.decisions.back().reason;
}

TEST(TunePolicy, RanksSharingTheCoresDoNotOversubscribeThem) {
  // Two ranks on two cores: each has one core's budget and one core's worth of CPU. Started
  // with two computing workers each, the reads wait for a core (stretched): half their time
  // off the CPU, as if they waited for I/O. The run-queue delay says they did not: the tuner
  // must not double them but give one back.
  const Pipeline decode{.read_s = 0.01, .on_cpu = 1.0, .cores = 1, .loop_s = 0.0001};
  const TuneRun run = drive(decode, {1, 64, 64}, 2, 4);
  EXPECT_LE(run.max_workers, 2u) << history(run);
  EXPECT_EQ(run.last.workers, 1u) << history(run);
}

TEST(TunePolicy, ComputingWorkersOnAMachineBusyWithOthersAreNotMultiplied) {
  // Other processes leave the workers a third of a core: reads are mostly off the CPU, but
  // runnable. One more worker is tried (the budget has room), gains nothing and is undone.
  const Pipeline decode{.read_s = 0.01, .on_cpu = 1.0, .cores = 0.3, .loop_s = 0.0001};
  const TuneRun run = drive(decode, {2, 64, 64}, 1, 4);
  EXPECT_LE(run.max_workers, 2u) << history(run);
  EXPECT_EQ(run.last.workers, 1u) << history(run);
  EXPECT_LE(run.changes, 2u) << history(run);
}

TEST(TunePolicy, ProcessWorkersCountAsCoresAndStopAtThePool) {
  // The threads only wait for the processes: no CPU time of their own
  Pipeline processes{.read_s = 0.01, .on_cpu = 0.0, .loop_s = 0.0001, .worker_limit = 8};
  TuneRun run = drive(processes, {4, 64, 64}, 1, 4);
  EXPECT_EQ(run.max_workers, 4u) << history(run);  // one per core, not doubled
  processes.worker_limit = 2;
  run = drive(processes, {4, 64, 64}, 1, 4);
  EXPECT_EQ(run.max_workers, 2u) << history(run);  // the pool
}

TEST(TunePolicy, StarvedWorkersGetMoreBatchesInFlightWithinTheMemoryBudget) {
  // Enough workers, but they need 8 batches in flight to stay busy
  const Pipeline jittery{.loop_s = 0.001, .depth_needed = 8};
  TuneRun run = drive(jittery, {2, 64, 64}, 16, 1);
  EXPECT_EQ(run.decisions.front().depth, 2u) << history(run);  // depth first, not workers
  EXPECT_EQ(run.decisions.front().workers, 16u) << history(run);
  EXPECT_LT(wait_fraction(run.last), kWaitThreshold) << history(run);
  run = drive(jittery, {2, 64, 3}, 16, 1);  // the memory budget holds 4 slabs
  EXPECT_EQ(run.max_depth, 3u) << history(run);
}

TEST(TunePolicy, CountsTheMemoryBudgetInSlabsOfTheWindow) {
  const Pipeline jittery{.loop_s = 0.001, .depth_needed = 8};
  TuneLimits limits{2, 64, 64};
  limits.memory_budget = 4000;  // 4 slabs of 1000 bytes: depth 3
  TunePolicy policy(limits);
  std::size_t workers = 16, depth = 6, most = 0;
  for (int i = 0; i < 50; ++i) {
    TuneWindow w = jittery.measure(workers, depth);
    w.slab_bytes = 1000;
    const TuneDecision d = policy.decide(w);
    workers = d.workers;
    depth = d.depth;
    if (i > 0) most = std::max(most, depth);  // the first window lowers the starting depth
  }
  EXPECT_EQ(most, 3u);
  TuneWindow unknown = jittery.measure(16, 6);  // no slab size yet: nothing to count
  EXPECT_EQ(TunePolicy(limits).decide(unknown).depth, 6u);
  unknown.slab_bytes = 1000;
  EXPECT_EQ(TunePolicy(limits).decide(unknown).depth, 3u);
}

TEST(TunePolicy, LowersADepthAboveTheMemoryBudget) {
  Pipeline sleeper;
  const TuneRun run = drive(sleeper, {2, 64, 5}, 8, 32, 5);
  EXPECT_EQ(run.decisions.front().depth, 5u) << run.decisions.front().reason;
  EXPECT_LE(run.max_depth, 5u);
}

TEST(TunePolicy, AStepIsJudgedOnTheWindowAfterNextAndUndoneIfItDidNotHelp) {
  // Four workers, busy and mostly off the CPU (doubled), and the same throughput and wait
  // whatever their count: a step up cannot help.
  TuneWindow w;
  w.elapsed_s = 1;
  w.consumer_wait_s = 0.5;
  w.samples = 1000;
  w.worker_busy_s = 3.6;
  w.worker_cpu_s = 0.1;
  w.workers = 4;
  w.depth = 4;
  TunePolicy policy({2, 64, 64});
  TuneDecision d = policy.decide(w);
  ASSERT_EQ(d.workers, 8u) << d.reason;
  w.workers = 8;
  w.worker_busy_s *= 2;
  d = policy.decide(w);  // the switch-over window: not judged
  EXPECT_EQ(d.workers, 8u) << d.reason;
  EXPECT_NE(d.reason.find("settling"), std::string::npos) << d.reason;
  d = policy.decide(w);
  EXPECT_EQ(d.workers, 4u) << d.reason;
  EXPECT_NE(d.reason.find("undone"), std::string::npos) << d.reason;
  w.workers = 4;
  w.worker_busy_s /= 2;
  d = policy.decide(w);  // 8 is now the ceiling: no second try
  EXPECT_EQ(d.workers, 4u) << d.reason;
  EXPECT_NE(d.reason.find("at the most workers"), std::string::npos) << d.reason;
}

TEST(TunePolicy, NeverCrossesEitherBudget) {
  for (double on_cpu : {0.02, 0.3, 1.0}) {
    for (double cores : {1.0, 2.0, 4.0}) {
      Pipeline p;
      p.on_cpu = on_cpu;
      p.cores = cores;
      p.loop_s = 0.0002;
      p.depth_needed = 6;
      TuneLimits limits{cores, 64, 4};
      TunePolicy policy(limits);
      std::size_t workers = 1, depth = 2;
      for (int i = 0; i < 200; ++i) {
        const TuneWindow w = p.measure(workers, depth);
        const TuneDecision d = policy.decide(w);
        workers = d.workers;
        depth = d.depth;
        ASSERT_LE(depth, limits.max_depth) << d.reason;
        if (on_cpu >= 0.5) {  // computing workers: no more than the cores
          ASSERT_LE(static_cast<double>(workers), cores) << d.reason;
        }
      }
    }
  }
}

TEST(TunePolicy, WorkersWaitingForTheGilGetNoCompany) {
  // A pure-Python __getitem__: one thread at a time on the GIL
  const Pipeline python{.on_cpu = 1.0, .loop_s = 0.0001, .gil = true};
  const TuneRun run = drive(python, {4, 64, 64}, 2, 4);
  EXPECT_EQ(run.max_workers, 2u) << history(run);
}

TEST(TunePolicy, WorkersWaitingForTheGilGetNoCompanyOnAMachineBusyWithOthers) {
  // Other processes leave the GIL's holder a quarter of a core: the reads hold the GIL a
  // quarter of the time on a CPU, and it is busy all the time all the same (the holder waits
  // for a core, the other threads for the GIL).
  const Pipeline python{.on_cpu = 1.0, .cores = 0.25, .loop_s = 0.0001, .gil = true};
  const TuneRun run = drive(python, {4, 64, 64}, 2, 4);
  EXPECT_EQ(run.max_workers, 2u) << history(run);
  EXPECT_NE(run.decisions.back().reason.find("GIL is saturated"), std::string::npos)
      << run.decisions.back().reason;
}

TEST(TunePolicy, ALoopThatDidNotWaitButDidNotComputeLeavesTheWorkersTheirCores) {
  // Two process workers on two cores, 80% busy; the training loop waited 20% of the window
  // (it took batches read ahead). Whether that is over the CPU budget depends on what the loop
  // did the rest of the time: its own CPU time says.
  TuneWindow w;
  w.elapsed_s = 1.0;
  w.consumer_wait_s = 0.2;
  w.worker_busy_s = 1.6;
  w.worker_cpu_s = 0.0;  // the threads wait for the processes
  w.samples = 1000;
  w.workers = 2;
  w.depth = 4;
  w.worker_limit = 2;
  w.consumer_cpu_s = 0.05;  // taking batches and touching them
  TunePolicy idle_loop(TuneLimits{2, 64, 64});
  EXPECT_EQ(idle_loop.decide(w).workers, 2u);
  w.consumer_cpu_s = 0.8;  // a loop that computes on the CPU
  TunePolicy busy_loop(TuneLimits{2, 64, 64});
  const TuneDecision d = busy_loop.decide(w);
  EXPECT_EQ(d.workers, 1u) << d.reason;
  EXPECT_NE(d.reason.find("over the CPU budget"), std::string::npos) << d.reason;
}

TEST(TunePolicy, InlineReadingIsLeftAlone) {
  TunePolicy policy({2, 8, 64});
  TuneWindow w;
  w.elapsed_s = 1;
  w.consumer_wait_s = 0.9;
  w.depth = 4;
  const TuneDecision d = policy.decide(w);
  EXPECT_EQ(d.workers, 0u);
  EXPECT_EQ(d.depth, 4u);
}

TEST(TunePolicy, CpuShareDividesTheCoresAmongLocalRanks) {
  EXPECT_EQ(cpu_share(8, nullptr), 8.0);
  EXPECT_EQ(cpu_share(8, "2"), 4.0);
  EXPECT_EQ(cpu_share(2, "4"), 1.0);  // at least one
  EXPECT_EQ(cpu_share(8, "x"), 8.0);
  EXPECT_EQ(cpu_share(8, "0"), 8.0);
  EXPECT_EQ(local_ranks("4"), 4u);
  EXPECT_EQ(local_ranks(nullptr), 1u);
  EXPECT_EQ(local_ranks("4x"), 1u);
}

TEST(TunePolicy, AutoMayGrowToEightThreadsACoreNativelyAndThirtyTwoForPythonReads) {
  EXPECT_EQ(default_max_workers(1.0, false), 16u);
  EXPECT_EQ(default_max_workers(4.0, false), 32u);
  EXPECT_EQ(default_max_workers(1.5, false), 16u);
  EXPECT_EQ(default_max_workers(2.5, false), 20u);
  EXPECT_EQ(default_max_workers(4.0, true), 32u);
  EXPECT_EQ(default_max_workers(48.0, true), 48u);
}

TEST(TunePolicy, TheHostShareIsTheAffinityOverTheNodesRanks) {
  const HostShare h = host_share();
  EXPECT_GE(h.cores, 1u);
  EXPECT_EQ(h.cpu_share, cpu_share(h.cores, std::getenv("LOCAL_WORLD_SIZE")));
  EXPECT_EQ(h.local_ranks, local_ranks(std::getenv("LOCAL_WORLD_SIZE")));
}

Stats stats_at(int ms, std::uint64_t batches, int wait_ms, int busy_ms, int cpu_ms) {
  Stats s;
  s.workers = 2;
  s.depth = 4;
  s.elapsed = std::chrono::milliseconds(ms);
  s.batches = batches;
  s.samples = batches * 8;
  s.consumer_wait = std::chrono::milliseconds(wait_ms);
  s.worker_busy = std::chrono::milliseconds(busy_ms);
  s.worker_cpu = std::chrono::milliseconds(cpu_ms);
  return s;
}

TEST(WorkerTuner, WindowsNeedTimeAndBatchesAndRestartWhenTheConfigurationChanges) {
  WorkerTuner tuner({2, 8, 64}, false);
  EXPECT_FALSE(tuner.observe(stats_at(0, 1, 0, 0, 0), 0));       // starts the window
  EXPECT_FALSE(tuner.observe(stats_at(50, 10, 45, 100, 0), 0));  // too short
  const auto d = tuner.observe(stats_at(400, 20, 350, 800, 10), 0);
  ASSERT_TRUE(d);
  EXPECT_EQ(d->workers, 8u);  // the loop waited 87%: 4x (kMostGrowth)
  Stats s = stats_at(900, 30, 800, 1600, 20);
  s.workers = 3;  // someone else changed the count: a new window
  EXPECT_FALSE(tuner.observe(s, 0));
  Stats out;
  tuner.add_stats(out);
  EXPECT_EQ(out.tuner_changes, 1u);
  EXPECT_NE(out.tuner.find("workers 2 -> 8"), std::string::npos) << out.tuner;
}

// Until the first batch is delivered the workers start up (processes fork, the layout is
// probed): a window from then would read the start as starved workers. It starts after it.
TEST(WorkerTuner, AWindowStartsOnceABatchWasDelivered) {
  WorkerTuner tuner({2, 8, 64}, false);
  EXPECT_FALSE(tuner.observe(stats_at(0, 0, 0, 0, 0), 0));
  // 400 ms, the loop waiting, the workers hardly busy: the start-up, not a window.
  EXPECT_FALSE(tuner.observe(stats_at(400, 4, 390, 30, 10), 0));
  const auto d = tuner.observe(stats_at(800, 20, 740, 830, 20), 0);
  ASSERT_TRUE(d);
  EXPECT_EQ(d->workers, 8u);  // busy workers, not starved ones: more workers, not more depth
  EXPECT_EQ(d->depth, 4u);
}

using testing::LogCapture;

TEST(WorkerTuner, ChangesAreLoggedAtDebugLevel) {
  LogCapture log(LogLevel::debug);
  WorkerTuner tuner({2, 8, 64}, false);
  tuner.observe(stats_at(0, 1, 0, 0, 0), 0);
  ASSERT_TRUE(tuner.observe(stats_at(400, 20, 350, 800, 10), 0));
  ASSERT_EQ(log.lines().size(), 1u);
  EXPECT_NE(log.lines()[0].find("tuner: workers 2 -> 8"), std::string::npos) << log.lines()[0];
}

TEST(WorkerTuner, AFixedConfigurationIsAdvisedOnceAndNeverChanged) {
  LogCapture log(LogLevel::info);
  WorkerTuner tuner({2, 8, 64}, true);
  tuner.observe(stats_at(0, 1, 0, 0, 0), 0);
  EXPECT_FALSE(tuner.observe(stats_at(400, 20, 350, 800, 10), 0));
  EXPECT_FALSE(tuner.due());  // said once: never looks again
  ASSERT_EQ(log.lines().size(), 1u);
  EXPECT_NE(log.lines()[0].find("would change workers 2 -> 8"), std::string::npos)
      << log.lines()[0];
  Stats out;
  tuner.add_stats(out);
  EXPECT_EQ(out.tuner_changes, 0u);
  EXPECT_EQ(out.tuner, log.lines()[0]);
}

// A data set whose reads wait (5 ms each, like I/O) and a consumer that only takes batches:
// starting from one worker, the tuner adds workers, and nothing is lost or reordered; a depth
// the memory budget cannot hold is lowered.
TEST(WorkerTuner, LoaderAddsWorkersForWaitingReadsAndKeepsEveryBatch) {
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
  o.depth = 8;
  const Stats before = Loader(o).stats();
  o.memory_budget = 4 * (before.slab_bytes / before.slabs);  // room for depth 3
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
  EXPECT_LE(loader.stats().depth, 3u);
  EXPECT_GT(loader.stats().tuner_changes, 0u);
}

// The workers' run-queue delay is sampled from /proc per thread, and a retiring thread adds
// its own last part: the total never goes back, whoever comes and goes.
TEST(WorkerTuner, RunDelayOnlyGrowsAsWorkersComeAndGo) {
  SyntheticDataset::Options so;
  so.samples = 1024;  // one epoch holds all the batches taken
  so.fields = {{"x", DType::f32, {4096}}};
  LoaderOptions o;
  o.dataset = std::make_shared<SyntheticDataset>(so);
  o.batch_size = 16;
  o.workers = 4;
  Loader loader(o);
  std::chrono::nanoseconds last{0};
  std::size_t batches = 0;
  for (std::size_t workers : {1u, 3u, 0u, 2u}) {
    loader.set_workers(workers);
    for (int i = 0; i < 8; ++i) {
      ASSERT_TRUE(loader.next());
      ++batches;
      const auto now = loader.stats().worker_run_delay;
      EXPECT_GE(now, last);
      last = now;
    }
  }
  EXPECT_EQ(batches, 32u);
}

}  // namespace
}  // namespace stoker::detail
