// The front end's decisions about kinds of worker (src/tune/worker_kind.cc): pure functions,
// tested on synthetic numbers.
#include "stoker/frontend/worker_kind.h"

#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <cstdint>
#include <optional>
#include <string>

#include "tune/tuner.h"

namespace stoker::detail {
namespace {

bool contains(const std::string& text, const char* part) {
  return text.find(part) != std::string::npos;
}

TEST(WorkerKind, GilBoundReadsAreTheOnesThatKeepTheGilBusyAlone) {
  // Pure-Python reads on two threads: busy ~95%, no load.
  auto v = gil_bound(0.95, 0.95, 0.0);
  EXPECT_TRUE(v.bound);
  EXPECT_DOUBLE_EQ(v.scale, 1.0);
  // The same reads on a loaded machine: 14% unscaled, but runnable 5x as long as on a core.
  EXPECT_TRUE(gil_bound(0.14, 0.14, 0.6).bound);
  // A sleeper's reads wait for a core after each wake-up: the scale stops at kRunDelayScale.
  v = gil_bound(0.05, 0.05, 0.5);
  EXPECT_FALSE(v.bound);
  EXPECT_DOUBLE_EQ(v.scale, kRunDelayScale);
  // Work that also runs with the GIL released (cheap dicts of tensors, ColorJitter): its
  // CPU time exceeds the wall time, and it is GIL-bound all the same (no upper bound).
  EXPECT_TRUE(gil_bound(1.24, 1.24, 0.0).bound);
  EXPECT_TRUE(gil_bound(1.54, 1.54, 0.0).bound);
  // Nothing measured: as it is.
  v = gil_bound(0.02, 0.0, 0.0);
  EXPECT_FALSE(v.bound);
  EXPECT_DOUBLE_EQ(v.scale, 1.0);
  // The threshold itself.
  EXPECT_TRUE(gil_bound(kGilBusy, 1, 0).bound);
  EXPECT_FALSE(gil_bound(kGilBusy * 0.99, 1, 0).bound);
}

TEST(WorkerKind, ProcessesOnlyWithTwoCoresAndTwoThreadsAndTheReasonSaysWhy) {
  auto c = choose_worker_kind(0.95, 0.95, 0.0, false, 2, 2);
  EXPECT_TRUE(c.processes);
  EXPECT_EQ(c.reason,
            "auto: reads kept the GIL busy 95% of the time on 2 threads, 2 cores: GIL-bound, so "
            "processes");
  c = choose_worker_kind(1.4, 1.4, 0.0, true, 2, 2);
  EXPECT_TRUE(c.processes);
  EXPECT_TRUE(contains(c.reason, "whole batches made in Python, so processes"));
  c = choose_worker_kind(0.95, 0.95, 0.0, false, 2, 1);
  EXPECT_FALSE(c.processes);
  EXPECT_TRUE(contains(c.reason, "fewer than 2 cores, so threads"));
  c = choose_worker_kind(0.95, 0.95, 0.0, false, 1, 4);
  EXPECT_FALSE(c.processes);
  EXPECT_TRUE(contains(c.reason, "fewer than 2 threads, so threads"));
  c = choose_worker_kind(1.54, 1.54, 0.0, false, 2, 2);
  EXPECT_TRUE(c.processes);
  EXPECT_TRUE(
      contains(c.reason, "busy 154% of the time on 2 threads, 2 cores: GIL-bound, so processes"));
  c = choose_worker_kind(0.02, 0.02, 0.0, false, 4, 4);
  EXPECT_FALSE(c.processes);
  EXPECT_TRUE(contains(c.reason, "not GIL-bound, so threads"));
  // Waits for a core are said with the scaled share.
  c = choose_worker_kind(0.14, 0.14, 0.6, false, 2, 2);
  EXPECT_TRUE(c.processes);
  EXPECT_TRUE(contains(c.reason, "(74% counting their waits for a core)"));
}

TEST(WorkerKind, RemoteWorkersAreAskedForOnlyPastSaturatedLocalWorkers) {
  // The loop waits and the local workers are saturated: one more, up to the count.
  EXPECT_EQ(next_remote_workers(0, 2, 0.5, 0.95, std::nullopt), 1u);
  EXPECT_EQ(next_remote_workers(2, 2, 0.5, 0.95, std::nullopt), 2u);
  // The loop waits but local cores are idle (I/O, a slow storage): no remote worker helps.
  EXPECT_EQ(next_remote_workers(0, 2, 0.5, 0.3, std::nullopt), 0u);
  // The loop no longer waits: one given back; in between, no change.
  EXPECT_EQ(next_remote_workers(2, 2, 0.0, 0.95, std::nullopt), 1u);
  EXPECT_EQ(next_remote_workers(1, 2, 0.05, 0.95, std::nullopt), 1u);
  // The remote worker in use reads 90% of its time: saturated too, one more helps.
  EXPECT_EQ(next_remote_workers(1, 2, 0.5, 0.95, 0.9), 2u);
  // It idles 40% of its time while its rows travel (network-bound): one more would idle too.
  EXPECT_EQ(next_remote_workers(1, 2, 0.5, 0.95, 0.6), 1u);
}

// The loader's Stats after `seconds`, with the GIL held `gil` of it, the workers on a core
// `cpu` and waiting for one `delay` of it.
Stats at(double seconds, double gil, double cpu, double delay) {
  const auto ns = [](double s) {
    return std::chrono::nanoseconds(static_cast<std::int64_t>(s * 1e9));
  };
  Stats s;
  s.elapsed = ns(seconds);
  s.worker_lock_held = ns(gil * seconds);
  s.worker_cpu = ns(cpu * seconds);
  s.worker_run_delay = ns(delay * seconds);
  return s;
}

TEST(WorkerKind, TheChooserMeasuresFromItsFirstBatch) {
  WorkerKindChooser chooser(false);
  // The start-up (GIL idle) is left out: measuring starts at the first call.
  EXPECT_FALSE(chooser.observe(at(1, 0, 0, 0), 0, 2, 2));
  // Enough batches but too few reads: still measuring.
  for (std::size_t b = 1; b <= kKindMinBatches; ++b) {
    EXPECT_FALSE(
        chooser.observe(at(1 + static_cast<double>(b), 0.5, 0.5, 0), kKindMinReads - 1, 2, 2));
  }
  // From the first call: the GIL held 0.95 s of each second.
  Stats now = at(1, 0, 0, 0);
  now.elapsed += std::chrono::seconds(2);
  now.worker_lock_held = std::chrono::milliseconds(1900);
  now.worker_cpu = std::chrono::milliseconds(1900);
  const auto d = chooser.observe(now, 100, 2, 2);
  ASSERT_TRUE(d);
  EXPECT_TRUE(d->processes);
  EXPECT_TRUE(contains(d->reason, "busy 95% of the time on 2 threads, 2 cores"));
}

TEST(WorkerKind, OneBatchOfSlowSamplesIsEnoughEvidence) {
  // torchvision's ColorJitter pipeline: 64 samples a batch, 2 ms each on 2 threads, an epoch
  // of 4 batches. The batch after the first (64 ms) decides, not the epoch's last.
  WorkerKindChooser chooser(false);
  EXPECT_FALSE(chooser.observe(at(1, 0, 0, 0), 64, 2, 2));
  Stats now = at(1, 0, 0, 0);
  now.elapsed += std::chrono::milliseconds(64);
  now.worker_lock_held = std::chrono::milliseconds(40);
  now.worker_cpu = std::chrono::milliseconds(100);
  const auto d = chooser.observe(now, 128, 2, 2);
  ASSERT_TRUE(d);
  EXPECT_TRUE(d->processes);
  // The same batch in under kKindMinSeconds (cheap samples): more batches first.
  WorkerKindChooser quick(false);
  EXPECT_FALSE(quick.observe(at(1, 0, 0, 0), 64, 2, 2));
  EXPECT_FALSE(quick.observe(at(1.01, 0.009, 0.009, 0), 128, 2, 2));
}

// A batch-jobs chooser fed its first batch and kKindMinBatches - 1 more (one batch read each):
// the next call with enough reads decides.
void feed_batch_jobs(WorkerKindChooser& chooser) {
  EXPECT_FALSE(chooser.observe(at(1, 0, 0, 0), 1, 2, 2));
  for (std::size_t b = 1; b < kKindMinBatches; ++b) {
    EXPECT_FALSE(
        chooser.observe(at(1 + 0.01 * static_cast<double>(b), 0.01, 0.01, 0), 1 + b, 2, 2));
  }
}

// The Stats 30 ms after a fed batch-jobs chooser's first batch (at 1 s): the GIL held `gil`,
// the workers on a CPU `cpu` and the training loop `loop_cpu` of those 30 ms.
Stats batch_jobs_window(std::chrono::milliseconds gil, std::chrono::milliseconds cpu,
                        std::chrono::milliseconds loop_cpu = {}) {
  Stats s = at(1, 0, 0, 0);
  s.elapsed += std::chrono::milliseconds(30);
  s.worker_lock_held = gil;
  s.worker_cpu = cpu;
  s.consumer_cpu = loop_cpu;
  return s;
}

TEST(WorkerKind, BatchJobsDecideAfterKindMinBatchesOfWholeBatchesRead) {
  // A padding collate's batches: each read is a batch, so 3 of them are the evidence (not
  // kKindMinReads, 2 epochs of 8 batches, after which the switch cost the third).
  WorkerKindChooser chooser(true);
  feed_batch_jobs(chooser);
  const Stats now = batch_jobs_window(std::chrono::milliseconds(30), std::chrono::milliseconds(30));
  const auto d = chooser.observe(now, 1 + kKindMinBatches, 2, 2);
  ASSERT_TRUE(d);
  EXPECT_TRUE(d->processes);
  EXPECT_TRUE(contains(d->reason, "busy 100% of the time on 2 threads"));
  // One batch read fewer: still measuring.
  WorkerKindChooser fewer(true);
  EXPECT_FALSE(fewer.observe(at(1, 0, 0, 0), 1, 2, 2));
  for (std::size_t b = 1; b < kKindMinBatches; ++b) {
    EXPECT_FALSE(fewer.observe(at(1 + 0.01 * static_cast<double>(b), 0.01, 0.01, 0), 1, 2, 2));
  }
  EXPECT_FALSE(fewer.observe(now, kKindMinBatches, 2, 2));
}

TEST(WorkerKind, ProcessesAreAsFewAsTheTrainingLoopsOwnCpuLeavesUseFor) {
  using detail::processes_for;
  // A loop that spends nothing between batches: one process per core.
  auto [workers, why] = processes_for({.read = 2e-3, .step = 0.05e-3}, 2);
  EXPECT_EQ(workers, 2u);
  EXPECT_TRUE(contains(why, "so 2 worker processes")) << why;
  // A balanced loop (its step as long as a batch's reads) on 2 cores: one process feeds it as
  // fast as two, and two would take the step's core.
  std::tie(workers, why) = processes_for({.read = 2e-3, .step = 2e-3}, 2);
  EXPECT_EQ(workers, 1u);
  EXPECT_TRUE(contains(why,
                       "a batch's reads took 2.000 ms of CPU and the training loop 2.000 "
                       "ms between batches, so 1 worker process (2 would be under 10% "
                       "faster)"))
      << why;
  // A light step on 4 cores: 2 of the 4 are within 10% (max(4/2, 1, 5/4) = 2 ms against
  // max(1, 1, 1.25) = 1.25 ms: no; 3: max(1.33, 1, 1.25) = 1.33 ms, within 10% of 1.25).
  EXPECT_EQ(processes_for({.read = 4e-3, .step = 1e-3}, 4).first, 3u);
  // A hand-over the loop pays counts as its time.
  EXPECT_EQ(processes_for({.read = 2e-3, .step = 0.5e-3, .unpack = 0.6e-3}, 2).first, 2u);
  EXPECT_EQ(processes_for({.read = 2e-3, .step = 1.5e-3, .unpack = 0.6e-3}, 2).first, 1u);
}

TEST(WorkerKind, WarmProcessesAreKeptAsTheirOwnReadsNeed) {
  using detail::processes_to_keep;
  // The padding collate beside a 1.4 ms step, measured: 1.94 ms a batch on 2 threads sharing
  // the GIL (2 processes), 1.18 ms in a warm process: one of the two is enough.
  const StreamCosts threads{.read = 1.94e-3, .step = 1.375e-3};
  ASSERT_EQ(detail::processes_for(threads, 2).first, 2u);
  auto [keep, why] = processes_to_keep(threads, 1.18e-3, 2, 2);
  EXPECT_EQ(keep, 1u);
  EXPECT_EQ(why, "; warm, a process's reads took 1.180 ms of CPU a batch, so 1 of the 2 kept");
  // Without a step, both are kept, and nothing is said.
  std::tie(keep, why) = processes_to_keep({.read = 2.8e-3, .step = 0.4e-3}, 1.18e-3, 2, 2);
  EXPECT_EQ(keep, 2u);
  EXPECT_EQ(why, "");
  // Never more than were started (and measured), even if warm reads cost more.
  EXPECT_EQ(processes_to_keep({.read = 1e-3, .step = 1e-3}, 8e-3, 1, 4).first, 1u);
  EXPECT_EQ(processes_to_keep({.read = 4e-3, .step = 1e-3}, 4e-3, 3, 4).first, 3u);
}

TEST(WorkerKind, TheChooserCountsProcessesFromTheReadsAndTheLoopsCpuPerBatch) {
  // Batch jobs on 2 threads, GIL-bound; over 3 batches after the first the reads took 3 ms
  // of CPU each, and the training loop 3 ms of its own between batches: one process.
  WorkerKindChooser chooser(true);
  feed_batch_jobs(chooser);
  const Stats now = batch_jobs_window(std::chrono::milliseconds(27),
                                      std::chrono::milliseconds(9),  // 3 reads
                                      std::chrono::milliseconds(9));
  auto d = chooser.observe(now, 1 + kKindMinBatches, 2, 2);
  ASSERT_TRUE(d && d->processes);
  EXPECT_EQ(d->workers, 1u);
  EXPECT_DOUBLE_EQ(d->costs.read, 3e-3);  // what processes_to_keep starts from
  EXPECT_DOUBLE_EQ(d->costs.step, 3e-3);
  EXPECT_TRUE(contains(d->reason, "whole batches made in Python, so processes")) << d->reason;
  EXPECT_TRUE(contains(d->workers_reason,
                       "a batch's reads took 3.000 ms of CPU and the "
                       "training loop 3.000 ms"))
      << d->workers_reason;
  // The same, but 6 of the loop's 9 ms were the front end timing a hand-over: the loop's own
  // 1 ms a batch leaves room for a second process.
  WorkerKindChooser measured(true);
  feed_batch_jobs(measured);
  d = measured.observe(now, 1 + kKindMinBatches, 2, 2, 0, 0, 6e-3);
  ASSERT_TRUE(d && d->processes);
  EXPECT_EQ(d->workers, 2u);
  // Samples: a batch's reads are its samples' (batches of 4 samples of 0.5 ms each, the GIL
  // held 90% of the time), and a loop of 0.1 ms a batch: two processes.
  WorkerKindChooser samples(false);
  EXPECT_FALSE(samples.observe(at(1, 0, 0, 0), 0, 2, 2));
  Stats later = at(1, 0, 0, 0);
  for (std::size_t b = 1; b <= 4; ++b) {
    later.elapsed = std::chrono::seconds(1) + std::chrono::milliseconds(2 * b);
    later.worker_lock_held = std::chrono::microseconds(1800 * b);
    later.worker_cpu = std::chrono::milliseconds(2 * b);
    later.consumer_cpu = std::chrono::microseconds(100 * b);
    later.samples = 4 * b;
    d = samples.observe(later, 4 * b, 2, 2);
  }
  ASSERT_TRUE(d && d->processes);
  EXPECT_EQ(d->workers, 2u);
  EXPECT_TRUE(contains(d->workers_reason, "so 2 worker processes")) << d->workers_reason;
}

TEST(WorkerKind, TheRemoteTunerDecidesEveryFewBatchesFromTheStretchSinceTheLast) {
  RemoteWorkerTuner tuner;
  std::size_t due = 0;
  for (std::size_t b = 0; b < 3 * kRemoteTuneBatches; ++b) due += tuner.due() ? 1 : 0;
  EXPECT_EQ(due, 3u);
  Stats s;
  s.cpu_cores = 2;
  s.elapsed = std::chrono::seconds(10);
  EXPECT_FALSE(tuner.observe(s, 2, 0, 2));  // the first: nothing to compare with
  // Over the next 10 s the loop waited half of it, and 2 local workers were busy 1.9 cores.
  s.elapsed += std::chrono::seconds(10);
  s.consumer_wait += std::chrono::seconds(5);
  s.worker_cpu += std::chrono::seconds(19);
  auto d = tuner.observe(s, 2, 0, 2);
  ASSERT_TRUE(d);
  EXPECT_EQ(d->active, 1u);
  EXPECT_DOUBLE_EQ(d->wait, 0.5);
  EXPECT_DOUBLE_EQ(d->load, 0.95);
  // The next stretch: the remote worker idled 40% while its rows travelled (network-bound).
  s.elapsed += std::chrono::seconds(10);
  s.consumer_wait += std::chrono::seconds(5);
  s.worker_cpu += std::chrono::seconds(19);
  s.network_read += std::chrono::seconds(6);
  s.network_idle += std::chrono::seconds(4);
  d = tuner.observe(s, 2, 1, 2);
  ASSERT_TRUE(d);
  EXPECT_EQ(d->active, 1u);
}

TEST(StreamWorkers, InlineWhenTheLoopDoesNothingBetweenBatches) {
  // The cheap stream without a training step: 1.2 ms a batch read, 0.01 ms between batches.
  // One worker would only add its hand-over to the reading.
  auto c = choose_stream_workers({.read = 1.2e-3, .step = 1e-5, .pack = 0.1e-3, .unpack = 0.05e-3},
                                 2, false);
  EXPECT_EQ(c.workers, 0u);
  EXPECT_DOUBLE_EQ(c.inline_s, 1.21e-3);
  EXPECT_DOUBLE_EQ(c.worker_s, 1.3e-3);
  EXPECT_TRUE(contains(c.reason, "auto: in-line (the loop's own time between batches is below"));
  EXPECT_TRUE(contains(c.reason, "1.210 ms a batch in-line against 1.300 ms"));
}

TEST(StreamWorkers, OneWorkerProcessWhenReadingAndTheStepOverlap) {
  // A balanced loop: 2 ms read, 2 ms of training step; a hand-over of 0.1 ms each side.
  auto c = choose_stream_workers({.read = 2e-3, .step = 2e-3, .pack = 0.1e-3, .unpack = 0.1e-3}, 2,
                                 false);
  EXPECT_EQ(c.workers, 1u);
  EXPECT_DOUBLE_EQ(c.inline_s, 4e-3);
  EXPECT_DOUBLE_EQ(c.worker_s, 2.1e-3);
  EXPECT_TRUE(contains(c.reason,
                       "auto: one worker process from the next epoch (read in-line, a batch took"));
  // One core: the worker would take the loop's.
  c = choose_stream_workers({.read = 2e-3, .step = 2e-3, .pack = 0.1e-3, .unpack = 0.1e-3}, 1,
                            false);
  EXPECT_EQ(c.workers, 0u);
  EXPECT_TRUE(contains(c.reason, "fewer than 2 cores"));
}

TEST(StreamWorkers, InlineWhenAHandOverCostsMoreThanTheRead) {
  // Batches cheap to read but big to hand over: the loop's half of the hand-over exceeds the
  // read it saves.
  auto c = choose_stream_workers({.read = 0.2e-3, .step = 3e-3, .pack = 0.5e-3, .unpack = 0.3e-3},
                                 2, false);
  EXPECT_EQ(c.workers, 0u);
  EXPECT_TRUE(contains(c.reason, "a batch costs less to read than to take over"));
}

TEST(StreamWorkers, TheGainMustExceedTheModelsMargin) {
  // Overlap saves a little, less than kStreamGain of the in-line time.
  const StreamCosts small{.read = 1e-3, .step = 0.2e-3, .pack = 0.1e-3, .unpack = 0.1e-3};
  auto c = choose_stream_workers(small, 2, false);
  EXPECT_LT(c.worker_s, c.inline_s);
  EXPECT_GT(c.worker_s, (1 - kStreamGain) * c.inline_s);
  EXPECT_EQ(c.workers, 0u);
  EXPECT_TRUE(contains(c.reason, "the overlap would save under 10% of the time"));
  // On 2 cores the sum bounds it: both sides busy and a hand-over on top.
  c = choose_stream_workers({.read = 2e-3, .step = 2e-3, .pack = 1e-3, .unpack = 1e-3}, 2, false);
  EXPECT_DOUBLE_EQ(c.worker_s, 3e-3);
  EXPECT_EQ(c.workers, 1u);
}

TEST(StreamWorkers, AStreamThatShardsItselfGetsWorkersToShareTheRead) {
  // The matrix's stream on 2 cores: 4 ms a batch read, the loop idle between batches. One
  // worker only moves the read; two halve it, and the stream takes its share of each.
  const StreamCosts stream{.read = 4e-3, .step = 0.1e-3, .pack = 0.03e-3, .unpack = 0.02e-3};
  auto c = choose_stream_workers(stream, 2, true);
  EXPECT_EQ(c.workers, 2u);
  EXPECT_DOUBLE_EQ(c.worker_s, stream_batch_seconds(stream, 2, 2));
  EXPECT_NEAR(c.worker_s, 2.075e-3, 1e-12);  // the cores bound it: (4.03 + 0.12) / 2
  EXPECT_TRUE(contains(c.reason, "auto: 2 worker processes from the next epoch"));
  EXPECT_TRUE(contains(c.reason, "it asked get_worker_info(), so it takes its worker's share"));
  // Not sharded: each worker would read all of it, so one at most, which saves nothing.
  c = choose_stream_workers(stream, 2, false);
  EXPECT_EQ(c.workers, 0u);
  EXPECT_TRUE(contains(c.reason, "it never asked get_worker_info()"));
  // On 8 cores the read is spread until the loop's own side bounds it (0.12 ms): the fewest
  // workers within kStreamGain of the best.
  c = choose_stream_workers(stream, 8, true);
  EXPECT_EQ(c.workers, 8u);
  const StreamCosts stepped{.read = 4e-3, .step = 1.5e-3, .pack = 0.03e-3, .unpack = 0.02e-3};
  c = choose_stream_workers(stepped, 8, true);
  EXPECT_EQ(c.workers, 3u);  // from 3 on the loop's own 1.52 ms bounds it; 2 make 2.015 ms
  EXPECT_LE(stream_batch_seconds(stepped, 3, 8), (1 + kStreamGain) * 1.52e-3);
  EXPECT_GT(stream_batch_seconds(stepped, 2, 8), (1 + kStreamGain) * 1.52e-3);
}

TEST(StreamWorkers, OneCoreStaysInLineEvenForAShardedStream) {
  auto c = choose_stream_workers({.read = 4e-3, .step = 4e-3, .pack = 0.1e-3, .unpack = 0.1e-3}, 1,
                                 true);
  EXPECT_EQ(c.workers, 0u);
  EXPECT_TRUE(contains(c.reason, "fewer than 2 cores"));
}

TEST(StreamThreads, AStreamWhoseReadsWaitGetsWorkerThreadsThatOverlapTheWaits) {
  // 32 samples a batch, each a 250 us wait (a fetch) and 10 us of Python: 8 ms a batch, 0.3 ms
  // of it on the CPU. Eight threads overlap the waits until the GIL-held 0.4 ms (the reads' CPU
  // and the loop's step) and the hand-over bound it; two processes on 2 cores halve it.
  const StreamCosts fetch{.read = 8e-3, .step = 0.1e-3, .pack = 0.03e-3, .unpack = 0.02e-3};
  auto t = choose_stream_threads(fetch, 7.7e-3, 2, true);
  EXPECT_EQ(t.threads, 8u);
  EXPECT_NEAR(t.seconds, 1e-3 + kThreadHandover, 1e-12);
  EXPECT_TRUE(contains(t.reason, "auto: 8 worker threads from the next epoch"));
  EXPECT_TRUE(contains(t.reason, "2 worker processes: 4.075 ms, and they take starting"));
  // One core: no process would help (choose_stream_workers stays in-line), threads still do.
  t = choose_stream_threads(fetch, 7.7e-3, 1, true);
  EXPECT_EQ(t.threads, 8u);
  // Not sharded: one thread, which overlaps only the 0.1 ms step: under kStreamGain.
  t = choose_stream_threads(fetch, 7.7e-3, 2, false);
  EXPECT_EQ(t.threads, 0u);
  EXPECT_TRUE(contains(t.reason, "threads would save under 10% of the in-line time"));
}

TEST(StreamThreads, AStreamThatNeverWaitsGetsNoThreads) {
  // All of the read on the CPU, holding the GIL: threads overlap nothing, whatever the step.
  const StreamCosts cpu{.read = 4e-3, .step = 4e-3, .pack = 0.1e-3, .unpack = 0.1e-3};
  EXPECT_EQ(choose_stream_threads(cpu, 0, 2, true).threads, 0u);
  EXPECT_EQ(choose_stream_threads(cpu, 0, 8, true).threads, 0u);
  // A wait longer than the read (clock noise) counts as the whole read: one thread overlaps
  // it with the step, and more would wait on the step.
  EXPECT_EQ(choose_stream_threads(cpu, 9e-3, 2, true).threads, 1u);
}

TEST(StreamThreads, ThreadsGiveWayToWorkerProcessesTheModelPutsFaster) {
  // Half the read waits, half computes: on 8 cores, 8 processes spread the computing too
  // (0.52 ms a batch); threads stop at the GIL-held 2.1 ms.
  const StreamCosts half{.read = 4e-3, .step = 0.1e-3, .pack = 0.03e-3, .unpack = 0.02e-3};
  const auto t = choose_stream_threads(half, 2e-3, 8, true);
  EXPECT_EQ(t.threads, 0u);
  EXPECT_TRUE(contains(t.reason, "8 worker processes (0.519 ms a batch) beat threads"));
  EXPECT_EQ(choose_stream_workers(half, 8, true).workers, 8u);
}

TEST(StreamThreads, AStreamBesideALongStepTriesOneThreadThatReadsDuringIt) {
  // The main matrix's short stream beside a 0.3 ms step of torch.mm, as auto measured it: the
  // processes' model picks one, the threads' (the step holding the GIL) none.
  const StreamCosts step{.read = 0.268e-3, .step = 0.526e-3, .pack = 0.031e-3, .unpack = 0.024e-3};
  EXPECT_EQ(choose_stream_workers(step, 2, true).workers, 1u);
  EXPECT_EQ(choose_stream_threads(step, 0, 2, true).threads, 0u);
  const auto t = stream_thread_trial(step, 2, 1);
  EXPECT_EQ(t.threads, 1u) << t.reason;
  EXPECT_NEAR(t.seconds, 0.546e-3, 1e-9);  // max(read, step) + the hand-over
  EXPECT_TRUE(contains(t.reason, "auto: 1 worker thread from the next epoch, on trial"));
  EXPECT_TRUE(contains(t.reason, "if the step releases the GIL"));
  EXPECT_TRUE(contains(t.reason, "0.794 ms in-line and 0.550 ms on 1 worker process"));
  // Kept in-line by the models, it is tried too; on one core there is nothing to read on.
  EXPECT_EQ(stream_thread_trial(step, 2, 0).threads, 1u);
  EXPECT_TRUE(contains(stream_thread_trial(step, 1, 1).reason, "no thread tried: one core"));
  // With no step to speak of, a thread overlaps nothing.
  const StreamCosts bare{.read = 1.547e-3, .step = 0.087e-3, .pack = 0.035e-3, .unpack = 0.024e-3};
  const auto none = stream_thread_trial(bare, 2, 2);
  EXPECT_EQ(none.threads, 0u);
  EXPECT_TRUE(contains(none.reason, "it would save under 10% of in-line even so"));
  // Processes that spread a long read over the cores beat the one thread by far.
  const StreamCosts wide{.read = 8e-3, .step = 1e-3, .pack = 0.05e-3, .unpack = 0.05e-3};
  const auto beaten = stream_thread_trial(wide, 8, 8);
  EXPECT_EQ(beaten.threads, 0u);
  EXPECT_TRUE(contains(beaten.reason, "the processes would beat it by over 10%"));
}

TEST(StreamDepth, QueuesDoubleWhenTheLoopWaitsWhileAnotherWorkerHasBatchesReady) {
  // A packing stream: each worker yields five batches at once after tokenizing a block, so the
  // loop waits on one worker while the other holds its two batches, 20 times in 64.
  auto d = deeper_stream_depth(2, kStreamDepthWindow, 20);
  EXPECT_EQ(d.depth, 4u);
  EXPECT_TRUE(contains(d.reason, "waited for 20 of 64 batches while another worker had batches"));
  EXPECT_TRUE(contains(d.reason, "holds 4 from now on"));
  // Again in the next window while still bursty; never past kStreamMostDepth.
  EXPECT_EQ(deeper_stream_depth(4, kStreamDepthWindow, 7).depth, 8u);
  EXPECT_EQ(deeper_stream_depth(12, kStreamDepthWindow, 40).depth, kStreamMostDepth);
  EXPECT_EQ(deeper_stream_depth(kStreamMostDepth, kStreamDepthWindow, 64).depth, kStreamMostDepth);
  // A queue the memory cap held at one batch doubles from one.
  EXPECT_EQ(deeper_stream_depth(1, kStreamDepthWindow, 64).depth, 2u);
}

TEST(StreamDepth, AStreamWhoseWorkersKeepUpKeepsItsDepth) {
  // Waits with no batch ready beside them are a slow stream, not a bursty one: more depth would
  // not help (the workers' count is auto's, not this rule's).
  auto d = deeper_stream_depth(2, kStreamDepthWindow, 6);
  EXPECT_EQ(d.depth, 2u);
  EXPECT_TRUE(d.reason.empty());
  EXPECT_EQ(deeper_stream_depth(2, 0, 0).depth, 2u);
}

// A window of `batches` delivered `seconds` apart, `jitter` less in one block of
// kWindowBlock, more in the next, and so on.
Window steady(std::size_t batches, double seconds, double jitter = 0) {
  Window w;
  for (std::size_t i = 0; i < batches; ++i) {
    w.add(seconds + ((i / kWindowBlock) % 2 ? jitter : -jitter));
  }
  return w;
}

TEST(CheckedSwitch, TheShortCheapStreamIsNotWorthStartingProcessesForInItsFirstEpochs) {
  // 128 batches of 32 samples of ~2 us: read in-line a batch took 0.075 ms and the loop 0.005
  // ms between batches; the model predicts 2 worker processes at 0.050 ms a batch (it leaves
  // out the trips over their sockets, which made them slower in fact).
  const StreamCosts costs{.read = 75e-6, .step = 5e-6, .pack = 10e-6, .unpack = 10e-6};
  const StreamChoice choice = choose_stream_workers(costs, 2, true);
  ASSERT_EQ(choice.workers, 2u);
  // 3.84 ms an epoch predicted, against a start of 150 ms: not in the first epochs.
  StartVerdict v = worth_starting(costs, choice.workers, 2, 128, 1, 0.15);
  EXPECT_FALSE(v.start);
  EXPECT_TRUE(contains(v.reason,
                       "2 worker processes would save 3.840 ms an epoch of 128 "
                       "batches and starting them costs about 150 ms"));
  EXPECT_TRUE(contains(v.reason, "(3.8 ms in 1 so far)"));
  EXPECT_FALSE(worth_starting(costs, choice.workers, 2, 128, 39, 0.15).start);
  v = worth_starting(costs, choice.workers, 2, 128, 40, 0.15);  // 153.6 ms lost by the model
  EXPECT_TRUE(v.start);
  EXPECT_TRUE(contains(v.reason, "the 40 epochs read in-line lost 153.6 ms by the model"));
}

TEST(CheckedSwitch, ALongEpochStartsProcessesAfterItsFirst) {
  // The matrix's stream: 625 batches an epoch, 2 ms a batch saved: 1.25 s lost in epoch 1.
  const StreamCosts stream{.read = 4e-3, .step = 0.1e-3, .pack = 0.03e-3, .unpack = 0.02e-3};
  const StreamChoice choice = choose_stream_workers(stream, 2, true);
  ASSERT_EQ(choice.workers, 2u);
  EXPECT_TRUE(worth_starting(stream, choice.workers, 2, 625, 1, 0.15).start);
}

TEST(CheckedSwitch, AWindowIsMeasuredUntilItHasEnoughBatchesAndSeconds) {
  const Window before = steady(100, 79e-6);
  // 16 batches of 0.142 ms are 2.3 ms: short of kCheckMinSeconds, pooled on over epochs.
  SwitchCheck c = check_switch(before, steady(16, 142e-6), "in-line", "2 worker processes");
  EXPECT_EQ(c.verdict, SwitchVerdict::measuring);
  EXPECT_TRUE(c.reason.empty());
  // Slow batches: the seconds are there, the batches not yet.
  c = check_switch(before, steady(kCheckMinBatches - 1, 10e-3), "in-line", "1 worker process");
  EXPECT_EQ(c.verdict, SwitchVerdict::measuring);
  EXPECT_EQ(check_switch(Window{}, steady(1000, 1e-3), "in-line", "x").verdict,
            SwitchVerdict::measuring);
}

TEST(CheckedSwitch, TheShortCheapStreamGoesBackInLineAndTheReasonNamesBothRates) {
  // In-line 403k samples/s (batches of 32 every 0.079 ms), 2 processes 226k (0.142 ms).
  const Window before = steady(127, 79e-6, 2e-6);
  const std::size_t enough = static_cast<std::size_t>(kCheckMinSeconds / 142e-6) + 1;
  const SwitchCheck c =
      check_switch(before, steady(enough, 142e-6, 5e-6), "in-line", "2 worker processes");
  EXPECT_EQ(c.verdict, SwitchVerdict::go_back);
  EXPECT_TRUE(contains(c.reason,
                       "back to in-line: 2 worker processes delivered a batch every "
                       "0.142 ms over"));
  EXPECT_TRUE(contains(c.reason, "in-line every 0.079 ms over 127"));
  EXPECT_TRUE(contains(c.reason, "(1.80x the time, beyond the noise of 5%)"));
}

TEST(CheckedSwitch, PaddingWithAShortStepGoesBackToTheThreadItLeft) {
  // The padding collate beside a 0.8 ms training step: 1 thread delivered a batch every 1.6 ms,
  // the 2 processes auto moved to every 2.08 ms (0.77 of the thread's rate).
  const Window before = steady(32, 1.6e-3, 0.1e-3);
  const SwitchCheck c =
      check_switch(before, steady(32, 2.08e-3, 0.15e-3), "1 worker thread", "2 worker processes");
  EXPECT_EQ(c.verdict, SwitchVerdict::go_back);
  EXPECT_TRUE(contains(c.reason,
                       "back to 1 worker thread: 2 worker processes delivered a batch "
                       "every 2.080 ms over 32 batches, 1 worker thread every 1.600 ms "
                       "over 32 (1.30x the time"));
}

TEST(CheckedSwitch, ASwitchThatDeliveredMoreIsKept) {
  // GIL-bound reads beside a 34 ms step: 1 thread a batch every 40 ms, 2 processes 36.8 ms.
  const SwitchCheck c = check_switch(steady(16, 40e-3, 2e-3), steady(32, 36.8e-3, 2e-3),
                                     "1 worker thread", "2 worker processes");
  EXPECT_EQ(c.verdict, SwitchVerdict::keep);
  EXPECT_TRUE(contains(c.reason,
                       "kept 2 worker processes: 2 worker processes delivered a batch "
                       "every 36.800 ms over 32 batches, 1 worker thread every 40.000 "
                       "ms over 16 (0.92x the time: not slower by over 5%)"));
}

TEST(CheckedSwitch, ALossUnderFivePercentIsKeptWhateverTheNoise) {
  SwitchCheck c =
      check_switch(steady(100, 1e-3), steady(100, 1.04e-3), "in-line", "1 worker process");
  EXPECT_EQ(c.verdict, SwitchVerdict::keep);
  EXPECT_TRUE(contains(c.reason, "(1.04x the time: not slower by over 5%)"));
  c = check_switch(steady(32, 1e-3, 1e-3), steady(32, 1.03e-3, 1e-3), "in-line", "x");
  EXPECT_EQ(c.verdict, SwitchVerdict::keep);
}

TEST(CheckedSwitch, ALossWithinTheNoiseIsMeasuredOnThenJudgedOnTheMeans) {
  // 10% slower, but blocks of batches that spread by +-1 ms: twice the standard error of the
  // difference (~1.5 ms) is more than the 0.1 ms lost, so the window grows.
  const Window before = steady(32, 1e-3, 1e-3);
  Window after = steady(48, 1.1e-3, 1e-3);
  EXPECT_GT(2 * std::hypot(before.error(), after.error()), 0.1e-3);
  SwitchCheck c = check_switch(before, after, "in-line", "1 worker process");
  EXPECT_EQ(c.verdict, SwitchVerdict::measuring);
  // Still within the noise after kCheckMostWindows windows: back, on the means.
  after = steady(kCheckMostWindows * kCheckMinBatches, 1.1e-3, 1e-3);
  EXPECT_GT(2 * std::hypot(before.error(), after.error()), 0.1e-3);
  c = check_switch(before, after, "in-line", "1 worker process");
  EXPECT_EQ(c.verdict, SwitchVerdict::go_back);
  EXPECT_TRUE(contains(c.reason,
                       "over 128 batches, in-line every 1.000 ms over 32 (1.10x the "
                       "time after 4 windows, within the noise of"));
  EXPECT_TRUE(contains(c.reason, "but slower by over 5%)"));
  // The same loss measured steadily is beyond the noise in one window.
  c = check_switch(steady(32, 1e-3), steady(48, 1.1e-3), "in-line", "1 worker process");
  EXPECT_EQ(c.verdict, SwitchVerdict::go_back);
  EXPECT_TRUE(contains(c.reason, "(1.10x the time, beyond the noise of 5%)"));
}

TEST(CheckedSwitch, AFewBatchesBeforeTakeTheNewSettingsSpreadAndAreNotJudgedOnTheMeansAlone) {
  // The engine pipeline's threads: 3 batches measured before auto moved to processes.
  const Window before = steady(3, 1e-3);
  EXPECT_EQ(before.error(), 0);
  // 10% slower, blocks spreading by +-0.3 ms: the threads' 3 batches are taken to spread as
  // much a batch, sqrt(32 / 3) times the processes' standard error: within the noise.
  Window after = steady(32, 1.1e-3, 0.3e-3);
  EXPECT_NEAR(before_error(before, after),
              after.error() / after.mean() * std::sqrt(32.0 / 3.0) * before.mean(), 1e-12);
  EXPECT_EQ(check_switch(before, after, "2 worker threads", "2 worker processes").verdict,
            SwitchVerdict::measuring);
  // After kCheckMostWindows windows, still within it: measured on, not left on 3 batches.
  after = steady(kCheckMostWindows * kCheckMinBatches, 1.1e-3, 0.3e-3);
  EXPECT_EQ(check_switch(before, after, "2 worker threads", "2 worker processes").verdict,
            SwitchVerdict::measuring);
  // A loss beyond it goes back at once.
  const SwitchCheck c =
      check_switch(before, steady(32, 2e-3, 0.05e-3), "2 worker threads", "2 worker processes");
  EXPECT_EQ(c.verdict, SwitchVerdict::go_back);
  EXPECT_TRUE(contains(c.reason, "2 worker threads every 1.000 ms over 3 (2.00x the time"));
  // A window of its own keeps its own error.
  EXPECT_EQ(before_error(steady(32, 1e-3, 1e-3), after), steady(32, 1e-3, 1e-3).error());
}

TEST(CheckedSwitch, TheCostModelLearnsTheHandOverFromWhatTheSwitchDelivered) {
  // The short cheap stream: the model put 2 processes at 0.050 ms a batch; they delivered one
  // every 0.142 ms. The hand-over that explains it: 0.092 ms more a batch on each side.
  const StreamCosts costs{.read = 75e-6, .step = 5e-6, .pack = 10e-6, .unpack = 10e-6};
  EXPECT_NEAR(stream_batch_seconds(costs, 2, 2), 50e-6, 1e-12);
  const StreamCosts learned = learn_handover(costs, 2, 2, 142e-6);
  EXPECT_NEAR(stream_batch_seconds(learned, 2, 2), 142e-6, 1e-12);
  EXPECT_NEAR(learned.pack, 102e-6, 1e-12);
  EXPECT_NEAR(learned.unpack, 102e-6, 1e-12);
  EXPECT_EQ(learned.read, costs.read);
  EXPECT_EQ(learned.step, costs.step);
  // With it, the model no longer predicts a saving: in-line.
  EXPECT_EQ(choose_stream_workers(learned, 2, true).workers, 0u);
  // Delivered as fast as predicted, or faster: nothing learned.
  const StreamCosts same = learn_handover(costs, 2, 2, 40e-6);
  EXPECT_EQ(same.pack, costs.pack);
  EXPECT_EQ(same.unpack, costs.unpack);
  // A training step's side bound the time (one process beside a 1 ms step): the loop's own
  // hand-over is what grew.
  const StreamCosts stepped{.read = 0.8e-3, .step = 1e-3, .pack = 20e-6, .unpack = 20e-6};
  const StreamCosts l = learn_handover(stepped, 1, 2, 1.2e-3);
  EXPECT_NEAR(stream_batch_seconds(l, 1, 2), 1.2e-3, 1e-12);
  EXPECT_NEAR(l.unpack, 0.2e-3, 1e-12);
}

TEST(CheckedSwitch, AWindowIsLongestAtItsMostWindowsOfBatchesAndSeconds) {
  EXPECT_FALSE(steady(kCheckMostWindows * kCheckMinBatches - 1, 1).longest());
  EXPECT_TRUE(steady(kCheckMostWindows * kCheckMinBatches, 1).longest());
  // 128 batches of 0.1 ms are 12.8 ms: short of 4 x kCheckMinSeconds.
  EXPECT_FALSE(steady(kCheckMostWindows * kCheckMinBatches, 0.1e-3).longest());
  EXPECT_TRUE(steady(1000, 0.1e-3).longest());
}

TEST(CheckedSwitch, TheStandardErrorOfAWindowIsTheSpreadOfItsBlocksMeans) {
  Window w;
  EXPECT_EQ(w.error(), 0);
  for (std::size_t i = 0; i < kWindowBlock; ++i) w.add(1);
  EXPECT_EQ(w.error(), 0);  // one block: no spread yet
  for (std::size_t i = 0; i < kWindowBlock; ++i) w.add(3);
  // Block means 1 and 3: mean 2, sample variance 2, standard error 1.
  EXPECT_DOUBLE_EQ(w.mean(), 2);
  EXPECT_DOUBLE_EQ(w.error(), 1);
  // Bursts inside a block (a queue drained, then a wait) do not count as spread.
  Window bursts;
  for (std::size_t i = 0; i < 4 * kWindowBlock; ++i) bursts.add(i % kWindowBlock ? 0 : 8);
  EXPECT_DOUBLE_EQ(bursts.mean(), 1);
  EXPECT_DOUBLE_EQ(bursts.error(), 0);
}

// A setting's epochs as it delivered them: `epochs` of `batches` each, the first one's
// `cold` seconds a batch, the later ones' `warm`, each with `jitter` (as steady()).
SettingWindows epochs_of(std::size_t epochs, std::size_t batches, double cold, double warm,
                         double jitter = 0) {
  SettingWindows s;
  for (std::size_t e = 0; e < epochs; ++e) {
    for (std::size_t i = 0; i < batches; ++i) {
      s.add((e ? warm : cold) + ((i / kWindowBlock) % 2 ? jitter : -jitter));
    }
    s.epoch_end();
  }
  return s;
}

TEST(WarmWithWarm, ProcessesSlowerThanWarmInLineGoBackWhereColdInLineLookedSlower) {
  // The `stream 1us 0.1s` row's shape: in-line's first epoch cold (0.150 ms a batch), its
  // second warm (0.079 ms); 2 processes deliver one every 0.100 ms. Over both in-line epochs
  // (0.115 ms a batch) the processes look faster; against in-line's warm epoch they are not.
  const SettingWindows inline_ = epochs_of(2, 128, 150e-6, 79e-6, 2e-6);
  const Window processes = steady(256, 100e-6, 2e-6);
  ASSERT_EQ(check_switch(inline_.all, processes, "in-line", "2 worker processes").verdict,
            SwitchVerdict::keep);
  const SwitchCheck c = check_switch(inline_, processes, "in-line", "2 worker processes");
  EXPECT_EQ(c.verdict, SwitchVerdict::go_back);
  EXPECT_TRUE(contains(c.reason,
                       "back to in-line: 2 worker processes delivered a batch every 0.100 ms "
                       "over 256 batches, in-line every 0.079 ms over 128"));
  EXPECT_TRUE(contains(c.reason,
                       "in-line measured from its second epoch on (128 batches), its first "
                       "(cold) left out"));
}

TEST(WarmWithWarm, ProcessesFasterThanWarmInLineAreKept) {
  // The converse: in-line warm at 0.120 ms a batch, the processes at 0.100: kept.
  const SettingWindows inline_ = epochs_of(2, 128, 150e-6, 120e-6, 2e-6);
  const SwitchCheck c =
      check_switch(inline_, steady(256, 100e-6, 2e-6), "in-line", "2 worker processes");
  EXPECT_EQ(c.verdict, SwitchVerdict::keep);
  EXPECT_TRUE(contains(c.reason, "in-line every 0.120 ms over 128"));
}

TEST(WarmWithWarm, ASettingLeftAfterOneEpochIsComparedOverAllItsBatches) {
  // One in-line epoch of 625 batches (a long epoch: the processes start after it): nothing
  // warm to compare with, so all of it.
  const SettingWindows one = epochs_of(1, 625, 4e-3, 4e-3);
  EXPECT_FALSE(one.warm_enough());
  EXPECT_EQ(one.compared().batches, 625u);
  const SwitchCheck c = check_switch(one, steady(64, 2.1e-3), "in-line", "2 worker processes");
  EXPECT_EQ(c.verdict, SwitchVerdict::keep);
  EXPECT_TRUE(contains(c.reason, "in-line measured over its first epoch too (0 batches after it"));
  // A second epoch of fewer than kCheckMinBatches batches is not yet enough on its own.
  const SettingWindows short_second = epochs_of(2, kCheckMinBatches - 1, 1e-3, 1e-3);
  EXPECT_EQ(short_second.compared().batches, 2 * (kCheckMinBatches - 1));
}

TEST(InlineTrial, CheapGilBoundSamplesTryInLineAfterTheProcessesTheyWereMovedTo) {
  // The headline's cheap dict samples, batches of 256: the reads took 0.579 ms of CPU a batch
  // on the threads, the loop 0.018 ms between batches; 2 processes delivered one every 0.684.
  const InlineTrial t =
      inline_trial(0.579e-3, 0.018e-3, steady(32, 0.684e-3, 0.05e-3), "2 worker processes");
  EXPECT_TRUE(t.trial);
  EXPECT_NEAR(t.inline_s, 0.597e-3, 1e-12);
  EXPECT_TRUE(contains(t.reason,
                       "in-line tried: the model's 0.597 ms a batch in-line (the reads' 0.579 ms "
                       "of CPU on the threads, the loop's 0.018 ms between batches) against the "
                       "0.684 ms 2 worker processes delivered one over 32"));
}

TEST(InlineTrial, ProcessesThatOverlapTheReadsWithALongStepAreNotLeft) {
  // GIL-bound reads of 20 ms a batch beside a 34 ms step (a GPU's, wall time): in-line would
  // take 54 ms a batch, the processes deliver one every 36.8.
  EXPECT_FALSE(inline_trial(20e-3, 34e-3, steady(32, 36.8e-3), "2 worker processes").trial);
  // Heavy reads, no step: 2 processes halve them, in-line cannot.
  EXPECT_FALSE(inline_trial(10e-3, 0, steady(32, 5.2e-3), "2 worker processes").trial);
}

TEST(InlineTrial, AGainWithinTheSwitchNoiseOrNothingMeasuredIsNotTried) {
  // 3% faster by the model: not worth a window on it.
  const InlineTrial t = inline_trial(0.97e-3, 0, steady(32, 1e-3), "1 worker thread");
  EXPECT_FALSE(t.trial);
  EXPECT_TRUE(contains(t.reason, "in-line not tried: the model's 0.970 ms a batch"));
  EXPECT_FALSE(inline_trial(0.1e-3, 0, Window{}, "1 worker thread").trial);
}

}  // namespace
}  // namespace stoker::detail
