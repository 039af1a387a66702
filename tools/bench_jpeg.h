// `stoker bench -w jpeg`: the ImageNet-style image pipelines (train: RandomResizedCrop(224) +
// flip + normalize; val: Resize(256) + CenterCrop(224) + normalize) on generated JPEGs, for
// stoker from an image folder, from record shards and from the RAM cache, against the PyTorch
// DataLoader with torchvision's transforms (bench/torchvision_baseline.py) and against bare
// libjpeg-turbo full-image decode on 1 and 2 threads.
#pragma once

#include <array>
#include <string>

#include "bench.h"

namespace stoker::bench {

struct JpegBenchOptions {
  // Where the generated images (and their record shards) live; made once and reused.
  // Default: $TMPDIR/stoker-bench-jpeg-v1-<images>.
  std::string data_dir;
  std::string baseline_script;  // default: bench/torchvision_baseline.py in the source tree
};

// The generated JPEG folder the benchmark reads (made on first use; options.smoke: a small
// one), and beside it its record shards: {folder, records}.
std::array<std::string, 2> jpeg_data(const BenchOptions& options, const JpegBenchOptions& jpeg);

// Runs the benchmark and prints it (a table, or one JSON object with options.json). Uses
// options.python (which needs torch and torchvision) for the baseline unless
// options.baseline is false. Returns the process exit code.
int run_jpeg(const BenchOptions& options, const JpegBenchOptions& jpeg);

}  // namespace stoker::bench
