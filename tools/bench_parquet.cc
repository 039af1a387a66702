#include "bench_parquet.h"

#include <fmt/core.h>
#include <time.h>

#include <nlohmann/json.hpp>
#include <stdexcept>
#include <thread>

#include "bench_util.h"
#include "interrupt.h"
#include "progress.h"
#include "stoker/loader.h"
#include "stoker/parquet.h"

namespace stoker::bench {

using json = nlohmann::json;

namespace {

double process_cpu_seconds() {
  timespec t{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
  return static_cast<double>(t.tv_sec) + 1e-9 * static_cast<double>(t.tv_nsec);
}

}  // namespace

int run_parquet(const BenchOptions& o, const std::string& files,
                const std::vector<std::string>& columns) {
  // As bench/parquet_bench.py measures stoker.ParquetDataset: the train pipeline, batch 64,
  // shuffled, every row group kept in RAM (1 GiB), a warm-up epoch, then `epochs` epochs timed
  // as one span.
  const std::size_t epochs = o.epochs ? o.epochs : (o.smoke ? 1 : 2);
  const std::size_t workers =
      o.workers ? o.workers : std::max(1u, std::thread::hardware_concurrency());
  ParquetOptions po;
  po.files = {files};
  po.columns = columns;
  po.transform = ImageTransform::train(224);
  po.cache_bytes = std::size_t{1} << 30;
  auto dataset = std::make_shared<ParquetDataset>(po);
  LoaderOptions lo;
  lo.dataset = dataset;
  lo.batch_size = o.smoke ? 16 : 64;
  lo.shuffle = true;
  lo.workers = workers;
  Loader loader(lo);
  if (!o.trace.empty()) loader.trace(o.trace);
  tools::ProgressBar bar("parquet: stoker, batches", (epochs + 1) * loader.batches_per_epoch(),
                         o.json);
  std::size_t taken = 0;
  std::size_t images = 0;
  Clock::time_point start;
  double cpu_start = 0;
  for (std::size_t e = 0; e <= epochs; ++e) {
    if (e == 1) {
      start = Clock::now();
      cpu_start = process_cpu_seconds();
      images = 0;
    }
    loader.set_epoch(e);
    while (auto b = loader.next()) {
      tools::throw_if_interrupted();
      images += b->size();
      bar.update(++taken);
    }
  }
  const double stoker_rate = static_cast<double>(images) / seconds_since(start);
  // CPU time per image of the whole process (the loader's threads: nothing else runs), which
  // a shared machine's load moves much less than images/s.
  const double cpu_ms = 1e3 * (process_cpu_seconds() - cpu_start) / static_cast<double>(images);
  loader.stop_trace();
  json result = {{"workload", "parquet"},
                 {"files", files},
                 {"columns", columns},
                 {"rows", dataset->size()},
                 {"epochs", epochs},
                 {"stoker_workers", workers},
                 {"stoker_images_per_s", stoker_rate},
                 {"stoker_cpu_ms_per_image", cpu_ms},
                 {"stoker_row_group_reads", dataset->counters().row_group_reads}};
  if (!o.json) {
    fmt::print("parquet: {} rows of {}, train pipeline, batch {}\n", dataset->size(), files,
               lo.batch_size);
    fmt::print(
        "  stoker::ParquetDataset (Arrow C++), {} workers: {:.1f} images/s, {:.2f} ms of CPU "
        "per image\n",
        workers, stoker_rate, cpu_ms);
    std::fflush(stdout);
  }
  if (o.baseline) {
    const std::string script = source_file("bench/parquet_bench.py");
    const std::string cmd =
        fmt::format("{} {} --file {} --torch-only --runs {} --batch-size {} --json {}",
                    shell_quote(o.python), shell_quote(script), shell_quote(files), epochs,
                    lo.batch_size, o.verbose ? "" : "2>/dev/null");
    std::string out;
    if (run_command(cmd, out) != 0) {
      throw std::runtime_error(fmt::format(
          "the pyarrow + torch baseline failed (pyarrow, torch and pillow for {}? -v shows its "
          "log)",
          o.python));
    }
    const json torch = json::parse(out);
    const double best = torch.at("torch_best_images_per_s").get<double>();
    result["torch_images_per_s"] = torch.at("torch_images_per_s");
    result["torch_best_workers"] = torch.at("torch_best_workers");
    result["torch_best_images_per_s"] = best;
    result["speedup"] = stoker_rate / best;
    if (!o.json) {
      fmt::print("  pyarrow + PIL + torch DataLoader, best num_workers={}: {:.1f} images/s\n",
                 torch.at("torch_best_workers").get<int>(), best);
      fmt::print("  stoker / torch: {:.2f}x\n", stoker_rate / best);
    }
  }
  if (o.json) fmt::print("{}\n", result.dump());
  return 0;
}

}  // namespace stoker::bench
