// `stoker bench`: stoker against the PyTorch DataLoader (bench/torch_dataloader.py, run as a
// subprocess in the same invocation) and against this machine's memcpy bandwidth.
#pragma once

#include <cstddef>
#include <memory>
#include <string>
#include <vector>

#include "stoker/dataset.h"

namespace stoker::bench {

struct BenchOptions {
  std::vector<std::string> workloads{"tensor", "tiny", "heavy", "overhead"};
  bool json = false;
  bool smoke = false;    // small sizes: checks the harness, measures nothing
  bool baseline = true;  // run the PyTorch side
  bool verbose = false;  // show the PyTorch side's progress
  std::string python = "python3";
  std::string baseline_script;  // default: bench/torch_dataloader.py in the source tree
  std::size_t workers = 0;      // 0: the workload's default
  std::size_t depth = 0;        // 0: the workload's default
  std::size_t epochs = 0;       // 0: the workload's default
  std::string device;           // "sim", "cuda", "cuda:N": benchmark the device stage instead
  double consumer_ms = -1;      // < 0: the workload's default (heavy only)
  // A timeline of the stoker side (Loader::trace) written here; with several workloads, one
  // file each, named with the workload ("run.json" -> "run-tiny.json"); jpeg: one per pipeline
  // and source ("run-jpeg-train-folder.json").
  std::string trace;
  // Instead of the comparison: the stoker side untraced and traced, alternated this many times
  // (0: not), with the medians and their ratio: what tracing costs.
  std::size_t trace_cost_runs = 0;
};

// A built-in workload as a data set and a training loop, for `stoker tune` and `stoker diagnose`.
struct WorkloadTarget {
  std::string description;
  std::shared_ptr<const Dataset> dataset;
  std::size_t batch_size = 0;
  double consumer_ms = 0;  // the training loop's compute per batch
};
// tensor, tiny, heavy or overhead (options.smoke, options.consumer_ms apply); throws
// std::invalid_argument for another name.
WorkloadTarget workload_target(const std::string& name, const BenchOptions& options);

// Runs the benchmark and prints it (a table, or one JSON object with --json). Returns the
// process exit code.
int run(const BenchOptions& options);

}  // namespace stoker::bench
