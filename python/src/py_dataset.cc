#include "py_dataset.h"

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

}  // namespace

struct PyDataset::State {
  py::object dataset;
  std::optional<RowReader> reader;  // of `dataset`
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
  st.reader.emplace(st.dataset);
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
    py::object sample =
        state_->reader->read_one({.index = index, .seed = seed, .epoch = std::nullopt});
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
  std::exception_ptr error;
  read_rows({&index, 1}, {&out, 1}, {&error, 1});
  if (error) std::rethrow_exception(error);
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
  const State& st = *state_;
  py::object objects = visit_sample(st.root, st.slots, index, sample, out, copies);
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

// The rows of a chunk on this thread. Rows probed here already are taken from the pending
// table; the others are read by the row reader under a timed GIL, their copies made with the
// GIL released: every kCopyRun bytes of arrays read row by row (a cheap sample then costs no
// GIL round trip of its own, and large arrays are still copied soon after they were read), and
// at the end.
class PyDataset::ThreadChunk final : public RowSink {
 public:
  ThreadChunk(const PyDataset& d, std::span<const std::size_t> indices,
              std::span<const SampleOut> outs, std::span<std::exception_ptr> errors)
      : d_(d), indices_(indices), outs_(outs), errors_(errors), copies_(indices.size()) {}

  void run() {
    gil_.emplace(d_.gil_reads_, d_.gil_wait_ns_, d_.gil_held_ns_, d_.gil_cpu_ns_, 0);
    d_.drain_graveyard();
    if (stopped(0)) return;
    for (std::size_t k = 0; k < indices_.size(); ++k) {
      py::object sample;
      if (!d_.take_pending(indices_[k], outs_[k].seed(), sample, errors_[k])) {
        at_.push_back(k);
        rows_.push_back({.index = indices_[k], .seed = outs_[k].seed(), .epoch = outs_[k].epoch()});
      } else if (!errors_[k]) {
        write(k, sample);
      }
    }
    if (!rows_.empty()) {
      try {
        d_.start_worker();
      } catch (...) {
        fail(0, 1);  // the first row read reports it; the worker is started all the same
        at_.erase(at_.begin());
        rows_.erase(rows_.begin());
      }
    }
    const std::size_t done = d_.state_->reader->read(rows_, *this);
    d_.gil_reads_.fetch_add(done, std::memory_order_relaxed);  // past `done`: next() stopped it
    gil_.reset();
    copy();
  }

  void take(std::size_t k, py::handle sample) override {
    write(at_[k], sample);
    for (const auto& c : copies_[at_[k]]) bytes_ += c.array.bytes();
  }
  void fail(std::size_t first, std::size_t end) override {
    const std::exception_ptr error = d_.capture_current(indices_[at_[first]]);
    for (std::size_t k = first; k < end; ++k) errors_[at_[k]] = error;
  }
  bool next(std::size_t k) override {
    if (bytes_ >= kCopyRun) {
      gil_.reset();
      copy();
      bytes_ = 0;
      gil_.emplace(d_.gil_reads_, d_.gil_wait_ns_, d_.gil_held_ns_, d_.gil_cpu_ns_, 0);
      d_.drain_graveyard();
    }
    return !stopped(at_[k]);
  }

 private:
  // Whether the reads stop (the loader closing, Ctrl-C on the consumer's own thread, which
  // ends the whole chunk: see clear_interrupt); if so, rows `from` on fail with that.
  bool stopped(std::size_t from) {
    std::exception_ptr error;
    if (d_.closed_.load(std::memory_order_acquire)) {
      error = std::make_exception_ptr(std::runtime_error("stoker: the loader is closing"));
    } else if (d_.interrupted_ && !on_engine_thread()) {
      error = std::make_exception_ptr(PythonError(&d_, d_.interrupt_ticket_, d_.interrupt_what_));
    } else {
      return false;
    }
    for (std::size_t k = from; k < indices_.size(); ++k) errors_[k] = error;
    return true;
  }
  void write(std::size_t k, py::handle sample) {
    try {
      d_.take_sample(indices_[k], sample, outs_[k], copies_[k]);
    } catch (...) {
      copies_[k].clear();
      errors_[k] = d_.capture_current(indices_[k]);
    }
  }
  // The copies noted so far, made with the GIL released.
  void copy() {
    for (std::size_t k = 0; k < indices_.size(); ++k) {
      if (copies_[k].empty()) continue;
      if (!errors_[k]) {
        try {
          d_.finish_copies(copies_[k], outs_[k]);
        } catch (...) {
          errors_[k] = std::current_exception();
        }
      } else {
        std::vector<py::object> owners;
        for (auto& c : copies_[k]) owners.push_back(std::move(c.array.owner));
        d_.bury(std::move(owners));
      }
      copies_[k].clear();
    }
  }

  // First, so that it is let go last: a read that throws leaves copies_ holding arrays.
  std::optional<TimedGil> gil_;
  const PyDataset& d_;
  std::span<const std::size_t> indices_;
  std::span<const SampleOut> outs_;
  std::span<std::exception_ptr> errors_;
  std::vector<std::vector<PendingCopy>> copies_;  // by row of the chunk
  std::vector<std::size_t> at_;                   // the chunk's row of the reader's row k
  std::vector<Row> rows_;                         // the rows the reader reads
  std::size_t bytes_ = 0;                         // of arrays noted since the last copy
};

void PyDataset::read_rows(std::span<const std::size_t> indices, std::span<const SampleOut> outs,
                          std::span<std::exception_ptr> errors) const {
  if (closed_.load(std::memory_order_acquire) || interpreter_finalizing()) {
    const auto closing =
        std::make_exception_ptr(std::runtime_error("stoker: the loader is closing"));
    for (auto& e : errors) e = closing;
    return;
  }
  ThreadChunk(*this, indices, outs, errors).run();
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

bool RemappedDataset::will_read(std::span<const std::size_t> rows) const noexcept {
  try {
    const auto order = order_.load();
    thread_local std::vector<std::size_t> mapped;
    mapped.clear();
    for (const std::size_t r : rows) {
      if (r < order->size()) mapped.push_back((*order)[r]);
    }
    return base_->will_read(mapped);
  } catch (...) {
    // A hint (an allocation failed): the reads go on without it.
  }
  return true;
}

void RemappedDataset::prefetch(std::size_t index) const {
  base_->prefetch((*order_.load())[index]);
}

std::string RemappedDataset::sample_name(std::size_t index) const {
  return base_->sample_name((*order_.load())[index]);
}

}  // namespace stoker::python
