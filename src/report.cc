#include "stoker/report.h"

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "util/format.h"

namespace stoker {
namespace {

// Waiting for more than this share of its time, the training loop is input-bound; for less
// than kCalm, it is compute-bound.
constexpr double kInputBound = 0.10;
constexpr double kCalm = 0.03;
// As the tuner's (src/tune/tuner.h): a GIL busy for more than this share is saturated; reads
// on a CPU for less than half their time wait (I/O, sleeps); workers busy for less than kStarved
// of the time wait for batches to read.
constexpr double kGilSaturated = 0.35;
constexpr double kStarved = 0.6;
// Reads runnable but waiting for a core for more than this share of their time: the machine's
// cores are taken, if not by this loader then by others.
constexpr double kRunDelay = 0.2;
// Reads waiting for remote workers' replies for more than this share of their time are the
// network stage's; remote workers reading for at least kRemoteSaturated of their time are
// saturated (else they idle while rows travel: the network, or the object store, is slow).
constexpr double kNetworkDominates = 0.5;
constexpr double kRemoteSaturated = 0.8;
// Reads waiting for object storage for at least this share of their time: the store (its
// latency, the network to it) is the bottleneck rather than the CPU.
constexpr double kStorageDominates = 0.5;

std::string memory_line(const Stats& s) {
  using detail::format;
  const auto mib = [](std::size_t bytes) { return format("%.0f", bytes / 1048576.0); };
  std::string parts;
  const auto part = [&](const char* what, std::size_t bytes) {
    if (bytes == 0) return;
    parts += (parts.empty() ? "" : ", ") + std::string(what) + " " + mib(bytes);
  };
  part("batch slabs", s.memory_slabs);
  part("device slots", s.memory_device_slots);
  part("RAM cache", s.memory_cache);
  part("worker processes", s.memory_workers);
  return "memory: " + mib(s.memory_used) + " MiB of the " + mib(s.memory_limit) + " MiB cap" +
         (parts.empty() ? "" : " (" + parts + ")") + ", peak " + mib(s.memory_peak) + " MiB";
}

// The verdict from the loader's own stages (reads, the GIL, remote workers, the training
// loop), before object storage is looked at.
Report diagnose_stages(const Stats& s, bool process_workers,
                       const std::vector<std::string>& cheaper_reads) {
  using detail::format;
  Report r;
  r.workers = s.workers;
  r.cpu_cores = s.cpu_cores;
  r.memory_limit = s.memory_limit;
  r.memory_used = s.memory_used;
  r.memory_peak = s.memory_peak;
  if (s.memory_limit != 0) r.memory = memory_line(s);
  if (s.batches == 0 || s.elapsed.count() <= 0) {
    r.verdict = "no data yet";
    return r;
  }
  const double elapsed = to_seconds(s.elapsed);
  const double busy_s = to_seconds(s.workers > 0 ? s.worker_busy : s.inline_busy);
  const double cpu_s = to_seconds(s.worker_cpu);
  r.wait_fraction = s.wait_fraction();
  r.samples_per_second = s.samples_per_second();
  r.worker_busy =
      std::min(1.0, busy_s / (static_cast<double>(std::max<std::size_t>(1, s.workers)) * elapsed));
  r.worker_cores = (process_workers ? std::max(cpu_s, busy_s) : cpu_s) / elapsed;
  r.gil_busy = to_seconds(s.worker_lock_held) / elapsed;
  r.worker_run_delay = to_seconds(s.worker_run_delay) / std::max(busy_s, 1e-9);
  r.network_wait = to_seconds(s.network_wait) / std::max(busy_s, 1e-9);
  r.network_bytes_per_second = s.network_bytes_per_second();
  const double remote_s = to_seconds(s.network_read + s.network_idle);
  r.remote_busy = remote_s > 0 ? to_seconds(s.network_read) / remote_s : 0.0;
  const double loop_cores = 1.0 - r.wait_fraction;
  const double delay_s = to_seconds(s.worker_run_delay);
  const bool computing = process_workers || cpu_s + delay_s >= 0.5 * busy_s;
  // Reads that run Python (worker processes, or threads holding the GIL): a Python data set.
  const bool python_reads = process_workers || s.worker_lock_held.count() > 0;
  const std::string cores = format("%.2g cores", r.cpu_cores);

  if (r.wait_fraction < kInputBound) {
    r.verdict = r.wait_fraction < kCalm ? "compute-bound" : "balanced";
    r.busiest = "the training loop";
    r.busiest_load = loop_cores;
    r.more_workers = "more workers would not help: the input pipeline keeps up";
    if (s.workers > 1 && r.worker_busy < 0.5) {
      r.suggestions.push_back(
          format("fewer workers would do: %zu are %.0f%% busy", s.workers, 100 * r.worker_busy));
    }
    return r;
  }
  r.verdict = "input-bound";
  if (s.workers == 0) {
    r.busiest = "reads";
    r.busiest_load = r.worker_cores;
    r.more_workers = "workers would help: every sample is read on the training loop's thread";
    r.suggestions.push_back("workers (num_workers='auto' tunes them)");
    return r;
  }
  if (r.network_wait > kNetworkDominates) {
    if (r.remote_busy >= kRemoteSaturated) {
      r.busiest = "remote reads";
      r.busiest_load = r.remote_busy;
      r.more_workers = "more remote workers would help: they are saturated";
      r.suggestions.push_back("more remote workers (stoker.ray_workers(n))");
    } else {
      r.verdict = "network-bound";
      r.busiest = "the network";
      r.busiest_load = r.network_wait;
      r.more_workers = format(
          "more workers would not help: the remote workers idle %.0f%% of their time while "
          "their rows travel",
          100 * (1 - r.remote_busy));
      r.suggestions.push_back(
          "smaller rows from the remote workers (uint8 crops, a lower resolution)");
      r.suggestions.push_back("more bandwidth to this node, or remote workers nearer to it");
    }
    r.suggestions.push_back("more local workers, if this node's cores are idle");
    return r;
  }
  if (r.gil_busy > kGilSaturated) {
    r.busiest = "the GIL";
    r.busiest_load = r.gil_busy;
    r.more_workers = "more worker threads would not help: the GIL is saturated";
    r.suggestions.push_back("worker_type='process'");
    r.suggestions.push_back("__getitem__ work that releases the GIL (numpy, torch ops)");
    return r;
  }
  r.busiest = "reads";
  r.busiest_load = r.worker_cores;
  if (r.worker_busy < kStarved) {
    r.more_workers = format(
        "more workers would not help: they are %.0f%% busy, waiting for "
        "batches to read",
        100 * r.worker_busy);
    r.suggestions.push_back("more batches in flight (depth; prefetch_factor in Python)");
    return r;
  }
  // The budget's cores in use, or the reads waiting for a core (others use them).
  const bool saturated =
      r.worker_cores + loop_cores > r.cpu_cores - 0.5 || r.worker_run_delay > kRunDelay;
  if (computing && saturated) {
    r.more_workers = "more workers would not help: CPU saturated";
    if (r.worker_run_delay > kRunDelay) {
      r.more_workers +=
          format(" (reads waited for a core %.0f%% of their time)", 100 * r.worker_run_delay);
    }
    if (python_reads) {
      // A Python data set's own per-sample work is what fills the cores.
      r.suggestions.push_back("remote workers on other machines (remote=stoker.ray_workers(n))");
      r.suggestions.push_back(
          "less Python per sample: __getitems__ to read a chunk at once, work on whole arrays");
      r.suggestions.push_back(
          "stoker's native pipeline (stoker.ImageFolder, stoker.transforms), if it decodes "
          "images");
      return r;
    }
    r.suggestions.insert(r.suggestions.end(), cheaper_reads.begin(), cheaper_reads.end());
    return r;
  }
  if (computing) {
    r.more_workers = format("more workers would help: %.1f of %s idle",
                            r.cpu_cores - r.worker_cores - loop_cores, cores.c_str());
  } else {
    r.more_workers = format(
        "more workers would help: reads are on a CPU %.0f%% of their time, "
        "the rest waits (I/O, sleeps)",
        100 * cpu_s / std::max(busy_s, 1e-9));
    r.suggestions.push_back("record shards (stoker pack) or a RAM cache, if the wait is I/O");
  }
  r.suggestions.insert(r.suggestions.begin(), "num_workers='auto' (tune_workers), or more workers");
  return r;
}

// Object storage's numbers, and the verdict network-bound when the loop waits for reads that
// wait for the store at least kStorageDominates of their time.
void add_object_storage(const Stats& s, Report& r) {
  using detail::format;
  const double busy_s = to_seconds(s.worker_busy + s.inline_busy);
  const double elapsed = to_seconds(s.elapsed);
  r.storage_wait = busy_s > 0 ? std::min(1.0, to_seconds(s.storage_wait) / busy_s) : 0.0;
  r.storage_fetch_latency =
      s.storage_fetches ? to_seconds(s.storage_fetch_time) / static_cast<double>(s.storage_fetches)
                        : 0.0;
  r.storage_bytes_per_second = elapsed > 0 ? static_cast<double>(s.storage_bytes) / elapsed : 0.0;
  if (s.storage_fetches + s.storage_cache_hits == 0) return;
  r.storage = format(
      "object storage: %llu chunk GETs at %.0f ms each, %.1f MB/s fetched, %llu retries, %llu "
      "reads from the local cache",
      static_cast<unsigned long long>(s.storage_fetches), 1e3 * r.storage_fetch_latency,
      r.storage_bytes_per_second / 1e6, static_cast<unsigned long long>(s.storage_retries),
      static_cast<unsigned long long>(s.storage_cache_hits));
  if (!s.shuffle.empty()) r.storage += "; shuffle: " + s.shuffle;  // which, and why
  if (r.verdict != "input-bound" || r.storage_wait < kStorageDominates) return;
  r.verdict = "network-bound";
  r.busiest = "the object store";
  r.busiest_load = r.storage_wait;
  r.more_workers =
      "more workers would help as more reads in flight: a read waiting for its "
      "chunk holds a worker and no CPU";
  const std::vector<std::string> store = {
      format("more reads in flight: num_workers above %zu (a read waiting %.0f ms for its chunk "
             "holds a worker thread and no CPU)",
             s.workers, 1e3 * r.storage_fetch_latency),
      "a local object cache that holds the data set (object_cache_bytes), so that later epochs "
      "read from disk",
      "the bucket in the machines' region, or an endpoint closer to them (AWS_ENDPOINT_URL)"};
  r.suggestions.insert(r.suggestions.begin(), store.begin(), store.end());
}

}  // namespace

Report diagnose(const Stats& s, bool process_workers,
                const std::vector<std::string>& cheaper_reads) {
  Report r = diagnose_stages(s, process_workers, cheaper_reads);
  add_object_storage(s, r);
  return r;
}

std::string Report::text() const {
  using detail::format;
  if (verdict == "no data yet") {
    return "no data yet: no batch was handed out" + (memory.empty() ? "" : "; " + memory);
  }
  std::string out = format("%s: the training loop waited %.0f%% of its time (%.0f samples/s); ",
                           verdict.c_str(), 100 * wait_fraction, samples_per_second);
  if (busiest == "reads") {
    out += format(
        "reads are the busiest stage at %.0f%% of %.2g cores (workers %zu, %.0f%% "
        "busy)",
        100 * busiest_load / std::max(cpu_cores, 1e-9), cpu_cores, workers, 100 * worker_busy);
  } else if (busiest == "the object store") {
    out += format("the object store is the busiest stage: reads waited for it %.0f%% of their time",
                  100 * busiest_load);
  } else if (busiest == "the network" || busiest == "remote reads") {
    out += format(
        "%s %s the busiest stage: reads waited for remote workers %.0f%% of their time "
        "(%.3g MB/s of rows received), and the remote workers read %.0f%% of theirs",
        busiest.c_str(), busiest == "the network" ? "is" : "are", 100 * network_wait,
        network_bytes_per_second / 1e6, 100 * remote_busy);
  } else {
    out += format("%s is the busiest stage at %.0f%% of the time", busiest.c_str(),
                  100 * busiest_load);
  }
  out += "; " + more_workers;
  if (!suggestions.empty()) {
    out += "; try: ";
    for (std::size_t i = 0; i < suggestions.size(); ++i) {
      out += (i ? " / " : "") + suggestions[i];
    }
  }
  if (!storage.empty()) out += "; " + storage;
  if (!memory.empty()) out += "; " + memory;
  return out;
}

}  // namespace stoker
