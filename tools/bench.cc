#include "bench.h"

#include <fmt/core.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <memory>
#include <nlohmann/json.hpp>
#include <numeric>
#include <optional>
#include <random>
#include <stdexcept>
#include <thread>

#include "bench_util.h"
#include "interrupt.h"
#include "progress.h"
#include "stoker/frontend/sim_step.h"
#include "stoker/loader.h"
#include "stoker/sources.h"

namespace stoker::bench {
namespace {

using json = nlohmann::json;

struct Workload {
  std::string name;
  std::string description;
  std::size_t samples = 0;
  std::size_t batch_size = 0;
  std::vector<FieldSpec> fields;
  double latency_ms = 0;   // slept per sample (heavy)
  double consumer_ms = 0;  // spun per batch by the training loop (heavy)
  bool in_memory = true;   // samples materialized as arrays first (tensor, tiny)
  std::size_t epochs = 5;
  std::size_t workers = 2;
  std::size_t depth = 4;
  bool torch_baseline = true;
};

Workload make_workload(const std::string& name, const BenchOptions& o) {
  Workload w;
  w.name = name;
  const FieldSpec label{"label", DType::i64, {}};
  if (name == "tensor") {
    w.description = "uint8 3x224x224 in memory, batch 64, shuffled";
    w.samples = o.smoke ? 256 : 4096;
    w.batch_size = 64;
    w.fields = {{"image", DType::u8, {3, 224, 224}}, label};
  } else if (name == "tiny") {
    w.description = "float32 784 in memory (MNIST-like), batch 256, shuffled";
    w.samples = o.smoke ? 6000 : 60000;
    w.batch_size = 256;
    w.fields = {{"x", DType::f32, {784}}, label};
  } else if (name == "heavy") {
    w.description =
        "float32 3x224x224, 5 ms latency per sample, batch 64, shuffled, "
        "consumer computes 50 ms per batch";
    w.samples = o.smoke ? 128 : 1024;
    w.batch_size = 64;
    w.fields = {{"x", DType::f32, {3, 224, 224}}, label};
    w.latency_ms = o.smoke ? 1 : 5;
    w.consumer_ms = o.smoke ? 2 : 50;
    w.in_memory = false;
    w.epochs = 3;
    // Latency-bound samples sleep, so threads beyond the core count still overlap them.
    w.workers = 8;
    w.depth = 4;
  } else if (name == "overhead") {
    w.description = "1-byte samples, batch 64: the loader's own cost per batch";
    w.samples = o.smoke ? 6400 : 640000;
    w.batch_size = 64;
    w.fields = {{"x", DType::u8, {1}}};
    w.workers = 1;
    w.torch_baseline = false;
  } else {
    throw std::invalid_argument("unknown workload '" + name +
                                "' (choose from tensor, tiny, heavy, overhead)");
  }
  if (o.smoke) w.epochs = 2;
  if (o.epochs) w.epochs = o.epochs;
  if (o.workers) w.workers = o.workers;
  if (o.depth) w.depth = o.depth;
  if (o.consumer_ms >= 0 && name == "heavy") w.consumer_ms = o.consumer_ms;
  return w;
}

struct Measurement {
  std::size_t workers = 0;
  std::size_t depth = 0;
  double samples_per_s = 0;
  double gb_per_s = 0;
  double first_batch_ms = 0;
  double wait_pct = 0;
  double epoch_s = 0;
  std::vector<double> epoch_times;
};

json to_json(const Measurement& m) {
  return {{"workers", m.workers},
          {"depth", m.depth},
          {"samples_per_s", m.samples_per_s},
          {"gb_per_s", m.gb_per_s},
          {"first_batch_ms", m.first_batch_ms},
          {"wait_pct", m.wait_pct},
          {"epoch_s", m.epoch_s},
          {"epoch_times_s", m.epoch_times}};
}

// The workload's trace file: --trace, named with the workload when there are several.
std::string trace_path(const BenchOptions& o, const Workload& w) {
  return o.trace.empty() || o.workloads.size() <= 1 ? o.trace : with_name(o.trace, w.name);
}

// The stoker side; traced into `trace` unless it is empty.
Measurement run_stoker(const Workload& w, std::shared_ptr<const Dataset> dataset,
                       const std::string& trace, bool quiet) {
  LoaderOptions o;
  o.dataset = std::move(dataset);
  o.batch_size = w.batch_size;
  o.shuffle = true;
  o.workers = w.workers;
  o.depth = w.depth;

  Measurement m;
  m.workers = w.workers;
  m.depth = w.depth;
  std::vector<double> waits;
  const auto created = Clock::now();
  Loader loader(o);
  if (!trace.empty()) loader.trace(trace);
  tools::ProgressBar bar(w.name + ": stoker, batches", w.epochs * loader.batches_per_epoch(),
                         quiet);
  std::size_t taken = 0;
  std::size_t samples_per_epoch = 0;
  std::size_t bytes_per_epoch = 0;
  for (std::size_t e = 0; e < w.epochs; ++e) {
    const auto start = Clock::now();
    const auto wait_before = loader.stats().consumer_wait;
    samples_per_epoch = bytes_per_epoch = 0;
    while (auto batch = loader.next()) {
      tools::throw_if_interrupted();
      if (e == 0 && samples_per_epoch == 0) {
        m.first_batch_ms = 1e3 * std::chrono::duration<double>(Clock::now() - created).count();
      }
      samples_per_epoch += batch->size();
      for (std::size_t f = 0; f < batch->fields().size(); ++f) {
        bytes_per_epoch += batch->bytes(f).size();
      }
      if (w.consumer_ms > 0) spin_for(w.consumer_ms);
      bar.update(++taken);
    }
    const double t = seconds_since(start);
    m.epoch_times.push_back(t);
    waits.push_back(100.0 * to_seconds(loader.stats().consumer_wait - wait_before) / t);
  }
  // Steady state: the first epoch (thread and pool start-up) is reported as first_batch_ms.
  std::vector<double> steady(m.epoch_times.begin() + (m.epoch_times.size() > 1 ? 1 : 0),
                             m.epoch_times.end());
  std::vector<double> steady_waits(waits.begin() + (waits.size() > 1 ? 1 : 0), waits.end());
  m.epoch_s = median(steady);
  m.wait_pct = median(steady_waits);
  m.samples_per_s = samples_per_epoch / m.epoch_s;
  m.gb_per_s = bytes_per_epoch / m.epoch_s / 1e9;
  loader.stop_trace();  // written here, outside the timed epochs, and a failure is reported
  return m;
}

// memcpy bandwidth in GB/s (bytes copied per second) on `threads` threads, best of 5.
double memcpy_gbps(std::size_t threads, std::size_t bytes) {
  std::vector<std::byte> src(bytes, std::byte{1}), dst(bytes, std::byte{2});
  double best = 0;
  for (int rep = 0; rep < 5; ++rep) {
    const auto start = Clock::now();
    std::vector<std::thread> pool;
    const std::size_t part = bytes / threads;
    for (std::size_t t = 0; t < threads; ++t) {
      pool.emplace_back(
          [&, t] { std::memcpy(dst.data() + t * part, src.data() + t * part, part); });
    }
    for (auto& th : pool) th.join();
    best = std::max(best, static_cast<double>(part * threads) / seconds_since(start) / 1e9);
  }
  return best;
}

// The gather's limit, as the same work done by the simplest code: each field's rows (of the
// sample's size) copied in the epoch's shuffled order from an in-memory array into a reused
// buffer of one batch, the batches dealt out to `threads` threads (each with its own buffer).
// GB/s of rows copied over one epoch, the median of 5 epochs: the statistic stoker's own rate
// is (the median of its steady epochs). A best of 5 took one lucky epoch of the limit against
// stoker's typical one: on a VM whose memory bandwidth moves between runs it varied 6.1-9.0
// GB/s where stoker's median varied 6.0-6.5.
double gather_gbps(const Workload& w, std::size_t threads) {
  std::vector<std::size_t> row;
  for (const FieldSpec& f : w.fields) row.push_back(f.bytes());
  std::vector<std::vector<std::byte>> src;
  for (const std::size_t r : row) src.emplace_back(w.samples * r, std::byte{1});
  std::vector<std::size_t> order(w.samples);
  std::iota(order.begin(), order.end(), std::size_t{0});
  std::shuffle(order.begin(), order.end(), std::mt19937_64(0));
  const std::size_t batches = (w.samples + w.batch_size - 1) / w.batch_size;
  double bytes = 0;
  for (const std::size_t r : row) bytes += static_cast<double>(w.samples * r);
  std::vector<double> rates;
  for (int rep = 0; rep < 5; ++rep) {
    const auto start = Clock::now();
    std::vector<std::thread> pool;
    for (std::size_t t = 0; t < threads; ++t) {
      pool.emplace_back([&, t] {
        std::vector<std::vector<std::byte>> buffer;
        for (const std::size_t r : row) buffer.emplace_back(w.batch_size * r);
        for (std::size_t b = t; b < batches; b += threads) {
          const std::size_t first = b * w.batch_size;
          const std::size_t end = std::min(w.samples, first + w.batch_size);
          for (std::size_t f = 0; f < row.size(); ++f) {
            std::byte* out = buffer[f].data();
            for (std::size_t i = first; i < end; ++i, out += row[f]) {
              std::memcpy(out, src[f].data() + order[i] * row[f], row[f]);
            }
          }
        }
      });
    }
    for (auto& th : pool) th.join();
    rates.push_back(bytes / seconds_since(start) / 1e9);
  }
  return median(rates);
}

std::string read_file(const std::string& path) {
  std::string text;
  if (FILE* f = std::fopen(path.c_str(), "r")) {
    char buf[4096];
    while (std::size_t n = std::fread(buf, 1, sizeof buf, f)) text.append(buf, n);
    std::fclose(f);
  }
  return text;
}

// Runs the PyTorch side; returns its JSON, or an error message. Its progress on stderr is kept
// in a temporary file and shown only if it fails (or with --verbose).
std::optional<json> run_torch(const Workload& w, const BenchOptions& o, std::string& error) {
  const std::string script =
      o.baseline_script.empty() ? source_file("bench/torch_dataloader.py") : o.baseline_script;
  std::string log_path =
      (std::filesystem::temp_directory_path() / "stoker-baseline-XXXXXX").string();
  const int log_fd = mkstemp(log_path.data());
  if (log_fd < 0) {
    error = "cannot create a temporary file for the baseline's log";
    return std::nullopt;
  }
  close(log_fd);
  const std::string cmd = fmt::format(
      "{} {} --workload {} --samples {} --epochs {} --batch-size {} --latency-ms {} "
      "--consumer-ms {} 2>{}",
      shell_quote(o.python), shell_quote(script), w.name, w.samples, w.epochs, w.batch_size,
      w.latency_ms, w.consumer_ms, o.verbose ? "&2" : log_path);
  std::string out;
  int status = 0;
  try {
    status = run_command(cmd, out);
  } catch (...) {  // interrupted
    std::remove(log_path.c_str());
    throw;
  }
  const std::string log = read_file(log_path);
  std::remove(log_path.c_str());
  if (status != 0) {
    error =
        fmt::format("the PyTorch baseline failed (is torch installed for {}?):\n{}", o.python, log);
    return std::nullopt;
  }
  try {
    return json::parse(out);
  } catch (const json::exception& e) {
    error = std::string("unreadable output from the PyTorch baseline: ") + e.what();
    return std::nullopt;
  }
}

std::shared_ptr<const Dataset> make_dataset(const Workload& w) {
  SyntheticDataset::Options so;
  so.samples = w.samples;
  so.fields = w.fields;
  so.latency = std::chrono::microseconds(static_cast<std::int64_t>(w.latency_ms * 1000));
  auto synthetic = std::make_shared<SyntheticDataset>(so);
  if (!w.in_memory) return synthetic;
  return ArrayDataset::materialize(*synthetic);
}

void print_row(const std::string& who, double sps, double gbps, double first_ms, double wait) {
  fmt::print("  {:<34} {:>12.0f} {:>9.2f} {:>15.1f} {:>8.1f}\n", who, sps, gbps, first_ms, wait);
}

// The stoker side untraced and traced (into a temporary file, written after the timed
// epochs), alternated o.trace_cost_runs times: medians and their ratio.
json run_trace_cost(const Workload& w, const BenchOptions& o, json result) {
  char path[] = "/tmp/stoker-trace-cost-XXXXXX";
  const int fd = mkstemp(path);
  if (fd < 0) throw std::runtime_error("cannot create a temporary file for the trace");
  close(fd);
  const auto dataset = make_dataset(w);
  std::vector<double> off, on;
  try {
    for (std::size_t run = 0; run < o.trace_cost_runs; ++run) {
      off.push_back(run_stoker(w, dataset, "", o.json).samples_per_s);
      on.push_back(run_stoker(w, dataset, path, o.json).samples_per_s);
    }
  } catch (...) {
    std::remove(path);  // Ctrl-C leaves nothing behind
    throw;
  }
  std::remove(path);
  const double ratio = median(on) / median(off);
  result["trace_cost"] = {{"untraced_samples_per_s", off},
                          {"traced_samples_per_s", on},
                          {"traced_over_untraced", ratio}};
  if (!o.json) {
    fmt::print(
        "  samples/s, median of {} alternated runs: untraced {:.0f}, traced {:.0f}; "
        "traced / untraced = {:.3f}\n",
        o.trace_cost_runs, median(off), median(on), ratio);
    std::fflush(stdout);
  }
  return result;
}

json run_workload(const Workload& w, const BenchOptions& o) {
  json result = {{"workload", w.name},
                 {"description", w.description},
                 {"samples", w.samples},
                 {"batch_size", w.batch_size},
                 {"epochs", w.epochs}};
  if (!o.json) {
    fmt::print("\n{}: {} samples, {}\n", w.name, w.samples, w.description);
    std::fflush(stdout);
  }
  if (o.trace_cost_runs > 0) return run_trace_cost(w, o, std::move(result));
  const Measurement m = run_stoker(w, make_dataset(w), trace_path(o, w), o.json);
  result["stoker"] = to_json(m);

  std::optional<json> torch;
  if (o.baseline && w.torch_baseline) {
    std::string error;
    tools::ProgressBar bar(w.name + ": PyTorch DataLoader (a subprocess)", 0, o.json);
    bar.update(0);
    torch = run_torch(w, o, error);
    if (torch) {
      result["torch"] = (*torch)["best"];
      result["torch_runs"] = (*torch)["runs"];
      result["torch_version"] = (*torch)["torch_version"];
      result["ratio"] = m.samples_per_s / (*torch)["best"]["samples_per_s"].get<double>();
    } else {
      result["torch_error"] = error;
    }
  }
  if (w.name == "tensor") {
    const std::size_t bytes = o.smoke ? (32u << 20) : (512u << 20);
    const double one = memcpy_gbps(1, bytes), two = memcpy_gbps(2, bytes);
    result["memcpy_gb_per_s"] = {{"1", one}, {"2", two}};
    result["fraction_of_memcpy_2t"] = m.gb_per_s / two;
  }
  if (w.name == "tensor" || w.name == "tiny") {
    const double gather = gather_gbps(w, m.workers);
    result["gather_gb_per_s"] = gather;
    result["fraction_of_gather"] = m.gb_per_s / gather;
  }
  if (w.name == "heavy") {
    const double batches = std::ceil(static_cast<double>(w.samples) / w.batch_size);
    const double compute_s = batches * w.consumer_ms / 1e3;
    const double latency_s = w.samples * w.latency_ms / 1e3 / w.workers;
    result["bound_s"] = std::max(compute_s, latency_s);
    result["compute_s"] = compute_s;
    result["latency_per_worker_s"] = latency_s;
    result["epoch_over_bound"] = m.epoch_s / std::max(compute_s, latency_s);
  }
  if (w.name == "overhead") {
    result["us_per_batch"] = 1e6 * m.epoch_s / std::ceil(double(w.samples) / w.batch_size);
  }

  if (!o.json) {
    fmt::print("  {:<34} {:>12} {:>9} {:>15} {:>8}\n", "", "samples/s", "GB/s", "first batch ms",
               "wait %");
    print_row(fmt::format("stoker (workers {})", m.workers), m.samples_per_s, m.gb_per_s,
              m.first_batch_ms, m.wait_pct);
    if (torch) {
      const json& b = (*torch)["best"];
      print_row(
          fmt::format("torch {} (best: workers {})", (*torch)["torch_version"].get<std::string>(),
                      b["num_workers"].get<int>()),
          b["samples_per_s"], b["gb_per_s"], b["first_batch_ms"], b["wait_pct"]);
      fmt::print("  stoker / torch: {:.2f}x\n", result["ratio"].get<double>());
    } else if (result.contains("torch_error")) {
      fmt::print("  torch: not measured: {}\n", result["torch_error"].get<std::string>());
    }
    if (result.contains("memcpy_gb_per_s")) {
      fmt::print(
          "  memcpy: {:.2f} GB/s on 1 thread, {:.2f} GB/s on 2; stoker at {:.0f}% of 2-thread "
          "memcpy\n",
          result["memcpy_gb_per_s"]["1"].get<double>(),
          result["memcpy_gb_per_s"]["2"].get<double>(),
          100 * result["fraction_of_memcpy_2t"].get<double>());
    }
    if (result.contains("gather_gb_per_s")) {
      fmt::print(
          "  gather: {:.2f} GB/s on {} threads (rows shuffled into a reused batch buffer); "
          "stoker at {:.0f}% of it\n",
          result["gather_gb_per_s"].get<double>(), m.workers,
          100 * result["fraction_of_gather"].get<double>());
    }
    if (result.contains("bound_s")) {
      fmt::print(
          "  epoch {:.3f} s; bound max(compute {:.3f} s, latency/workers {:.3f} s); "
          "epoch / bound = {:.3f}\n",
          m.epoch_s, result["compute_s"].get<double>(),
          result["latency_per_worker_s"].get<double>(), result["epoch_over_bound"].get<double>());
    }
    if (result.contains("us_per_batch")) {
      fmt::print("  loader overhead: {:.2f} us per batch\n", result["us_per_batch"].get<double>());
    }
    std::fflush(stdout);
  }
  return result;
}

// --- the device stage ----------------------------------------------------------------------

// A `tensor`-like batch layout in memory, for the device benchmarks.
std::shared_ptr<const Dataset> device_dataset(std::size_t samples) {
  SyntheticDataset::Options so;
  so.samples = samples;
  so.fields = {{"image", DType::u8, {3, 224, 224}}, {"label", DType::i64, {}}};
  return ArrayDataset::materialize(SyntheticDataset(so));
}

json run_device_sim(const BenchOptions& o) {
  const auto ds = device_dataset(o.smoke ? 64 : 640);
  json rows = json::array();
  if (!o.json) {
    fmt::print(
        "\ndevice sim: batches of 64 x uint8 3x224x224; simulated copy T and kernel C per "
        "batch\n  {:>8} {:>8} {:>6} {:>12} {:>12} {:>12} {:>14}\n",
        "C ms", "T ms", "depth", "step ms", "max(C,T) ms", "C+T ms", "step/max(C,T)");
  }
  for (auto [c, t] : {std::pair{10.0, 4.0}, {4.0, 10.0}, {8.0, 8.0}}) {
    for (std::size_t depth : {1, 2, 4}) {
      const double step = 1e3 * detail::sim_step(ds, 64, t / 1e3, c / 1e3, depth).step_s;
      rows.push_back({{"compute_ms", c},
                      {"copy_ms", t},
                      {"device_depth", depth},
                      {"step_ms", step},
                      {"max_ms", std::max(c, t)},
                      {"sum_ms", c + t}});
      if (!o.json) {
        fmt::print("  {:>8.1f} {:>8.1f} {:>6} {:>12.3f} {:>12.1f} {:>12.1f} {:>14.3f}\n", c, t,
                   depth, step, std::max(c, t), c + t, step / std::max(c, t));
      }
    }
  }
  return {{"workload", "device"}, {"device", "sim"}, {"steps", rows}};
}

// Host-to-device GB/s through the loader, pinned against pageable slabs; the consumer waits
// for every batch's copy, so this is the delivered rate of a small pipeline (2 workers by
// default) with the copy in it, not the copy engine's rate nor the overlap.
json run_device_cuda(const BenchOptions& o) {
  const auto ds = device_dataset(o.smoke ? 256 : 2048);
  json result = {{"workload", "device"}, {"device", o.device}};
  for (PinMemory pin : {PinMemory::on, PinMemory::off}) {
    LoaderOptions lo;
    lo.dataset = ds;
    lo.batch_size = 64;
    lo.device = o.device;
    lo.pin_memory = pin;
    lo.workers = o.workers ? o.workers : 2;
    Loader loader(lo);
    if (loader.stats().device == "cpu") {
      throw std::runtime_error("no CUDA device answers: nothing to measure for " + o.device);
    }
    std::vector<double> rates;
    for (std::size_t e = 0; e < (o.epochs ? o.epochs : 3); ++e) {
      const auto bytes_before = loader.stats().copy_bytes;
      const auto start = Clock::now();
      while (auto b = loader.next()) {
        tools::throw_if_interrupted();
        b->synchronize();
      }
      rates.push_back(static_cast<double>(loader.stats().copy_bytes - bytes_before) /
                      seconds_since(start) / 1e9);
    }
    const char* name = pin == PinMemory::on ? "pinned" : "pageable";
    result[name] = {{"gb_per_s", median(rates)}, {"locked_slabs", loader.stats().locked_slabs}};
    if (!o.json) fmt::print("  {:<9} slabs: {:.2f} GB/s host to device\n", name, median(rates));
  }
  return result;
}

}  // namespace

WorkloadTarget workload_target(const std::string& name, const BenchOptions& options) {
  const Workload w = make_workload(name, options);
  return {w.description, make_dataset(w), w.batch_size, w.consumer_ms};
}

int run(const BenchOptions& options) {
  if (!options.device.empty() && options.device != "cpu") {
    const json r = options.device == "sim" ? run_device_sim(options) : run_device_cuda(options);
    if (options.json) fmt::print("{}\n", r.dump(2));
    return 0;
  }
  json all = json::array();
  for (const auto& name : options.workloads) {
    all.push_back(run_workload(make_workload(name, options), options));
  }
  if (options.json) fmt::print("{}\n", json{{"smoke", options.smoke}, {"workloads", all}}.dump(2));
  return 0;
}

}  // namespace stoker::bench
