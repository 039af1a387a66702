#include "py_loader.h"

#include <pybind11/stl.h>

#include <algorithm>
#include <cmath>
#include <set>
#include <string>
#include <system_error>
#include <utility>

#include "gil.h"
#include "py_executors.h"
#include "py_workers.h"

namespace stoker::python {
namespace {

// How often a waiting Python thread looks for signals (Ctrl-C). Waking up costs nothing
// measurable at this rate; a person pressing Ctrl-C does not notice 50 ms.
constexpr std::chrono::milliseconds kWaitSlice{50};

PyObject* g_sample_error_type = nullptr;

// Every open PyLoader, for close_all() and abandon_all_after_fork(). Guarded by the GIL.
std::set<PyLoader*>& registry() {
  static auto* loaders = new std::set<PyLoader*>();  // never destroyed: used at exit
  return *loaders;
}

// Waits for `m` without holding the GIL, so that the thread holding it can take the GIL.
template <class Lock>
void lock_without_gil(Lock& lock) {
  if (!lock.try_lock()) {
    py::gil_scoped_release nogil;
    lock.lock();
  }
}

void add_note(const py::object& exception, const std::string& note) {
  if (py::hasattr(exception, "add_note")) {
    exception.attr("add_note")(note);
  } else {  // before Python 3.11: kept, though tracebacks do not show it
    py::list notes =
        py::hasattr(exception, "__notes__") ? py::list(exception.attr("__notes__")) : py::list();
    notes.append(note);
    exception.attr("__notes__") = notes;
  }
}

}  // namespace

void set_sample_error_type(py::handle type) {
  Py_XINCREF(type.ptr());
  Py_XDECREF(g_sample_error_type);
  g_sample_error_type = type.ptr();
}

// --- RawBatch ------------------------------------------------------------------------------

RawBatch::RawBatch(std::shared_ptr<BatchHolder> holder, py::list objects,
                   std::vector<std::size_t> indices, std::vector<SkippedSample> skipped,
                   std::size_t array_fields)
    : holder_(std::move(holder)),
      objects_(std::move(objects)),
      indices_(std::move(indices)),
      skipped_(std::move(skipped)),
      array_fields_(array_fields),
      epoch_(holder_->batch.epoch()),
      number_(holder_->batch.number()),
      size_(holder_->batch.size()) {}

const std::shared_ptr<BatchHolder>& RawBatch::holder() const {
  if (!holder_) throw std::logic_error("stoker: this batch handle was released");
  return holder_;
}

py::list RawBatch::capsules() const {
  py::list out;
  for (std::size_t f = 0; f < array_fields_; ++f) out.append(field_dlpack(holder(), f));
  return out;
}

py::list RawBatch::arrays() const {
  py::list out;
  for (std::size_t f = 0; f < array_fields_; ++f) out.append(field_numpy(holder(), f));
  return out;
}

py::tuple RawBatch::take(bool as_arrays) {
  py::list fields = as_arrays ? arrays() : capsules();
  release();
  return py::make_tuple(std::move(fields), objects_);
}

py::list RawBatch::indices() const {
  py::list out;
  for (std::size_t i : indices_) out.append(i);
  return out;
}

py::list RawBatch::skipped() const {
  py::list out;
  for (const auto& s : skipped_) out.append(py::make_tuple(s.index, s.reason));
  return out;
}

// --- PyLoader ------------------------------------------------------------------------------

PyLoader::PyLoader(PyLoaderOptions options)
    : py_dataset_(std::move(options.py_dataset)), remap_(std::move(options.remap)) {
  if (py_dataset_) {
    executors_ = std::make_shared<detail::Executors>();
    executors_->add(std::make_shared<PyThreads>(py_dataset_));
    options.internals.executors = executors_;
  }
  {
    py::gil_scoped_release nogil;  // starting workers: they may already want the GIL
    loader_ = std::make_unique<Loader>(options.loader, options.internals);
  }
  batches_per_epoch_ = loader_->batches_per_epoch();
  samples_per_epoch_ = loader_->samples_per_epoch();
  registry().insert(this);
}

PyLoader::~PyLoader() {
  if (closed_) return;
  if (!Py_IsInitialized() || interpreter_finalizing()) {
    abandon();
    return;
  }
  close();
}

PyLoader::CallLocks PyLoader::lock_call(bool consumer) {
  CallLocks locks{std::shared_lock(lifetime_mu_, std::defer_lock),
                  std::unique_lock(call_mu_, std::defer_lock)};
  lock_without_gil(locks.lifetime);
  if (consumer) lock_without_gil(locks.call);
  if (closed_) throw std::runtime_error("stoker: the DataLoader is closed");
  return locks;
}

py::object PyLoader::next(double timeout_s) {
  using Clock = std::chrono::steady_clock;
  auto locks = lock_call(true);
  if (py_dataset_) py_dataset_->clear_interrupt();
  if (held_) {
    Batch batch = std::move(*held_);
    held_.reset();
    return deliver(std::move(batch));
  }
  const auto start = Clock::now();
  const auto timeout =
      std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(timeout_s));
  for (;;) {
    auto slice = std::chrono::duration_cast<std::chrono::nanoseconds>(kWaitSlice);
    if (timeout_s > 0) {
      slice = std::clamp<std::chrono::nanoseconds>(start + timeout - Clock::now(), {}, slice);
    }
    NextResult result;
    try {
      py::gil_scoped_release nogil;
      result = loader_->next_for(slice);
    } catch (const SampleError& e) {
      raise_sample_error(e);
    }
    // Anything else (no memory for a slab, ...) propagates; pybind11 maps the standard
    // exception types to Python's (std::bad_alloc to MemoryError, ...).
    switch (result.status) {
      case NextResult::Status::batch:
        // Ctrl-C during the wait: Python would raise KeyboardInterrupt as this call returns
        // and the batch would be lost; raise it here and keep the batch for the next call.
        if (PyErr_CheckSignals() != 0) {
          held_.emplace(std::move(*result.batch));
          throw py::error_already_set();
        }
        return deliver(std::move(*result.batch));
      case NextResult::Status::end_of_epoch:
        return py::none();
      case NextResult::Status::timed_out:
        break;
    }
    // Runs the Python signal handlers (main thread only): Ctrl-C raises KeyboardInterrupt
    // here; the batch waited for stays with the loader for the next call.
    if (PyErr_CheckSignals() != 0) throw py::error_already_set();
    if (timeout_s > 0 && Clock::now() - start >= timeout) {
      // torch's message, which prints the timeout as the user gave it: most often a whole
      // number, so one is printed without Python's ".0".
      const std::string seconds = timeout_s == std::floor(timeout_s)
                                      ? std::to_string(static_cast<long long>(timeout_s))
                                      : static_cast<std::string>(py::str(py::float_(timeout_s)));
      throw std::runtime_error("DataLoader timed out after " + seconds + " seconds");
    }
  }
}

