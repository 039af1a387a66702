#include "stoker/frontend/worker_kind.h"

#include <algorithm>
#include <cmath>
#include <tuple>
#include <utility>

#include "tune/tuner.h"
#include "util/format.h"

namespace stoker::detail {

GilVerdict gil_bound(double busy, double on_cpu, double delayed) {
  const double scale = on_cpu > 0 ? std::min(kRunDelayScale, (on_cpu + delayed) / on_cpu) : 1.0;
  return {.bound = kGilBusy <= scale * busy, .scale = scale};
}

KindChoice choose_worker_kind(double busy, double on_cpu, double delayed, bool whole_batches,
                              std::size_t threads, std::size_t cores) {
  const GilVerdict v = gil_bound(busy, on_cpu, delayed);
  std::string measured =
      format("reads kept the GIL busy %.0f%% of the time on %zu threads, %zu cores", 100 * busy,
             threads, cores);
  if (v.scale > 1.05) {
    measured += format(" (%.0f%% counting their waits for a core)", 100 * v.scale * busy);
  }
  if (v.bound && cores >= 2 && threads >= 2) {
    const char* why = whole_batches ? "whole batches made in Python" : "GIL-bound";
    KindChoice choice;
    choice.processes = true;
    choice.gil_bound = true;
    choice.reason = "auto: " + measured + ": " + why + ", so processes";
    return choice;
  }
  const char* why = cores < 2                ? "fewer than 2 cores"
                    : threads < 2 && v.bound ? "fewer than 2 threads"
                                             : "not GIL-bound";
  KindChoice choice;
  choice.gil_bound = v.bound;
  choice.reason = "auto: " + measured + ": " + why + ", so threads";
  return choice;
}

double stream_inline_seconds(const StreamCosts& c) { return c.read + c.step; }

double stream_batch_seconds(const StreamCosts& c, std::size_t workers, std::size_t cores) {
  const double worker = c.read + c.pack;
  const double loop = c.step + c.unpack;
  return std::max({worker / static_cast<double>(std::max<std::size_t>(workers, 1)), loop,
                   (worker + loop) / static_cast<double>(std::max<std::size_t>(cores, 1))});
}

namespace {

// The fewest workers whose time is within kStreamGain of `most` workers' (more never take
// longer).
std::size_t fewest_workers(const StreamCosts& c, std::size_t most, std::size_t cores) {
  const double best = stream_batch_seconds(c, most, cores);
  std::size_t workers = 1;
  while (stream_batch_seconds(c, workers, cores) > (1 + kStreamGain) * best) ++workers;
  return workers;
}

}  // namespace

StreamChoice choose_stream_workers(const StreamCosts& c, std::size_t cores, bool shards) {
  StreamChoice out;
  out.inline_s = stream_inline_seconds(c);
  // The fewest workers within kStreamGain of the most allowed (more never take longer): a
  // process more for a few per cent is a core taken from everything else on the node.
  const std::size_t most = shards ? std::max<std::size_t>(cores, 1) : 1;
  const std::size_t workers = fewest_workers(c, most, cores);
  out.worker_s = stream_batch_seconds(c, workers, cores);
  const std::string sharding =
      shards ? format(
                   "; it asked get_worker_info(), so it takes its worker's share: up to %zu "
                   "workers",
                   most)
             : "; it never asked get_worker_info(), so each worker would read all of it: one "
               "worker at most";
  const std::string measured = format(
      "read in-line, a batch took %.3f ms to read and the training loop spent %.3f ms "
      "between batches; a hand-over costs the worker %.3f ms and the loop %.3f ms, so %.3f ms "
      "a batch in-line against %.3f ms with %zu worker process%s%s",
      1e3 * c.read, 1e3 * c.step, 1e3 * c.pack, 1e3 * c.unpack, 1e3 * out.inline_s,
      1e3 * out.worker_s, workers, workers == 1 ? "" : "es", sharding.c_str());
  if (cores < 2) {
    out.reason = "auto: in-line (fewer than 2 cores: a worker process would take the loop's)";
    return out;
  }
  if (out.worker_s <= (1 - kStreamGain) * out.inline_s) {
    out.workers = workers;
    out.reason =
        workers == 1
            ? "auto: one worker process from the next epoch (" + measured + ")"
            : format("auto: %zu worker processes from the next epoch (", workers) + measured + ")";
  } else {
    const std::string why =
        c.step <= c.pack && workers == 1
            ? "the loop's own time between batches is below a hand-over's, so nothing overlaps"
        : c.read <= c.unpack
            ? "a batch costs less to read than to take over"
            : format("the overlap would save under %.0f%% of the time", 100 * kStreamGain);
    out.reason = "auto: in-line (" + why + "; " + measured + ")";
  }
  return out;
}

StreamDepth deeper_stream_depth(std::size_t depth, std::size_t batches, std::size_t blocked) {
  StreamDepth out{.depth = depth, .reason = {}};
  if (batches == 0 || depth >= kStreamMostDepth ||
      static_cast<double>(blocked) < kStreamBlockedShare * static_cast<double>(batches)) {
    return out;
  }
  out.depth = std::min(2 * std::max<std::size_t>(depth, 1), kStreamMostDepth);
  out.reason = format(
      "the training loop waited for %zu of %zu batches while another worker had batches ready "
      "in its queue of %zu: its batches come in bursts; each worker's queue holds %zu from now on",
      blocked, batches, depth, out.depth);
  return out;
}

StreamThreads choose_stream_threads(const StreamCosts& c, double read_wait, std::size_t cores,
                                    bool shards) {
  const double wait = std::clamp(read_wait, 0.0, c.read);
  const auto on_threads = [&](std::size_t w) {
    return std::max(c.read - wait + c.step, c.read / static_cast<double>(w)) + kThreadHandover;
  };
  const std::size_t most = shards ? kStreamMostThreads : 1;
  std::size_t threads = 1;
  while (on_threads(threads) > (1 + kStreamGain) * on_threads(most)) ++threads;
  StreamThreads out;
  out.seconds = on_threads(threads);
  const double inline_s = stream_inline_seconds(c);
  const StreamChoice processes = choose_stream_workers(c, cores, shards);
  const std::string measured = format(
      "read in-line, a batch took %.3f ms to read, %.3f ms of it off the CPU, and the training "
      "loop spent %.3f ms between batches: %.3f ms a batch in-line against %.3f ms on %zu "
      "thread%s",
      1e3 * c.read, 1e3 * wait, 1e3 * c.step, 1e3 * inline_s, 1e3 * out.seconds, threads,
      threads == 1 ? "" : "s");
  if (out.seconds > (1 - kStreamGain) * inline_s) {
    out.reason = "threads would save under " + format("%.0f%%", 100 * kStreamGain) +
                 " of the in-line time (" + measured + ")";
    return out;
  }
  if (processes.workers > 0 && out.seconds > (1 + kStreamGain) * processes.worker_s) {
    out.reason = format("%zu worker process%s (%.3f ms a batch) beat threads (", processes.workers,
                        processes.workers == 1 ? "" : "es", 1e3 * processes.worker_s) +
                 measured + ")";
    return out;
  }
  out.threads = threads;
  out.reason =
      format("auto: %zu worker thread%s from the next epoch (", threads, threads == 1 ? "" : "s") +
      measured +
      (processes.workers > 0
           ? format("; %zu worker process%s: %.3f ms, and they take starting", processes.workers,
                    processes.workers == 1 ? "" : "es", 1e3 * processes.worker_s)
           : std::string()) +
      (shards ? "" : "; it never asked get_worker_info(): one thread at most") + ")";
  return out;
}

StreamThreads stream_thread_trial(const StreamCosts& c, std::size_t cores, std::size_t workers) {
  StreamThreads out;
  out.seconds = std::max(c.read, c.step) + kThreadHandover;
  const double inline_s = stream_inline_seconds(c);
  const double processes_s = workers > 0 ? stream_batch_seconds(c, workers, cores) : 0.0;
  std::string measured = format(
      "a batch took %.3f ms to read in-line and the training loop spent %.3f ms between "
      "batches: %.3f ms a batch on one thread reading while the step runs, if the step releases "
      "the GIL as torch's operations do, against %.3f ms in-line",
      1e3 * c.read, 1e3 * c.step, 1e3 * out.seconds, 1e3 * inline_s);
  if (workers > 0) {
    measured += format(" and %.3f ms on %zu worker process%s", 1e3 * processes_s, workers,
                       workers == 1 ? "" : "es");
  }
  const std::string gain = format("%.0f%%", 100 * kStreamGain);
  if (cores < 2) {
    out.reason = "no thread tried: one core";
  } else if (out.seconds > (1 - kStreamGain) * inline_s) {
    out.reason =
        "no thread tried: it would save under " + gain + " of in-line even so (" + measured + ")";
  } else if (workers > 0 && out.seconds > (1 + kStreamGain) * processes_s) {
    out.reason =
        "no thread tried: the processes would beat it by over " + gain + " (" + measured + ")";
  } else {
    out.threads = 1;
    out.reason = "auto: 1 worker thread from the next epoch, on trial (" + measured +
                 "; it starts at once; checked against in-line's measured rate, and left if "
                 "slower)";
  }
  return out;
}

StartVerdict worth_starting(const StreamCosts& costs, std::size_t workers, std::size_t cores,
                            double batches_per_epoch, std::size_t epochs, double start_s) {
  const double per_epoch =
      std::max(0.0, stream_inline_seconds(costs) - stream_batch_seconds(costs, workers, cores)) *
      batches_per_epoch;
  const double lost = per_epoch * static_cast<double>(epochs);
  StartVerdict v;
  v.start = lost >= start_s;
  const std::string what = format(
      "%zu worker process%s would save %.3f ms an epoch of %.0f batches and starting "
      "them costs about %.0f ms",
      workers, workers == 1 ? "" : "es", 1e3 * per_epoch, batches_per_epoch, 1e3 * start_s);
  v.reason = v.start ? format(
                           "%s: the %zu epoch%s read in-line lost %.1f ms by the model, so "
                           "they start",
                           what.c_str(), epochs, epochs == 1 ? "" : "s", 1e3 * lost)
                     : format(
                           "%s: they start once the epochs read in-line have lost that much "
                           "by the model (%.1f ms in %zu so far)",
                           what.c_str(), 1e3 * lost, epochs);
  return v;
}

void Window::add(double s) {
  ++batches;
  seconds += s;
  if (batches % kWindowBlock == 0) {
    const double block = (seconds - closed) / static_cast<double>(kWindowBlock);
    ++blocks;
    closed = seconds;
    block_squares += block * block;
  }
}

void SettingWindows::add(double s) {
  all.add(s);
  if (epochs > 0) warm.add(s);
}

double Window::error() const {
  if (blocks < 2) return 0;
  const auto n = static_cast<double>(blocks);
  const double m = closed / (n * static_cast<double>(kWindowBlock));
  const double variance = std::max(0.0, block_squares / n - m * m) * n / (n - 1);
  return std::sqrt(variance / n);
}

double before_error(const Window& before, const Window& after) {
  if (before.blocks >= 2 || after.blocks < 2 || after.mean() <= 0) return before.error();
  // The spread of one batch's time, relative, taken as the new setting's.
  const double relative = after.error() / after.mean() *
                          std::sqrt(static_cast<double>(after.batches) /
                                    static_cast<double>(std::max<std::size_t>(before.batches, 1)));
  return relative * before.mean();
}

InlineTrial inline_trial(double read_s, double step_s, const Window& now,
                         const std::string& now_name) {
  InlineTrial t;
  t.inline_s = stream_inline_seconds({.read = read_s, .step = step_s});
  const double measured = now.mean();
  t.trial = now.batches > 0 && t.inline_s < (1 - kSwitchNoise) * measured;
  t.reason = format(
      "%s: the model's %.3f ms a batch in-line (the reads' %.3f ms of CPU on the threads, the "
      "loop's %.3f ms between batches) against the %.3f ms %s delivered one over %zu",
      t.trial ? "in-line tried" : "in-line not tried", 1e3 * t.inline_s, 1e3 * read_s, 1e3 * step_s,
      1e3 * measured, now_name.c_str(), now.batches);
  return t;
}

StreamCosts learn_handover(const StreamCosts& c, std::size_t workers, std::size_t cores,
                           double measured) {
  StreamCosts learned = c;
  const double loop = c.step + c.unpack;
  const double worker = c.read + c.pack;
  const auto w = static_cast<double>(std::max<std::size_t>(workers, 1));
  const auto n = static_cast<double>(std::max<std::size_t>(cores, 1));
  // The hand-over `h` a batch (on each side) that makes the model's time the measured one:
  // max((worker + h) / w, loop + h, (worker + loop + 2h) / n) = measured; each term grows
  // with h, so it is the least of the three solutions.
  const double h =
      std::min({measured * w - worker, measured - loop, (measured * n - worker - loop) / 2});
  const double extra = std::max(0.0, h);
  learned.pack += extra;
  learned.unpack += extra;
  return learned;
}

SwitchCheck check_switch(const Window& before, const Window& after, const std::string& left,
                         const std::string& now) {
  if (!after.full() || before.batches == 0) return {};
  const double b = before.mean();
  const double a = after.mean();
  const double noise = 2 * std::hypot(before_error(before, after), after.error());
  const std::string measured =
      format("%s delivered a batch every %.3f ms over %zu batches, %s every %.3f ms over %zu",
             now.c_str(), 1e3 * a, after.batches, left.c_str(), 1e3 * b, before.batches);
  if (a <= (1 + kSwitchNoise) * b) {
    return {.verdict = SwitchVerdict::keep,
            .reason =
                format("kept %s: ", now.c_str()) + measured +
                format(" (%.2fx the time: not slower by over %.0f%%)", a / b, 100 * kSwitchNoise)};
  }
  if (a > b + noise) {
    return {.verdict = SwitchVerdict::go_back,
            .reason = format("back to %s: ", left.c_str()) + measured +
                      format(" (%.2fx the time, beyond the noise of %.0f%%)", a / b,
                             100 * std::max(kSwitchNoise, noise / b))};
  }
  // Slower, but within the noise so far: measured on; on the means alone only when the
  // setting left was measured over a window too (a few batches could be a lucky stretch).
  if (!after.longest() || !before.full()) return {};
  return {.verdict = SwitchVerdict::go_back,
          .reason = format("back to %s: ", left.c_str()) + measured +
                    format(" (%.2fx the time after %zu windows, within the noise of %.0f%% but "
                           "slower by over %.0f%%)",
                           a / b, kCheckMostWindows, 100 * noise / b, 100 * kSwitchNoise)};
}

SwitchCheck check_switch(const SettingWindows& before, const Window& after, const std::string& left,
                         const std::string& now) {
  SwitchCheck c = check_switch(before.compared(), after, left, now);
  if (c.verdict != SwitchVerdict::measuring) {
    c.reason += before.warm_enough()
                    ? format(
                          "; %s measured from its second epoch on (%zu batches), its first "
                          "(cold) left out",
                          left.c_str(), before.warm.batches)
                    : format(
                          "; %s measured over its first epoch too (%zu batches after it, "
                          "under %zu)",
                          left.c_str(), before.warm.batches, kCheckMinBatches);
  }
  return c;
}

std::size_t next_remote_workers(std::size_t active, std::size_t count, double wait_fraction,
                                double local_load, std::optional<double> remote_busy) {
  const bool network_bound = remote_busy && *remote_busy < kRemoteSaturated;
  if (wait_fraction > kRemoteGrowWait && local_load >= kRemoteSaturated && active < count &&
      !network_bound) {
    return active + 1;
  }
  if (wait_fraction < kRemoteShrinkWait && active > 0) return active - 1;
  return active;
}

std::pair<std::size_t, std::string> processes_for(const StreamCosts& c, std::size_t cores) {
  cores = std::max<std::size_t>(cores, 1);
  const std::size_t workers = fewest_workers(c, cores, cores);
  std::string why = format(
      "a batch's reads took %.3f ms of CPU and the training loop %.3f ms between batches, so "
      "%zu worker process%s",
      1e3 * c.read, 1e3 * c.step, workers, workers == 1 ? "" : "es");
  if (workers < cores) {
    why += format(" (%zu would be under %.0f%% faster)", cores, 100 * kStreamGain);
  }
  return {workers, why};
}

std::pair<std::size_t, std::string> processes_to_keep(const StreamCosts& costs, double warm_read,
                                                      std::size_t started, std::size_t cores) {
  StreamCosts warm = costs;
  warm.read = warm_read;
  const std::size_t keep = std::min(processes_for(warm, cores).first, started);
  if (keep >= started) return {started, ""};
  return {keep, format("; warm, a process's reads took %.3f ms of CPU a batch, so %zu of the %zu "
                       "kept",
                       1e3 * warm_read, keep, started)};
}

std::optional<KindChoice> WorkerKindChooser::observe(const Stats& stats, std::uint64_t reads,
                                                     std::size_t threads, std::size_t cores,
                                                     double pack, double unpack, double measuring) {
  if (!first_) {
    first_ = stats;
    first_reads_ = reads;
    return std::nullopt;
  }
  ++batches_;
  // A batch job's read is a whole batch: kKindMinBatches of them are the evidence (16 would
  // be 2 epochs of a small data set, and the switch would cost the third).
  const std::uint64_t min_reads = whole_batches_ ? kKindMinBatches : kKindMinReads;
  const double wall = std::max(to_seconds(stats.elapsed - first_->elapsed), 1e-9);
  if ((batches_ < kKindMinBatches && wall < kKindMinSeconds) || reads - first_reads_ < min_reads) {
    return std::nullopt;
  }
  const double busy = to_seconds(stats.worker_lock_held - first_->worker_lock_held) / wall;
  const double cpu = to_seconds(stats.worker_cpu - first_->worker_cpu);
  KindChoice choice =
      choose_worker_kind(busy, cpu, to_seconds(stats.worker_run_delay - first_->worker_run_delay),
                         whole_batches_, threads, cores);
  // Per batch handed out: the reads' CPU (a batch job is one read; samples, as many as a
  // batch holds) and the loop's own.
  const double batches = static_cast<double>(std::max<std::uint64_t>(batches_, 1));
  const double per_batch =
      whole_batches_ ? 1.0 : static_cast<double>(stats.samples - first_->samples) / batches;
  choice.costs = StreamCosts{
      .read = cpu / static_cast<double>(reads - first_reads_) * per_batch,
      .step = std::max(0.0, to_seconds(stats.consumer_cpu - first_->consumer_cpu) - measuring) /
              batches,
      .pack = pack,
      .unpack = unpack};
  if (choice.processes) {
    std::tie(choice.workers, choice.workers_reason) = processes_for(choice.costs, cores);
  }
  return choice;
}

std::optional<RemoteDecision> RemoteWorkerTuner::observe(const Stats& stats,
                                                         std::size_t local_workers,
                                                         std::size_t active, std::size_t count) {
  const std::optional<Stats> last = std::exchange(last_, stats);
  if (!last) return std::nullopt;
  const double elapsed = to_seconds(stats.elapsed - last->elapsed);
  if (elapsed <= 0) return std::nullopt;
  RemoteDecision d;
  d.wait = to_seconds(stats.consumer_wait - last->consumer_wait) / elapsed;
  // worker_cpu also counts the threads waiting on remote workers, which use little.
  d.load = to_seconds(stats.worker_cpu - last->worker_cpu) / elapsed /
           std::max(1.0, std::min(static_cast<double>(local_workers), stats.cpu_cores));
  const double read = to_seconds(stats.network_read - last->network_read);
  const double idle = to_seconds(stats.network_idle - last->network_idle);
  const std::optional<double> remote_busy =
      read + idle > 0 ? std::optional<double>(read / (read + idle)) : std::nullopt;
  d.active = next_remote_workers(active, count, d.wait, d.load, remote_busy);
  return d;
}

}  // namespace stoker::detail
