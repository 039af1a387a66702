#include "py_dataset.h"

#include <algorithm>
#include <cstring>
#include <set>
#include <utility>

#include "gil.h"

namespace stoker::python {
namespace {

// Exceptions kept for the loader to raise. Under ErrorPolicy::raise only the first failure of
// the head batch is wanted; under skip, only one past the budget. A bound keeps failures that
// are never raised (skipped rows, cancelled batches) from holding their tracebacks' frames,
// and the arrays in them, for the loader's life.
constexpr std::size_t kKeptErrors = 64;

thread_local std::optional<std::uint64_t> t_sample_seed;

struct SeedScope {
  explicit SeedScope(std::uint64_t seed) { t_sample_seed = seed; }
  ~SeedScope() { t_sample_seed.reset(); }
  SeedScope(const SeedScope&) = delete;
  SeedScope& operator=(const SeedScope&) = delete;
};

std::string join(const std::string& path, const std::string& part) {
  return path.empty() ? part : path + "." + part;
}

std::string describe(const std::string& path) {
  return path.empty() ? "the sample" : "field '" + path + "'";
}

std::string type_name(py::handle v) { return Py_TYPE(v.ptr())->tp_name; }

std::string shape_str(const std::vector<std::int64_t>& shape) {
  std::string s = "(";
  for (std::size_t i = 0; i < shape.size(); ++i) {
    if (i) s += ", ";
    s += std::to_string(shape[i]);
  }
  if (shape.size() == 1) s += ",";
  return s + ")";
}

constexpr const char* kBatchingHint =
    "; batching needs every sample to have the layout of sample 0 (pass collate_fn to batch "
    "samples yourself)";

}  // namespace

std::optional<std::uint64_t> current_sample_seed() { return t_sample_seed; }

struct PyDataset::Node {
  enum class Kind : std::uint8_t { sequence, mapping, array, number, object };
  Kind kind = Kind::object;
  std::string path;
  py::object type;               // sequence, mapping: sample 0's container type
  std::vector<py::object> keys;  // mapping
  std::vector<Node> children;
  std::size_t field = 0;  // array, number
  std::size_t slot = 0;   // object
  ElementType element;    // array, number
  std::vector<std::int64_t> shape;
};

struct PyDataset::State {
  py::object dataset;
  py::object on_worker_start;
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
};

namespace {

// Builds the layout from sample 0.
struct LayoutBuilder {
  std::vector<FieldSpec>& fields;
  std::size_t& slots;
  std::set<std::string> names;

  std::size_t add_field(const std::string& path, DType dtype, std::vector<std::int64_t> shape) {
    std::string name = path.empty() ? "sample" : path;
    while (!names.insert(name).second) name += "'";  // dict keys whose str() collide
    fields.push_back({name, dtype, std::move(shape)});
    return fields.size() - 1;
  }

  PyDataset::Node build(py::handle v, const std::string& path) {
    using Kind = PyDataset::Node::Kind;
    PyDataset::Node n;
    n.path = path;
    PyObject* o = v.ptr();
    if (PyTuple_Check(o) || PyList_Check(o)) {
      n.kind = Kind::sequence;
      n.type = py::reinterpret_borrow<py::object>(reinterpret_cast<PyObject*>(Py_TYPE(o)));
      const py::sequence seq = py::reinterpret_borrow<py::sequence>(v);
      for (std::size_t i = 0; i < seq.size(); ++i) {
        n.children.push_back(build(seq[i], join(path, std::to_string(i))));
      }
    } else if (PyDict_Check(o)) {
      n.kind = Kind::mapping;
      n.type = py::reinterpret_borrow<py::object>(reinterpret_cast<PyObject*>(Py_TYPE(o)));
      for (auto item : py::reinterpret_borrow<py::dict>(v)) {
        n.keys.push_back(py::reinterpret_borrow<py::object>(item.first));
        n.children.push_back(build(item.second, join(path, py::str(item.first))));
      }
    } else {
      switch (classify(v)) {
        case ValueKind::scalar:
          n.kind = Kind::number;
          n.element = element_type(PyBool_Check(o)   ? "bool"
                                   : PyLong_Check(o) ? "int64"
                                                     : "float64");
          n.field = add_field(path, n.element.storage, {});
          break;
        case ValueKind::array: {
          HostArray a = import_array(v, describe(path) + " of sample 0");
          n.kind = Kind::array;
          n.element = a.type;
          n.shape = a.shape;
          n.field = add_field(path, a.type.storage, a.shape);
          break;
        }
        case ValueKind::other:
          n.kind = Kind::object;
          n.slot = slots++;
          break;
      }
    }
    return n;
  }
};

py::object structure_of(const PyDataset::Node& n) {
  using Kind = PyDataset::Node::Kind;
  switch (n.kind) {
    case Kind::sequence:
    case Kind::mapping: {
      py::list children;
      for (const auto& c : n.children) children.append(structure_of(c));
      if (n.kind == Kind::sequence) return py::make_tuple("seq", n.type, children);
      py::list keys;
      for (const auto& k : n.keys) keys.append(k);
      return py::make_tuple("map", n.type, keys, children);
    }
    case Kind::array:
    case Kind::number:
      return py::make_tuple("array", n.field, n.element.name);
    case Kind::object:
      return py::make_tuple("object", n.slot);
  }
  return py::none();
}

struct PendingCopy {
  std::size_t field;
  HostArray array;
};

// Checks one sample against the layout (GIL held), writes its numbers, notes its arrays'
// copies and collects its object values.
struct SampleVisitor {
  std::size_t index;
  const SampleOut& out;
  std::vector<PendingCopy>& copies;
  PyObject* objects;  // a tuple with one item per slot, or null

