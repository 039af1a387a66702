// A Python map-style data set (__len__, and __getitem__ or __getitems__) as a stoker::Dataset,
// plus the custom sampler order wrapper.
//
// Layout: made without reading anything. The first sample a worker reads (a probe, see
// Dataset::probe: the engine's first workers each read one, on threads or in worker
// processes) gives the batch layout: its structure (tuples, lists and dicts, nested) with
// every array-like leaf (numpy array or scalar, torch tensor, anything exporting DLPack or a
// buffer) and every Python bool/int/float a fixed-shape field, and any other leaf (str, None,
// objects) an "object" value, which the batch returns as a Python list. A probed sample (or
// its exception) is kept until its row is read, so no sample is read twice. A later sample
// whose structure, shape or element type differs fails with an error naming the sample and
// the field. With whole_sample (a user collate_fn) the layout is one object value, known at
// once.
//
// A read, on a worker thread: the row reader (row_reader.h: which of __getitem__ and
// __getitems__ is called, the one fallback, what stoker.sample_seed() returns) reads a chunk's
// rows with the GIL held; each sample is checked against the layout and its arrays' places
// noted; every 256 KiB of arrays read one by one, and at the end, the GIL is released and the
// arrays copied into their rows of the batch slab. The samples' arrays stay referenced during
// the copy and are let go (which needs the GIL) at the start of a later read ("graveyard").
// Object values are kept in a table keyed by (slab, row) until the batch is delivered.
//
// Errors: an exception from __getitem__ (or __getitems__) is kept here, with its traceback,
// under a ticket; the engine carries a PythonError (plain C++) with the ticket, and the loader
// binding takes the exception back when it raises it in the training loop (gil.h, rule 3).
//
// Thread safety: read(), read_rows() and probe() may be called from any number of engine
// threads. The Python-facing members (structure, take_objects, take_error, ...) need the
// GIL; the GIL guards all Python state here. fields() and fields_known() may be called from
// any thread (the layout is published once, with a release store). close() may be called
// from any thread.
#pragma once

#include <pybind11/pybind11.h>

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <stdexcept>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "host_array.h"
#include "py_layout.h"
#include "row_reader.h"
#include "stoker/dataset.h"
#include "stoker/frontend/mutex.h"
#include "stoker/loader.h"

namespace stoker::python {

namespace py = pybind11;

class PyDataset;
class ProcessPool;

// An exception raised in Python while reading a sample; what() is "Type: message". The
// exception object itself stays with `origin` under `ticket`.
class PythonError : public std::runtime_error {
 public:
  PythonError(const PyDataset* origin, std::uint64_t ticket, const std::string& what)
      : std::runtime_error(what), origin_(origin), ticket_(ticket) {}
  const PyDataset* origin() const noexcept { return origin_; }
  std::uint64_t ticket() const noexcept { return ticket_; }

 private:
  const PyDataset* origin_;
  std::uint64_t ticket_;
};

class PyDataset final : public Dataset {
 public:
  // Reads nothing (GIL held; takes len(dataset)). With `whole_sample`, the sample is one
  // object value (for a user collate_fn, which wants the samples as they are).
  // `on_worker_start(worker_id)`, if not None, is called on each worker thread before its
  // first read.
  static std::shared_ptr<PyDataset> make(py::object dataset, bool whole_sample,
                                         py::object on_worker_start);
  ~PyDataset() override;

  std::size_t size() const override { return size_; }
  std::vector<FieldSpec> fields() const override;
  bool fields_known() const override { return layout_known_.load(std::memory_order_acquire); }
  std::vector<FieldSpec> probe(std::size_t index, std::uint64_t seed,
                               std::exception_ptr& failure) const override;
  void read(std::size_t index, const SampleOut& out) const override;
  // Reads on the calling thread go a chunk at a time, through the row reader (row_reader.h).
  // Chunks read elsewhere (worker processes, remote workers) are the loader's executors'
  // (py_executors.h).
  bool reads_chunks() const override;
  void read_rows(std::span<const std::size_t> indices, std::span<const SampleOut> outs,
                 std::span<std::exception_ptr> errors) const override;
  // CPU time the reads on threads spent holding the GIL, summed over threads (PyThreads).
  std::chrono::nanoseconds gil_cpu() const;
  std::uint64_t gil_reads() const { return gil_reads_.load(std::memory_order_relaxed); }

