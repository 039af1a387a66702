#include "py_dataset.h"

#include <time.h>

#include <algorithm>
#include <cstring>
#include <set>
#include <utility>

#include "gil.h"
#include "py_workers.h"

namespace stoker::python {
namespace {

// Exceptions kept for the loader to raise. Under ErrorPolicy::raise only the first failure of
// the head batch is wanted; under skip, only one past the budget. A bound keeps failures that
// are never raised (skipped rows, cancelled batches) from holding their tracebacks' frames,
// and the arrays in them, for the loader's life.
constexpr std::size_t kKeptErrors = 64;

// A thread reads samples under one GIL acquisition until their arrays add up to this many
// bytes, then copies them into the slab with the GIL released.
constexpr std::size_t kCopyRun = 256 << 10;

thread_local std::optional<std::uint64_t> t_sample_seed;
thread_local std::optional<std::uint64_t> t_sample_epoch;

// A read's seed and epoch (current_sample_seed(), current_sample_epoch()) on this thread while
// it runs; a probe has no epoch.
struct SeedScope {
  explicit SeedScope(std::uint64_t seed) { t_sample_seed = seed; }
  explicit SeedScope(const SampleOut& out) : SeedScope(out.seed()) { t_sample_epoch = out.epoch(); }
  ~SeedScope() {
    t_sample_seed.reset();
    t_sample_epoch.reset();
  }
  SeedScope(const SeedScope&) = delete;
  SeedScope& operator=(const SeedScope&) = delete;
};

// The GIL for a read on an engine thread, timed: how long the thread waited to take it and
// how long it held it (the auto worker type and the tuner read these). No worker process is
// forked meanwhile.
class TimedGil {
 public:
  TimedGil(std::atomic<std::uint64_t>& reads, std::atomic<std::int64_t>& wait_ns,
           std::atomic<std::int64_t>& held_ns, std::atomic<std::int64_t>& cpu_ns,
           std::size_t samples)
      : held_ns_(held_ns),
        cpu_ns_(cpu_ns),
        start_(Clock::now()),
        held_from_(acquired()),
        cpu_from_(thread_cpu_ns()) {
    reads.fetch_add(samples, std::memory_order_relaxed);
    wait_ns.fetch_add(ns(held_from_ - start_), std::memory_order_relaxed);
  }
  ~TimedGil() {
    // CPU time, not wall time: the wall time in here also counts sleeps and I/O (which
    // release the GIL) and waits for the GIL taken back in between.
    cpu_ns_.fetch_add(thread_cpu_ns() - cpu_from_, std::memory_order_relaxed);
    held_ns_.fetch_add(ns(Clock::now() - held_from_), std::memory_order_relaxed);
  }
  TimedGil(const TimedGil&) = delete;
  TimedGil& operator=(const TimedGil&) = delete;

 private:
  using Clock = std::chrono::steady_clock;
  static std::int64_t ns(Clock::duration d) {
    return std::chrono::duration_cast<std::chrono::nanoseconds>(d).count();
  }
  Clock::time_point acquired() {
    gil_.emplace();
    return Clock::now();
  }

  static std::int64_t thread_cpu_ns() {
    timespec t{};
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
    return std::int64_t{t.tv_sec} * 1'000'000'000 + t.tv_nsec;
  }