  [[noreturn]] void mismatch(const PyDataset::Node& n, const std::string& what) const {
    throw py::type_error("stoker: " + describe(n.path) + " of sample " + std::to_string(index) +
                         " " + what + kBatchingHint);
  }

  void visit(const PyDataset::Node& n, py::handle v) {
    using Kind = PyDataset::Node::Kind;
    PyObject* o = v.ptr();
    switch (n.kind) {
      case Kind::sequence: {
        if (!PyTuple_Check(o) && !PyList_Check(o)) {
          mismatch(n, "is a " + type_name(v) + " where sample 0 has a " +
                          std::string(reinterpret_cast<PyTypeObject*>(n.type.ptr())->tp_name));
        }
        const Py_ssize_t size = PySequence_Fast_GET_SIZE(o);
        if (static_cast<std::size_t>(size) != n.children.size()) {
          mismatch(n, "has " + std::to_string(size) + " values where sample 0 has " +
                          std::to_string(n.children.size()));
        }
        PyObject** items = PySequence_Fast_ITEMS(o);
        for (std::size_t i = 0; i < n.children.size(); ++i) visit(n.children[i], items[i]);
        break;
      }
      case Kind::mapping: {
        if (!PyDict_Check(o)) mismatch(n, "is a " + type_name(v) + " where sample 0 has a dict");
        if (static_cast<std::size_t>(PyDict_Size(o)) != n.keys.size()) {
          mismatch(n, "has " + std::to_string(PyDict_Size(o)) + " keys where sample 0 has " +
                          std::to_string(n.keys.size()));
        }
        for (std::size_t i = 0; i < n.keys.size(); ++i) {
          PyObject* child = PyDict_GetItemWithError(o, n.keys[i].ptr());
          if (child == nullptr) {
            if (PyErr_Occurred()) throw py::error_already_set();
            mismatch(n, "has no key " + std::string(py::repr(n.keys[i])) + ", which sample 0 has");
          }
          visit(n.children[i], child);
        }
        break;
      }
      case Kind::number:
        write_number(n, v);
        break;
      case Kind::array: {
        if (classify(v) == ValueKind::other) {
          mismatch(n, "is a " + type_name(v) + " where sample 0 has an array");
        }
        HostArray a = import_array(v, describe(n.path) + " of sample " + std::to_string(index));
        if (a.type != n.element) {
          mismatch(n, "has element type " + a.type.name + " where sample 0 has " + n.element.name);
        }
        if (a.shape != n.shape) {
          throw py::value_error("stoker: " + describe(n.path) + " of sample " +
                                std::to_string(index) + " has shape " + shape_str(a.shape) +
                                " where sample 0 has " + shape_str(n.shape) + kBatchingHint);
        }
        copies.push_back({n.field, std::move(a)});
        break;
      }
      case Kind::object:
        Py_INCREF(o);
        PyTuple_SET_ITEM(objects, static_cast<Py_ssize_t>(n.slot), o);
        break;
    }
  }

