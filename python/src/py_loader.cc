#include "py_loader.h"

#include <algorithm>
#include <set>
#include <string>
#include <utility>

#include "gil.h"
#include "py_workers.h"

namespace stoker::python {
namespace {

// How often a waiting Python thread looks for signals (Ctrl-C). Waking up costs nothing
// measurable at this rate; a person pressing Ctrl-C does not notice 20 ms.
constexpr std::chrono::milliseconds kWaitSlice{20};

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

// --- ConsumerThread ------------------------------------------------------------------------

ConsumerThread::ConsumerThread() : thread_([this] { run(); }) {}

ConsumerThread::~ConsumerThread() {
  {
    std::lock_guard lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

void ConsumerThread::start(std::function<void()> job) {
  {
    std::lock_guard lock(mu_);
    job_ = std::move(job);
    done_ = false;
  }
  cv_.notify_all();
}

bool ConsumerThread::wait_for(std::chrono::nanoseconds timeout) {
  std::unique_lock lock(mu_);
  return cv_.wait_for(lock, timeout, [this] { return done_; });
}

void ConsumerThread::run() {
  std::unique_lock lock(mu_);
  for (;;) {
    cv_.wait(lock, [this] { return stop_ || job_; });
    if (!job_) return;  // stopping, and no job left
    auto job = std::move(job_);
    job_ = nullptr;
    lock.unlock();
    job();  // jobs catch their own exceptions
    lock.lock();
    done_ = true;
    cv_.notify_all();
  }
}

// --- PyLoader ------------------------------------------------------------------------------

PyLoader::PyLoader(PyLoaderOptions options)
    : py_dataset_(std::move(options.py_dataset)), remap_(std::move(options.remap)) {
  {
    py::gil_scoped_release nogil;  // starting workers: they may already want the GIL
    loader_ = std::make_unique<Loader>(options.loader);
    if (options.threaded) consumer_ = std::make_unique<ConsumerThread>();
  }
  if (consumer_ && py_dataset_) py_dataset_->set_inline_thread(consumer_->id());
  batches_per_epoch_ = loader_->batches_per_epoch();
  samples_per_epoch_ = loader_->samples_per_epoch();
  array_fields_ = loader_->fields().size();
  if (py_dataset_ && py_dataset_->objects_field()) --array_fields_;
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

void PyLoader::await_job(std::optional<std::chrono::steady_clock::time_point> deadline,
                         double timeout_s) {
  using Clock = std::chrono::steady_clock;
  for (;;) {
    std::chrono::nanoseconds slice = kWaitSlice;
    if (deadline) slice = std::clamp<std::chrono::nanoseconds>(*deadline - Clock::now(), {}, slice);
    bool done;
    {
      py::gil_scoped_release nogil;
      done = consumer_->wait_for(slice);
    }
    if (done) return;
    // Runs the Python signal handlers (main thread only): Ctrl-C raises KeyboardInterrupt
    // here, and the job goes on.
    if (PyErr_CheckSignals() != 0) throw py::error_already_set();
    if (deadline && Clock::now() >= *deadline) {
      // torch's message, with the number as Python prints it
      const std::string seconds = py::str(py::float_(timeout_s));
      throw std::runtime_error("DataLoader timed out after " + seconds + " seconds");
    }
  }
}

void PyLoader::call(JobKind kind, std::function<void()> job,
                    std::optional<std::chrono::steady_clock::time_point> deadline) {
  if (!consumer_) {
    py::gil_scoped_release nogil;
    job();
    return;
  }
  consumer_->start(std::move(job));
  running_ = kind;
  await_job(deadline, 0);
  running_ = JobKind::none;
}

void PyLoader::settle() {
  if (running_ == JobKind::none) return;
  await_job(std::nullopt, 0);
  running_ = JobKind::none;
  result_ = {};  // a batch nobody took goes back to its pool (no GIL needed)
}

py::object PyLoader::next(double timeout_s) {
  auto locks = lock_call(true);
  std::optional<std::chrono::steady_clock::time_point> deadline;
  if (timeout_s > 0) {
    deadline =
        std::chrono::steady_clock::now() + std::chrono::duration_cast<std::chrono::nanoseconds>(
                                               std::chrono::duration<double>(timeout_s));
  }
  auto job = [this] {
    JobResult r;
    r.before = loader_->position();
    try {
      r.batch = loader_->next();
    } catch (...) {
      r.error = std::current_exception();
    }
    result_ = std::move(r);
  };
  if (!consumer_) {
    call(JobKind::next, job);
    return deliver(std::exchange(result_, {}));
  }
  if (running_ == JobKind::other) settle();
  if (running_ == JobKind::none) {
    consumer_->start(job);
    running_ = JobKind::next;
  }
  // An interrupted wait leaves running_ == next: the next call collects this batch.
  await_job(deadline, timeout_s);
  running_ = JobKind::none;
  return deliver(std::exchange(result_, {}));
}

void PyLoader::consumer_op(std::function<void(Loader&)> op) {
  auto locks = lock_call(true);
  settle();
  // `op` is moved into the job: an interrupted wait leaves the job running after we return.
  call(JobKind::other, [this, op = std::move(op)] {
    try {
      op(*loader_);
    } catch (...) {
      result_.error = std::current_exception();
    }
  });
  if (auto e = std::exchange(result_.error, nullptr)) std::rethrow_exception(e);
}

void PyLoader::set_epoch(std::uint64_t epoch) {
  consumer_op([epoch](Loader& l) { l.set_epoch(epoch); });
}

void PyLoader::restore(std::uint64_t epoch, std::size_t batch) {
  consumer_op([epoch, batch](Loader& l) { l.restore({epoch, batch}); });
}

void PyLoader::restart_fresh(std::uint64_t epoch) {
  consumer_op([epoch](Loader& l) {
    // Two restarts to different positions: the second always cancels everything in flight
    // (restarting to the current position keeps what is prefetched).
    l.restore({epoch, l.batches_per_epoch()});
    l.set_epoch(epoch);
  });
}

py::tuple PyLoader::position() {
  auto locks = lock_call(true);
  if (running_ == JobKind::next) {
    // A batch fetched but not handed out yet: the caller has not seen it.
    await_job(std::nullopt, 0);
    return py::make_tuple(result_.before.epoch, result_.before.batch);
  }
  settle();
  call(JobKind::other, [this] { result_.position = loader_->position(); });
  return py::make_tuple(result_.position.epoch, result_.position.batch);
}

void PyLoader::set_workers(std::size_t workers) {
  auto locks = lock_call(false);
  py::gil_scoped_release nogil;  // joins retired workers, which may be waiting for the GIL
  loader_->set_workers(workers);
}

void PyLoader::set_depth(std::size_t depth) {
  auto locks = lock_call(false);
  py::gil_scoped_release nogil;
  loader_->set_depth(depth);
}

py::dict PyLoader::stats() {
  auto locks = lock_call(false);
  Stats s;
  {
    py::gil_scoped_release nogil;
    s = loader_->stats();
  }
  auto seconds = [](std::chrono::nanoseconds ns) {
    return std::chrono::duration<double>(ns).count();
  };
  py::dict d;
  d["elapsed_s"] = seconds(s.elapsed);
  d["batches"] = s.batches;
  d["samples"] = s.samples;
  d["bytes"] = s.bytes;
  d["consumer_wait_s"] = seconds(s.consumer_wait);
  d["worker_busy_s"] = seconds(s.worker_busy);
  d["worker_lock_held_s"] = seconds(s.worker_lock_held);
  d["inline_busy_s"] = seconds(s.inline_busy);
  d["skipped"] = s.skipped;
  d["workers"] = s.workers;
  d["depth"] = s.depth;
  d["in_flight"] = s.in_flight;
  d["ready"] = s.ready;
  d["mean_ready_at_next"] = s.mean_ready_at_next;
  d["slabs"] = s.slabs;
  d["slab_bytes"] = s.slab_bytes;
  d["locked_slabs"] = s.locked_slabs;
  d["device"] = s.device;
  d["copies"] = s.copies;
  d["copy_bytes"] = s.copy_bytes;
  d["samples_per_second"] = s.samples_per_second();
  d["bytes_per_second"] = s.bytes_per_second();
  d["wait_fraction"] = s.wait_fraction();
  return d;
}

std::size_t PyLoader::dataset_index(std::size_t loader_index) const {
  if (!remap_) return loader_index;
  const auto order = remap_->order();
  return loader_index < order->size() ? (*order)[loader_index] : loader_index;
}

py::object PyLoader::deliver(JobResult result) {
  if (result.error) {
    try {
      std::rethrow_exception(result.error);
    } catch (const SampleError& e) {
      raise_sample_error(e);
    }
    // Anything else (no memory for a slab, ...) propagates; pybind11 maps the standard
    // exception types to Python's (std::bad_alloc to MemoryError, ...).
  }
  if (!result.batch) return py::none();
  Batch& batch = *result.batch;
  if (batch.device() == "sim") {
    // The simulated device's memory is host memory, read here by the host rather than by a
    // kernel on the consumer's stream: wait for the simulated copy itself.
    py::gil_scoped_release nogil;
    batch.synchronize();
  }
  std::vector<std::size_t> indices(batch.indices().begin(), batch.indices().end());
  std::vector<SkippedSample> skipped(batch.skipped().begin(), batch.skipped().end());
  if (remap_) {
    for (auto& i : indices) i = dataset_index(i);
    for (auto& s : skipped) s.index = dataset_index(s.index);
  }
  py::list objects =
      (py_dataset_ && py_dataset_->objects_field()) ? py_dataset_->take_objects(batch) : py::list();
  auto holder = std::make_shared<BatchHolder>(BatchHolder{std::move(batch)});
  return py::cast(RawBatch(std::move(holder), std::move(objects), std::move(indices),
                           std::move(skipped), array_fields_));
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
      std::string note = "stoker: raised while reading sample " + std::to_string(read_index);
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
  if (on_engine_thread()) {
    close_from_engine_thread();
    return;
  }
  std::unique_lock lifetime(lifetime_mu_, std::defer_lock);
  lock_without_gil(lifetime);  // a call in another thread finishes first
  {
    py::gil_scoped_release nogil;
    consumer_.reset();  // waits for its job
    result_ = {};
    loader_.reset();  // stops and joins the workers
  }
  if (py_dataset_) py_dataset_->release_workers();  // and reaps worker processes
  // With the GIL: the last references to the Python data set may go here.
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
    std::unique_ptr<ConsumerThread> consumer;
    JobResult result;
    std::unique_ptr<Loader> loader;
    std::shared_ptr<RemappedDataset> remap;
    std::shared_ptr<PyDataset> py_dataset;
  };
  auto remains = std::make_unique<Remains>(Remains{std::move(consumer_), std::move(result_),
                                                   std::move(loader_), std::move(remap_),
                                                   std::move(py_dataset_)});
  // The Python objects left (in the data set) are let go by their owners' destructors, which
  // take the GIL themselves, or leave them to the interpreter's teardown if it has begun.
  std::thread([remains = std::move(remains)]() mutable {
    remains->consumer.reset();
    remains->result = {};
    remains->loader.reset();
    if (remains->py_dataset && !interpreter_finalizing()) {
      py::gil_scoped_acquire gil;
      remains->py_dataset->release_workers();
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
  (void)consumer_.release();
  new std::shared_ptr<PyDataset>(std::move(py_dataset_));
  new std::shared_ptr<RemappedDataset>(std::move(remap_));
  new JobResult(std::move(result_));
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

// --- epoch_order ---------------------------------------------------------------------------

namespace {

// One byte per sample, never written: the loader is run only for Batch::indices().
class IndexOnlyDataset final : public Dataset {
 public:
  explicit IndexOnlyDataset(std::size_t size) : size_(size) {}
  std::size_t size() const override { return size_; }
  std::vector<FieldSpec> fields() const override { return {{"index", DType::u8, {}}}; }
  void read(std::size_t, const SampleOut&) const override {}

 private:
  std::size_t size_;
};

}  // namespace

std::vector<std::size_t> epoch_order(std::size_t size, bool shuffle, std::uint64_t seed,
                                     std::uint64_t epoch, Shard shard) {
  // The sampler is internal to the engine; one unbatched pass of a loader over a data set
  // that reads nothing yields its order through the public API.
  LoaderOptions o;
  o.dataset = std::make_shared<IndexOnlyDataset>(size);
  o.batch_size = std::max<std::size_t>(size, 1);
  o.shuffle = shuffle;
  o.seed = seed;
  o.shard = shard;
  o.workers = 0;
  o.depth = 1;
  Loader loader(o);
  loader.set_epoch(epoch);
  std::vector<std::size_t> order;
  if (auto batch = loader.next()) order.assign(batch->indices().begin(), batch->indices().end());
  return order;
}

}  // namespace stoker::python
