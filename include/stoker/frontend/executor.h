// Chunk executors: the kinds of worker that read a chunk of a batch somewhere other than on
// the engine's own threads (a Python data set's threads holding the GIL, worker processes,
// remote workers on Ray; python/src/py_executors.h). The engine's worker thread that claimed a
// chunk offers it to its executors in order (Executors below) and reads it itself, through
// Dataset::read_rows (or read per row), if none takes it. So the scheduling, sample order,
// exactly-once delivery, cancellation and error policy stay the engine's whatever the kind:
// an executor only fills rows and says which failed.
//
// Thread safety: offer() from any number of engine threads at once; limit(), stats() and
// stop() from any thread.
//
// Installed for front ends, unstable (include/stoker/frontend/README.md).
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <memory>
#include <span>
#include <vector>

#include "stoker/dataset.h"
#include "stoker/frontend/mutex.h"

namespace stoker::detail {

// A chunk: sample indices[k] of the engine's data set goes into outs[k]; a row that fails
// leaves its exception in errors[k] (handed in null), as Dataset::read_rows.
struct ChunkJob {
  std::span<const std::size_t> indices;
  std::span<const SampleOut> outs;
  std::span<std::exception_ptr> errors;
};

// What an executor's reads cost, summed since it started: the parts of Stats that the
// engine's own threads cannot measure.
struct ExecutorStats {
  // Time of processes that read for it (Stats::worker_cpu, worker_run_delay): on a core, and
  // runnable but waiting for one. The engine threads that wait on them use little, so
  // without it a machine too busy to run them would look idle.
  std::chrono::nanoseconds cpu{0};
  std::chrono::nanoseconds run_delay{0};
  // CPU time its reads spent holding a lock that serializes them (the GIL;
  // Stats::worker_lock_held): when it approaches the wall time, more threads only wait.
  std::chrono::nanoseconds lock_held{0};
  // The network stage (Stats::network_*): chunks read by remote workers, their rows' bytes
  // received, the time the engine's threads waited for the replies, and of the replies, the
  // time the remote workers spent reading them and idle before them.
  std::uint64_t remote_units = 0;
  std::uint64_t remote_bytes = 0;
  std::chrono::nanoseconds remote_wait{0};
  std::chrono::nanoseconds remote_read{0};
  std::chrono::nanoseconds remote_idle{0};

  // Not a sum over time: its processes' own memory now, each one's proportional share of the
  // anonymous memory it maps (Pss_Anon, pages shared copy-on-write split among the processes
  // sharing them; not the shared slabs they write into, which are the loader's), as
  // AnonMemorySampler estimates it (proc_memory.h: read on a thread of its own at most a
  // period, 0.5 s or more, ago; growth since counted at once); 0 for threads.
  std::uint64_t resident_bytes = 0;

  ExecutorStats& operator+=(const ExecutorStats& o);
};

class ChunkExecutor {
 public:
  // The order executors are offered chunks in: those that decline when busy first (a remote
  // worker is used only when one is free), then those that queue (a pool of processes), then
  // the offering thread itself.
  enum class Kind : std::uint8_t { remote, process, thread };

  virtual ~ChunkExecutor() = default;
  virtual Kind kind() const = 0;
  // Reads the chunk and returns true, or returns false at once having touched nothing (the
  // next executor, or the engine's thread, reads it). Returns only when no row of it is
  // being written any more.
  virtual bool offer(const ChunkJob& job) = 0;
  // The most chunks it reads at once (a pool of N processes: N), which bounds the engine's
  // worker threads; 0: no bound of its own.
  virtual std::size_t limit() const { return 0; }
  virtual ExecutorStats stats() const { return {}; }
  // The loader is closing: offers in progress return promptly, later ones fail or decline.
  virtual void stop() noexcept {}
};

// The executors of one loader, shared by the engine (which offers) and the front end (which
// adds kinds while it runs: worker_type='auto' moves reads to processes after the first
// batches; and back to threads when the processes measured slower). Adding and removing
// never wait for offers in progress.
class Executors {
 public:
  // From the next offer on, `executor` is offered chunks (in Kind order; same kinds in the
  // order added).
  void add(std::shared_ptr<ChunkExecutor> executor) STOKER_EXCLUDES(mu_);
  // From the next offer on, no executor of `kind` is offered chunks; returns those removed
  // once no offer made before uses them (they may be stopped then), polling every
  // millisecond: call it without any lock an offer may need (the GIL). Their stats() as of
  // then stay in stats(), so its sums never go back.
  std::vector<std::shared_ptr<ChunkExecutor>> remove(ChunkExecutor::Kind kind) STOKER_EXCLUDES(mu_);
  // Offers the chunk to each executor in turn; false if none took it.
  bool offer(const ChunkJob& job) const STOKER_EXCLUDES(mu_);
  bool empty() const STOKER_EXCLUDES(mu_);
  // The sum of the executors' bounds (0: none bounds the workers).
  std::size_t limit() const STOKER_EXCLUDES(mu_);
  ExecutorStats stats() const STOKER_EXCLUDES(mu_);
  void stop() noexcept STOKER_EXCLUDES(mu_);

 private:
  using List = std::vector<std::shared_ptr<ChunkExecutor>>;
  std::shared_ptr<const List> list() const STOKER_EXCLUDES(mu_);

  mutable Mutex mu_;
  // Replaced, never changed in place: an offer walks the list it took.
  std::shared_ptr<const List> list_ STOKER_GUARDED_BY(mu_) = std::make_shared<const List>();
  ExecutorStats removed_ STOKER_GUARDED_BY(mu_);  // the removed executors' sums (not memory)
};

}  // namespace stoker::detail
