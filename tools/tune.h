// `stoker tune` and `stoker diagnose`: run a pipeline briefly, with the online tuner or a fixed
// configuration, and say what the tuner chose and how close it is to the best of a full grid
// (tune), or what holds the pipeline back (diagnose).
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include "bench.h"

namespace stoker::bench {

struct TuneOptions {
  double seconds = 5;             // the tuner's run, from a cold start
  double measure_s = 2;           // then the tuned loader's measurement, and each grid point's
  std::size_t workers = 0;        // the tuner's starting count; 0: the CPU budget's cores
  std::size_t depth = 4;          // the tuner's starting depth
  std::size_t memory_budget = 0;  // slab bytes; 0: the loader's default
  bool grid = false;              // also measure every fixed configuration below
  // Rounds of the tuner's run and the grid, alternated; figures are medians. 0: 3 with the
  // grid, else 1.
  std::size_t repeat = 0;
  std::vector<std::size_t> grid_workers{1, 2, 4, 8, 16};
  std::vector<std::size_t> grid_depth{2, 4, 8};
  bool json = false;
  std::string plot;  // a PNG or SVG chart of the grid (needs the grid and matplotlib)
  std::string python = "python3";
};

// Prints the tuner's choice, its throughput, how long it took to settle and its peak slab
// memory against the budget; with the grid, every configuration, the best and the ratio.
// Returns the process exit code.
int run_tune(const WorkloadTarget& target, const TuneOptions& options);

struct DiagnoseOptions {
  double seconds = 5;
  std::size_t workers = 0;  // 0: the CPU budget's cores
  std::size_t depth = 4;
  bool tune = false;  // let the tuner run (num_workers='auto')
  bool json = false;
};

// Runs the pipeline and prints the loader's report (stoker/report.h) with its numbers.
int run_diagnose(const WorkloadTarget& target, const DiagnoseOptions& options);

}  // namespace stoker::bench
