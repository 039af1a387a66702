// Small helpers shared by the benchmarks: clocks, medians, and running the baseline scripts.
#pragma once

#include <chrono>
#include <string>
#include <vector>

namespace stoker::bench {

using Clock = std::chrono::steady_clock;

inline double seconds_since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

double median(std::vector<double> v);  // 0 for an empty vector

// Keeps this thread busy for `ms` milliseconds: a training loop's compute.
void spin_for(double ms);

// `path` with "-<name>" before its extension ("run.json" -> "run-tiny.json"): one trace file
// per run when a command makes several.
std::string with_name(const std::string& path, const std::string& name);

// `relative` (such as "bench/torch_dataloader.py") in the source tree this command was built
// from: the baseline scripts and the chart it runs.
std::string source_file(const std::string& relative);

// `s` quoted for /bin/sh.
std::string shell_quote(const std::string& s);

// Runs `command` through /bin/sh; returns its exit status (-1 if it could not start) and puts
// its standard output in `out`.
int run_command(const std::string& command, std::string& out);

}  // namespace stoker::bench
