#include "host_array.h"

#include <dlpack/dlpack.h>
#include <pybind11/numpy.h>

#include <cstring>
#include <stdexcept>
#include <utility>

#include "gil.h"

namespace stoker::python {
namespace {

// DLPack 0.8 added a bool type code; libdlpack-dev ships 0.6, and producers (torch, numpy)
// already use it.
constexpr std::uint8_t kDLBoolCode = 6;
constexpr const char* kDLTensorName = "dltensor";

ElementType from_dlpack(DLDataType t, const std::string& what) {
  std::string name;
  if (t.lanes == 1) {
    switch (t.code) {
      case kDLInt:
        if (t.bits == 8 || t.bits == 16 || t.bits == 32 || t.bits == 64)
          name = "int" + std::to_string(t.bits);
        break;
      case kDLUInt:
        if (t.bits == 8 || t.bits == 16 || t.bits == 32 || t.bits == 64)
          name = "uint" + std::to_string(t.bits);
        break;
      case kDLFloat:
        if (t.bits == 16 || t.bits == 32 || t.bits == 64) name = "float" + std::to_string(t.bits);
        break;
      case kDLBfloat:
        if (t.bits == 16) name = "bfloat16";
        break;
      case kDLBoolCode:
        if (t.bits == 8) name = "bool";
        break;
      default:
        break;
    }
  }
  if (name.empty()) {
    throw py::type_error(what + ": element type (DLPack code " + std::to_string(t.code) + ", " +
                         std::to_string(t.bits) + " bits) cannot be batched by stoker");
  }
  return element_type(name);
}

// PEP 3118 format codes numpy uses for its native types.
ElementType from_format(const std::string& format, py::ssize_t itemsize, const std::string& what) {
  std::string f = format;
  if (!f.empty() && (f[0] == '@' || f[0] == '=' || f[0] == '<')) f.erase(0, 1);
  std::string name;
  if (f.size() == 1) {
    const bool is_signed = f[0] == 'b' || f[0] == 'h' || f[0] == 'i' || f[0] == 'l' || f[0] == 'q';
    const bool is_unsigned =
        f[0] == 'B' || f[0] == 'H' || f[0] == 'I' || f[0] == 'L' || f[0] == 'Q';
    if (f[0] == '?') {
      name = "bool";
    } else if (is_signed || is_unsigned) {
      name = (is_signed ? "int" : "uint") + std::to_string(itemsize * 8);
    } else if (f[0] == 'e' || f[0] == 'f' || f[0] == 'd') {
      name = "float" + std::to_string(itemsize * 8);
    }
  }
  try {
    if (!name.empty()) return element_type(name);
  } catch (const std::invalid_argument&) {
  }
  throw py::type_error(what + ": element type '" + format +
                       "' cannot be batched by stoker (numbers and bool only)");
}

struct BufferOwner {
  Py_buffer view{};
  ~BufferOwner() { PyBuffer_Release(&view); }
};

HostArray import_buffer(py::handle obj, const std::string& what) {
  auto owner = std::make_unique<BufferOwner>();
  if (PyObject_GetBuffer(obj.ptr(), &owner->view, PyBUF_RECORDS_RO) != 0) {
    throw py::error_already_set();
  }
  const Py_buffer& v = owner->view;
  HostArray a;
  a.type = from_format(v.format ? v.format : "B", v.itemsize, what);
  a.data = static_cast<const std::byte*>(v.buf);
  a.shape.assign(v.shape, v.shape + v.ndim);
  if (v.strides) {
    a.strides.assign(v.strides, v.strides + v.ndim);
  } else {
    a.strides.resize(v.ndim);
    std::int64_t s = v.itemsize;
    for (int d = v.ndim - 1; d >= 0; --d) {
      a.strides[d] = s;
      s *= v.shape[d];
    }
  }
  a.owner = py::capsule(owner.release(), [](void* p) { delete static_cast<BufferOwner*>(p); });
  return a;
}

HostArray import_dlpack(py::handle obj, const std::string& what) {
  py::object capsule;
  try {
    capsule = obj.attr("__dlpack__")();
  } catch (py::error_already_set& e) {
    // torch refuses to export a tensor that requires grad; its data is what we want.
    if (!e.matches(PyExc_BufferError) || !py::hasattr(obj, "detach")) throw;
    capsule = obj.attr("detach")().attr("__dlpack__")();
  }
  auto* managed = static_cast<DLManagedTensor*>(PyCapsule_GetPointer(capsule.ptr(), kDLTensorName));
  if (managed == nullptr) throw py::error_already_set();
  const DLTensor& t = managed->dl_tensor;
  if (t.device.device_type != kDLCPU && t.device.device_type != kDLCUDAHost) {
    throw py::value_error(what + " is not in host memory (DLPack device type " +
                          std::to_string(t.device.device_type) +
                          "); return CPU arrays from the data set");
  }
  HostArray a;
  a.type = from_dlpack(t.dtype, what);
  a.data = static_cast<const std::byte*>(t.data) + t.byte_offset;
  a.shape.assign(t.shape, t.shape + t.ndim);
  a.strides.resize(t.ndim);
  const std::int64_t item = static_cast<std::int64_t>(dtype_size(a.type.storage));
  std::int64_t compact = item;
  for (int d = t.ndim - 1; d >= 0; --d) {
    a.strides[d] = t.strides ? t.strides[d] * item : compact;
    compact *= t.shape[d];
  }
  // The capsule stays unconsumed: its producer's destructor frees the export when it goes.
  a.owner = std::move(capsule);
  return a;
}

}  // namespace

ElementType element_type(const std::string& name) {
  static const std::pair<const char*, DType> kTypes[] = {
      {"bool", DType::u8},     {"uint8", DType::u8},      {"int8", DType::i8},
      {"int16", DType::i16},   {"uint16", DType::i16},    {"int32", DType::i32},
      {"uint32", DType::i32},  {"int64", DType::i64},     {"uint64", DType::i64},
      {"float16", DType::f16}, {"bfloat16", DType::bf16}, {"float32", DType::f32},
      {"float64", DType::f64},
  };
  for (const auto& [n, storage] : kTypes) {
    if (name == n) return {storage, name};
  }
  throw std::invalid_argument("stoker: element type '" + name +
                              "' is not supported (bool, (u)int8-64, float16/32/64, bfloat16)");
}

ElementType element_type(DType storage) { return {storage, std::string(dtype_name(storage))}; }

std::size_t HostArray::elements() const {
  std::size_t n = 1;
  for (auto d : shape) n *= static_cast<std::size_t>(d);
  return n;
}

bool HostArray::contiguous() const {
  std::int64_t run = static_cast<std::int64_t>(dtype_size(type.storage));
  for (std::size_t d = shape.size(); d-- > 0;) {
    if (shape[d] != 1 && strides[d] != run) return false;
    run *= shape[d];
  }
  return true;
}

ValueKind classify(py::handle obj) {
  PyObject* o = obj.ptr();
  if (PyBool_Check(o) || PyLong_Check(o) || PyFloat_Check(o)) return ValueKind::scalar;
  // Strings and bytes are sequences of characters to torch's default_collate, not arrays.
  if (PyUnicode_Check(o) || PyBytes_Check(o) || PyByteArray_Check(o)) return ValueKind::other;
  // numpy arrays and scalars, array.array, memoryview.
  if (PyObject_CheckBuffer(o)) return ValueKind::array;
  // torch tensors and other DLPack producers.
  if (PyObject_HasAttrString(o, "__dlpack__")) return ValueKind::array;
  return ValueKind::other;
}

HostArray import_array(py::handle obj, const std::string& what) {
  // The buffer protocol first: it also takes read-only numpy arrays (np.load(mmap_mode='r')),
  // which DLPack 0.6 has no way to flag, and numpy refuses to export through it.
  if (PyObject_CheckBuffer(obj.ptr())) return import_buffer(obj, what);
  return import_dlpack(obj, what);
}

void copy_to_contiguous(const HostArray& src, std::span<std::byte> dst) {
  if (dst.size() != src.bytes()) {
    throw std::invalid_argument("stoker: copy of " + std::to_string(src.bytes()) + " bytes into " +
                                std::to_string(dst.size()));
  }
  if (dst.empty()) return;
  // The innermost run of dimensions laid out contiguously is copied with one memcpy; the outer
  // dimensions are walked like an odometer.
  std::size_t run = dtype_size(src.type.storage);
  std::size_t outer = src.shape.size();
  while (outer > 0 &&
         (src.shape[outer - 1] == 1 || src.strides[outer - 1] == static_cast<std::int64_t>(run))) {
    run *= static_cast<std::size_t>(src.shape[outer - 1]);
    --outer;
  }
  std::vector<std::int64_t> index(outer, 0);
  std::byte* out = dst.data();
  std::int64_t offset = 0;
  for (;;) {
    std::memcpy(out, src.data + offset, run);
    out += run;
    for (std::size_t d = outer;;) {
      if (d == 0) return;
      --d;
      offset += src.strides[d];
      if (++index[d] < src.shape[d]) break;
      offset -= src.strides[d] * src.shape[d];
      index[d] = 0;
    }
  }
}

// --- export --------------------------------------------------------------------------------

namespace {

struct ExportContext {
  std::shared_ptr<BatchHolder> holder;
  std::vector<std::int64_t> shape;
  DLManagedTensor tensor{};
};

DLDataType to_dlpack(DType t) {
  const DTypeInfo& info = dtype_info(t);
  const auto bits = static_cast<std::uint8_t>(8 * info.size);
  switch (info.kind) {
    case DTypeInfo::Kind::unsigned_int:
      return {kDLUInt, bits, 1};
    case DTypeInfo::Kind::signed_int:
      return {kDLInt, bits, 1};
    case DTypeInfo::Kind::floating:
      return {kDLFloat, bits, 1};
    case DTypeInfo::Kind::bfloat:
      return {kDLBfloat, bits, 1};
  }
  throw std::invalid_argument("stoker: unknown dtype");
}

std::vector<std::int64_t> batch_shape(const Batch& batch, std::size_t field) {
  const FieldSpec& spec = batch.fields()[field];
  std::vector<std::int64_t> shape;
  shape.reserve(spec.shape.size() + 1);
  shape.push_back(static_cast<std::int64_t>(batch.size()));
  shape.insert(shape.end(), spec.shape.begin(), spec.shape.end());
  return shape;
}

// Runs when the capsule dies. If a consumer took the tensor, it renamed the capsule to
// "used_dltensor" and owns the deleter call.
void dlpack_capsule_destructor(PyObject* capsule) {
  if (PyCapsule_IsValid(capsule, kDLTensorName)) {
    auto* t = static_cast<DLManagedTensor*>(PyCapsule_GetPointer(capsule, kDLTensorName));
    t->deleter(t);
  }
}

}  // namespace

py::capsule field_dlpack(const std::shared_ptr<BatchHolder>& holder, std::size_t field) {
  auto ctx = std::make_unique<ExportContext>();
  ctx->holder = holder;
  ctx->shape = batch_shape(holder->batch, field);
  DLTensor& t = ctx->tensor.dl_tensor;
  const Batch& batch = holder->batch;
  t.data = batch.data(field);
  t.device = {kDLCPU, 0};
  // A batch on a CUDA device: its array fields are device buffers ("sim" keeps its simulated
  // device memory on the host, so it stays kDLCPU).
  if (batch.on_device(field) && batch.device().starts_with("cuda")) {
    const auto colon = batch.device().find(':');
    const int id = colon == std::string_view::npos
                       ? 0
                       : std::stoi(std::string(batch.device().substr(colon + 1)));
    t.device = {kDLCUDA, id};
  }
  t.ndim = static_cast<int>(ctx->shape.size());
  t.dtype = to_dlpack(holder->batch.fields()[field].dtype);
  t.shape = ctx->shape.data();
  t.strides = nullptr;  // compact, row-major
  t.byte_offset = 0;
  ctx->tensor.manager_ctx = ctx.get();
  // Called by whoever frees the tensor, on any thread, with or without the GIL: it touches
  // only C++ state (returning the slab to its pool takes the pool's own short lock).
  ctx->tensor.deleter = [](DLManagedTensor* self) {
    delete static_cast<ExportContext*>(self->manager_ctx);
  };
  PyObject* capsule = PyCapsule_New(&ctx->tensor, kDLTensorName, dlpack_capsule_destructor);
  if (capsule == nullptr) throw py::error_already_set();
  ctx.release();
  return py::reinterpret_steal<py::capsule>(capsule);
}

py::object field_numpy(const std::shared_ptr<BatchHolder>& holder, std::size_t field) {
  const FieldSpec& spec = holder->batch.fields()[field];
  if (spec.dtype == DType::bf16) {
    throw py::type_error("stoker: field '" + spec.name +
                         "' is bfloat16, which numpy has no type for; install torch");
  }
  const auto shape = batch_shape(holder->batch, field);
  std::vector<py::ssize_t> dims(shape.begin(), shape.end());
  std::vector<py::ssize_t> strides(dims.size());
  py::ssize_t s = static_cast<py::ssize_t>(dtype_size(spec.dtype));
  for (std::size_t d = dims.size(); d-- > 0;) {
    strides[d] = s;
    s *= dims[d];
  }
  py::capsule base(new std::shared_ptr<BatchHolder>(holder),
                   [](void* p) { delete static_cast<std::shared_ptr<BatchHolder>*>(p); });
  return py::array(py::dtype(std::string(dtype_name(spec.dtype))), dims, strides,
                   holder->batch.bytes(field).data(), base);
}

}  // namespace stoker::python