  void write_number(const PyDataset::Node& n, py::handle v) {
    PyObject* o = v.ptr();
    const auto dst = out.bytes(n.field);
    if (n.element.name == "bool" && PyBool_Check(o)) {
      dst[0] = std::byte{o == Py_True};
    } else if (n.element.name == "int64" && PyLong_Check(o)) {
      const long long x = PyLong_AsLongLong(o);
      if (x == -1 && PyErr_Occurred()) throw py::error_already_set();
      const std::int64_t x64 = x;
      std::memcpy(dst.data(), &x64, sizeof x64);
    } else if (n.element.name == "float64" && (PyFloat_Check(o) || PyLong_Check(o))) {
      const double x = PyFloat_AsDouble(o);
      if (x == -1.0 && PyErr_Occurred()) throw py::error_already_set();
      std::memcpy(dst.data(), &x, sizeof x);
    } else {
      mismatch(n, "is a " + type_name(v) + " where sample 0 has a Python " +
                      (n.element.name == "bool"    ? "bool"
                       : n.element.name == "int64" ? "int"
                                                   : "float"));
    }
  }
};

}  // namespace

std::shared_ptr<PyDataset> PyDataset::discover(py::object dataset, bool whole_sample,
                                               py::object on_worker_start, std::size_t probes) {
  std::shared_ptr<PyDataset> self(new PyDataset());
  self->state_ = std::make_unique<State>();
  State& st = *self->state_;
  st.dataset = std::move(dataset);
  st.on_worker_start = std::move(on_worker_start);
  self->size_ = py::len(st.dataset);
  if (self->size_ == 0) throw py::value_error("stoker: the data set is empty");

  LayoutBuilder builder{self->fields_, st.slots, {}};
  if (whole_sample) {
    st.root.kind = Node::Kind::object;
    st.root.slot = st.slots++;
  } else {
    // The first sample that reads: with the skip policy a broken sample 0 must not stop the
    // loader before it starts (the engine skips it again later, and reports it).
    const std::size_t attempts = std::min(std::max<std::size_t>(probes, 1), self->size_);
    for (std::size_t i = 0;; ++i) {
      try {
        const py::object sample = st.dataset[py::int_(i)];
        st.root = builder.build(sample, "");
        break;
      } catch (py::error_already_set&) {
        if (i + 1 >= attempts) throw;
        self->fields_.clear();
        st.slots = 0;
      }
    }
  }
  if (st.slots > 0) {
    // One byte per row, never read: its address names the (slab, row) the values belong to.
    self->objects_field_ = builder.add_field("<objects>", DType::u8, {});
  }
  if (self->fields_.empty()) throw py::value_error("stoker: sample 0 holds no values");
  return self;
}

PyDataset::~PyDataset() {
  if (!Py_IsInitialized() || interpreter_finalizing()) {
    // Too late to let go of Python objects: leave them to the interpreter's teardown.
    (void)state_.release();
    for (auto& o : graveyard_) (void)o.release();
    return;
  }
  py::gil_scoped_acquire gil;
  state_.reset();
  graveyard_.clear();
}

void PyDataset::read(std::size_t index, const SampleOut& out) const {
  if (closed_.load(std::memory_order_acquire) || interpreter_finalizing()) {
    throw std::runtime_error("stoker: the loader is closing");
  }
  std::vector<PendingCopy> copies;
  {
    EngineThreadGil gil;
    drain_graveyard();
    State& st = *state_;
    if (interrupted_ && !on_engine_thread()) {
      throw PythonError(this, interrupt_ticket_, interrupt_what_);
    }
    try {
      // Not for the consumer's own thread reading inline (workers = 0), as in torch.
      if (st.on_worker_start && !st.on_worker_start.is_none() && on_engine_thread()) {
        const auto [it, first] =
            st.workers.try_emplace(std::this_thread::get_id(), st.workers.size());
        if (first) st.on_worker_start(it->second);
      }
      const SeedScope seed(out.seed());
      const auto key = py::reinterpret_steal<py::object>(PyLong_FromSize_t(index));
      if (!key) throw py::error_already_set();
      const auto sample =
          py::reinterpret_steal<py::object>(PyObject_GetItem(st.dataset.ptr(), key.ptr()));
      if (!sample) throw py::error_already_set();
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
      if (objects_field_) {
        const std::byte* slab = out.bytes(*objects_field_).data() - out.row();
        auto& rows = st.objects[slab];
        if (rows.size() <= out.row()) rows.resize(out.row() + 1);
        rows[out.row()] = std::move(objects);
      }
    } catch (py::error_already_set& e) {
      copies.clear();
      e.restore();
      raise_current(index);
    } catch (py::builtin_exception& e) {
      copies.clear();
      e.set_error();
      raise_current(index);
    } catch (const std::exception& e) {
      copies.clear();
      PyErr_SetString(PyExc_RuntimeError, e.what());
      raise_current(index);
    }
  }
  // The GIL is released; the arrays stay alive through their owners until buried.
  std::vector<py::object> owners;
  owners.reserve(copies.size());
  try {
    for (auto& c : copies) {
      if (c.array.contiguous()) {
        out.copy_from(c.field, {c.array.data, c.array.bytes()});
      } else {
        copy_to_contiguous(c.array, out.bytes(c.field));
      }
      owners.push_back(std::move(c.array.owner));
    }
  } catch (...) {
    for (auto& c : copies) {
      if (c.array.owner) owners.push_back(std::move(c.array.owner));
    }
    bury(std::move(owners));
    throw;
  }
  bury(std::move(owners));
}

void PyDataset::raise_current(std::size_t index) const {
  PyObject* type = nullptr;
  PyObject* value = nullptr;
  PyObject* trace = nullptr;
  PyErr_Fetch(&type, &value, &trace);
  PyErr_NormalizeException(&type, &value, &trace);
  if (trace != nullptr) PyException_SetTraceback(value, trace);
  Py_XDECREF(type);
  Py_XDECREF(trace);
  auto exception = py::reinterpret_steal<py::object>(value);

  std::string what = type_name(exception);
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
  throw PythonError(this, ticket, what);
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

void RemappedDataset::prefetch(std::size_t index) const {
  base_->prefetch((*order_.load())[index]);
}

}  // namespace stoker::python
