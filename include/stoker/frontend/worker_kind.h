// The two decisions about kinds of worker that the Python front end takes while a loader
// runs, as pure functions beside the tuner's policy (no clocks, no threads; tested with
// synthetic numbers in tests/worker_kind_test.cc, and called from python/stoker/loader/
// worker_choice.py and stream_pipeline.py, which only measure):
//   - worker_type='auto': threads, or worker processes for reads that the GIL serializes,
//     decided once from the first batches read on threads;
//   - num_workers='auto' with remote=: how many remote workers to use, one more or one fewer
//     every kRemoteTuneBatches batches;
//   - after a switch, whether what it delivered is kept or left (check_switch), and what the
//     cost model learns from it (learn_handover);
//   - once settled with GIL-bound reads, whether reading in-line is worth a trial
//     (inline_trial), checked as a switch is.
//
// Installed for front ends, unstable (include/stoker/frontend/README.md).
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <utility>

#include "stoker/stats.h"

namespace stoker::detail {

// worker_type='auto' measures reads from the first batch handed out (the start-up is left
// out) over at least this many more batches, or one more batch if it took kKindMinSeconds,
// and this many samples (batch jobs: reads of whole batches, kKindMinBatches of them): long
// enough for the threads to meet at the GIL, short next to an epoch, and early in it, so that
// the worker processes start, and pay their start-up, in the epoch that decided (a data set of
// 4 batches of slow samples decided at its last batch, and the next epoch paid the start).
inline constexpr std::size_t kKindMinBatches = 3;
inline constexpr std::size_t kKindMinReads = 16;
inline constexpr double kKindMinSeconds = 0.05;

// The reads keep the GIL busy (CPU time of the worker threads while they hold it, over wall
// time) for at least this share of the time: GIL-bound, so processes. Pure-Python
// __getitem__s on two threads keep it busy ~95% of the time (measured on a 2-core machine),
// cheap Python samples ~55-125% (their torch ops run with the GIL released, and that time
// counts too); one that sleeps or waits for I/O ~1-3%.
// Other processes competing for the cores take CPU time, not GIL time: a thread that holds the
// GIL while it waits for a core keeps the others out all the same. So the bound is checked on
// the CPU time scaled by the share of their runnable time the reading threads got a core (CPU
// time plus run-queue delay over CPU time), at most kRunDelayScale (tuner.h): a sleeper's
// reads wait for a core after each wake-up, and the scale must not make their 1-5% look like
// a busy GIL.
// No upper bound: work that also runs with the GIL released (torch ops, PIL, numpy), whose
// threads' CPU time exceeds the wall time, still serialises its Python at the GIL, and worker
// processes ran it faster wherever it was measured, side by side on 2 cores: per sample,
// cheap dicts (busy 55-125%) 1.75x, torchvision's ColorJitter pipeline (154%) 1.3x,
// torch.randn per sample (97-100%) 2.0x (docs/BENCHMARKS.md, 2026-11-27); on the batch path
// (bench/worker_kinds.py) a padding collate (80-140%) 2.0x, per-sample randn stacked (106%)
// 1.7x, a tensor indexed and stacked (25%) 1.2x. An upper bound of 125% sent the first two to
// threads whenever a measurement crossed it.
inline constexpr double kGilBusy = 0.4;

struct GilVerdict {
  bool bound = false;  // GIL-bound
  double scale = 1;    // applied to `busy` for the threads' waits for a core
};
// Whether reads that kept the GIL busy `busy` of the wall time are GIL-bound, given the
// worker threads' CPU time `on_cpu` and run-queue delay `delayed` over the same time.
GilVerdict gil_bound(double busy, double on_cpu, double delayed);

// Per batch: the CPU time of its reads, the training loop's own between batches, a hand-over's
// to the worker (pack) and to the loop (unpack); seconds.
struct StreamCosts {
  double read = 0;
  double step = 0;
  double pack = 0;
  double unpack = 0;
};

struct KindChoice {
  bool processes = false;
  bool gil_bound = false;  // the reads' verdict (an in-line trial is for GIL-bound reads only)
  std::string reason;      // "auto: reads kept the GIL busy 95% of the time on 2 threads, ..."
  // With processes, WorkerKindChooser's count for them (processes_for) and why: what a front
  // end starts when the count is its to choose (num_workers='auto').
  std::size_t workers = 0;
  std::string workers_reason;
  // Per batch, measured on the threads (read: their CPU; step: the loop's): what the count
  // was decided from (processes_to_keep takes them), and an in-line trial's prediction.
  StreamCosts costs;
};
// worker_type='auto' once measured: `threads` reading on `cores` cores; `whole_batches`: the
// reads are batch jobs (the reason says so).
KindChoice choose_worker_kind(double busy, double on_cpu, double delayed, bool whole_batches,
                              std::size_t threads, std::size_t cores);

// worker_type='auto' while the first batches are read on threads: fed the loader's Stats
// after each batch handed out, with the samples read on threads so far (`reads`), it measures
// from the first call on (the start-up is left out) and decides once, when it has seen
// kKindMinBatches more batches (or one over kKindMinSeconds) and kKindMinReads more reads. The
// GIL's busy share is Stats::worker_lock_held over Stats::elapsed, both over that stretch.
class WorkerKindChooser {
 public:
  explicit WorkerKindChooser(bool whole_batches) : whole_batches_(whole_batches) {}
  // None while measuring. `threads` reading on `cores` cores; `pack`, `unpack`: a batch's
  // hand-over to the training process, seconds (batch jobs'; a sample's row goes straight into
  // the shared slab). A choice of processes says how many (KindChoice::workers, processes_for:
  // the reads' CPU time per batch and the training loop's over the same batches) and why.
  // `measuring`: CPU seconds the training loop's thread spent measuring for it (timing the
  // hand-over), left out of the loop's own.
  std::optional<KindChoice> observe(const Stats& stats, std::uint64_t reads, std::size_t threads,
                                    std::size_t cores, double pack = 0, double unpack = 0,
                                    double measuring = 0);

