// The Loader as the Python package sees it: stoker::Loader plus what Python needs around it,
// namely waits that Ctrl-C can interrupt, errors raised with their Python type, batches handed
// out as zero-copy tensors, and a clean shutdown (explicit, at garbage collection, at
// interpreter exit, and after fork).
//
// Interruptible waits. A signal does not wake a thread blocked on a condition variable, so
// next() waits for its batch in slices (Loader::next_for) with the GIL released, and runs the
// Python signal handlers between slices: Ctrl-C raises KeyboardInterrupt promptly even while
// a __getitem__ hangs, and the batch it was waiting for is handed out by the next call (a
// timed-out next_for loses nothing). With no workers, the calling thread reads inline, taking
// the GIL around each __getitem__ itself.
//
// Thread safety: all methods need the GIL on entry and release it around every loader call.
// Calls from several Python threads are serialized by call_mu_, which is only ever waited for
// with the GIL released.
#pragma once

#include <pybind11/pybind11.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <type_traits>
#include <vector>

#include "fields.h"
#include "host_array.h"
#include "py_dataset.h"
#include "py_workers.h"
#include "stoker/frontend/loader_internals.h"
#include "stoker/frontend/mutex.h"
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
  // (capsules, or numpy arrays with `arrays`; objects), then release(): what the Python layer
  // makes a delivered batch from, in one call.
  py::tuple take(bool as_arrays);

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

struct PyLoaderOptions {
  LoaderOptions loader;
  std::shared_ptr<PyDataset> py_dataset;   // the Python data set behind loader.dataset
  std::shared_ptr<RemappedDataset> remap;  // a custom sampler's order, if any
  // Shared slabs for worker processes; the executors (made by the PyLoader for a Python
  // data set).
  detail::LoaderInternals internals;
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
  // Elastic resume: Loader::resume.
  void resume(std::uint64_t epoch, std::vector<std::size_t> order, std::size_t batch);
  bool order_ahead(std::uint64_t epoch, std::vector<std::size_t> order);  // Loader::order_ahead
  std::size_t batches_in(std::uint64_t epoch) const;
  // This rank's samples for the rest of `epoch` after `consumed`, in the loader's own order
  // (its shuffle resolved: Loader::order()) laid out over `nodes` (the layout the epoch began
  // on, from its state), as resumed_order() gives them.
  std::vector<std::size_t> resumed_order(std::uint64_t epoch, const PositionRanges& consumed,
                                         NodeLayout nodes);
  // The windowed shuffle's blocks (SampleOrder::window; 0: global or no shuffle) and the nodes
  // its order is laid out for (SampleOrder::nodes), for states.
  std::size_t shuffle_window() const { return loader_->order().window; }
  NodeLayout shuffle_nodes() const { return loader_->order().nodes; }
  py::tuple position();

  std::size_t batches_per_epoch() const { return batches_per_epoch_; }
  std::size_t samples_per_epoch() const { return samples_per_epoch_; }
  void set_workers(std::size_t workers);
  void set_depth(std::size_t depth);
  py::dict stats();
  // The same, as the struct (for the worker-kind decisions, src/tune/worker_kind.cc), and the
  // samples read on threads so far (those holding the GIL; 0 for a native data set).
  Stats typed_stats();
  std::uint64_t thread_reads() const;
  // Loader::report() as a dict: the verdict, its text, the numbers behind it, suggestions.
  py::dict report();
  // Loader::skipped_samples() as (data set index, name, reason) tuples.
  py::list skipped_samples();
  // Loader::trace to `path`, or Loader::stop_trace with None. A file that cannot be created
  // or written raises OSError (FileNotFoundError, PermissionError, ...) naming it.
  void trace(const std::optional<std::string>& path, std::size_t max_events);
  std::shared_ptr<RemappedDataset> remap() const { return remap_; }
  // From now on chunks go to `pool`'s worker processes (ProcessExecutor, py_executors.h), and
  // so do probes; reads in progress on threads finish there. A Python data set's only.
  void use_processes(std::shared_ptr<ProcessPool> pool);
  // From now on chunks are read on the threads again (worker_type='auto' measured the
  // processes slower): returns once no read is in progress in a worker process, whose pool
  // may then be finished. Their CPU time so far stays in stats().
  void use_threads();
  // From now on a chunk goes to a remote worker when one is free (RemoteExecutor).
  void use_remote(py::object remote);

  // Stops the workers and lets go of the data set; further calls raise. Idempotent.
  void close();
  bool closed() const { return closed_; }

  // For the package's atexit hook and os.register_at_fork(after_in_child=...).
  static void close_all();
  static void abandon_all_after_fork();

 private:
  // Takes lifetime_mu_ shared (and call_mu_ for consumer calls), waiting without the GIL,
  // and checks the loader is open.
  struct CallLocks {
    std::shared_lock<detail::SharedMutex> lifetime;
    std::unique_lock<detail::Mutex> call;
  };
  CallLocks lock_call(bool consumer);
  // `call(*loader_)` from any thread's side (not the consumer's), with the GIL released; its
  // result.
  template <class Call>
  auto released(Call&& call) {
    auto locks = lock_call(false);
    py::gil_scoped_release nogil;  // set_workers joins retired workers, which may want the GIL
    return call(*loader_);
  }
  py::object deliver(Batch batch);
  [[noreturn]] void raise_sample_error(const SampleError& error);
  std::size_t dataset_index(std::size_t loader_index) const;  // through the custom order
  void close_from_engine_thread();                            // close() on a thread a loader owns
  // `loader_index` through `order` (a custom order's), as dataset_index().
  static std::size_t through(const std::vector<std::size_t>& order, std::size_t loader_index);
  void abandon();

  std::unique_ptr<Loader> loader_;
  // A batch that arrived as Ctrl-C did: next() raised KeyboardInterrupt instead of returning
  // it (the exception would have dropped it), and the next next() returns it. Guarded by
  // call_mu_ (consumer calls).
  std::optional<Batch> held_;
  std::shared_ptr<PyDataset> py_dataset_;
  std::shared_ptr<RemappedDataset> remap_;
  // The engine's executors (a Python data set's: its threads, then the kinds added); let go
  // with the GIL held, after the loader (they may hold Python objects).
  std::shared_ptr<detail::Executors> executors_;
  std::size_t batches_per_epoch_ = 0;
  std::size_t samples_per_epoch_ = 0;

  // Held shared by every call, exclusively by close(): the loader outlives any call in
  // progress, also one from another Python thread (set_workers next to a blocked next()).
  detail::SharedMutex lifetime_mu_;
  detail::Mutex call_mu_;  // one consumer call at a time
  bool closed_ = false;
};

// The Python exception type raised for a sample that failed in native code (and for a Python
// one whose exception was no longer kept): stoker.SampleError. Set once at module import.
void set_sample_error_type(py::handle type);

}  // namespace stoker::python
