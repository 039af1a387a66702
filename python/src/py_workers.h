// Worker processes for a Python data set whose __getitem__ holds the GIL.
//
// N persistent child processes (started by python/stoker/workers/processes.py with
// multiprocessing, honouring multiprocessing_context) each read rows with the row reader
// (row_reader.h; their half is SampleWriter) and write the samples' arrays straight into their
// rows of the batch slab, which lives in shared memory (a
// memfd per slab, stoker/frontend/shared_memory.h) mapped in both processes. Only indices, small
// object values and errors cross the socket; array bytes never do, so every byte is copied
// once, as on threads. The exception: before the layout is known, each worker's first
// sample (a probe) is sent back whole, pickled, and written by the parent.
//
// The parent side is the engine's own worker threads: for each chunk a thread leases one
// child, sends it the job and blocks on the socket without the GIL until the reply, so the
// engine's scheduling, ordering, cancellation and error policy are those of threads. A chunk's
// slab is released by the engine only after the chunk's offer returns (ProcessExecutor), i.e. after
// the child replied or died: no slab is recycled while a child still writes into it.
//
// The wire protocol (one unix stream socketpair per child) is specified in
// docs/worker_protocol.md; `wire` below holds its numbers, which the Python end
// (python/stoker/workers/main.py) takes from the extension (WORKER_WIRE), and
// tests/python/test_worker_protocol.py checks both ends against the document. Memory is
// named by (region id, byte offset), never by address, so the same jobs are served by remote
// workers on Ray (RemoteExecutor, py_executors.h) with a buffer of their own as region 1.
// A child that dies shows as EOF on its socket; the rows it was reading fail with a
// WorkerDiedError naming the pid and the signal or exit code (read with waitid(WNOWAIT), so
// multiprocessing still reaps it), and the child is started afresh before its next job.
//
// Thread safety: run() from any number of engine threads (each leases its own child); stop()
// from any thread, without the GIL; the other members with the GIL.
#pragma once

#include <pybind11/pybind11.h>
#include <sys/types.h>

#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <exception>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

#include "py_layout.h"
#include "stoker/dataset.h"
#include "stoker/frontend/executor.h"
#include "stoker/frontend/mutex.h"
#include "stoker/frontend/proc_memory.h"
#include "stoker/frontend/shared_memory.h"

namespace stoker::python {

namespace py = pybind11;

// The worker protocol's numbers (docs/worker_protocol.md): message kinds, a job's flags, and
// the bytes of each fixed-size part (native byte order).
namespace wire {
enum : std::uint32_t { kJob = 1, kMap = 2, kDrop = 3, kLayout = 4, kProbe = 5, kResult = 1 };
inline constexpr std::uint32_t kTimeRows = 1;    // a job's flag: send the rows' times
inline constexpr unsigned kArgsShift = 8;        // a job's flags: the bytes of its args from here
inline constexpr std::size_t kHeaderBytes = 8;   // u32 kind, u32 payload bytes
inline constexpr std::size_t kJobBytes = 24;     // u64 job, u32 region, fields, rows, flags
inline constexpr std::size_t kFieldBytes = 16;   // u64 offset of the first row, u64 row bytes
inline constexpr std::size_t kRowBytes = 16;     // u64 sample index, u64 seed
inline constexpr std::size_t kMapBytes = 16;     // u32 region, u32 0, u64 bytes (+ the memfd)
inline constexpr std::size_t kDropBytes = 4;     // u32 region
inline constexpr std::size_t kProbeBytes = 16;   // u64 sample index, u64 seed
inline constexpr std::size_t kResultBytes = 16;  // u64 job, u32 rows, u32 blob bytes
inline constexpr std::size_t kTimeBytes = 16;    // per row, with kTimeRows: i64 start, end

// A fixed-size part's number, appended and read in native byte order.
template <class T>
void put(std::vector<std::uint8_t>& out, T value) {
  const auto* p = reinterpret_cast<const std::uint8_t*>(&value);
  out.insert(out.end(), p, p + sizeof value);
}
template <class T>
T get(const std::uint8_t* p) {
  T value;
  std::memcpy(&value, p, sizeof value);
  return value;
}
}  // namespace wire

class PyDataset;

// A worker process died while reading samples: what() is PyTorch's message ("DataLoader
// worker (pid N) is killed by signal: Killed") and the samples lost.
class WorkerDiedError : public std::runtime_error {
 public:
  WorkerDiedError(pid_t pid, const std::string& what) : std::runtime_error(what), pid_(pid) {}
  pid_t pid() const noexcept { return pid_; }