  // From now on probes (the first samples, which learn the layout) are read in `pool`'s
  // worker processes, which get the layout once it is known and stop with the loader (GIL
  // held). Its chunks are the ProcessExecutor's.
  void use_processes(std::shared_ptr<ProcessPool> pool);
  // `set_layout(message)` is called with layout_message() once the layout is known (now, if
  // it is): a remote worker pool's (GIL held).
  void on_layout(py::object set_layout);
  // Reads a chunk elsewhere: the rows probed on this side are written here, and each run of
  // rows between them is handed to `run` (a worker process's or a remote worker's read).
  using ChunkRun = std::function<void(std::span<const std::size_t>, std::span<const SampleOut>,
                                      std::span<std::exception_ptr>)>;
  void read_around_probed(std::span<const std::size_t> indices, std::span<const SampleOut> outs,
                          std::span<std::exception_ptr> errors, const ChunkRun& run) const;
  // Whether the reads were told to stop (close()).
  bool closed() const { return closed_.load(std::memory_order_acquire); }
  // Whether probed samples wait for their rows' reads (read_around_probed writes them).
  bool has_pending() const { return pending_.load(std::memory_order_relaxed) != 0; }
  // Stops and reaps the worker processes, if any, and drops the object values of batches
  // read ahead (GIL held, after the engine has stopped).
  void release_workers();
  // Batch jobs (python/stoker/workers/jobs.py): `job_args(indices, epoch)` returns the bytes a
  // worker process needs besides the indices to run those rows of that epoch (the batches'
  // sample indices), sent with each job (GIL held); errors then name the item "batch" rather
  // than "sample".
  void set_batch_jobs(py::object job_args);
  bool has_job_args() const { return has_job_args_; }
  std::string job_args(std::span<const std::size_t> indices,
                       std::uint64_t epoch) const;  // GIL held; throws
  const char* item_name() const { return has_job_args_ ? "batch" : "sample"; }
  // How the reads used the GIL, summed over threads: (reads, seconds waiting to take it at
  // the start of a read, seconds holding it, CPU seconds of the thread while holding it).
  // The auto worker type decides from these.
  py::tuple gil_stats() const;

  // For ProcessPool (GIL held): the object values of a row read elsewhere, and an exception
  // raised elsewhere, kept like this thread's own (the PythonError to hand the engine).
  void store_objects(const SampleOut& out, py::object values) const;
  // The same for every row of a chunk that failed nowhere: `values`, a list, holds row k's
  // object values at k.
  void store_objects(std::span<const SampleOut> outs, py::handle values) const;
  std::exception_ptr keep_error(py::object exception, std::size_t index) const;
  // The layout as a worker process gets it (kLayout): pickled (description, object slots).
  py::bytes layout_message() const;

  // The layout for the Python layer (GIL held, layout known): nested tuples
  //   ("seq", type, [child...]) | ("map", type, [key...], [child...])
  //   | ("array", field, element type name) | ("object", slot).
  py::object structure() const;
  // The field holding the object values' row markers, if the layout has object values.
  std::optional<std::size_t> objects_field() const { return objects_field_; }
  // The object values of a delivered batch, one list per slot (GIL held).
  py::list take_objects(const Batch& batch) const;
  // The exception behind a PythonError from this data set with its sample index, or None if
  // it was dropped (only the most recent ones are kept). GIL held.
  py::object take_error(std::uint64_t ticket, std::size_t& index) const;

  // From now on reads fail at once without calling Python: the loader is shutting down.
  // Worker processes are told to stop (their sockets shut down, SIGTERM), so that engine
  // threads waiting for them return at once.
  void close() noexcept;
  // A KeyboardInterrupt raised in __getitem__ on the consumer's own thread (reading inline,
  // no workers) fails that thread's further reads at once with the same exception, so Ctrl-C
  // ends the batch being read instead of interrupting one row of it; the next call of the
  // loader clears it (GIL held).
  void clear_interrupt() const noexcept { interrupted_ = false; }

  using Node = LayoutNode;
  struct State;

