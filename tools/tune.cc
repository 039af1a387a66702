#include "tune.h"

#include <fmt/core.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <optional>
#include <stdexcept>
#include <utility>
#include <vector>

#include "bench_util.h"
#include "interrupt.h"
#include "progress.h"
#include "stoker/frontend/host_allocator.h"
#include "stoker/loader.h"
#include "stoker/log.h"

namespace stoker::bench {
namespace {

using json = nlohmann::json;

struct Measured {
  double samples_per_s = 0;
  double wait_pct = 0;
  std::size_t peak_slab_bytes = 0;
  double settled_s = 0;  // when the tuner last changed something, from the start
  // From when on every second of the run delivered at least 90% of samples_per_s.
  double reached_s = 0;
  Stats stats;
};

// The first time from which every window of `window_s` (starting at a batch) delivered at
// least `rate` samples/s; `timeline` holds (seconds, samples so far) after each batch.
double reached(const std::vector<std::pair<double, double>>& timeline, double rate,
               double window_s) {
  double from = 0;
  for (std::size_t i = 0, j = 0; i < timeline.size(); ++i) {
    j = std::max(j, i);
    while (j < timeline.size() && timeline[j].first < timeline[i].first + window_s) ++j;
    if (j == timeline.size()) break;
    const auto [t0, n0] = timeline[i];
    const auto [t1, n1] = timeline[j];
    if ((n1 - n0) / (t1 - t0) < rate) from = timeline[j].first;
  }
  return from;
}

// Takes batches (with the training loop's compute after each) until `warmup_s` and then
// `measure_s` more have passed, epoch after epoch; measures the second part.
Measured drive(Loader& loader, const WorkloadTarget& t, double warmup_s, double measure_s) {
  Measured m;
  const auto start = Clock::now();
  std::uint64_t changes = 0;
  std::vector<std::pair<double, double>> timeline;
  std::optional<std::pair<double, Stats>> first;  // when the measurement started
  for (;;) {
    tools::throw_if_interrupted();
    auto batch = loader.next();
    if (!batch) continue;  // the next epoch
    if (t.consumer_ms > 0) spin_for(t.consumer_ms);
    const Stats s = loader.stats();
    const double now = seconds_since(start);
    timeline.emplace_back(now, static_cast<double>(s.samples));
    m.peak_slab_bytes = std::max(m.peak_slab_bytes, s.slab_bytes);
    if (s.tuner_changes != changes) {
      changes = s.tuner_changes;
      m.settled_s = now;
    }
    if (!first) {
      if (now >= warmup_s && s.batches >= 2) first.emplace(now, s);
    } else if (now - first->first >= measure_s) {
      const double took = now - first->first;
      m.samples_per_s = static_cast<double>(s.samples - first->second.samples) / took;
      m.wait_pct = 100 * to_seconds(s.consumer_wait - first->second.consumer_wait) / took;
      m.reached_s = reached(timeline, 0.9 * m.samples_per_s, 1.0);
      m.stats = s;
      return m;
    }
  }
}

LoaderOptions base_options(const WorkloadTarget& t) {
  LoaderOptions o;
  o.dataset = t.dataset;
  o.batch_size = t.batch_size;
  o.shuffle = true;
  return o;
}

// The CPU budget a loader of `t` takes (its share of the node's cores).
double cpu_cores(const WorkloadTarget& t) {
  LoaderOptions o = base_options(t);
  o.workers = 0;
  o.depth = 1;
  return Loader(o).stats().cpu_cores;
}

void print_point(const json& p) {
  const auto runs = p["runs"].get<std::vector<double>>();
  fmt::print(
      "  workers {:>3}  depth {:>3}  pin {:<4} {:>10.0f} samples/s ({:.0f}-{:.0f})  waited "
      "{:>5.1f}%\n",
      p["workers"].get<std::size_t>(), p["depth"].get<std::size_t>(), p["pin"].get<std::string>(),
      p["samples_per_s"].get<double>(), *std::min_element(runs.begin(), runs.end()),
      *std::max_element(runs.begin(), runs.end()), p["wait_pct"].get<double>());
}

// Writes `result` to a temporary file and has python/stoker/tuning_chart.py draw it.
void plot(const json& result, const TuneOptions& o) {
  char path[] = "/tmp/stoker-tune-XXXXXX";
  const int fd = mkstemp(path);
  if (fd < 0) throw std::runtime_error("cannot create a temporary file for the plot's data");
  const std::string text = result.dump();
  const bool written = ::write(fd, text.data(), text.size()) == static_cast<ssize_t>(text.size());
  ::close(fd);
  std::string out;
  const std::string chart = source_file("python/stoker/tuning_chart.py");
  const int status =
      written ? run_command(fmt::format("{} {} {} {}", shell_quote(o.python), shell_quote(chart),
                                        shell_quote(path), shell_quote(o.plot)),
                            out)
              : -1;
  std::remove(path);
  if (status != 0) {
    throw std::runtime_error("the chart was not written (" + o.python +
                             " with matplotlib is needed; --python names another)");
  }
}

}  // namespace

int run_tune(const WorkloadTarget& t, const TuneOptions& o) {
  if (!o.plot.empty() && !o.grid) throw std::invalid_argument("--plot needs --grid");
  const std::size_t rounds = o.repeat != 0 ? o.repeat : (o.grid ? 3 : 1);
  const double cores = cpu_cores(t);
  LoaderOptions lo = base_options(t);
  lo.workers = o.workers ? o.workers : static_cast<std::size_t>(std::lround(cores));
  lo.depth = o.depth;
  lo.tune_workers = true;
  lo.memory_budget = o.memory_budget;
  const std::size_t start_workers = lo.workers;
  const std::size_t budget = o.memory_budget ? o.memory_budget : detail::default_pin_budget();

  struct Point {
    std::size_t workers = 0;
    std::size_t depth = 0;
    PinMemory pin = PinMemory::off;
    std::vector<Measured> runs;
  };
  std::vector<Point> points;
  if (o.grid) {
    for (PinMemory pin : {PinMemory::off, PinMemory::on}) {
      for (std::size_t depth : o.grid_depth) {
        for (std::size_t workers : o.grid_workers) points.push_back({workers, depth, pin, {}});
      }
    }
  }
  // Rounds, each the tuner's run from a cold start and then every grid point, so that the
  // load of the machine drifts over all of them alike; each figure is the median of its
  // rounds. One 2 s point on a shared machine is good to about +-25%, and the best of a grid
  // of single points is biased upwards by as much (the luckiest of many draws).
  std::vector<Measured> tuned_runs;
  {
    tools::ProgressBar bar("tune: " + t.description, rounds * (1 + points.size()), o.json);
    std::size_t done = 0;
    // Each fixed point that waits would say what the tuner would do: noise here.
    const LogLevel level = log_level();
    for (std::size_t round = 0; round < rounds; ++round) {
      {
        Loader loader(lo);
        tuned_runs.push_back(drive(loader, t, o.seconds, o.measure_s));
      }
      bar.update(++done, fmt::format("round {} of {}", round + 1, rounds));
      set_log_level(LogLevel::warning);
      for (Point& p : points) {
        LoaderOptions fixed = base_options(t);
        fixed.workers = p.workers;
        fixed.depth = p.depth;
        fixed.pin_memory = p.pin;
        Loader loader(fixed);
        p.runs.push_back(drive(loader, t, 0, o.measure_s));
        bar.update(++done, fmt::format("round {} of {}", round + 1, rounds));
      }
      set_log_level(level);
    }
  }
  auto figure = [](const std::vector<Measured>& runs, double Measured::*field) {
    std::vector<double> values;
    for (const Measured& m : runs) values.push_back(m.*field);
    return median(values);
  };
  auto rates = [](const std::vector<Measured>& runs) {
    std::vector<double> values;
    for (const Measured& m : runs) values.push_back(m.samples_per_s);
    return values;
  };
  // The tuned configuration reported is that of the median run.
  std::vector<const Measured*> by_rate;
  for (const Measured& m : tuned_runs) by_rate.push_back(&m);
  std::sort(by_rate.begin(), by_rate.end(), [](const Measured* a, const Measured* b) {
    return a->samples_per_s < b->samples_per_s;
  });
  const Stats& s = by_rate[(by_rate.size() - 1) / 2]->stats;
  std::size_t peak = 0;
  json configurations = json::array();
  for (const Measured& m : tuned_runs) {
    peak = std::max(peak, m.peak_slab_bytes);
    configurations.push_back({{"workers", m.stats.workers},
                              {"depth", m.stats.depth},
                              {"changes", m.stats.tuner_changes}});
  }
  const double tuned_rate = figure(tuned_runs, &Measured::samples_per_s);
  json result = {{"target", t.description},
                 {"batch_size", t.batch_size},
                 {"consumer_ms", t.consumer_ms},
                 {"cpu_cores", cores},
                 {"memory_budget", budget},
                 {"rounds", rounds},
                 {"start", {{"workers", start_workers}, {"depth", o.depth}}},
                 {"tuned",
                  {{"workers", s.workers},
                   {"depth", s.depth},
                   {"pin", "auto"},
                   {"samples_per_s", tuned_rate},
                   {"runs", rates(tuned_runs)},
                   {"configurations", configurations},
                   {"wait_pct", figure(tuned_runs, &Measured::wait_pct)},
                   {"reached_s", figure(tuned_runs, &Measured::reached_s)},
                   {"settled_s", figure(tuned_runs, &Measured::settled_s)},
                   {"changes", s.tuner_changes},
                   {"last_change", s.tuner},
                   {"peak_slab_bytes", peak}}}};
  if (!o.json) {
    fmt::print("{} (batch {}, {:.2g} cores)\n", t.description, t.batch_size, cores);
    const auto runs = rates(tuned_runs);
    fmt::print(
        "tuned: workers {}, depth {} (from {} and {}): {:.0f} samples/s ({:.0f}-{:.0f} in {} "
        "rounds), waited {:.1f}%\n"
        "  within 90% of that from {:.1f} s on, settled after {:.1f} s, {} changes, last: {}\n"
        "  peak slab memory {:.1f} MB (budget {:.1f} MB)\n",
        s.workers, s.depth, start_workers, o.depth, tuned_rate,
        *std::min_element(runs.begin(), runs.end()), *std::max_element(runs.begin(), runs.end()),
        rounds, result["tuned"]["wait_pct"].get<double>(),
        result["tuned"]["reached_s"].get<double>(), result["tuned"]["settled_s"].get<double>(),
        s.tuner_changes, s.tuner.empty() ? "none" : s.tuner, peak / 1e6, budget / 1e6);
  }
  if (o.grid) {
    if (!o.json) {
      fmt::print("grid (each point {:.1f} s after its first batches, median of {} rounds):\n",
                 o.measure_s, rounds);
    }
    json grid = json::array();
    json best;
    for (const Point& p : points) {
      std::size_t point_peak = 0;
      for (const Measured& m : p.runs) point_peak = std::max(point_peak, m.peak_slab_bytes);
      const json point = {{"workers", p.workers},
                          {"depth", p.depth},
                          {"pin", p.pin == PinMemory::on ? "on" : "off"},
                          {"samples_per_s", figure(p.runs, &Measured::samples_per_s)},
                          {"runs", rates(p.runs)},
                          {"wait_pct", figure(p.runs, &Measured::wait_pct)},
                          {"peak_slab_bytes", point_peak}};
      if (!o.json) print_point(point);
      if (best.is_null() || point["samples_per_s"] > best["samples_per_s"]) best = point;
      grid.push_back(point);
    }
    result["grid"] = grid;
    result["best"] = best;
    result["ratio"] = tuned_rate / best["samples_per_s"].get<double>();
    // The tuned configuration as a fixed point of the same grid, where it has one: how well
    // the tuner chose, apart from how its own runs went.
    for (const json& p : grid) {
      if (p["workers"] == s.workers && p["depth"] == s.depth && p["pin"] == "off") {
        result["choice_ratio"] =
            p["samples_per_s"].get<double>() / best["samples_per_s"].get<double>();
      }
    }
    if (!o.json) {
      fmt::print("best fixed: workers {}, depth {}, pin {}: {:.0f} samples/s\n",
                 best["workers"].get<std::size_t>(), best["depth"].get<std::size_t>(),
                 best["pin"].get<std::string>(), best["samples_per_s"].get<double>());
      fmt::print("tuned / best fixed: {:.2f}", result["ratio"].get<double>());
      if (result.contains("choice_ratio")) {
        fmt::print("; the tuned configuration as a fixed point / best: {:.2f}",
                   result["choice_ratio"].get<double>());
      }
      fmt::print("\n");
    }
    if (!o.plot.empty()) {
      plot(result, o);
      if (!o.json) fmt::print("chart: {}\n", o.plot);
    }
  }
  if (o.json) fmt::print("{}\n", result.dump(2));
  return 0;
}

int run_diagnose(const WorkloadTarget& t, const DiagnoseOptions& o) {
  LoaderOptions lo = base_options(t);
  lo.workers = o.workers ? o.workers : static_cast<std::size_t>(std::lround(cpu_cores(t)));
  lo.depth = o.depth;
  lo.tune_workers = o.tune;
  Loader loader(lo);
  drive(loader, t, 0, o.seconds);
  const Report r = loader.report();
  if (o.json) {
    const json numbers = {{"verdict", r.verdict},
                          {"text", r.text()},
                          {"wait_fraction", r.wait_fraction},
                          {"samples_per_second", r.samples_per_second},
                          {"workers", r.workers},
                          {"worker_busy", r.worker_busy},
                          {"worker_cores", r.worker_cores},
                          {"cpu_cores", r.cpu_cores},
                          {"gil_busy", r.gil_busy},
                          {"worker_run_delay", r.worker_run_delay},
                          {"busiest", r.busiest},
                          {"busiest_load", r.busiest_load},
                          {"more_workers", r.more_workers},
                          {"suggestions", r.suggestions}};
    fmt::print("{}\n", numbers.dump(2));
  } else {
    fmt::print("{} (batch {}, workers {}, depth {})\n{}\n", t.description, t.batch_size,
               loader.stats().workers, loader.stats().depth, r.text());
  }
  return 0;
}

}  // namespace stoker::bench