 private:
  pid_t pid_;
};

// The Python exception type WorkerDiedError becomes (stoker.WorkerError). Set once at import.
void set_worker_error_type(py::handle type);
py::handle worker_error_type();

class ProcessPool {
 public:
  // `spawn(worker_id)` starts worker `worker_id` (again) and returns (fd, pid): the parent's
  // end of its socket, which the pool then owns, and its pid. `decode(blob, worker_id, pid,
  // indices)` turns a reply's blob into (object values per row or None, {row: exception}).
  // `reap()` waits for the workers to exit (killing those that do not) and reaps them.
  // `exitcode(pid)` is a worker's exit code as multiprocessing read it (None: not known).
  ProcessPool(py::object spawn, py::object decode, py::object reap, py::object exitcode,
              std::size_t workers);
  ~ProcessPool();  // GIL held; closes the sockets (the workers see EOF and exit)
  ProcessPool(const ProcessPool&) = delete;
  ProcessPool& operator=(const ProcessPool&) = delete;

  void start();  // GIL held: starts every worker now
  // The layout message (PyDataset::layout_message) every worker gets before its next job.
  // Any thread.
  void set_layout(py::bytes message);
  // Reads sample `index` in a worker and returns it (see kProbe). Throws the sample's
  // failure, kept in `owner`'s table, or a WorkerDiedError. No GIL on entry.
  py::object probe(const PyDataset& owner, std::size_t index, std::uint64_t seed);
  // Reads one chunk in one worker (ProcessExecutor, py_executors.h). Object values and errors go to
  // `owner`'s tables. A worker that dies is replaced and the chunk read again; a chunk that
  // kills two workers is read row by row, and the rows that kill a worker fail with a
  // WorkerDiedError.
  void run(const PyDataset& owner, std::span<const std::size_t> indices,
           std::span<const SampleOut> outs, std::span<std::exception_ptr> errors);
  // Sends worker `worker_id` a call (a job with no fields: `index`, and `args` as the job's
  // args) and waits for its reply without the GIL; jobs for one worker run in the order their
  // callers lease it. Returns (True, failed, blob, pid), or (False, why) if the worker died
  // (it is started afresh by its next job) or the pool stopped. GIL held on entry.
  py::tuple call(std::size_t worker_id, std::uint64_t index, const py::bytes& args);
  // Shuts the sockets down (a thread blocked on one returns at once; a worker reading its
  // socket sees EOF and exits, with code 0, as torch's workers do when asked); no more
  // workers are started. reap() terminates those still busy. Any thread, no GIL.
  void stop() noexcept;
  // stop(), then reap() and close the sockets (GIL held). Idempotent.
  void finish();
  // Keeps workers 0..keep-1 and lets the others go (worker_type='auto' keeping fewer after
  // their warm-up): waits without the GIL until none of those is leased, then shuts their
  // sockets down (each sees EOF and exits; the reap of the others reaps it too) and forgets
  // them. size() is `keep` from then on. GIL held.
  void retire(std::size_t keep);

  // The workers' time (cpu, run_delay) since the pool started, of those that died too (up to
  // their last reading), and their memory now (resident_bytes: the sum of their Pss_Anon
  // estimates, detail::AnonMemorySampler). Any thread, no GIL; reads /proc/<pid>/schedstat
  // and status, never smaps_rollup.
  detail::ExecutorStats times();

  std::size_t size() const { return workers_.load(); }
  py::list pids();
  // Workers that died while reading (each replaced by a new one). Any thread, no GIL.
  std::size_t deaths() {
    detail::MutexLock lock(mu_);
    return deaths_;
  }

  // Every socket fd the pools of this process hold: a forked worker closes the ones it
  // inherited, so that only the parent holds the parent's ends (EOF then means the parent
  // died) and it keeps no other worker's socket open.
  static std::vector<int> all_fds();