void PyLoader::set_epoch(std::uint64_t epoch) {
  auto locks = lock_call(true);
  held_.reset();
  py::gil_scoped_release nogil;
  loader_->set_epoch(epoch);
}

void PyLoader::restore(std::uint64_t epoch, std::size_t batch) {
  auto locks = lock_call(true);
  held_.reset();
  py::gil_scoped_release nogil;
  loader_->restore({epoch, batch});
}

void PyLoader::restart_fresh(std::uint64_t epoch) {
  auto locks = lock_call(true);
  held_.reset();
  py::gil_scoped_release nogil;
  // Two restarts to different positions: the second always cancels everything in flight
  // (restarting to the current position keeps what is prefetched).
  loader_->restore({epoch, loader_->batches_in(epoch)});
  loader_->set_epoch(epoch);
}

void PyLoader::resume(std::uint64_t epoch, std::vector<std::size_t> order, std::size_t batch) {
  auto locks = lock_call(true);
  held_.reset();
  py::gil_scoped_release nogil;
  loader_->resume(epoch, std::move(order), batch);
}

bool PyLoader::order_ahead(std::uint64_t epoch, std::vector<std::size_t> order) {
  auto locks = lock_call(true);
  py::gil_scoped_release nogil;
  return loader_->order_ahead(epoch, std::move(order));
}

std::size_t PyLoader::batches_in(std::uint64_t epoch) const { return loader_->batches_in(epoch); }

std::vector<std::size_t> PyLoader::resumed_order(std::uint64_t epoch,
                                                 const PositionRanges& consumed, NodeLayout nodes) {
  return released([&](Loader& loader) {
    std::vector<std::size_t> out;
    SampleOrder order = loader.order();
    order.nodes = nodes;
    stoker::resumed_order(order, epoch, consumed, out);
    return out;
  });
}

py::tuple PyLoader::position() {
  auto locks = lock_call(true);
  if (held_) return py::make_tuple(held_->epoch(), held_->number());  // not handed out yet
  Position p;
  {
    py::gil_scoped_release nogil;
    p = loader_->position();
  }
  return py::make_tuple(p.epoch, p.batch);
}

void PyLoader::set_workers(std::size_t workers) {
  released([&](Loader& loader) { loader.set_workers(workers); });
}

void PyLoader::set_depth(std::size_t depth) {
  released([&](Loader& loader) { loader.set_depth(depth); });
}

py::list PyLoader::skipped_samples() {
  const auto report = released([](Loader& loader) { return loader.skipped_samples(); });
  py::list out;
  for (const auto& s : report) out.append(py::make_tuple(dataset_index(s.index), s.name, s.reason));
  return out;
}

