// The built-in C++ data sets (sources.h) made from Python: they run entirely in C++, without
// the GIL.
#pragma once

#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include "host_array.h"
#include "stoker/dataset.h"
#include "stoker/encoded.h"

namespace stoker::python {

namespace py = pybind11;

// A Python object that a C++ data set keeps alive: the last reference may be dropped on any
// thread (a Loader's destructor runs with the GIL released), so the GIL is taken for it; while
// the interpreter finalizes, its teardown has the object.
std::shared_ptr<py::object> hold(py::object obj);

struct NativeDataset {
  std::shared_ptr<const Dataset> dataset;
  std::vector<std::string> element_types;  // logical type per field (bool over u8, ...)
  std::shared_ptr<EncodedSource> source;   // image data sets: where the encoded bytes live
};

// An ArrayDataset over `arrays` (numpy arrays or torch tensors, C-contiguous, on the CPU, one
// per field, sample-major), without a copy: the arrays stay referenced while the data set
// lives. GIL held.
NativeDataset make_array_dataset(const std::vector<std::string>& names, const py::list& arrays);

// A SyntheticDataset; `fields` holds (name, element type name, shape) tuples.
NativeDataset make_synthetic_dataset(std::size_t samples, const py::list& fields, double latency_s,
                                     double cpu_work_s, std::int64_t classes);

// ToTensor (+ Normalize, with `mean` and `std`) of an RGB image that Python code produced (the
// pixels of a PIL image after transforms stoker does not implement): uint8 [H, W, 3] in,
// float32 [3, H, W] out, in one pass with the GIL released.
py::array to_tensor(const py::array& pixels, const std::vector<float>& mean,
                    const std::vector<float>& std);

// An ImageDataset over an image folder ("folder") or record shards ("records") at `path`,
// optionally behind a RAM cache of `cache_bytes`. `transform` holds ImageTransform's settings
// by name (crop, size, resize, scale, ratio, flip, dtype, layout, mean, std). Opens the source
// with the GIL released.
// `transform` is an ImageTransform spec (ImageTransform::parse; transforms.Compose.spec()).
// `path` may be a URL (docs/storage.md): the rest are ObjectStorageOptions' settings, as
// make_webdataset's ("" the default places).
NativeDataset make_image_dataset(
    const std::string& kind, const std::string& path, const std::string& transform,
    std::size_t cache_bytes, std::uint64_t max_pixels, const std::string& index_cache_dir,
    bool index_cache, const std::string& object_cache_dir, std::uint64_t object_cache_bytes,
    const std::vector<std::tuple<std::string, std::uint64_t, std::string>>& known_objects);

// A WebDataset (stoker/webdataset.h) over `shards` (tar files, directories or URLs) with
// `fields`, optionally behind a RAM cache of `cache_bytes`; indexes cached in `index_cache_dir`
// ("" the default place) unless `index_cache` is false; URL shards read through the object
// cache `object_cache_dir` ("" the default place) of `object_cache_bytes` (0: none). Opens the
// shards with the GIL released.
NativeDataset make_webdataset(
    const std::vector<std::string>& shards, const std::vector<std::string>& fields,
    const std::string& transform, std::size_t cache_bytes, std::uint64_t max_pixels,
    const std::string& index_cache_dir, bool index_cache, const std::string& object_cache_dir,
    std::uint64_t object_cache_bytes,
    const std::vector<std::tuple<std::string, std::uint64_t, std::string>>& known_objects);

// The Python constructors' object-storage arguments (stoker/datasets/native.py,
// object_storage_args) as the C++ options.
ObjectStorageOptions object_storage_options(
    const std::string& index_cache_dir, bool index_cache, const std::string& object_cache_dir,
    std::uint64_t object_cache_bytes,
    const std::vector<std::tuple<std::string, std::uint64_t, std::string>>& known_objects = {});

// The objects of a data set over URLs as resolved: (url, size, etag) each (WebDataset::objects(),
// EncodedSource::objects()).
std::vector<std::tuple<std::string, std::uint64_t, std::string>> webdataset_objects(
    const NativeDataset& dataset);

// stoker._stoker.ObjectFile and open_object_files: objects read by ranges (the Python Parquet
// data set's s3:// and http(s):// files, for pyarrow).
void bind_object_files(py::module_& m);

// The object-storage counters of a data set over URLs (ObjectStorageCounters' fields by name);
// empty for other data sets.
py::dict object_storage_counters(const NativeDataset& dataset);

// One encoded image (JPEG or PNG) decoded and transformed as an image data set does it, into a
// fresh array of the transform's shape and dtype, with the GIL released. `name` starts the
// error message (a std::runtime_error) of an image that does not decode.
py::array decode_image_bytes(const py::bytes& data, const std::string& transform,
                             std::uint64_t seed, std::uint64_t max_pixels, const std::string& name);

// The source's read counters (reads, storage_reads, storage_bytes, cached, cached_bytes).
py::dict source_counters(const NativeDataset& dataset);

// Reads sample `index` of a native data set into fresh numpy arrays, one per field (with the
// GIL released during the read), with `seed` for its random augmentations.
py::list read_sample(const NativeDataset& dataset, std::size_t index, std::uint64_t seed);

}  // namespace stoker::python
