// What a Loader is asked to do: LoaderOptions and the enums and structs it is made of.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "stoker/dataset.h"
#include "stoker/sampler.h"

namespace stoker {

enum class ErrorPolicy : std::uint8_t {
  raise,  // a failed sample makes next() throw SampleError for its batch (default)
  skip,   // a failed sample is replaced by another one; the batch reports it
};

// Whether batch slabs are page-locked. Page-locked ("pinned") slabs let the device's copy
// engine read them directly (no staging copy, and the copy overlaps compute), but every locked
// byte is taken from the rest of the machine, so stoker never locks more than a budget.
enum class PinMemory : std::uint8_t {
  automatic,  // pinned when batches go to a device and the budget allows (default)
  on,         // pinned (by CUDA if a device answers, even for "cpu" delivery), else mlock'ed;
              // still within the budget
  off,        // ordinary pageable memory
};

// The simulated device ("sim"): a copy engine and streams with virtual clocks, for testing
// and benchmarking the device stage on machines without a GPU.
struct SimDevice {
  double bandwidth_gb_per_s = 25.0;       // host-to-device copy rate
  std::chrono::microseconds latency{10};  // per copy
  double time_scale = 0.0;                // real seconds slept per simulated second
};

// Which shuffle a shuffled epoch gets (docs/storage.md, "Data larger than the cache").
enum class ShuffleMode : std::uint8_t {
  automatic,  // global while the data set fits its object cache, else window (default)
  global,     // a uniform permutation of every sample
  window,     // blocks in a random order, samples mixed across a window the cache holds
};

struct LoaderOptions {
  std::shared_ptr<const Dataset> dataset;
  std::size_t batch_size = 1;
  bool shuffle = false;
  std::uint64_t seed = 0;  // the order of epoch e is a function of (seed + e), as in torch
  // With shuffle: global, or windowed over the data set's storage blocks when it is read from
  // object storage and does not fit the object cache (Stats::shuffle says which and why).
  ShuffleMode shuffle_mode = ShuffleMode::automatic;
  bool drop_last = false;  // drop the last batch of an epoch if it is short
  Shard shard;

  // Worker threads; 0 reads every sample inline on the thread that calls next().
  std::size_t workers = 2;
  // Batches in flight (being read or ready, not yet handed out). At least 1.
  std::size_t depth = 4;
  // Online tuning of `workers` and `depth` (the starting values), both ways: while the
  // consumer waits for data, more workers (doubled if they mostly wait themselves on I/O or
  // sleeps, one more if they compute) or, if the workers sit idle, more batches in flight;
  // when it has stopped waiting, idle workers and unneeded depth are given back. Never past
  // max_workers (0: 8 x cpu_cores, at least 16), the CPU budget or the memory budget. The
  // tuner runs inside next(), on the consumer's thread; its last change and why are in
  // Stats::tuner. Without it, a consumer that waits is told once in the log what the tuner
  // would do.
  bool tune_workers = false;
  std::size_t max_workers = 0;
  // The cores this loader's workers and its training loop may use together (the CPU budget):
  // 0 takes the process's CPU affinity divided among the ranks torchrun started on this node
  // (LOCAL_WORLD_SIZE), so ranks sharing a machine do not oversubscribe it.
  double cpu_cores = 0;
  // The one memory cap: bytes the loader may hold in all. Counted against it: the batch
  // slabs (in flight, ready and those the consumer holds), the device slots (device_depth
  // batches on the device), the data set's RAM cache (Dataset::resident_bytes) and the worker
  // processes' own memory (each one's proportional share of its anonymous memory, Pss_Anon:
  // pages a forked worker shares copy-on-write with the training process split among them;
  // read in the background at most every 0.5 s or so, growth since counted at once; the
  // shared slabs they write into are counted as slabs). The cache and the worker processes
  // hold what they hold; the batches in flight get the rest, beside two the consumer may hold
  // (the one it uses and, while it asks for the next, that one): a depth (given, set or
  // tuned) whose slabs do not fit is lowered (said once in the log) and the tuner never
  // raises one past it. When even one batch in flight
  // (three slabs) does not fit, construction (or, when the layout is learned from the first
  // sample, next()) throws std::invalid_argument saying what would fit. 0: half of
  // MemAvailable when the loader is made. Stats::memory_* and Report show it.
  std::size_t memory_limit = 0;
  // Superseded by memory_limit, kept working: a bound on the slab bytes alone ((depth + 1)
  // slabs), within the cap; 0: none of its own.
  std::size_t memory_budget = 0;

  // Where batches are delivered: "cpu" (host slabs), "cuda" or "cuda:N" (copied on a side
  // stream into recycled device buffers, device_depth batches ahead), or "sim". If no CUDA
  // device answers, the loader says so once in the log and delivers on the CPU.
  std::string device = "cpu";
  std::size_t device_depth = 2;
  // The consumer's stream (a cudaStream_t, or a SimStream* for "sim"); null is the device's
  // default stream. next() makes it wait for the batch's copy; see Batch::wait.
  void* stream = nullptr;
  PinMemory pin_memory = PinMemory::automatic;
  // Page-locked slab bytes allowed in the whole process; 0: a quarter of MemAvailable. Past
  // it, further slabs are pageable (said once in the log).
  std::size_t pin_budget = 0;
  SimDevice sim;
  // Fields (by FieldSpec::name) that stay in host memory when batches go to a device, as if
  // the data set had marked them host_only: metadata such as ids or sizes.
  std::vector<std::string> keep_on_host;

  ErrorPolicy on_error = ErrorPolicy::raise;
  // With ErrorPolicy::skip: failed samples tolerated over the loader's life; the next one
  // raises SampleError as under ErrorPolicy::raise.
  std::size_t max_skipped = 1000;
};

}  // namespace stoker
