// What a loader has done so far: Stats, and the one table of its fields that every printout
// (the C++ tools, JSON, the Python package's stats() dict) is made from.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <string>

namespace stoker {

// A duration in seconds, as every printout of Stats shows its durations.
inline double to_seconds(std::chrono::nanoseconds ns) {
  return std::chrono::duration<double>(ns).count();
}

struct Stats {
  std::chrono::nanoseconds elapsed{0};  // since the first next()
  std::uint64_t batches = 0;            // handed out
  std::uint64_t samples = 0;
  std::uint64_t bytes = 0;                    // batch bytes handed out
  std::chrono::nanoseconds consumer_wait{0};  // time next() blocked waiting for data
  // CPU time of the thread calling next() between its calls: the training loop's own work
  // (what it does not spend waiting, in sleeps or for a GPU does not count).
  std::chrono::nanoseconds consumer_cpu{0};
  std::chrono::nanoseconds worker_busy{0};  // summed over workers: time spent in read()
  std::chrono::nanoseconds inline_busy{0};  // read() time on the consumer (workers = 0)
  // Of worker_busy, time on a CPU (the rest waited); with worker processes, the CPU time of
  // their main threads too (the executor's, stoker/frontend/executor.h), and their run delay below.
  std::chrono::nanoseconds worker_cpu{0};
  // Skip policy, in the batches handed out: failed reads (a replacement that failed too
  // counts again), and the distinct samples among them (Loader::skipped_samples).
  std::uint64_t skipped = 0;
  std::uint64_t bad_samples = 0;
  std::size_t workers = 0;
  std::size_t depth = 0;
  std::size_t in_flight = 0;        // batches being read or ready, now
  std::size_t ready = 0;            // of those, complete and waiting for the consumer
  double mean_ready_at_next = 0.0;  // ready batches seen by next(), averaged over calls
  std::size_t slabs = 0;            // batch buffers allocated
  std::size_t slab_bytes = 0;       // their total size
  std::size_t locked_slabs = 0;     // of those, page-locked (pinned or mlock'ed)
  std::string device;               // where batches are delivered: "cpu", "cuda:0", "sim"
  std::uint64_t copies = 0;         // host-to-device batch copies issued
  std::uint64_t copy_bytes = 0;
  // Of worker_cpu, time holding a lock that serializes reads (the GIL).
  std::chrono::nanoseconds worker_lock_held{0};
  // Time the workers were runnable but waited for a core (Linux schedstat): with worker_cpu,
  // it tells workers that compute on an oversubscribed machine from ones that wait for I/O.
  std::chrono::nanoseconds worker_run_delay{0};
  // The network stage: chunks read by remote workers, the bytes of
  // their rows received, the time the workers' threads waited for them, and of the replies,
  // the time the remote workers read and idled before them.
  std::uint64_t network_units = 0;
  std::uint64_t network_bytes = 0;
  std::chrono::nanoseconds network_wait{0};
  std::chrono::nanoseconds network_read{0};
  std::chrono::nanoseconds network_idle{0};
  // Object storage (a data set reading s3:// or http(s):// URLs: Dataset::object_storage_counters),
  // since the loader was made: the range GETs made for reads, their time and the bytes
  // fetched, the time reads waited for the store (summed over the reading threads), retries,
  // and chunk reads the local object cache served. All zero for local data.
  std::uint64_t storage_fetches = 0;
  std::chrono::nanoseconds storage_fetch_time{0};
  std::uint64_t storage_bytes = 0;
  std::chrono::nanoseconds storage_wait{0};
  std::uint64_t storage_retries = 0;
  std::uint64_t storage_cache_hits = 0;
  // The epoch order's shuffle and why (tune/shuffle_choice.h): "global: ...", "window of 40
  // blocks (...): ..."; empty without shuffle. shuffle_window: its blocks (0: global).
  std::string shuffle;
  std::size_t shuffle_window = 0;
  double cpu_cores = 0;             // the CPU budget: cores for the workers and the training loop
  std::uint64_t tuner_changes = 0;  // configurations the tuner changed (tune_workers)
  // The tuner's last change and why ("workers 2 -> 3: the training loop waits, ..."), or,
  // without tune_workers, what it would have done once the consumer waited; empty if nothing.
  std::string tuner;
  // The memory cap (LoaderOptions::memory_limit, resolved), what counts against it now and
  // the most seen at once (looked at while next() is called, at most every
  // kMemoryCheckPeriod), and what is held now by kind: the batch slabs, the device slots, the
  // data set's RAM cache and the worker processes' own memory (their Pss_Anon, estimated
  // between background reads: ExecutorStats::resident_bytes).
  std::size_t memory_limit = 0;
  std::size_t memory_used = 0;
  std::size_t memory_peak = 0;
  std::size_t memory_slabs = 0;
  std::size_t memory_device_slots = 0;
  std::size_t memory_cache = 0;
  std::size_t memory_workers = 0;