 private:
  struct Link {
    std::size_t id = 0;
    int fd = -1;
    pid_t pid = 0;
    bool busy = false;
    bool dead = false;
    std::set<std::uint32_t> regions;  // regions mapped by this worker
    bool has_layout = false;
    std::uint64_t next_job = 1;
    // times(): the schedstat (on a core, waiting for one) last read of process `timed_pid`.
    pid_t timed_pid = 0;
    std::int64_t timed_cpu_ns = 0;
    std::int64_t timed_delay_ns = 0;
  };

  // A worker's reply to a job.
  struct Reply {
    std::vector<std::uint8_t> status;  // per row: 0 read, else failed
    std::vector<std::int64_t> times;   // (start, end) per row, if the job asked for them
    std::vector<std::uint8_t> blob;
    pid_t pid = 0;
    std::size_t worker_id = 0;
  };
  // Sends `job` (for `indices`, rows in `region`) to a leased worker and returns its reply; if
  // the worker died, sets `lost` to the WorkerDiedError naming it and the rows, counts the
  // death, logs it when the rows are to be read `again`, and returns nothing. Throws if the
  // pool is closing.
  std::optional<Reply> attempt(const detail::SharedRegion& region, std::vector<std::uint8_t> job,
                               std::span<const std::size_t> indices, bool traced, const char* items,
                               bool again, std::exception_ptr& lost);
  // A reply's rows: object values and errors into `owner`'s tables and `errors`.
  void take_reply(const PyDataset& owner, std::span<const std::size_t> indices,
                  std::span<const SampleOut> outs, std::span<std::exception_ptr> errors,
                  const Reply& reply);
  // Waits for a free worker (worker `only`, if given); starts a dead one afresh (takes the
  // GIL).
  Link* lease(std::optional<std::size_t> only = std::nullopt);
  void give_back(Link* link, bool dead);
  bool stopping() {
    detail::MutexLock lock(mu_);
    return stopped_;
  }
  void respawn(Link& link);  // GIL held
  // Sends the job and reads the reply without the GIL. False if the worker is gone. The rows'
  // times, if the job asked for them, go to `times` (start, end per row).
  bool exchange(Link& link, const std::vector<std::uint8_t>& job, std::uint32_t region_id,
                int region_fd, std::size_t region_bytes, std::vector<std::uint8_t>& status,
                std::vector<std::int64_t>& times, std::vector<std::uint8_t>& blob);
  // Reads a kResult reply into `status`, `times` (if it has them) and `blob`. False if the
  // worker is gone.
  static bool receive_result(Link& link, std::vector<std::uint8_t>& status,
                             std::vector<std::int64_t>& times, std::vector<std::uint8_t>& blob);
  // Fails every row of `errors` after a failed exchange with `link` (given back dead); the
  // message names the lost rows as `items` ("samples", "batches").
  void fail_lost(Link* link, std::span<const std::size_t> indices,
                 std::span<std::exception_ptr> errors, const char* items);
  // Why worker `pid` is gone (death_message), from its Process (`exitcode_`, with the GIL)
  // when multiprocessing reaped it before its status could be read here: starting a Process
  // reaps its finished siblings.
  std::string died(pid_t pid);

  std::atomic<std::size_t> workers_;  // the links' count; retire() lowers it
  const pid_t owner_pid_;             // a forked copy of the pool (in a worker) does nothing
  py::object spawn_;
  py::object decode_;
  py::object reap_;
  py::object exitcode_;

  detail::Mutex mu_;
  std::condition_variable free_cv_;
  // The links; a leased link's fields are its lessee's.
  std::vector<std::unique_ptr<Link>> links_ STOKER_GUARDED_BY(mu_);
  bool stopped_ STOKER_GUARDED_BY(mu_) = false;
  detail::ExecutorStats times_ STOKER_GUARDED_BY(mu_);  // cpu, run_delay
  std::size_t deaths_ STOKER_GUARDED_BY(mu_) = 0;
  std::vector<std::uint8_t> layout_message_ STOKER_GUARDED_BY(mu_);  // empty: not known yet
  bool finished_ = false;                                            // GIL
  // The workers' memory, read on its own thread; told of each worker as it starts. Held by
  // pointer: a forked worker's copy of the pool lets go of it without destroying it.
  std::unique_ptr<detail::AnonMemorySampler> memory_;
};

}  // namespace stoker::python
