#include "py_layout.h"

#include <cstring>
#include <stdexcept>
#include <string>
#include <utility>

namespace stoker::python {
namespace {

std::string join_path(const std::string& path, const std::string& part) {
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

// Tensors up to this size are copied into their row while the GIL is held (see visit()).
constexpr std::size_t kCopyUnderGil = 16 << 10;

constexpr const char* kBatchingHint =
    "; batching needs every sample to have the layout of the first sample read (pass collate_fn "
    "to batch samples yourself)";

// torch's types for the tensor fast path of an array node (see LayoutNode), if torch is loaded.
void note_tensor_types(LayoutNode& n) {
  const py::dict modules = py::module_::import("sys").attr("modules");
  if (!modules.contains("torch")) return;
  const py::object torch = modules["torch"];
  n.tensor_dtype = py::getattr(torch, n.element.name.c_str(), py::none());
  if (n.tensor_dtype.is_none()) return;
  n.tensor_type = torch.attr("Tensor");
  n.tensor_layout = torch.attr("strided");
}

PyObject* interned(const char* name) {
  PyObject* s = PyUnicode_InternFromString(name);
  if (s == nullptr) throw py::error_already_set();
  return s;  // kept for the process's life
}

// A leaf that is exactly torch.Tensor, of the node's dtype and shape, on the CPU, strided and
// contiguous, viewed through its attributes: the address of its data, or null for anything
// else (the general path then checks it, with its error messages). GIL held.
const std::byte* tensor_data(const LayoutNode& n, PyObject* o) {
  if (!n.tensor_type || Py_TYPE(o) != reinterpret_cast<PyTypeObject*>(n.tensor_type.ptr())) {
    return nullptr;
  }
  static PyObject* const kDtype = interned("dtype");
  static PyObject* const kLayout = interned("layout");
  static PyObject* const kIsCpu = interned("is_cpu");
  static PyObject* const kShape = interned("shape");
  static PyObject* const kIsContiguous = interned("is_contiguous");
  static PyObject* const kDataPtr = interned("data_ptr");
  auto is = [o](PyObject* name, PyObject* expected) {
    PyObject* v = PyObject_GetAttr(o, name);
    if (v == nullptr) PyErr_Clear();
    Py_XDECREF(v);
    return v != nullptr && v == expected;
  };
  if (!is(kDtype, n.tensor_dtype.ptr()) || !is(kLayout, n.tensor_layout.ptr()) ||
      !is(kIsCpu, Py_True)) {
    return nullptr;
  }
  const auto shape = py::reinterpret_steal<py::object>(PyObject_GetAttr(o, kShape));
  if (!shape || !PyTuple_Check(shape.ptr()) ||
      static_cast<std::size_t>(PyTuple_GET_SIZE(shape.ptr())) != n.shape.size()) {
    PyErr_Clear();
    return nullptr;
  }
  for (std::size_t d = 0; d < n.shape.size(); ++d) {
    if (PyLong_AsLongLong(PyTuple_GET_ITEM(shape.ptr(), static_cast<Py_ssize_t>(d))) !=
        n.shape[d]) {
      PyErr_Clear();
      return nullptr;
    }
  }
  const auto contiguous =
      py::reinterpret_steal<py::object>(PyObject_CallMethodNoArgs(o, kIsContiguous));
  const auto data = py::reinterpret_steal<py::object>(PyObject_CallMethodNoArgs(o, kDataPtr));
  if (contiguous.ptr() != Py_True || !data) {
    PyErr_Clear();
    return nullptr;
  }
  void* p = PyLong_AsVoidPtr(data.ptr());
  if (p == nullptr && PyErr_Occurred()) {
    PyErr_Clear();
    return nullptr;
  }
  return static_cast<const std::byte*>(p);
}

// The bytes of an array leaf of node n.
std::size_t array_bytes(const LayoutNode& n) {
  std::size_t bytes = dtype_size(n.element.storage);
  for (const auto d : n.shape) bytes *= static_cast<std::size_t>(d);
  return bytes;
}

// The contiguous array `data` of node n as a host array owned by `owner`.
HostArray contiguous_array(const LayoutNode& n, const std::byte* data, PyObject* owner) {
  HostArray a;
  a.data = data;
  a.type = n.element;
  a.shape = n.shape;
  a.strides.resize(n.shape.size());
  std::int64_t stride = static_cast<std::int64_t>(dtype_size(n.element.storage));
  for (std::size_t d = n.shape.size(); d-- > 0;) {
    a.strides[d] = stride;
    stride *= n.shape[d];
  }
  a.owner = py::reinterpret_borrow<py::object>(owner);
  return a;
}

py::tuple shape_tuple(const std::vector<std::int64_t>& shape) {
  py::tuple t(shape.size());
  for (std::size_t i = 0; i < shape.size(); ++i) t[i] = py::int_(shape[i]);
  return t;
}

// torch's default_collate batches any collections.abc.Mapping as a mapping (UserDict, Hugging
// Face's BatchEncoding), not only dicts.
bool is_mapping(PyObject* o) {
  if (PyDict_Check(o)) return true;
  // Kept for the process's life: a static py::object would be released after the
  // interpreter is gone.
  static PyObject* const mapping =
      py::object(py::module_::import("collections.abc").attr("Mapping")).release().ptr();
  const int r = PyObject_IsInstance(o, mapping);
  if (r < 0) throw py::error_already_set();
  return r == 1;
}

// The leaves default_collate keeps as they are (strings, bytes); it raises on any other object.
bool is_text(PyObject* o) { return PyUnicode_Check(o) || PyBytes_Check(o); }

// default_collate's refusal, in its words, of the tensors it cannot stack: nested and sparse
// ones have no strided buffer (their DLPack export fails with an internal error instead).
void check_stackable(py::handle v) {
  if (!py::hasattr(v, "is_nested")) return;
  std::string kind;
  if (v.attr("is_nested").cast<bool>()) kind = "nested";
  if (std::string(py::str(v.attr("layout"))).starts_with("torch.sparse")) kind = "sparse";
  if (kind.empty()) return;
  throw std::runtime_error("Batches of " + kind +
                           " tensors are not currently supported by the default collate_fn; "
                           "please provide a custom collate_fn to handle them appropriately.");
}

}  // namespace

std::size_t LayoutBuilder::add_field(const std::string& path, DType dtype,
                                     std::vector<std::int64_t> shape) {
  std::string name = path.empty() ? "sample" : path;
  while (!names.insert(name).second) name += "'";  // dict keys whose str() collide
  fields.push_back({name, dtype, std::move(shape)});
  return fields.size() - 1;
}

LayoutNode LayoutBuilder::build(py::handle v, const std::string& path) {
  using Kind = LayoutNode::Kind;
  LayoutNode n;
  n.path = path;
  PyObject* o = v.ptr();
  if (PyTuple_Check(o) || PyList_Check(o)) {
    n.kind = Kind::sequence;
    n.type = py::reinterpret_borrow<py::object>(reinterpret_cast<PyObject*>(Py_TYPE(o)));
    const py::sequence seq = py::reinterpret_borrow<py::sequence>(v);
    for (std::size_t i = 0; i < seq.size(); ++i) {
      n.children.push_back(build(seq[i], join_path(path, std::to_string(i))));
    }
  } else if (is_mapping(o)) {
    n.kind = Kind::mapping;
    n.type = py::reinterpret_borrow<py::object>(reinterpret_cast<PyObject*>(Py_TYPE(o)));
    for (auto key : py::reinterpret_borrow<py::iterable>(v)) {
      n.keys.push_back(py::reinterpret_borrow<py::object>(key));
      n.children.push_back(build(v[key], join_path(path, py::str(key))));
    }
  } else {
    switch (classify(v)) {
      case ValueKind::scalar:
        n.kind = Kind::number;
        n.element = element_type(PyBool_Check(o) ? "bool" : PyLong_Check(o) ? "int64" : "float64");
        n.field = add_field(path, n.element.storage, {});
        break;
      case ValueKind::array: {
        check_stackable(v);
        HostArray a = import_array(v, describe(path) + " of sample " + std::to_string(index));
        n.kind = Kind::array;
        n.element = a.type;
        n.shape = a.shape;
        n.field = add_field(path, a.type.storage, a.shape);
        note_tensor_types(n);
        break;
      }
      case ValueKind::other:
        if (!is_text(o)) {
          // As torch's default_collate: an image still in PIL form, None or any other object
          // cannot be batched, and a list of them would silently differ from PyTorch.
          throw py::type_error(
              "default_collate: batch must contain tensors, numpy arrays, numbers, dicts or "
              "lists; found " +
              std::string(py::repr(py::type::handle_of(v))) + " (stoker: " + describe(path) +
              " of sample " + std::to_string(index) +
              "; pass collate_fn to batch such samples yourself)");
        }
        n.kind = Kind::object;
        n.slot = slots++;
        break;
    }
  }
  return n;
}

py::object structure_of(const LayoutNode& n) {
  using Kind = LayoutNode::Kind;
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

py::object describe_layout(const LayoutNode& n) {
  using Kind = LayoutNode::Kind;
  switch (n.kind) {
    case Kind::sequence:
    case Kind::mapping: {
      py::list children;
      for (const auto& c : n.children) children.append(describe_layout(c));
      py::list keys;
      for (const auto& k : n.keys) keys.append(k);
      return py::make_tuple(n.kind == Kind::sequence ? "seq" : "map", n.type, keys, children);
    }
    case Kind::array:
    case Kind::number:
      return py::make_tuple(n.kind == Kind::array ? "array" : "number", n.field, n.element.name,
                            shape_tuple(n.shape));
    case Kind::object:
      return py::make_tuple("object", n.slot);
  }
  return py::none();
}

LayoutNode layout_from_description(py::handle description, const std::string& path) {
  using Kind = LayoutNode::Kind;
  const auto d = py::reinterpret_borrow<py::tuple>(description);
  const std::string kind = py::str(d[0]);
  LayoutNode n;
  n.path = path;
  if (kind == "seq" || kind == "map") {
    n.kind = kind == "seq" ? Kind::sequence : Kind::mapping;
    n.type = d[1];
    const auto keys = py::reinterpret_borrow<py::list>(d[2]);
    const auto children = py::reinterpret_borrow<py::list>(d[3]);
    for (std::size_t i = 0; i < children.size(); ++i) {
      std::string part = std::to_string(i);
      if (n.kind == Kind::mapping) {
        n.keys.push_back(keys[i]);
        part = py::str(keys[i]);
      }
      n.children.push_back(layout_from_description(children[i], join_path(path, part)));
    }
  } else if (kind == "array" || kind == "number") {
    n.kind = kind == "array" ? Kind::array : Kind::number;
    n.field = d[1].cast<std::size_t>();
    n.element = element_type(d[2].cast<std::string>());
    for (auto v : py::reinterpret_borrow<py::tuple>(d[3]))
      n.shape.push_back(v.cast<std::int64_t>());
    if (n.kind == Kind::array) note_tensor_types(n);
  } else if (kind == "object") {
    n.kind = Kind::object;
    n.slot = d[1].cast<std::size_t>();
  } else {
    throw py::value_error("stoker: not a layout description: " + std::string(py::repr(d)));
  }
  return n;
}

void SampleVisitor::mismatch(const LayoutNode& n, const std::string& what) const {
  throw py::type_error("stoker: " + describe(n.path) + " of sample " + std::to_string(index) + " " +
                       what + kBatchingHint);
}

void SampleVisitor::visit(const LayoutNode& n, py::handle v) {
  using Kind = LayoutNode::Kind;
  PyObject* o = v.ptr();
  switch (n.kind) {
    case Kind::sequence: {
      if (!PyTuple_Check(o) && !PyList_Check(o)) {
        mismatch(n, "is a " + type_name(v) + " where the first sample read has a " +
                        std::string(reinterpret_cast<PyTypeObject*>(n.type.ptr())->tp_name));
      }
      const Py_ssize_t size = PySequence_Fast_GET_SIZE(o);
      if (static_cast<std::size_t>(size) != n.children.size()) {
        mismatch(n, "has " + std::to_string(size) + " values where the first sample read has " +
                        std::to_string(n.children.size()));
      }
      PyObject** items = PySequence_Fast_ITEMS(o);
      for (std::size_t i = 0; i < n.children.size(); ++i) visit(n.children[i], items[i]);
      break;
    }
    case Kind::mapping: {
      if (PyDict_Check(o)) {
        if (static_cast<std::size_t>(PyDict_Size(o)) != n.keys.size()) {
          mismatch(n, "has " + std::to_string(PyDict_Size(o)) +
                          " keys where the first sample read has " + std::to_string(n.keys.size()));
        }
        for (std::size_t i = 0; i < n.keys.size(); ++i) {
          PyObject* child = PyDict_GetItemWithError(o, n.keys[i].ptr());
          if (child == nullptr) {
            if (PyErr_Occurred()) throw py::error_already_set();
            mismatch(n, "has no key " + std::string(py::repr(n.keys[i])) +
                            ", which the first sample read has");
          }
          visit(n.children[i], child);
        }
        break;
      }
      if (!is_mapping(o)) {
        mismatch(n, "is a " + type_name(v) + " where the first sample read has a " +
                        std::string(reinterpret_cast<PyTypeObject*>(n.type.ptr())->tp_name));
      }
      const Py_ssize_t size = PyObject_Size(o);
      if (size < 0) throw py::error_already_set();
      if (static_cast<std::size_t>(size) != n.keys.size()) {
        mismatch(n, "has " + std::to_string(size) + " keys where the first sample read has " +
                        std::to_string(n.keys.size()));
      }
      for (std::size_t i = 0; i < n.keys.size(); ++i) {
        const py::object child =
            py::reinterpret_steal<py::object>(PyObject_GetItem(o, n.keys[i].ptr()));
        if (!child) {
          if (!PyErr_ExceptionMatches(PyExc_KeyError)) throw py::error_already_set();
          PyErr_Clear();
          mismatch(n, "has no key " + std::string(py::repr(n.keys[i])) +
                          ", which the first sample read has");
        }
        visit(n.children[i], child);
      }
      break;
    }
    case Kind::number:
      write_number(n, v);
      break;
    case Kind::array: {
      if (const std::byte* data = tensor_data(n, o)) {
        // A small tensor is copied now: cheaper than noting the copy, and too short a copy
        // for other threads to gain from the GIL being released for it.
        const auto dst = out.bytes(n.field);
        if (dst.size() <= kCopyUnderGil && dst.size() == array_bytes(n)) {
          std::memcpy(dst.data(), data, dst.size());
        } else {
          copies.push_back({n.field, contiguous_array(n, data, o)});
        }
        break;
      }
      if (classify(v) != ValueKind::array) {
        mismatch(n, "is a " + type_name(v) + " where the first sample read has an array");
      }
      HostArray a = import_array(v, describe(n.path) + " of sample " + std::to_string(index));
      if (a.type != n.element) {
        mismatch(n, "has element type " + a.type.name + " where the first sample read has " +
                        n.element.name);
      }
      if (a.shape != n.shape) {
        throw py::value_error("stoker: " + describe(n.path) + " of sample " +
                              std::to_string(index) + " has shape " + shape_str(a.shape) +
                              " where the first sample read has " + shape_str(n.shape) +
                              kBatchingHint);
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

void SampleVisitor::write_number(const LayoutNode& n, py::handle v) {
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
    mismatch(n, "is a " + type_name(v) + " where the first sample read has a Python " +
                    (n.element.name == "bool"    ? "bool"
                     : n.element.name == "int64" ? "int"
                                                 : "float"));
  }
}

void copy_pending(const std::vector<PendingCopy>& copies, const SampleOut& out) {
  for (const auto& c : copies) {
    if (c.array.contiguous()) {
      out.copy_from(c.field, {c.array.data, c.array.bytes()});
    } else {
      copy_to_contiguous(c.array, out.bytes(c.field));
    }
  }
}

}  // namespace stoker::python