 private:
  bool whole_batches_;
  std::size_t batches_ = 0;
  std::optional<Stats> first_;
  std::uint64_t first_reads_ = 0;
};

// A stream (an iterable data set) on num_workers='auto' and worker_type='auto': every worker
// iterates its own copy, so a stream that does not shard itself by get_worker_info() would be
// read once per worker. Epoch 1 runs in-line and is measured, per batch: `read`, the loop's
// time making a batch; `step`, its time between batches (the training step: the consumer's
// own CPU counts); `pack` and `unpack`, a hand-over of one of those batches timed on its own
// code (the worker writes it into a shared-memory arena, the loop maps it:
// stoker/workers/arena.py); and whether the stream asked get_worker_info() as it began (torch's
// documented way for a stream to take its worker's share), which allows `max_workers` (the
// cores) workers, else one at most. In-line a batch costs read + step; with w workers each
// makes every w-th batch, the loop and the workers overlap, each side paying its half of the
// hand-over, and the cores bound the sum: max((read + pack) / w, step + unpack, (read + pack +
// step + unpack) / cores). The fewest workers within kStreamGain of the best count are taken,
// and only when they save at least kStreamGain of the in-line time: the model leaves out the
// reply's trip over the worker's socket and the producer threads' wake-ups (a few tens of
// microseconds a batch), and a saving below it is not worth a process.
inline constexpr double kStreamGain = 0.1;
// Measured over at least this many batches of epoch 1 after its first (the start-up).
inline constexpr std::size_t kStreamMinBatches = 8;

struct StreamChoice {
  std::size_t workers = 0;  // 0: in-line, else that many worker processes
  double inline_s = 0;      // the model's seconds per batch, in-line and with `workers`
  double worker_s = 0;      // (with one worker when in-line is chosen)
  std::string reason;       // "auto: in-line (a batch costs less to read than to take over; ...)"
};
// The model's seconds per batch in-line (the read and the step, one after the other), and with
// `workers` worker processes (>= 1) on `cores` cores.
double stream_inline_seconds(const StreamCosts& costs);
double stream_batch_seconds(const StreamCosts& costs, std::size_t workers, std::size_t cores);
// How many worker processes auto starts when it moves reads to them, from what the reads
// and the training loop cost per batch (`costs`: `read`, the CPU time of the reads making one
// batch; `step`, the loop's own CPU time between batches; `pack`, `unpack`, a batch's
// hand-over, as a stream's): the training loop competes with the processes for the cores,
// so a batch takes stream_batch_seconds() with w processes, and the fewest within kStreamGain
// of one per core are taken (a process more for less is a core taken from the training step;
// a balanced loop, its step as long as a batch's reads, needs one). Returns the count and the
// reason's clause.
std::pair<std::size_t, std::string> processes_for(const StreamCosts& costs, std::size_t cores);
// After the `started` worker processes' warm-up (batch jobs: python/stoker/workers/warming.py),
// how many to keep: processes_for() again with `warm_read`, the CPU time a warm process took
// for a batch, in place of the threads' measurement (costs.read). Threads that share the GIL
// pay its hand-offs and each other's cache misses in their CPU time: a padding collate's batch
// took 1.9-4.3 ms of CPU on 2 threads and 0.7-1.5 ms in a warm process (docs/BENCHMARKS.md,
// 2026-11-29), and counted on the threads it started 2 processes beside a 1-1.8 ms training
// step where 1 ran 12-16% faster. Never more than `started` (only they were measured).
// Returns the count and the reason's clause ("" when all are kept).
std::pair<std::size_t, std::string> processes_to_keep(const StreamCosts& costs, double warm_read,
                                                      std::size_t started, std::size_t cores);

// The setting for epoch 2 on, `cores` the cores of this rank's share; `shards`: the stream
// asked get_worker_info() (so up to `cores` workers, else 1).
StreamChoice choose_stream_workers(const StreamCosts& costs, std::size_t cores, bool shards);

// Worker threads for a stream whose reads wait (a fetch over the network, a file's read, a
// sleep: the reading thread off the CPU for `read_wait` of a batch's `read`). Threads start at
// once (no process to spawn: nothing for worth_starting to win back) and hand a batch over by a
// queue (no copy), but share the GIL: taken as held for all of a read's CPU time and all of the
// loop's step, a batch on w threads costs max(read - read_wait + step, read / w) plus
// kThreadHandover; a stream that never waits gains nothing from them. The fewest threads within
// kStreamGain of kStreamMostThreads (one when the stream does not shard itself) are taken
// where they save kStreamGain of the in-line time and come within kStreamGain of the worker
// processes' model (choose_stream_workers), which they then replace; checked after the switch
// as processes are (check_switch).
inline constexpr std::size_t kStreamMostThreads = 8;
inline constexpr double kThreadHandover = 20e-6;
struct StreamThreads {
  std::size_t threads = 0;  // 0: not threads (choose_stream_workers decides)
  double seconds = 0;       // the model's seconds a batch on them
  std::string reason;       // "auto: 4 worker threads from the next epoch (...)" or why not
};
StreamThreads choose_stream_threads(const StreamCosts& costs, double read_wait, std::size_t cores,
                                    bool shards);

// A trial of one worker thread where the models leave a stream in-line, for good or for now
// (`workers` worker processes not yet worth their start: worth_starting).
// choose_stream_threads takes the loop's step as holding the GIL all along; a training step of
// torch operations releases it for most of its time, and then one thread reads the next batch
// while the step runs: a batch costs max(read, step) + kThreadHandover, with no process to
// start and no batch to copy. Where that saves kStreamGain of the in-line time, comes within
// kStreamGain of the processes' model (stream_batch_seconds) and a second core is there, auto
// tries one thread from the next epoch, checked against in-line's measured rate as any switch
// is (check_switch); a step that holds the GIL costs one measuring window, then the stream is
// back in-line and the choice goes on without threads. Not instead of processes worth their
// start: beside a 2 ms step of torch.mm, a stream's 1 ms reads on one thread delay the step's
// every return to the GIL, and it ran at 0.77-1.0 of one process (docs/BENCHMARKS.md,
// 2026-12-04); a short stream's 0.14 ms reads beside a 0.4 ms step ran 1.15-1.23x in-line.
StreamThreads stream_thread_trial(const StreamCosts& costs, std::size_t cores, std::size_t workers);

// A stream's workers each fill a queue of `depth` batches and the training loop takes from them
// in turn, so a worker whose batches come in bursts (a block of documents tokenized and packed
// at once, a shuffle buffer refilled) stalls the loop while the others sit with full queues,
// idle. Over a window of kStreamDepthWindow batches taken, `blocked` counts the batches the loop
// waited for while another worker had batches ready: from kStreamBlockedShare of the window on,
// each queue doubles (at most kStreamMostDepth; the memory cap may still hold it lower). Only
// where the user left prefetch_factor to stoker.
inline constexpr std::size_t kStreamDepthWindow = 64;
inline constexpr double kStreamBlockedShare = 0.1;
inline constexpr std::size_t kStreamMostDepth = 16;
struct StreamDepth {
  std::size_t depth = 0;  // each worker's queue from now on
  std::string reason;     // why it grew; empty when it did not
};
StreamDepth deeper_stream_depth(std::size_t depth, std::size_t batches, std::size_t blocked);

// Starting worker processes is paid once (spawning them, importing the stream's modules,
// unpickling it, its first iter()): a short run does not win it back. Auto starts them only
// when the saving the model predicts, over the epochs read in-line so far, reaches that cost
// (a ski-rental rule: it never pays more than twice what the better choice in hindsight would
// have, however many epochs follow), else it reads the next epoch in-line and asks again.
// kProcessStartSeconds: the first epoch's first batch's wait over a later epoch's, with 1 or 2
// worker processes over a stream of small tensors (fork), the median of six starts on a busy
// 2-core machine: 24-211 ms (docs/BENCHMARKS.md, 2026-12-02).
inline constexpr double kProcessStartSeconds = 0.08;
// While a stream's choice is first measured, its worker processes may start in the
// background: forked mid-epoch (from the training loop's thread, between two in-line batches),
// they start up (a forked worker's set-up, worker_init_fn) while that epoch goes on in-line,
// and the stream moves to them at the first epoch boundary at which all of them answered;
// processes started and never used are stopped with the loader. What the training loop still
// pays is the forks themselves and the start-up's CPU beside it on a busy machine:
// kBackgroundStartSeconds, the ski-rental rule's start cost then (python/stoker/loader/
// stream_pipeline.py, _Choice.early). Measured: the forks of 2 worker processes from a training
// process that imported torch, on the loop's thread, 18-29 ms, median 23 (8 starts, `nice -n 19` on
// a shared 2-core machine, load 2.1, 2026-12-03); both answered 36-51 ms after the first fork.
inline constexpr double kBackgroundStartSeconds = 0.025;

struct StartVerdict {
  bool start = false;
  std::string reason;  // the clause: "... would save 1.2 ms an epoch; starting them costs ..."
};
// `workers`: choose_stream_workers' count (> 0) for `costs` on `cores`; `batches_per_epoch`,
// `epochs`: as read in-line so far; `start_s`: what starting the processes costs
// (kProcessStartSeconds).
StartVerdict worth_starting(const StreamCosts& costs, std::size_t workers, std::size_t cores,
                            double batches_per_epoch, std::size_t epochs, double start_s);

// Measure after deciding. After a switch (a stream moved from in-line to worker processes;
// the engine pipeline's reads moved from threads to worker processes, python/stoker/loader/
// engine_pipeline.py),
// the delivered time per batch over a window of the new setting is compared with the one
// measured before it: not slower by more than kSwitchNoise, the new one is kept; slower by
// more than that and by more than twice the standard error of the difference of the two
// means, the loader goes back; slower within that noise, the window grows, up to
// kCheckMostWindows windows, and then goes back on the means alone (a loaded machine's stalls
// made the noise of one window 68% where the processes took 1.5x the time). A window is at
// least kCheckMinBatches batches and kCheckMinSeconds, pooled across epochs when they are
// shorter; a setting left is not tried again.
inline constexpr double kSwitchNoise = 0.05;
inline constexpr std::size_t kCheckMinBatches = 32;
inline constexpr double kCheckMinSeconds = 0.02;
inline constexpr std::size_t kCheckMostWindows = 4;
// The engine pipeline's worker processes (per sample: no warm-up the loop waits for) start
// cold, after the move: the batches delivered in this long after it are not measured (their
// start, which kProcessStartSeconds measured at 24-211 ms for 1 or 2 forked processes, is
// paid once; counted, it made 2 processes of cheap pure-Python reads measure 3.9 ms a batch
// over their first 40 where the threads had taken 0.7).
inline constexpr double kCheckStartSeconds = 0.25;
// Batches from workers come in bursts (a queue drained, then a wait), so their times are not
// independent; blocks of kWindowBlock of them nearly are, and the standard error is taken
// over the blocks' means (the batch-means method).
inline constexpr std::size_t kWindowBlock = 8;

// Batches delivered to the training loop under one setting: the seconds between consecutive
// ones (a read and a step each), and their blocks of kWindowBlock for the spread.
struct Window {
  std::size_t batches = 0;
  double seconds = 0;
  std::size_t blocks = 0;    // full blocks
  double closed = 0;         // their seconds
  double block_squares = 0;  // the sum of the squares of their means
  void add(double s);
  double mean() const { return batches ? seconds / static_cast<double>(batches) : 0; }
  // The standard error of mean(), from the blocks' means (0 with fewer than 2 blocks).
  double error() const;
  bool full() const { return batches >= kCheckMinBatches && seconds >= kCheckMinSeconds; }
  // kCheckMostWindows windows: the most a check measures. The window of the setting left
  // stops at the end of the epoch that reached it, so that both hold a setting's first epochs
  // (slower than its later ones: page faults, caches, the processes' first pass) and neither
  // is compared with many warm epochs of the other.
  bool longest() const {
    return batches >= kCheckMostWindows * kCheckMinBatches &&
           seconds >= static_cast<double>(kCheckMostWindows) * kCheckMinSeconds;
  }
};

// Compare warm with warm. A setting's first epoch is cold (its first pass over the stream:
// page faults, the interpreter's first runs of the stream's code, and read in-line, the
// model's own timing of each batch): on the matrix's `stream 1us 0.1s` row in-line's window,
// holding its first epochs, made 2 worker processes look 0.67x its time a batch where whole
// alternated epochs put in-line ahead (docs/BENCHMARKS.md, 2026-12-03). So the setting left is
// compared from its second epoch on (`warm`) once that holds kCheckMinBatches batches; before
// that (a setting left after one epoch), from all its batches (`all`).
struct SettingWindows {
  Window all;              // every batch measured on the setting
  Window warm;             // those after its first epoch
  std::size_t epochs = 0;  // ended
  void add(double s);
  void epoch_end() { ++epochs; }
  bool warm_enough() const { return warm.batches >= kCheckMinBatches; }
  // What a check compares the new setting with.
  const Window& compared() const { return warm_enough() ? warm : all; }
};

enum class SwitchVerdict { measuring, keep, go_back };
struct SwitchCheck {
  SwitchVerdict verdict = SwitchVerdict::measuring;
  std::string reason;  // names both measured times per batch (empty while measuring)
};
// `before`: the window of the setting left (`left`, e.g. "in-line"); `after`: the new one's
// (`now`, e.g. "2 worker processes") so far.
SwitchCheck check_switch(const Window& before, const Window& after, const std::string& left,
                         const std::string& now);
// The same with the setting left's windows: compared from its second epoch on where that holds
// enough batches (SettingWindows::compared), and the reason says which.
SwitchCheck check_switch(const SettingWindows& before, const Window& after, const std::string& left,
                         const std::string& now);
// The standard error of `before`'s mean that check_switch uses: its own with 2 blocks or more;
// with fewer (the engine pipeline's threads are measured over the few batches before auto
// decides, 3 or more), each batch's relative spread is taken as `after`'s, over `before`'s
// batches (0 while `after` has fewer than 2 blocks). And with such a short `before`, a
// slower setting within the noise is measured on rather than left on its means alone.
double before_error(const Window& before, const Window& after);

// The neighbour auto did not choose. With GIL-bound reads, threads read one at a time and
// processes hand each batch over; reading in-line (the training loop reads each batch itself:
// no hand-over, no GIL passed between threads) can beat both when a batch's reads cost about
// what a hand-over does (cheap Python samples: 2 processes delivered a batch every 0.59 ms
// where in-line took 0.51, docs/BENCHMARKS.md), and the engine pipeline never measured it.
// Once auto settled on `now` (its window: what it delivered), in-line is tried when the model
// puts it faster by more than kSwitchNoise: a batch's reads' CPU on the threads plus the
// loop's time between batches on `now` (`step_s`, wall time: a loop that waits on a GPU is
// not overlapped in-line). The trial is checked as a switch is (check_switch: kept, or back
// to `now` after a window).
struct InlineTrial {
  bool trial = false;
  double inline_s = 0;  // the model's seconds a batch in-line
  std::string reason;   // the clause: "in-line tried: the model's 0.514 ms a batch against ..."
};
InlineTrial inline_trial(double read_s, double step_s, const Window& now,
                         const std::string& now_name);

// The cost model learns from the comparison: the hand-over cost a batch, on each side, that
// makes the model's time with `workers` processes (stream_batch_seconds) the `measured` one;
// `costs` with it added to pack and unpack (unchanged when the model was not too fast). A
// stream auto left names it (`... so a hand-over cost about 0.120 ms a batch, not 0.020`).
StreamCosts learn_handover(const StreamCosts& costs, std::size_t workers, std::size_t cores,
                           double measured);

// num_workers='auto' with remote=: remote workers are asked for one at a time while the
// training loop waits more than kRemoteGrowWait of its time and the local workers are
// CPU-saturated (their CPU time over wall time, per core of their share, at least
// kRemoteSaturated), and given back one at a time while it waits less than kRemoteShrinkWait.
// Decided every kRemoteTuneBatches batches, from the engine's stats over that stretch.
inline constexpr std::size_t kRemoteTuneBatches = 8;
inline constexpr double kRemoteGrowWait = 0.10;
inline constexpr double kRemoteShrinkWait = 0.02;
inline constexpr double kRemoteSaturated = 0.8;

// How many of `count` remote workers to use next, `active` being used now: local first
// (Pecan's rule), remote workers only for the excess. `remote_busy`: the share of their time
// the remote workers in use read (the rest they idled between replies), none if they replied
// to nothing in the stretch; below kRemoteSaturated they wait for their rows to travel (the
// network stage, the report's "network-bound"), and one more would wait too.
std::size_t next_remote_workers(std::size_t active, std::size_t count, double wait_fraction,
                                double local_load, std::optional<double> remote_busy);

struct RemoteDecision {
  std::size_t active = 0;  // remote workers to use
  double wait = 0;         // the share of the stretch the training loop waited
  double load = 0;         // the local workers' CPU time over wall time, per core of theirs
};
// Fed the loader's Stats every kRemoteTuneBatches batches handed out (due()), decides from
// the stretch since the last call: none at the first.
class RemoteWorkerTuner {
 public:
  bool due() { return ++batches_ % kRemoteTuneBatches == 0; }  // counts a batch handed out
  // `local_workers` reading here, `active` of `count` remote workers in use.
  std::optional<RemoteDecision> observe(const Stats& stats, std::size_t local_workers,
                                        std::size_t active, std::size_t count);

 private:
  std::size_t batches_ = 0;
  std::optional<Stats> last_;
};

}  // namespace stoker::detail
