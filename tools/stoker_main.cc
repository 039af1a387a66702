// The stoker command line.
#include <fmt/core.h>
#include <fmt/ranges.h>

#include <CLI/CLI.hpp>
#include <exception>
#include <stdexcept>
#include <string>
#include <vector>

#include "bench.h"
#include "bench_jpeg.h"
#ifdef STOKER_HAVE_PARQUET
#include "bench_parquet.h"
#endif
#include "image_commands.h"
#include "interrupt.h"
#include "shuffle_commands.h"
#include "stoker/info.h"
#include "tune_commands.h"

namespace {

// `stoker info`: the version and what the search for a CUDA runtime found (the Python
// package's stoker.build_info() says the same).
void print_info() {
  const stoker::CudaInfo cuda = stoker::cuda_info();
  fmt::print("stoker {}\n", stoker::version());
  fmt::print("cuda runtime: {}\n", cuda.library.empty() ? "none found" : cuda.library);
  if (!cuda.library.empty()) {
    fmt::print("cuda runtime version: {}.{}\n", cuda.runtime_version / 1000,
               cuda.runtime_version % 1000 / 10);
    fmt::print("cuda driver version: {}\n", cuda.driver_version
                                                ? fmt::format("{}.{}", cuda.driver_version / 1000,
                                                              cuda.driver_version % 1000 / 10)
                                                : "none");
  }
  fmt::print("cuda devices: {}\n", cuda.devices);
  if (!cuda.why.empty()) fmt::print("why no device: {}\n", cuda.why);
  fmt::print("searched: {}\n", fmt::join(cuda.searched, ", "));
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"stoker: keeps accelerators fed with training data"};
  app.require_subcommand(1);
  app.set_version_flag("--version", "stoker " + std::string(stoker::version()));
  auto* info = app.add_subcommand("info", "Show the version and the CUDA runtime found");

  stoker::bench::BenchOptions bench;
  auto* cmd = app.add_subcommand(
      "bench", "Benchmark stoker against the PyTorch DataLoader on generated data");
  cmd->add_option("-w,--workload", bench.workloads,
                  "tensor, tiny, heavy, overhead (default: these four), jpeg (opt-in: needs "
                  "torchvision for its baseline, see scripts/bench_jpeg.sh)")
      ->check(CLI::IsMember({"tensor", "tiny", "heavy", "overhead", "jpeg"}));
  cmd->add_flag("--json", bench.json, "Print one JSON object instead of tables");
  cmd->add_flag("--smoke", bench.smoke, "Tiny sizes: check that everything runs");
  cmd->add_flag("!--no-baseline", bench.baseline, "Skip the PyTorch DataLoader side");
  cmd->add_flag("-v,--verbose", bench.verbose, "Show the PyTorch side's progress");
  cmd->add_option("--python", bench.python, "Python with torch for the baseline");
  cmd->add_option("--baseline-script", bench.baseline_script, "Path to torch_dataloader.py");
  cmd->add_option("--workers", bench.workers, "stoker worker threads (default per workload)");
  cmd->add_option("--depth", bench.depth, "Batches in flight (default per workload)");
  cmd->add_option("--epochs", bench.epochs, "Epochs per run (default per workload)");
  cmd->add_option("--device", bench.device,
                  "sim or cuda[:N]: benchmark the device stage (overlap, H2D rate)");
  cmd->add_option("--consumer-ms", bench.consumer_ms, "heavy: consumer compute per batch");
  cmd->add_option("--trace", bench.trace,
                  "Write a timeline of the stoker side (Chrome trace-event JSON, for Perfetto); "
                  "one file per workload when there are several, and per pipeline and source "
                  "for jpeg (FILE-jpeg-train-folder.json, ...)");
  cmd->add_option("--trace-cost", bench.trace_cost_runs,
                  "Instead: run the stoker side untraced and traced, alternated N times, and "
                  "print what tracing costs");
  stoker::bench::JpegBenchOptions jpeg_bench;
  cmd->add_option("--data-dir", jpeg_bench.data_dir, "jpeg: where the generated images live");
  std::string parquet;
  std::vector<std::string> parquet_columns{"image", "label"};
  cmd->add_option("--parquet", parquet,
                  "Instead: Parquet files (a file or a directory of *.parquet) through "
                  "stoker::ParquetDataset and the train pipeline, against pyarrow + PIL + torch "
                  "(bench/parquet_bench.py) at its best num_workers (needs a build with Arrow "
                  "C++)");
  cmd->add_option("--columns", parquet_columns,
                  "--parquet: an encoded-image column and a label (default: image label)");

  auto run_image_command = stoker::tools::add_image_commands(app);
  auto run_tune_command = stoker::tools::add_tune_commands(app);
  auto run_shuffle_command = stoker::tools::add_shuffle_commands(app);

  CLI11_PARSE(app, argc, argv);
  stoker::tools::install_interrupt_handler();
  try {
    if (info->parsed()) {
      print_info();
      return 0;
    }
    if (const int rc = run_image_command(); rc >= 0) return rc;
    if (const int rc = run_tune_command(); rc >= 0) return rc;
    if (const int rc = run_shuffle_command(); rc >= 0) return rc;
    if (cmd->parsed() && !parquet.empty()) {
#ifdef STOKER_HAVE_PARQUET
      return stoker::bench::run_parquet(bench, parquet, parquet_columns);
#else
      throw std::invalid_argument(
          "--parquet: this stoker was built without Arrow C++ (cmake/parquet.cmake)");
#endif
    }
    if (cmd->parsed()) {
      // jpeg runs on its own (its baseline needs torchvision), after any other workloads.
      auto& w = bench.workloads;
      const bool jpeg = std::erase(w, "jpeg") > 0;
      if (!w.empty()) {
        if (const int rc = stoker::bench::run(bench); rc != 0 || !jpeg) return rc;
      }
      return stoker::bench::run_jpeg(bench, jpeg_bench);
    }
  } catch (const stoker::tools::Interrupted&) {
    fmt::print(stderr, "stoker: interrupted\n");
    return 130;  // as a shell reports a command ended by SIGINT
  } catch (const std::exception& e) {
    fmt::print(stderr, "stoker: {}\n", e.what());
    return 1;
  }
  return 0;
}