 private:
  PyDataset() = default;
  // The C++ exception being handled, as a kept Python error (GIL held, inside a catch).
  std::exception_ptr capture_current(std::size_t index) const;
  // Calls on_worker_start the first time this worker thread reads (GIL held).
  void start_worker() const;
  // Learns the layout from `sample` unless known (GIL held; throws if it cannot be batched).
  void learn(std::size_t index, py::handle sample) const;
  // Keeps a probe's sample, or its failure, for the read of (index, seed) (GIL held).
  void keep_probed(std::size_t index, std::uint64_t seed, py::object sample,
                   std::exception_ptr failure) const;
  // A probed sample (or its failure) kept for the read of (index, seed): true if there was
  // one (GIL held).
  bool take_pending(std::size_t index, std::uint64_t seed, py::object& sample,
                    std::exception_ptr& error) const;
  // Checks `sample` against the layout, writes its numbers, notes its copies, keeps its
  // object values (GIL held; throws like the visitor).
  void take_sample(std::size_t index, py::handle sample, const SampleOut& out,
                   std::vector<PendingCopy>& copies) const;
  // Makes the copies with the GIL released and buries the arrays' owners.
  void finish_copies(std::vector<PendingCopy>& copies, const SampleOut& out) const;
  // A chunk read on this thread: the threads' RowSink (py_dataset.cc).
  class ThreadChunk;
  void bury(std::vector<py::object>&& owners) const;  // no GIL needed
  void drain_graveyard() const;                       // GIL held

  std::size_t size_ = 0;
  // Written once, with the GIL, before layout_known_ is set.
  mutable std::vector<FieldSpec> fields_;
  mutable std::optional<std::size_t> objects_field_;
  mutable std::atomic<bool> layout_known_{false};
  // Probed samples not yet read into their rows (State::pending), for reads without the GIL.
  mutable std::atomic<std::size_t> pending_{0};
  std::atomic<bool> closed_{false};
  // The consumer thread's KeyboardInterrupt (see clear_interrupt). GIL-guarded.
  mutable bool interrupted_ = false;
  mutable std::uint64_t interrupt_ticket_ = 0;
  mutable std::string interrupt_what_;
  std::unique_ptr<State> state_;  // everything that holds Python objects (GIL-guarded)
  bool has_job_args_ = false;     // set before the loader starts
  std::atomic<std::shared_ptr<ProcessPool>> processes_;  // probes' (use_processes)
  mutable std::atomic<std::uint64_t> gil_reads_{0};
  mutable std::atomic<std::int64_t> gil_wait_ns_{0};
  mutable std::atomic<std::int64_t> gil_held_ns_{0};
  mutable std::atomic<std::int64_t> gil_cpu_ns_{0};

  mutable detail::Mutex graveyard_mu_;  // a leaf lock: nothing is acquired while holding it
  mutable std::vector<py::object> graveyard_ STOKER_GUARDED_BY(graveyard_mu_);
};

// Sample k of this data set is sample order[k] of `base`: a custom sampler's order, run
// through the engine as an unshuffled data set. The order is replaced between epochs, and the
// loader then restarted, so that no batch read with the old order is delivered.
//
// Thread safety: read() from any thread; set_order() from the consumer's thread.
class RemappedDataset final : public Dataset {
 public:
  RemappedDataset(std::shared_ptr<const Dataset> base, std::vector<std::size_t> order);

  std::size_t size() const override { return size_; }
  std::vector<FieldSpec> fields() const override { return base_->fields(); }
  bool fields_known() const override { return base_->fields_known(); }
  std::vector<FieldSpec> probe(std::size_t index, std::uint64_t seed,
                               std::exception_ptr& failure) const override {
    return base_->probe((*order_.load())[index], seed, failure);
  }
  void read(std::size_t index, const SampleOut& out) const override;
  void prefetch(std::size_t index) const override;
  bool will_read(std::span<const std::size_t> rows) const noexcept override;
  std::string sample_name(std::size_t index) const override;
  std::size_t resident_bytes() const override { return base_->resident_bytes(); }
  std::vector<std::string> cheaper_reads() const override { return base_->cheaper_reads(); }
  ObjectStorageCounters object_storage_counters() const override {
    return base_->object_storage_counters();
  }
  bool reads_chunks() const override { return base_->reads_chunks(); }
  void read_rows(std::span<const std::size_t> indices, std::span<const SampleOut> outs,
                 std::span<std::exception_ptr> errors) const override;
  // The base's indices of `indices` (what executors read: py_executors.h).
  std::vector<std::size_t> map(std::span<const std::size_t> indices) const;

  // Throws std::invalid_argument if the length differs or an index is past the base's end.
  void set_order(std::vector<std::size_t> order);
  std::shared_ptr<const std::vector<std::size_t>> order() const { return order_.load(); }
  const std::shared_ptr<const Dataset>& base() const { return base_; }

 private:
  std::shared_ptr<const Dataset> base_;
  std::size_t size_;
  std::atomic<std::shared_ptr<const std::vector<std::size_t>>> order_;
};

}  // namespace stoker::python
