// The Loader as the Python package sees it: stoker::Loader plus what Python needs around it,
// namely waits that Ctrl-C can interrupt, errors raised with their Python type, batches handed
// out as zero-copy tensors, and a clean shutdown (explicit, at garbage collection, at
// interpreter exit, and after fork).
//
// Interruptible waits. Loader::next() has no timeout, and a signal does not wake a thread
// blocked on a condition variable, so a training loop blocked in next() could not be stopped
// with Ctrl-C until the batch is ready (never, if __getitem__ hangs). For Python data sets,
// and whenever a timeout is set, the loader's consumer calls therefore run on a consumer
// thread of their own, and the Python thread waits for each call in short slices with the GIL
// released, checking for signals between slices. An interrupted next() leaves its call
// running; its batch is kept and handed out by the following next(), so nothing is lost or
// reordered. Native data sets (in-memory arrays, synthetic) call the loader directly: their
// wait is bounded by the time to read one batch, and a thread hand-off would cost a few tens
// of microseconds per batch. (A core Loader::next_for(timeout) would make the consumer thread
// unnecessary; see docs/python.md.)
//
// Thread safety: all methods need the GIL on entry and release it around every loader call.
// Calls from several Python threads are serialized by call_mu_, which is only ever waited for
// with the GIL released.
#pragma once

#include <pybind11/pybind11.h>

#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <shared_mutex>
#include <thread>
#include <vector>

#include "host_array.h"
#include "py_dataset.h"
#include "stoker/loader.h"

namespace stoker::python {

namespace py = pybind11;

// A delivered batch as the Python layer gets it: field tensors or arrays (zero-copy, each
// keeping the slab alive), object values, and what the batch is.
class RawBatch {
 public:
  RawBatch(std::shared_ptr<BatchHolder> holder, py::list objects, std::vector<std::size_t> indices,
           std::vector<SkippedSample> skipped, std::size_t array_fields);

  std::uint64_t epoch() const { return epoch_; }
  std::size_t number() const { return number_; }
  std::size_t size() const { return size_; }
  // DLPack capsules (or numpy arrays) of the array fields, in field order.
  py::list capsules() const;
  py::list arrays() const;
  bool released() const { return holder_ == nullptr; }
  const py::list& objects() const { return objects_; }
  py::list indices() const;
  py::list skipped() const;
  // Drops this handle's hold on the slab (the tensors made from it keep their own).
  void release() { holder_.reset(); }

 private:
  const std::shared_ptr<BatchHolder>& holder() const;

  std::shared_ptr<BatchHolder> holder_;
  py::list objects_;
  std::vector<std::size_t> indices_;
  std::vector<SkippedSample> skipped_;
  std::size_t array_fields_;
  std::uint64_t epoch_;
  std::size_t number_;
  std::size_t size_;
};

// Runs one job at a time on its own thread; the caller waits for it in slices.
//
// Thread safety: start() and wait_for() from one thread at a time (the PyLoader
// serializes them); the job runs on the consumer thread.
class ConsumerThread {
 public:
  ConsumerThread();
  ~ConsumerThread();  // waits for the running job, then joins
  ConsumerThread(const ConsumerThread&) = delete;
  ConsumerThread& operator=(const ConsumerThread&) = delete;

  void start(std::function<void()> job);            // requires the previous job to be done
  bool wait_for(std::chrono::nanoseconds timeout);  // true once the job is done
  std::thread::id id() const { return thread_.get_id(); }

 private:
  void run();

  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::function<void()> job_;
  bool done_ = true;
  bool stop_ = false;
  std::thread thread_;
};

struct PyLoaderOptions {
  LoaderOptions loader;
  std::shared_ptr<PyDataset> py_dataset;   // the Python data set behind loader.dataset
  std::shared_ptr<RemappedDataset> remap;  // a custom sampler's order, if any
  bool threaded = false;                   // consumer calls on a consumer thread
};

class PyLoader {
 public:
  explicit PyLoader(PyLoaderOptions options);
  ~PyLoader();
  PyLoader(const PyLoader&) = delete;
  PyLoader& operator=(const PyLoader&) = delete;

