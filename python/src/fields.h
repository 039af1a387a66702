// How a struct of the C++ API crosses into Python: from its field table (stoker/stats.h's
// for_each_stat; for_each_field for Report, CudaInfo, PackResult, EncodedSource::Counters and
// ObjectStorageCounters), never field by field. A field is a dict entry; a duration is in
// seconds and named "<field>_s"; the rest as pybind11 casts it. The tables' keys are exported
// as _stoker.FIELDS, which the Python tests compare with the dicts.
#pragma once

#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <chrono>
#include <string>
#include <type_traits>

#include "stoker/stats.h"

namespace stoker::python {

namespace py = pybind11;

template <class T>
std::string py_stat_name(const char* name, const T&) {
  if constexpr (std::is_same_v<T, std::chrono::nanoseconds>) return std::string(name) + "_s";
  return name;
}
template <class T>
py::object py_stat_value(const T& value) {
  if constexpr (std::is_same_v<T, std::chrono::nanoseconds>) {
    return py::float_(to_seconds(value));
  } else {
    return py::cast(value);
  }
}

// What an empty string field becomes in Python.
enum class EmptyString { empty, none };

// `value`'s fields (for_each_field's table) as a dict.
template <class T>
py::dict fields_dict(const T& value, EmptyString empty = EmptyString::empty) {
  py::dict d;
  for_each_field(value, [&](const char* name, const auto& v) {
    using V = std::decay_t<decltype(v)>;
    if constexpr (std::is_same_v<V, std::string>) {
      if (v.empty() && empty == EmptyString::none) {
        d[py::str(name)] = py::none();
        return;
      }
    }
    d[py::str(py_stat_name(name, v))] = py_stat_value(v);
  });
  return d;
}

// The keys fields_dict makes for a T.
template <class T>
py::list field_names() {
  py::list out;
  for_each_field(T{}, [&](const char* name, const auto& v) { out.append(py_stat_name(name, v)); });
  return out;
}

}  // namespace stoker::python