  double samples_per_second() const;
  double bytes_per_second() const;
  double wait_fraction() const;  // consumer_wait / elapsed
  double network_bytes_per_second() const;
};

// The table of Stats' fields: calls visit(name, value) for each, in declaration order, with
// the field itself (a std::chrono::nanoseconds, an integer, a double or a std::string).
// Printers turn durations into seconds (Python: "<name>_s"). stats.cc checks at compile time
// that the table names every member.
template <class S, class Visit>
void for_each_stat(S& s, Visit&& visit) {
  visit("elapsed", s.elapsed);
  visit("batches", s.batches);
  visit("samples", s.samples);
  visit("bytes", s.bytes);
  visit("consumer_wait", s.consumer_wait);
  visit("consumer_cpu", s.consumer_cpu);
  visit("worker_busy", s.worker_busy);
  visit("inline_busy", s.inline_busy);
  visit("worker_cpu", s.worker_cpu);
  visit("skipped", s.skipped);
  visit("bad_samples", s.bad_samples);
  visit("workers", s.workers);
  visit("depth", s.depth);
  visit("in_flight", s.in_flight);
  visit("ready", s.ready);
  visit("mean_ready_at_next", s.mean_ready_at_next);
  visit("slabs", s.slabs);
  visit("slab_bytes", s.slab_bytes);
  visit("locked_slabs", s.locked_slabs);
  visit("device", s.device);
  visit("copies", s.copies);
  visit("copy_bytes", s.copy_bytes);
  visit("worker_lock_held", s.worker_lock_held);
  visit("worker_run_delay", s.worker_run_delay);
  visit("network_units", s.network_units);
  visit("network_bytes", s.network_bytes);
  visit("network_wait", s.network_wait);
  visit("network_read", s.network_read);
  visit("network_idle", s.network_idle);
  visit("storage_fetches", s.storage_fetches);
  visit("storage_fetch_time", s.storage_fetch_time);
  visit("storage_bytes", s.storage_bytes);
  visit("storage_wait", s.storage_wait);
  visit("storage_retries", s.storage_retries);
  visit("storage_cache_hits", s.storage_cache_hits);
  visit("shuffle", s.shuffle);
  visit("shuffle_window", s.shuffle_window);
  visit("cpu_cores", s.cpu_cores);
  visit("tuner_changes", s.tuner_changes);
  visit("tuner", s.tuner);
  visit("memory_limit", s.memory_limit);
  visit("memory_used", s.memory_used);
  visit("memory_peak", s.memory_peak);
  visit("memory_slabs", s.memory_slabs);
  visit("memory_device_slots", s.memory_device_slots);
  visit("memory_cache", s.memory_cache);
  visit("memory_workers", s.memory_workers);
}

// One line per field, "name: value" (durations in seconds), for logs and tools.
std::string to_string(const Stats& stats);

}  // namespace stoker
