// `stoker bench --parquet FILE|DIR` (built where Arrow C++ is found): stoker::ParquetDataset,
// the C++ reader, through the training pipeline, and bench/parquet_bench.py's pyarrow + PIL +
// torch DataLoader baseline at its best num_workers on the same files, in the same run.
#pragma once

#include <string>
#include <vector>

#include "bench.h"

namespace stoker::bench {

// Prints images/s of both sides and their ratio (one JSON object with options.json); returns
// the exit status. The files' `columns` are an encoded-image column and an integer label.
int run_parquet(const BenchOptions& options, const std::string& files,
                const std::vector<std::string>& columns);

}  // namespace stoker::bench