Stats PyLoader::typed_stats() {
  return released([](Loader& loader) { return loader.stats(); });
}

std::uint64_t PyLoader::thread_reads() const { return py_dataset_ ? py_dataset_->gil_reads() : 0; }

py::dict PyLoader::stats() {
  const Stats s = typed_stats();
  py::dict d;
  for_each_stat(s, [&](const char* name, const auto& value) {
    d[py::str(py_stat_name(name, value))] = py_stat_value(value);
  });
  d["samples_per_second"] = s.samples_per_second();
  d["bytes_per_second"] = s.bytes_per_second();
  d["network_bytes_per_second"] = s.network_bytes_per_second();
  d["wait_fraction"] = s.wait_fraction();
  return d;
}

py::dict PyLoader::report() {
  const Report r = released([](Loader& loader) { return loader.report(); });
  py::dict d = fields_dict(r);
  d["text"] = r.text();
  return d;
}

void PyLoader::trace(const std::optional<std::string>& path, std::size_t max_events) {
  auto locks = lock_call(true);
  try {
    py::gil_scoped_release nogil;  // writing a large trace takes a while
    if (path) {
      loader_->trace(*path, {.max_events = max_events});
    } else {
      loader_->stop_trace();
    }
  } catch (const std::system_error& e) {
    // OSError(errno, message) becomes the errno's subclass, as Python's own file errors do.
    PyErr_SetObject(PyExc_OSError, py::make_tuple(e.code().value(), std::string(e.what())).ptr());
    throw py::error_already_set();
  }
}

std::size_t PyLoader::dataset_index(std::size_t loader_index) const {
  if (!remap_) return loader_index;
  return through(*remap_->order(), loader_index);
}

std::size_t PyLoader::through(const std::vector<std::size_t>& order, std::size_t loader_index) {
  return loader_index < order.size() ? order[loader_index] : loader_index;
}

py::object PyLoader::deliver(Batch batch) {
  if (batch.device() == "sim") {
    // The simulated device's memory is host memory, read here by the host rather than by a
    // kernel on the consumer's stream: wait for the simulated copy itself.
    py::gil_scoped_release nogil;
    batch.synchronize();
  }
  std::vector<std::size_t> indices(batch.indices().begin(), batch.indices().end());
  std::vector<SkippedSample> skipped(batch.skipped().begin(), batch.skipped().end());
  if (remap_) {
    const auto order = remap_->order();  // once a batch: an atomic shared_ptr's load locks
    for (auto& i : indices) i = through(*order, i);
    for (auto& s : skipped) s.index = through(*order, s.index);
  }
  // A Python data set's layout is known once a batch exists.
  const bool objects_field = py_dataset_ && py_dataset_->objects_field();
  const std::size_t array_fields = batch.fields().size() - (objects_field ? 1 : 0);
  py::list objects = objects_field ? py_dataset_->take_objects(batch) : py::list();
  auto holder = std::make_shared<BatchHolder>(BatchHolder{std::move(batch)});
  return py::cast(RawBatch(std::move(holder), std::move(objects), std::move(indices),
                           std::move(skipped), array_fields));
}

void PyLoader::raise_sample_error(const SampleError& error) {
  const std::size_t index = dataset_index(error.index());
  // what() is "sample <loader index>: <reason>"; the index is the data set's here.
  std::string reason = error.what();
  if (auto colon = reason.find(": "); colon != std::string::npos) reason.erase(0, colon + 2);
  try {
    error.rethrow_cause();
  } catch (const PythonError& cause) {
    std::size_t read_index = index;
    py::object exception;
    if (py_dataset_ && cause.origin() == py_dataset_.get()) {
      exception = py_dataset_->take_error(cause.ticket(), read_index);
    }
    if (exception && !exception.is_none()) {
      // The engine appends why a failure was raised rather than skipped.
      const std::string what = cause.what();
      std::string note = std::string("stoker: raised while reading ") + py_dataset_->item_name() +
                         " " + std::to_string(read_index);
      if (reason.size() > what.size() && reason.compare(0, what.size(), what) == 0) {
        note += reason.substr(what.size());
      }
      add_note(exception, note);
      PyObject* type = reinterpret_cast<PyObject*>(Py_TYPE(exception.ptr()));
      Py_INCREF(type);
      PyObject* trace = PyException_GetTraceback(exception.ptr());
      PyErr_Restore(type, exception.release().ptr(), trace);
      throw py::error_already_set();
    }
  } catch (const WorkerDiedError& cause) {
    // A worker process died: stoker.WorkerError (a SampleError) with torch's message.
    if (worker_error_type()) {
      py::object exception =
          py::reinterpret_borrow<py::object>(worker_error_type())(std::string(cause.what()));
      exception.attr("index") = index;
      exception.attr("pid") = cause.pid();
      PyErr_SetObject(worker_error_type().ptr(), exception.ptr());
      throw py::error_already_set();
    }
  } catch (...) {
    // A native data set's exception: reported below with its message.
  }
  const std::string message = "sample " + std::to_string(index) + ": " + reason;
  py::object exception = py::reinterpret_borrow<py::object>(
      g_sample_error_type ? g_sample_error_type : PyExc_RuntimeError)(message);
  exception.attr("index") = index;
  PyErr_SetObject(reinterpret_cast<PyObject*>(Py_TYPE(exception.ptr())), exception.ptr());
  throw py::error_already_set();
}