  std::atomic<std::int64_t>& held_ns_;
  std::atomic<std::int64_t>& cpu_ns_;
  ForkGate::Pass pass_;  // taken before the GIL, let go after it (gil.h, rule 5)
  std::optional<EngineThreadGil> gil_;
  Clock::time_point start_;
  Clock::time_point held_from_;
  std::int64_t cpu_from_;
};

}  // namespace

void set_sample_seed(std::optional<std::uint64_t> seed) { t_sample_seed = seed; }

std::optional<std::uint64_t> current_sample_seed() { return t_sample_seed; }

std::optional<std::uint64_t> current_sample_epoch() { return t_sample_epoch; }

py::object read_one(py::handle dataset, std::size_t index) {
  // A worker process reads each sample through here. PyObject_HasAttr looks a str up without
  // raising for a plain object; py::hasattr made the C string a str and raised and cleared an
  // AttributeError each time: 0.43 us a sample of a data set without __getitems__
  // (SampleWriter.read_sample of bench/python_bench.py's cheap data set took 2.29 us, now
  // 1.86, and its __getitem__ alone 1.28).
  static PyObject* const kGetitems = PyUnicode_InternFromString("__getitems__");
  if (PyObject_HasAttr(dataset.ptr(), kGetitems) != 1) return dataset[py::int_(index)];
  py::list keys(1);
  keys[0] = py::int_(index);
  const py::sequence got = dataset.attr("__getitems__")(keys);
  if (got.size() != 1) {
    throw py::value_error("stoker: __getitems__ returned " + std::to_string(got.size()) +
                          " samples for 1 index");
  }
  return got[0];
}

struct PyDataset::State {
  py::object dataset;
  py::object on_worker_start;
  py::object job_args;
  std::vector<py::object> layout_listeners;  // see on_layout
  Node root;
  std::size_t slots = 0;
  struct KeptError {
    py::object exception;
    std::size_t index;
  };
  std::uint64_t next_ticket = 1;
  std::map<std::uint64_t, KeptError> errors;
  std::unordered_map<std::thread::id, std::size_t> workers;  // worker id by thread
  // Object values by slab (the base of the objects field) and row: a tuple per row.
  std::unordered_map<const std::byte*, std::vector<py::object>> objects;
  // Probed samples (or their failures) by (index, seed), until their rows are read.
  struct Pending {
    py::object sample;
    std::exception_ptr error;
  };
  std::map<std::pair<std::size_t, std::uint64_t>, Pending> pending;
};

std::shared_ptr<PyDataset> PyDataset::make(py::object dataset, bool whole_sample,
                                           py::object on_worker_start) {
  std::shared_ptr<PyDataset> self(new PyDataset());
  self->state_ = std::make_unique<State>();
  State& st = *self->state_;
  st.dataset = std::move(dataset);
  st.on_worker_start = std::move(on_worker_start);
  self->size_ = py::len(st.dataset);
  self->has_getitems_ = py::hasattr(st.dataset, "__getitems__");
  if (self->size_ == 0) throw py::value_error("stoker: the data set is empty");
  if (whole_sample) {
    LayoutBuilder builder{self->fields_, st.slots, {}};
    st.root.kind = Node::Kind::object;
    st.root.slot = st.slots++;
    self->objects_field_ = builder.add_field("<objects>", DType::u8, {});
    self->layout_known_.store(true, std::memory_order_release);
  }
  return self;
}

std::vector<FieldSpec> PyDataset::fields() const {
  return fields_known() ? fields_ : std::vector<FieldSpec>{};
}

void PyDataset::learn(std::size_t index, py::handle sample) const {
  if (fields_known()) return;
  State& st = *state_;
  std::vector<FieldSpec> fields;
  std::size_t slots = 0;
  LayoutBuilder builder{fields, slots, {}, index};
  Node root = builder.build(sample, "");
  std::optional<std::size_t> objects_field;
  if (slots > 0) {
    // One byte per row, never read: its address names the (slab, row) the values belong to.
    objects_field = builder.add_field("<objects>", DType::u8, {});
  }
  if (fields.empty()) {
    throw py::value_error("stoker: sample " + std::to_string(index) + " holds no values to batch");
  }
  st.root = std::move(root);
  st.slots = slots;
  fields_ = std::move(fields);
  objects_field_ = objects_field;
  layout_known_.store(true, std::memory_order_release);
  if (auto pool = processes_.load()) pool->set_layout(layout_message());
  for (const auto& listener : st.layout_listeners) listener(layout_message());
}

std::vector<FieldSpec> PyDataset::probe(std::size_t index, std::uint64_t seed,
                                        std::exception_ptr& failure) const {
  if (closed_.load(std::memory_order_acquire) || interpreter_finalizing()) {
    throw std::runtime_error("stoker: the loader is closing");
  }
  if (auto pool = processes_.load()) {
    // Read in a worker process, which sends the sample back; its row is written here.
    py::object sample;
    try {
      sample = pool->probe(*this, index, seed);
    } catch (...) {
      failure = std::current_exception();
    }
    EngineThreadGil gil;
    if (!failure) {
      try {
        learn(index, sample);
      } catch (...) {
        failure = capture_current(index);
      }
    }
    keep_probed(index, seed, failure ? py::object() : sample, failure);
    sample = py::object();  // let go with the GIL held
    return failure ? std::vector<FieldSpec>{} : fields_;
  }
  TimedGil gil(gil_reads_, gil_wait_ns_, gil_held_ns_, gil_cpu_ns_, 1);
  drain_graveyard();
  if (interrupted_ && !on_engine_thread()) {
    throw PythonError(this, interrupt_ticket_, interrupt_what_);
  }
  try {
    start_worker();
    py::object sample;
    {
      const SeedScope scope(seed);
      sample = read_one(state_->dataset, index);
    }
    learn(index, sample);
    keep_probed(index, seed, std::move(sample), nullptr);
    return fields_;
  } catch (...) {
    failure = capture_current(index);
  }
  // Ctrl-C on the consumer's own thread (reading inline) is not the sample's failure: it
  // ends this call (see clear_interrupt) and the sample is read again later.
  if (interrupted_ && !on_engine_thread()) std::rethrow_exception(std::exchange(failure, nullptr));
  keep_probed(index, seed, py::object(), failure);
  return {};
}

void PyDataset::keep_probed(std::size_t index, std::uint64_t seed, py::object sample,
                            std::exception_ptr failure) const {
  state_->pending[{index, seed}] = {std::move(sample), std::move(failure)};
  pending_.store(state_->pending.size(), std::memory_order_relaxed);
}

bool PyDataset::take_pending(std::size_t index, std::uint64_t seed, py::object& sample,
                             std::exception_ptr& error) const {
  if (pending_.load(std::memory_order_relaxed) == 0) return false;
  State& st = *state_;
  const auto it = st.pending.find({index, seed});
  if (it == st.pending.end()) return false;
  sample = std::move(it->second.sample);
  error = it->second.error;
  st.pending.erase(it);
  pending_.store(st.pending.size(), std::memory_order_relaxed);
  return true;
}

py::bytes PyDataset::layout_message() const {
  return py::module_::import("pickle").attr("dumps")(
      py::make_tuple(describe_layout(state_->root), state_->slots));
}

PyDataset::~PyDataset() {
  if (!Py_IsInitialized() || interpreter_finalizing()) {
    // Too late to let go of Python objects: leave them to the interpreter's teardown.
    (void)state_.release();
    for (auto& o : graveyard_) (void)o.release();
    return;
  }
  py::gil_scoped_acquire gil;
  processes_.store(nullptr);  // holds Python callables
  state_.reset();
  graveyard_.clear();
}

void PyDataset::read(std::size_t index, const SampleOut& out) const {
  if (closed_.load(std::memory_order_acquire) || interpreter_finalizing()) {
    throw std::runtime_error("stoker: the loader is closing");
  }
  std::vector<PendingCopy> copies;
  {
    TimedGil gil(gil_reads_, gil_wait_ns_, gil_held_ns_, gil_cpu_ns_, 1);
    drain_graveyard();
    State& st = *state_;
    if (interrupted_ && !on_engine_thread()) {
      throw PythonError(this, interrupt_ticket_, interrupt_what_);
    }
    py::object sample;
    std::exception_ptr probed_error;
    if (take_pending(index, out.seed(), sample, probed_error) && probed_error) {
      std::rethrow_exception(probed_error);
    }
    try {
      if (!sample) {
        start_worker();
        const SeedScope seed(out);
        const auto key = py::reinterpret_steal<py::object>(PyLong_FromSize_t(index));
        if (!key) throw py::error_already_set();
        sample = py::reinterpret_steal<py::object>(PyObject_GetItem(st.dataset.ptr(), key.ptr()));
        if (!sample) throw py::error_already_set();
      }
      take_sample(index, sample, out, copies);
    } catch (...) {
      copies.clear();
      std::rethrow_exception(capture_current(index));
    }
  }
  finish_copies(copies, out);
}

void PyDataset::start_worker() const {
  State& st = *state_;
  // Not for the consumer's own thread reading inline (workers = 0), as in torch.
  if (st.on_worker_start && !st.on_worker_start.is_none() && on_engine_thread()) {
    const auto [it, first] = st.workers.try_emplace(std::this_thread::get_id(), st.workers.size());
    if (first) st.on_worker_start(it->second);
  }
}

void PyDataset::take_sample(std::size_t index, py::handle sample, const SampleOut& out,
                            std::vector<PendingCopy>& copies) const {
  State& st = *state_;
  py::object objects;
  if (st.slots > 0) {
    objects = py::reinterpret_steal<py::object>(PyTuple_New(static_cast<Py_ssize_t>(st.slots)));
    if (!objects) throw py::error_already_set();
    for (std::size_t s = 0; s < st.slots; ++s) {
      Py_INCREF(Py_None);
      PyTuple_SET_ITEM(objects.ptr(), static_cast<Py_ssize_t>(s), Py_None);
    }
  }
  SampleVisitor{index, out, copies, objects.ptr()}.visit(st.root, sample);
  if (objects_field_) store_objects(out, std::move(objects));
}

void PyDataset::store_objects(const SampleOut& out, py::object values) const {
  if (!objects_field_) return;
  const std::byte* slab = out.bytes(*objects_field_).data() - out.row();
  auto& rows = state_->objects[slab];
  if (rows.size() <= out.row()) rows.resize(out.row() + 1);
  rows[out.row()] = std::move(values);
}

void PyDataset::store_objects(std::span<const SampleOut> outs, py::handle values) const {
  if (!objects_field_ || outs.empty()) return;
  // A chunk's rows are rows of one slab, in order.
  const SampleOut& first = outs.front();
  const std::byte* slab = first.bytes(*objects_field_).data() - first.row();
  auto& rows = state_->objects[slab];
  if (rows.size() <= outs.back().row()) rows.resize(outs.back().row() + 1);
  for (std::size_t k = 0; k < outs.size(); ++k) {
    rows[outs[k].row()] = py::reinterpret_borrow<py::object>(
        PyList_GET_ITEM(values.ptr(), static_cast<Py_ssize_t>(k)));
  }
}

void PyDataset::finish_copies(std::vector<PendingCopy>& copies, const SampleOut& out) const {
  // The GIL is released; the arrays stay alive through their owners until buried.
  std::vector<py::object> owners;
  owners.reserve(copies.size());
  try {
    copy_pending(copies, out);
  } catch (...) {
    for (auto& c : copies) owners.push_back(std::move(c.array.owner));
    bury(std::move(owners));
    throw;
  }
  for (auto& c : copies) owners.push_back(std::move(c.array.owner));
  bury(std::move(owners));
}

bool PyDataset::reads_chunks() const { return true; }

void PyDataset::read_rows(std::span<const std::size_t> indices, std::span<const SampleOut> outs,
                          std::span<std::exception_ptr> errors) const {
  if (closed_.load(std::memory_order_acquire) || interpreter_finalizing()) {
    const auto closing =
        std::make_exception_ptr(std::runtime_error("stoker: the loader is closing"));
    for (auto& e : errors) e = closing;
    return;
  }
  if (has_getitems_) {
    read_items(indices, outs, errors);
  } else {
    read_each(indices, outs, errors);
  }
}

void PyDataset::read_each(std::span<const std::size_t> indices, std::span<const SampleOut> outs,
                          std::span<std::exception_ptr> errors) const {
  std::vector<std::vector<PendingCopy>> copies(indices.size());
  std::size_t k = 0;
  while (k < indices.size()) {
    // One GIL acquisition for as many samples as fit in kCopyRun bytes of arrays: a cheap
    // sample then costs no GIL round trip of its own, and large arrays are still copied
    // with the GIL released soon after they were read.
    const std::size_t from = k;
    {
      TimedGil gil(gil_reads_, gil_wait_ns_, gil_held_ns_, gil_cpu_ns_, 0);
      drain_graveyard();
      State& st = *state_;
      std::size_t bytes = 0;
      for (; k < indices.size() && bytes < kCopyRun; ++k) {
        if (closed_.load(std::memory_order_acquire) || (interrupted_ && !on_engine_thread())) {
          break;
        }
        py::object sample;
        if (take_pending(indices[k], outs[k].seed(), sample, errors[k]) && errors[k]) continue;
        try {
          if (!sample) {
            start_worker();
            const SeedScope seed(outs[k]);
            const auto key = py::reinterpret_steal<py::object>(PyLong_FromSize_t(indices[k]));
            if (!key) throw py::error_already_set();
            sample =
                py::reinterpret_steal<py::object>(PyObject_GetItem(st.dataset.ptr(), key.ptr()));
            if (!sample) throw py::error_already_set();
          }
          take_sample(indices[k], sample, outs[k], copies[k]);
          for (const auto& c : copies[k]) bytes += c.array.bytes();
        } catch (...) {
          copies[k].clear();
          errors[k] = capture_current(indices[k]);
        }
      }
      gil_reads_.fetch_add(k - from, std::memory_order_relaxed);
      if (k < indices.size() && (interrupted_ && !on_engine_thread())) {
        // Ctrl-C on the consumer's own thread ends the whole chunk (see clear_interrupt).
        const auto interrupt =
            std::make_exception_ptr(PythonError(this, interrupt_ticket_, interrupt_what_));
        for (std::size_t j = k; j < indices.size(); ++j) errors[j] = interrupt;
        k = indices.size();
      }
    }
    for (std::size_t j = from; j < k; ++j) {
      if (errors[j]) continue;
      try {
        finish_copies(copies[j], outs[j]);
      } catch (...) {
        errors[j] = std::current_exception();
      }
    }
    if (k < indices.size() && closed_.load(std::memory_order_acquire)) {
      const auto closing =
          std::make_exception_ptr(std::runtime_error("stoker: the loader is closing"));
      for (std::size_t j = k; j < indices.size(); ++j) errors[j] = closing;
      return;
    }
  }
}

void PyDataset::read_around_probed(std::span<const std::size_t> indices,
                                   std::span<const SampleOut> outs,
                                   std::span<std::exception_ptr> errors,
                                   const ChunkRun& run) const {
  if (pending_.load(std::memory_order_relaxed) == 0) {
    run(indices, outs, errors);
    return;
  }
  // Probed rows (sent back whole by a worker process, or read here) are written here; the
  // runs of rows between them go to the workers as usual.
  std::vector<bool> here(indices.size());
  {
    EngineThreadGil gil;
    for (std::size_t k = 0; k < indices.size(); ++k) {
      py::object sample;
      if (!take_pending(indices[k], outs[k].seed(), sample, errors[k])) continue;
      here[k] = true;
      if (errors[k]) continue;
      std::vector<PendingCopy> copies;
      try {
        take_sample(indices[k], sample, outs[k], copies);
        copy_pending(copies, outs[k]);
      } catch (...) {
        errors[k] = capture_current(indices[k]);
      }
    }
  }
  for (std::size_t k = 0; k < indices.size();) {
    if (here[k]) {
      ++k;
      continue;
    }
    std::size_t end = k;
    while (end < indices.size() && !here[end]) ++end;
    run(indices.subspan(k, end - k), outs.subspan(k, end - k), errors.subspan(k, end - k));
    k = end;
  }
}

void PyDataset::read_items(std::span<const std::size_t> indices, std::span<const SampleOut> outs,
                           std::span<std::exception_ptr> errors) const {
  std::vector<std::vector<PendingCopy>> copies(indices.size());
  bool one_by_one = false;
  {
    TimedGil gil(gil_reads_, gil_wait_ns_, gil_held_ns_, gil_cpu_ns_, indices.size());
    drain_graveyard();
    State& st = *state_;
    if (interrupted_ && !on_engine_thread()) {
      const auto interrupt =
          std::make_exception_ptr(PythonError(this, interrupt_ticket_, interrupt_what_));
      for (auto& error : errors) error = interrupt;
      return;
    }
    // Probed rows are not asked for again.
    std::vector<py::object> samples(indices.size());
    py::list keys;
    for (std::size_t k = 0; k < indices.size(); ++k) {
      if (!take_pending(indices[k], outs[k].seed(), samples[k], errors[k])) {
        keys.append(py::int_(indices[k]));
      }
    }
    try {
      if (!keys.empty()) {
        start_worker();
        const SeedScope seed(outs[0]);
        const py::list got(st.dataset.attr("__getitems__")(keys));
        if (got.size() != keys.size()) {
          throw py::value_error("stoker: __getitems__ returned " + std::to_string(got.size()) +
                                " samples for " + std::to_string(keys.size()) + " indices");
        }
        std::size_t j = 0;
        for (std::size_t k = 0; k < indices.size(); ++k) {
          if (!samples[k] && !errors[k]) samples[k] = got[j++];
        }
      }
    } catch (const py::error_already_set& e) {
      if (e.matches(PyExc_KeyboardInterrupt) && !on_engine_thread()) {
        // Ctrl-C on the consumer's own thread: the whole chunk ends with it (see
        // clear_interrupt), rather than being read again sample by sample.
        const std::exception_ptr interrupt = capture_current(indices[0]);
        for (auto& error : errors) error = interrupt;
        return;
      }
      // Which sample failed is unknown: read them one by one, so that each failure names
      // its own sample (and the skip policy replaces only those); probed ones stay probed.
      one_by_one = true;
      for (std::size_t k = 0; k < indices.size(); ++k) {
        if (!samples[k] && !errors[k]) continue;
        keep_probed(indices[k], outs[k].seed(), std::move(samples[k]),
                    std::exchange(errors[k], nullptr));
      }
    }
    if (!one_by_one) {
      for (std::size_t k = 0; k < indices.size(); ++k) {
        if (errors[k]) continue;
        try {
          take_sample(indices[k], samples[k], outs[k], copies[k]);
        } catch (...) {
          copies[k].clear();
          errors[k] = capture_current(indices[k]);
        }
      }
    }
  }
  if (one_by_one) {
    read_each(indices, outs, errors);
    return;
  }
  for (std::size_t k = 0; k < indices.size(); ++k) {
    if (errors[k]) continue;
    try {
      finish_copies(copies[k], outs[k]);
    } catch (...) {
      errors[k] = std::current_exception();
    }
  }
}

std::chrono::nanoseconds PyDataset::gil_cpu() const {
  return std::chrono::nanoseconds(gil_cpu_ns_.load(std::memory_order_relaxed));
}

void PyDataset::use_processes(std::shared_ptr<ProcessPool> pool) {
  if (fields_known()) pool->set_layout(layout_message());
  processes_.store(std::move(pool));
}

void PyDataset::on_layout(py::object set_layout) {
  if (fields_known()) set_layout(layout_message());
  state_->layout_listeners.push_back(std::move(set_layout));
}

void PyDataset::close() noexcept {
  closed_.store(true, std::memory_order_release);
  if (auto pool = processes_.load()) pool->stop();
}

void PyDataset::release_workers() {
  if (auto pool = processes_.load()) pool->finish();
  // The object values of batches read ahead are never delivered now; a batch job's may view
  // a worker's shared memory, which goes with them.
  state_->objects.clear();
}

py::tuple PyDataset::gil_stats() const {
  return py::make_tuple(gil_reads_.load(), 1e-9 * static_cast<double>(gil_wait_ns_.load()),
                        1e-9 * static_cast<double>(gil_held_ns_.load()),
                        1e-9 * static_cast<double>(gil_cpu_ns_.load()));
}

std::exception_ptr PyDataset::capture_current(std::size_t index) const {
  return keep_error(take_current_exception(), index);
}

py::object take_current_exception() {
  try {
    throw;
  } catch (py::error_already_set& e) {
    e.restore();
  } catch (py::builtin_exception& e) {
    e.set_error();
  } catch (const std::exception& e) {
    PyErr_SetString(PyExc_RuntimeError, e.what());
  } catch (...) {
    PyErr_SetString(PyExc_RuntimeError, "unknown C++ exception");
  }
  return take_python_error();
}

py::object take_python_error() {
  PyObject* type = nullptr;
  PyObject* value = nullptr;
  PyObject* trace = nullptr;
  PyErr_Fetch(&type, &value, &trace);
  PyErr_NormalizeException(&type, &value, &trace);
  if (trace != nullptr) PyException_SetTraceback(value, trace);
  Py_XDECREF(type);
  Py_XDECREF(trace);
  return py::reinterpret_steal<py::object>(value);
}

std::exception_ptr PyDataset::keep_error(py::object exception, std::size_t index) const {
  std::string what = Py_TYPE(exception.ptr())->tp_name;
  if (PyObject* text = PyObject_Str(exception.ptr())) {
    const char* s = PyUnicode_AsUTF8(text);
    if (s != nullptr && *s != '\0') what += std::string(": ") + s;
    Py_DECREF(text);
  }
  PyErr_Clear();  // an unprintable exception is still reported, by type

  State& st = *state_;
  const std::uint64_t ticket = st.next_ticket++;
  if (PyErr_GivenExceptionMatches(exception.ptr(), PyExc_KeyboardInterrupt) &&
      !on_engine_thread()) {
    interrupted_ = true;
    interrupt_ticket_ = ticket;
    interrupt_what_ = what;
  }
  st.errors.emplace(ticket, State::KeptError{std::move(exception), index});
  while (st.errors.size() > kKeptErrors) st.errors.erase(st.errors.begin());
  return std::make_exception_ptr(PythonError(this, ticket, what));
}

void PyDataset::bury(std::vector<py::object>&& owners) const {
  if (owners.empty()) return;
  // Moving a py::object does not touch its reference count, so no GIL is needed here.
  detail::MutexLock lock(graveyard_mu_);
  for (auto& o : owners) graveyard_.push_back(std::move(o));
  owners.clear();
}

void PyDataset::drain_graveyard() const {
  std::vector<py::object> dead;
  {
    detail::MutexLock lock(graveyard_mu_);
    dead.swap(graveyard_);
  }
  // `dead` goes here, with the GIL held.
}

void PyDataset::set_batch_jobs(py::object job_args) {
  state_->job_args = std::move(job_args);
  has_job_args_ = true;
}

std::string PyDataset::job_args(std::span<const std::size_t> indices, std::uint64_t epoch) const {
  py::list keys(indices.size());
  for (std::size_t k = 0; k < indices.size(); ++k) keys[k] = py::int_(indices[k]);
  return state_->job_args(keys, epoch).cast<std::string>();
}

py::object PyDataset::structure() const { return structure_of(state_->root); }

py::list PyDataset::take_objects(const Batch& batch) const {
  State& st = *state_;
  py::list lists;
  for (std::size_t s = 0; s < st.slots; ++s) lists.append(py::list(batch.size()));
  if (!objects_field_) return lists;
  auto it = st.objects.find(batch.bytes(*objects_field_).data());
  for (std::size_t r = 0; r < batch.size(); ++r) {
    py::object row;
    if (it != st.objects.end() && r < it->second.size()) row = std::move(it->second[r]);
    for (std::size_t s = 0; s < st.slots; ++s) {
      py::object value = row ? py::reinterpret_borrow<py::object>(
                                   PyTuple_GET_ITEM(row.ptr(), static_cast<Py_ssize_t>(s)))
                             : py::none();
      PyList_SET_ITEM(lists[s].ptr(), static_cast<Py_ssize_t>(r), value.release().ptr());
    }
  }
  return lists;
}

py::object PyDataset::take_error(std::uint64_t ticket, std::size_t& index) const {
  State& st = *state_;
  auto it = st.errors.find(ticket);
  if (it == st.errors.end()) return py::none();
  py::object exception = std::move(it->second.exception);
  index = it->second.index;
  st.errors.erase(it);
  return exception;
}

// --- RemappedDataset -----------------------------------------------------------------------

RemappedDataset::RemappedDataset(std::shared_ptr<const Dataset> base,
                                 std::vector<std::size_t> order)
    : base_(std::move(base)), size_(order.size()) {
  set_order(std::move(order));
}

void RemappedDataset::set_order(std::vector<std::size_t> order) {
  if (order.size() != size_) {
    throw std::invalid_argument("stoker: the sampler gave " + std::to_string(order.size()) +
                                " indices, not " + std::to_string(size_));
  }
  const std::size_t n = base_->size();
  for (std::size_t i : order) {
    if (i >= n) {
      throw std::out_of_range("stoker: the sampler gave index " + std::to_string(i) +
                              ", past the data set's " + std::to_string(n) + " samples");
    }
  }
  order_.store(std::make_shared<const std::vector<std::size_t>>(std::move(order)));
}

void RemappedDataset::read(std::size_t index, const SampleOut& out) const {
  base_->read((*order_.load())[index], out);
}

void RemappedDataset::read_rows(std::span<const std::size_t> indices,
                                std::span<const SampleOut> outs,
                                std::span<std::exception_ptr> errors) const {
  base_->read_rows(map(indices), outs, errors);
}

std::vector<std::size_t> RemappedDataset::map(std::span<const std::size_t> indices) const {
  const auto order = order_.load();
  std::vector<std::size_t> mapped(indices.size());
  for (std::size_t k = 0; k < indices.size(); ++k) mapped[k] = (*order)[indices[k]];
  return mapped;
}

void RemappedDataset::will_read(std::span<const std::size_t> rows) const noexcept {
  try {
    const auto order = order_.load();
    thread_local std::vector<std::size_t> mapped;
    mapped.clear();
    for (const std::size_t r : rows) {
      if (r < order->size()) mapped.push_back((*order)[r]);
    }
    base_->will_read(mapped);
  } catch (...) {
    // A hint (an allocation failed): the reads go on without it.
  }
}

void RemappedDataset::prefetch(std::size_t index) const {
  base_->prefetch((*order_.load())[index]);
}

std::string RemappedDataset::sample_name(std::size_t index) const {
  return base_->sample_name((*order_.load())[index]);
}

}  // namespace stoker::python