  // The next batch as a RawBatch, or None at the end of the epoch. With timeout_s > 0, a wait
  // longer than that raises RuntimeError("DataLoader timed out after N seconds"), as torch's
  // does (the call goes on, and the next next() picks its batch up).
  py::object next(double timeout_s);
  void set_epoch(std::uint64_t epoch);
  void restore(std::uint64_t epoch, std::size_t batch);
  // Starts `epoch` afresh, discarding everything prefetched (after a custom sampler's order
  // changed).
  void restart_fresh(std::uint64_t epoch);
  py::tuple position();

  std::size_t batches_per_epoch() const { return batches_per_epoch_; }
  std::size_t samples_per_epoch() const { return samples_per_epoch_; }
  void set_workers(std::size_t workers);
  void set_depth(std::size_t depth);
  py::dict stats();
  std::shared_ptr<RemappedDataset> remap() const { return remap_; }

  // Stops the workers and lets go of the data set; further calls raise. Idempotent.
  void close();
  bool closed() const { return closed_; }

  // For the package's atexit hook and os.register_at_fork(after_in_child=...).
  static void close_all();
  static void abandon_all_after_fork();

 private:
  enum class JobKind : std::uint8_t { none, next, other };
  struct JobResult {
    std::optional<Batch> batch;
    std::exception_ptr error;
    Position before;  // the position when a next() job started
    Position position;
  };

  // Takes lifetime_mu_ shared (and call_mu_ for consumer calls), waiting without the GIL,
  // and checks the loader is open.
  struct CallLocks {
    std::shared_lock<std::shared_mutex> lifetime;
    std::unique_lock<std::mutex> call;
  };
  CallLocks lock_call(bool consumer);
  // Runs `job` as a consumer call: on the consumer thread, waited for in slices, or directly
  // with the GIL released. Leaves the result in result_.
  void call(JobKind kind, std::function<void()> job,
            std::optional<std::chrono::steady_clock::time_point> deadline = std::nullopt);
  void await_job(std::optional<std::chrono::steady_clock::time_point> deadline, double timeout_s);
  // Runs `op` as a consumer call (after any call an interrupted wait left running) and
  // rethrows what it threw.
  void consumer_op(std::function<void(Loader&)> op);
  // Finishes a call left running by an interrupted wait, dropping a batch nobody took.
  void settle();
  py::object deliver(JobResult result);
  [[noreturn]] void raise_sample_error(const SampleError& error);
  std::size_t dataset_index(std::size_t loader_index) const;  // through the custom order
  void close_from_engine_thread();                            // close() on a thread a loader owns
  void abandon();

  std::unique_ptr<Loader> loader_;
  std::shared_ptr<PyDataset> py_dataset_;
  std::shared_ptr<RemappedDataset> remap_;
  std::unique_ptr<ConsumerThread> consumer_;
  std::size_t batches_per_epoch_ = 0;
  std::size_t samples_per_epoch_ = 0;
  std::size_t array_fields_ = 0;

  // Held shared by every call, exclusively by close(): the loader outlives any call in
  // progress, also one from another Python thread (set_workers next to a blocked next()).
  std::shared_mutex lifetime_mu_;
  std::mutex call_mu_;               // one consumer call at a time
  JobKind running_ = JobKind::none;  // a job started and not yet collected
  JobResult result_;
  bool closed_ = false;
};

// The Python exception type raised for a sample that failed in native code (and for a Python
// one whose exception was no longer kept): stoker.SampleError. Set once at module import.
void set_sample_error_type(py::handle type);

// The order of one epoch of the sampler (shuffle, seed, shard rules of LoaderOptions) over a
// data set of `size` samples: what DistributedSampler.__iter__ yields.
std::vector<std::size_t> epoch_order(std::size_t size, bool shuffle, std::uint64_t seed,
                                     std::uint64_t epoch, Shard shard);

}  // namespace stoker::python
