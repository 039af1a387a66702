// A verdict on a loader's run, made from its Stats: is the training loop waiting for data,
// which stage is the busiest and how loaded, would more workers help, and what to try.
#pragma once

#include <string>
#include <vector>

#include "stoker/stats.h"

namespace stoker {

struct Report {
  // "input-bound" (the training loop waits for data), "network-bound" (it waits, and the
  // reads mostly wait for object storage, or for remote workers' rows, which those workers
  // are mostly idle to send: the network or the store is the bottleneck), "compute-bound" (it
  // hardly waits),
  // "balanced" (in between), or "no data yet" (no batch handed out).
  std::string verdict;
  // The numbers behind it.
  double wait_fraction = 0;  // of the training loop's time, waiting for data
  double samples_per_second = 0;
  std::size_t workers = 0;
  double worker_busy = 0;       // per worker, share of the time inside reads
  double worker_cores = 0;      // cores the reads kept busy (CPU time over wall time)
  double cpu_cores = 0;         // the CPU budget (Stats::cpu_cores)
  double gil_busy = 0;          // share of the time a read held the GIL
  double worker_run_delay = 0;  // share of the reads' time runnable but waiting for a core
  // The network stage: share of the reads' time waiting for remote workers' replies, the bytes
  // of rows received per second, and the remote workers' load (reading, against reading and
  // idling).
  double network_wait = 0;
  double network_bytes_per_second = 0;
  double remote_busy = 0;
  // Object storage (Stats::storage_*): share of the reads' time waiting for the store,
  // seconds per range GET, and bytes fetched per second (all zero for local data).
  double storage_wait = 0;
  double storage_fetch_latency = 0;
  double storage_bytes_per_second = 0;
  // With object storage, one line of its traffic: "object storage: 80 chunk GETs at 79 ms
  // each, 0.1 MB/s fetched, 0 retries, 0 reads from the local cache", and the shuffle chosen
  // and why (Stats::shuffle: "; shuffle: window of 312 blocks (...): ..."); text() ends with
  // it, before the memory line; empty for local data.
  std::string storage;
  // The memory cap and what counts against it, now and at peak (Stats::memory_*), and as one
  // line with what holds it: "memory: 412 MiB of the 1536 MiB cap (batch slabs 300, worker
  // processes 100, RAM cache 12), peak 450 MiB" (text() ends with it).
  std::size_t memory_limit = 0;
  std::size_t memory_used = 0;
  std::size_t memory_peak = 0;
  std::string memory;
  // The busiest stage: "reads", "the GIL", "the network", "the object store", "remote reads"
  // or "the training loop".
  std::string busiest;
  double busiest_load = 0;  // its load: cores for reads, a share of the time otherwise
  // Whether more workers would help, and why ("more workers would not help: CPU saturated").
  std::string more_workers;
  std::vector<std::string> suggestions;  // what to try, most promising first

  // One paragraph: the verdict, the numbers, the suggestions.
  std::string text() const;
};

// The verdict on `stats` (pure: tested on synthetic stats). `process_workers`: reads run in
// worker processes, so a busy worker counts as a busy core (their CPU time is in
// Stats::worker_cpu, the wait of a runnable one for a core is not). `cheaper_reads`: what the
// data set says makes its reads cheaper (Dataset::cheaper_reads), suggested when they fill the
// cores.
Report diagnose(const Stats& stats, bool process_workers = false,
                const std::vector<std::string>& cheaper_reads = {});

// The table of Report's fields, as for_each_stat is Stats' (stats.h): calls visit(name, value)
// for each, in declaration order. Every printout of a Report that lists its fields (the Python
// package's report() dict) is made from it; src/field_tables.cc checks at compile time that it
// names every member.
template <class Visit>
void for_each_field(const Report& r, Visit&& visit) {
  visit("verdict", r.verdict);
  visit("wait_fraction", r.wait_fraction);
  visit("samples_per_second", r.samples_per_second);
  visit("workers", r.workers);
  visit("worker_busy", r.worker_busy);
  visit("worker_cores", r.worker_cores);
  visit("cpu_cores", r.cpu_cores);
  visit("gil_busy", r.gil_busy);
  visit("worker_run_delay", r.worker_run_delay);
  visit("network_wait", r.network_wait);
  visit("network_bytes_per_second", r.network_bytes_per_second);
  visit("remote_busy", r.remote_busy);
  visit("storage_wait", r.storage_wait);
  visit("storage_fetch_latency", r.storage_fetch_latency);
  visit("storage_bytes_per_second", r.storage_bytes_per_second);
  visit("storage", r.storage);
  visit("memory_limit", r.memory_limit);
  visit("memory_used", r.memory_used);
  visit("memory_peak", r.memory_peak);
  visit("memory", r.memory);
  visit("busiest", r.busiest);
  visit("busiest_load", r.busiest_load);
  visit("more_workers", r.more_workers);
  visit("suggestions", r.suggestions);
}

}  // namespace stoker
