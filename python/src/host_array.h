// Host arrays crossing the Python boundary, both ways, without copies:
// - in: a borrowed view of any CPU array a Python object exports (DLPack, which numpy, torch
//   and most array libraries speak, or the buffer protocol, for numpy scalars);
// - out: a batch field as a DLPack capsule (for torch.from_dlpack) or a numpy array, both
//   keeping the batch's slab alive.
//
// Element types: stoker's DType covers what the engine stores; "logical" types add the ones
// PyTorch batches carry that have a same-sized storage type (bool as u8, uint16/32/64 as
// i16/32/64). The Python layer views the stored bytes back as the logical type.
#pragma once

#include <pybind11/pybind11.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "stoker/dataset.h"
#include "stoker/loader.h"

namespace stoker::python {

namespace py = pybind11;

struct ElementType {
  DType storage = DType::u8;
  std::string name;  // numpy's name: "float32", "bool", "uint16", ...
  bool operator==(const ElementType&) const = default;
};

// The logical type named `name` (numpy's names; torch.float32 and np.dtype objects are turned
// into names by the Python layer). Throws std::invalid_argument for a type stoker cannot batch.
ElementType element_type(const std::string& name);
// The plain logical type of a stored DType.
ElementType element_type(DType storage);

// A CPU array exported by a Python object, valid while `owner` (which holds the export: a
// DLPack capsule or a buffer view) lives. Strides are in bytes.
struct HostArray {
  const std::byte* data = nullptr;
  ElementType type;
  std::vector<std::int64_t> shape;
  std::vector<std::int64_t> strides;
  py::object owner;

  std::size_t elements() const;
  std::size_t bytes() const { return elements() * dtype_size(type.storage); }
  bool contiguous() const;  // C order, no gaps
};

// What kind of value `obj` is to the batching code.
enum class ValueKind { array, scalar, other };
ValueKind classify(py::handle obj);

// Exports `obj` (ValueKind::array or ::scalar) as a host array. GIL held. Throws
// py::type_error / py::value_error naming `what` if it is on a device, has an unsupported
// element type, or cannot be exported.
HostArray import_array(py::handle obj, const std::string& what);

// Copies `src` (any strides, including negative and zero ones) into the contiguous `dst` of
// src.bytes() bytes, one memcpy per contiguous run. (Contiguous sources should rather go
// through SampleOut::copy_from, which uses streaming stores for large copies.)
void copy_to_contiguous(const HostArray& src, std::span<std::byte> dst);

// Shared ownership of a delivered batch; the last tensor or array over it recycles the slab.
struct BatchHolder {
  Batch batch;
};

// Field `field` of `holder`'s batch, shaped [batch size, field shape...], as a DLPack capsule
// named "dltensor" (torch.from_dlpack consumes it) or as a numpy array. Zero-copy.
py::capsule field_dlpack(const std::shared_ptr<BatchHolder>& holder, std::size_t field);
py::object field_numpy(const std::shared_ptr<BatchHolder>& holder, std::size_t field);

}  // namespace stoker::python