void PyLoader::close() {
  if (closed_) return;
  closed_ = true;
  registry().erase(this);
  // From here reads fail at once, so the calls below wait for at most the __getitem__ calls
  // in progress.
  if (py_dataset_) py_dataset_->close();
  if (executors_) executors_->stop();
  if (on_engine_thread()) {
    close_from_engine_thread();
    return;
  }
  std::unique_lock lifetime(lifetime_mu_, std::defer_lock);
  lock_without_gil(lifetime);  // a call in another thread finishes first
  {
    py::gil_scoped_release nogil;
    held_.reset();
    loader_.reset();  // stops and joins the workers
  }
  if (py_dataset_) py_dataset_->release_workers();  // and reaps worker processes
  // With the GIL: the last references to the Python data set may go here.
  executors_.reset();
  remap_.reset();
  py_dataset_.reset();
}

void PyLoader::close_from_engine_thread() {
  // Typically the cyclic garbage collector, run by a __getitem__ on one of this or another
  // loader's threads, finalizing this loader. Stopping it here could mean joining this very
  // thread, so a thread of its own stops it. A call still in progress on another thread (only
  // possible with an explicit close()) keeps the loader: it is abandoned then, not stopped.
  std::unique_lock lifetime(lifetime_mu_, std::try_to_lock);
  if (!lifetime.owns_lock()) {
    abandon();
    return;
  }
  struct Remains {
    std::unique_ptr<Loader> loader;
    std::shared_ptr<RemappedDataset> remap;
    std::shared_ptr<PyDataset> py_dataset;
    std::shared_ptr<detail::Executors> executors;
  };
  auto remains = std::make_unique<Remains>(Remains{std::move(loader_), std::move(remap_),
                                                   std::move(py_dataset_), std::move(executors_)});
  // The Python objects left (in the data set) are let go by their owners' destructors, which
  // take the GIL themselves, or leave them to the interpreter's teardown if it has begun.
  std::thread([remains = std::move(remains)]() mutable {
    remains->loader.reset();
    if (remains->py_dataset && !interpreter_finalizing()) {
      py::gil_scoped_acquire gil;
      remains->py_dataset->release_workers();
      remains->executors.reset();
    }
    remains.reset();
  }).detach();
}

void PyLoader::abandon() {
  // After fork the threads are gone and any lock they held stays held: destroying the
  // loader would wait forever. Leak it; the process that made it cleans up.
  closed_ = true;
  registry().erase(this);
  (void)loader_.release();
  if (held_) new Batch(std::move(*held_));  // its pool's lock may be held too
  new std::shared_ptr<PyDataset>(std::move(py_dataset_));
  new std::shared_ptr<RemappedDataset>(std::move(remap_));
  new std::shared_ptr<detail::Executors>(std::move(executors_));
}

void PyLoader::use_processes(std::shared_ptr<ProcessPool> pool) {
  auto locks = lock_call(false);
  if (!py_dataset_) throw py::type_error("stoker: worker processes read Python data sets only");
  executors_->add(std::make_shared<ProcessExecutor>(py_dataset_, remap_, std::move(pool)));
}

void PyLoader::use_threads() {
  auto locks = lock_call(false);
  if (!py_dataset_) throw py::type_error("stoker: worker processes read Python data sets only");
  std::vector<std::shared_ptr<detail::ChunkExecutor>> gone;
  {
    py::gil_scoped_release nogil;  // a read in progress in a process may want the GIL
    gone = executors_->remove(detail::ChunkExecutor::Kind::process);
  }
}

void PyLoader::use_remote(py::object remote) {
  auto locks = lock_call(false);
  if (!py_dataset_) throw py::type_error("stoker: remote workers read Python data sets only");
  executors_->add(std::make_shared<RemoteExecutor>(py_dataset_, remap_, std::move(remote)));
}

void PyLoader::close_all() {
  // close() erases from the registry; iterate over a copy.
  const std::vector<PyLoader*> loaders(registry().begin(), registry().end());
  for (PyLoader* l : loaders) l->close();
}

void PyLoader::abandon_all_after_fork() {
  const std::vector<PyLoader*> loaders(registry().begin(), registry().end());
  for (PyLoader* l : loaders) l->abandon();
}

}  // namespace stoker::python
