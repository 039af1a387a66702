// The batch layout of a Python data set, learned from the first sample read, and the code
// that checks a sample against it and writes it into a batch row. Shared by the two kinds of
// worker: the engine's threads (py_dataset.cc) and worker processes (py_workers.cc), which rebuild
// the layout from describe_layout() (plain, picklable tuples) so that a spawned worker, which never
// saw that sample, checks and writes samples exactly as a thread does.
//
// Thread safety: everything here needs the GIL.
#pragma once

#include <pybind11/pybind11.h>

#include <cstddef>
#include <cstdint>
#include <set>
#include <string>
#include <vector>

#include "host_array.h"
#include "stoker/dataset.h"

namespace stoker::python {

namespace py = pybind11;

struct LayoutNode {
  enum class Kind : std::uint8_t { sequence, mapping, array, number, object };
  Kind kind = Kind::object;
  std::string path;
  py::object type;               // sequence, mapping: the first sample's container type
  std::vector<py::object> keys;  // mapping
  std::vector<LayoutNode> children;
  std::size_t field = 0;  // array, number
  std::size_t slot = 0;   // object
  ElementType element;    // array, number
  std::vector<std::int64_t> shape;
  // Array: torch.Tensor, the torch dtype of `element` and torch.strided, if the program
  // imported torch. A leaf of exactly that type is then checked and located through a few
  // attribute reads: a DLPack export costs more than a whole cheap __getitem__.
  py::object tensor_type;
  py::object tensor_dtype;
  py::object tensor_layout;
};

// Builds the layout from the first sample read (sample `index`): array leaves and Python
// numbers become fields, other leaves object slots.
struct LayoutBuilder {
  std::vector<FieldSpec>& fields;
  std::size_t& slots;
  std::set<std::string> names;
  std::size_t index = 0;

  std::size_t add_field(const std::string& path, DType dtype, std::vector<std::int64_t> shape);
  LayoutNode build(py::handle v, const std::string& path);
};

// The layout for the Python layer: nested tuples
//   ("seq", type, [child...]) | ("map", type, [key...], [child...])
//   | ("array", field, element type name) | ("object", slot).
py::object structure_of(const LayoutNode& n);

// The whole layout as picklable tuples (numbers and arrays told apart, shapes included), and
// back: layout_from_description(describe_layout(n)) checks and writes samples as n does.
py::object describe_layout(const LayoutNode& n);
LayoutNode layout_from_description(py::handle description, const std::string& path = "");

struct PendingCopy {
  std::size_t field;
  HostArray array;
};

// Checks one sample against the layout, writes its numbers into `out`, notes its arrays'
// copies (made by the caller, which may release the GIL for them) and collects its object
// values into `objects` (a tuple with one item per slot, or null).
struct SampleVisitor {
  std::size_t index;
  const SampleOut& out;
  std::vector<PendingCopy>& copies;
  PyObject* objects;

  [[noreturn]] void mismatch(const LayoutNode& n, const std::string& what) const;
  void visit(const LayoutNode& n, py::handle v);
  void write_number(const LayoutNode& n, py::handle v);
};

// Makes the copies a SampleVisitor noted (no GIL needed while the arrays' owners live).
void copy_pending(const std::vector<PendingCopy>& copies, const SampleOut& out);

}  // namespace stoker::python
