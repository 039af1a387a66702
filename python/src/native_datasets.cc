#include "native_datasets.h"

#include <pybind11/numpy.h>
#include <pybind11/stl.h>

#include <array>
#include <chrono>
#include <span>
#include <stdexcept>

#include "fields.h"
#include "gil.h"
#include "stoker/frontend/object_files.h"
#include "stoker/frontend/pixels.h"
#include "stoker/image.h"
#include "stoker/sources.h"
#include "stoker/webdataset.h"

namespace stoker::python {

std::shared_ptr<py::object> hold(py::object obj) {
  return std::shared_ptr<py::object>(new py::object(std::move(obj)), [](py::object* p) {
    if (!Py_IsInitialized() || interpreter_finalizing()) {
      (void)p->release();  // the interpreter's teardown has it
      delete p;
      return;
    }
    py::gil_scoped_acquire gil;
    delete p;
  });
}

NativeDataset make_array_dataset(const std::vector<std::string>& names, const py::list& arrays) {
  if (names.size() != arrays.size() || names.empty()) {
    throw py::value_error("stoker.ArrayDataset: needs one or more arrays, one per name");
  }
  std::vector<FieldSpec> fields;
  std::vector<std::span<const std::byte>> data;
  py::list refs;  // what the arrays' memory belongs to
  NativeDataset out;
  std::size_t samples = 0;
  for (std::size_t f = 0; f < names.size(); ++f) {
    const std::string what = "stoker.ArrayDataset: array '" + names[f] + "'";
    HostArray a = import_array(arrays[f], what);
    if (a.shape.empty()) throw py::value_error(what + " has no sample dimension (it is 0-d)");
    if (!a.contiguous()) {
      throw py::value_error(what +
                            " is not C-contiguous (np.ascontiguousarray or "
                            ".contiguous() makes it so)");
    }
    const auto n = static_cast<std::size_t>(a.shape[0]);
    if (f == 0) samples = n;
    if (n != samples) {
      throw py::value_error(what + " has " + std::to_string(n) + " samples, the first array " +
                            std::to_string(samples));
    }
    fields.push_back({names[f], a.type.storage, {a.shape.begin() + 1, a.shape.end()}});
    data.emplace_back(a.data, a.bytes());
    out.element_types.push_back(a.type.name);
    refs.append(std::move(a.owner));
    refs.append(arrays[f]);
  }
  out.dataset = std::make_shared<ArrayDataset>(std::move(fields), std::move(data), samples,
                                               hold(std::move(refs)));
  return out;
}

NativeDataset make_synthetic_dataset(std::size_t samples, const py::list& fields, double latency_s,
                                     double cpu_work_s, std::int64_t classes) {
  SyntheticDataset::Options o;
  o.samples = samples;
  o.classes = classes;
  auto micros = [](double s) {
    if (s < 0) throw py::value_error("stoker.SyntheticDataset: times must not be negative");
    return std::chrono::microseconds(static_cast<std::int64_t>(s * 1e6 + 0.5));
  };
  o.latency = micros(latency_s);
  o.cpu_work = micros(cpu_work_s);
  NativeDataset out;
  for (auto item : fields) {
    auto t = item.cast<py::tuple>();
    const auto type = element_type(t[1].cast<std::string>());
    if (type.name != dtype_name(type.storage)) {
      throw py::value_error("stoker.SyntheticDataset: element type " + type.name +
                            " is not generated (use a signed or float type, or uint8)");
    }
    o.fields.push_back(
        {t[0].cast<std::string>(), type.storage, t[2].cast<std::vector<std::int64_t>>()});
    out.element_types.push_back(type.name);
  }
  out.dataset = std::make_shared<SyntheticDataset>(std::move(o));
  return out;
}

ObjectStorageOptions object_storage_options(
    const std::string& index_cache_dir, bool index_cache, const std::string& object_cache_dir,
    std::uint64_t object_cache_bytes,
    const std::vector<std::tuple<std::string, std::uint64_t, std::string>>& known_objects) {
  ObjectStorageOptions o;
  o.index_cache_dir = index_cache_dir;
  o.index_cache = index_cache;
  o.object_cache_dir = object_cache_dir;
  o.object_cache_bytes = object_cache_bytes;
  for (const auto& [url, size, etag] : known_objects) o.known_objects.push_back({url, size, etag});
  return o;
}

NativeDataset make_image_dataset(
    const std::string& kind, const std::string& path, const std::string& transform,
    std::size_t cache_bytes, std::uint64_t max_pixels, const std::string& index_cache_dir,
    bool index_cache, const std::string& object_cache_dir, std::uint64_t object_cache_bytes,
    const std::vector<std::tuple<std::string, std::uint64_t, std::string>>& known_objects) {
  ImageDatasetOptions o;
  o.transform = ImageTransform::parse(transform);  // std::invalid_argument: ValueError
  o.max_pixels = max_pixels;
  const ObjectStorageOptions remote = object_storage_options(
      index_cache_dir, index_cache, object_cache_dir, object_cache_bytes, known_objects);

  NativeDataset out;
  {
    py::gil_scoped_release nogil;  // a folder scan, a listing or a shard check may take a while
    if (kind == "folder") {
      o.source = open_image_folder(path, remote);
    } else if (kind == "records") {
      o.source = open_records(path, remote);
    } else {
      throw std::invalid_argument("stoker: unknown image source '" + kind + "'");
    }
    if (cache_bytes > 0) o.source = cache_in_ram(o.source, cache_bytes);
    out.source = o.source;
    out.dataset = std::make_shared<ImageDataset>(std::move(o));
  }
  for (const auto& f : out.dataset->fields()) {
    out.element_types.emplace_back(dtype_name(f.dtype));
  }
  return out;
}

NativeDataset make_webdataset(
    const std::vector<std::string>& shards, const std::vector<std::string>& fields,
    const std::string& transform, std::size_t cache_bytes, std::uint64_t max_pixels,
    const std::string& index_cache_dir, bool index_cache, const std::string& object_cache_dir,
    std::uint64_t object_cache_bytes,
    const std::vector<std::tuple<std::string, std::uint64_t, std::string>>& known_objects) {
  WebDatasetOptions o;
  o.shards = shards;
  o.fields = fields;
  o.transform = ImageTransform::parse(transform);  // std::invalid_argument: ValueError
  o.max_pixels = max_pixels;
  o.cache_bytes = cache_bytes;
  o.storage = object_storage_options(index_cache_dir, index_cache, object_cache_dir,
                                     object_cache_bytes, known_objects);
  NativeDataset out;
  {
    py::gil_scoped_release nogil;  // indexing the shards may take a while
    auto d = std::make_shared<WebDataset>(std::move(o));
    out.source = d->source();
    out.dataset = std::move(d);
  }
  for (const auto& f : out.dataset->fields()) {
    out.element_types.emplace_back(dtype_name(f.dtype));
  }
  return out;
}

py::array decode_image_bytes(const py::bytes& data, const std::string& transform,
                             std::uint64_t seed, std::uint64_t max_pixels,
                             const std::string& name) {
  const ImageTransform t = ImageTransform::parse(transform);  // std::invalid_argument: ValueError
  const auto shape = t.shape();
  py::array out(py::dtype(std::string(dtype_name(t.dtype))),
                std::vector<py::ssize_t>(shape.begin(), shape.end()));
  const std::string_view bytes = data;  // the bytes object stays referenced by the caller
  const std::span<const std::byte> encoded(reinterpret_cast<const std::byte*>(bytes.data()),
                                           bytes.size());
  const std::span<std::byte> pixels(static_cast<std::byte*>(out.mutable_data()),
                                    static_cast<std::size_t>(out.nbytes()));
  {
    py::gil_scoped_release nogil;
    decode_image(encoded, name, t, seed, pixels, nullptr, max_pixels);
  }
  return out;
}

py::dict source_counters(const NativeDataset& dataset) {
  if (!dataset.source) throw py::type_error("stoker: not an image data set");
  return fields_dict(dataset.source->counters());
}

void bind_object_files(py::module_& m) {
  using detail::ObjectFile;
  py::class_<ObjectFile, std::shared_ptr<ObjectFile>>(m, "ObjectFile")
      .def_property_readonly("url", &ObjectFile::url)
      .def_property_readonly("size", &ObjectFile::size)
      .def_property_readonly("etag", &ObjectFile::etag)
      .def(
          "read",
          [](const ObjectFile& f, std::uint64_t offset, std::size_t n, bool exact) {
            std::string bytes(n, '\0');
            {
              py::gil_scoped_release nogil;  // a GET, or a wait for one
              bytes.resize(f.read_at(offset, reinterpret_cast<std::byte*>(bytes.data()), n, exact));
            }
            return py::bytes(bytes);
          },
          py::arg("offset"), py::arg("n"), py::arg("exact") = false,
          "Up to n bytes at offset (fewer past the end), through the object cache; exact: by "
          "exactly this range, not through the cache.")
      .def("will_read", &ObjectFile::will_read, py::arg("ranges"),
           py::call_guard<py::gil_scoped_release>(),
           "A hint: these (offset, length) ranges are read soon.")
      .def("cut_at", &ObjectFile::cut_at, py::arg("starts"),
           "The same object with its cache chunks starting at these offsets.")
      .def(
          "counters", [](const ObjectFile& f) { return fields_dict(f.counters()); },
          "The traffic of the object cache it reads through.");
  m.def(
      "open_object_files",
      [](const std::vector<std::string>& urls, const std::string& suffix,
         const std::string& index_cache_dir, bool index_cache, const std::string& object_cache_dir,
         std::uint64_t object_cache_bytes,
         const std::vector<std::tuple<std::string, std::uint64_t, std::string>>& known_objects) {
        const ObjectStorageOptions o = object_storage_options(
            index_cache_dir, index_cache, object_cache_dir, object_cache_bytes, known_objects);
        py::gil_scoped_release nogil;  // listings, HEADs
        return detail::open_object_files(urls, suffix, o);
      },
      py::arg("urls"), py::arg("suffix"), py::arg("index_cache_dir"), py::arg("index_cache"),
      py::arg("object_cache_dir"), py::arg("object_cache_bytes"), py::arg("known_objects"),
      "The objects the URLs name (objects or s3:// prefixes: those ending in suffix), in "
      "order, through the object cache named (as the data sets' arguments); known_objects: "
      "(url, size, etag) as another process resolved them, taken with no request.");
}

std::vector<std::tuple<std::string, std::uint64_t, std::string>> webdataset_objects(
    const NativeDataset& dataset) {
  std::vector<std::tuple<std::string, std::uint64_t, std::string>> out;
  if (const auto* w = dynamic_cast<const WebDataset*>(dataset.dataset.get())) {
    for (const auto& o : w->objects()) out.emplace_back(o.url, o.size, o.etag);
  } else if (dataset.source) {
    for (const auto& o : dataset.source->objects()) out.emplace_back(o.url, o.size, o.etag);
  }
  return out;
}

py::dict object_storage_counters(const NativeDataset& dataset) {
  return fields_dict(dataset.dataset->object_storage_counters());  // zero: local files
}

py::list read_sample(const NativeDataset& dataset, std::size_t index, std::uint64_t seed) {
  if (index >= dataset.dataset->size()) {
    throw py::index_error("stoker: sample " + std::to_string(index) + " of a data set of " +
                          std::to_string(dataset.dataset->size()));
  }
  const auto fields = dataset.dataset->fields();
  py::list out;
  std::vector<std::size_t> bytes;
  std::vector<std::byte*> bases;
  for (const auto& f : fields) {
    if (f.dtype == DType::bf16) throw py::type_error("stoker: bfloat16 needs torch");
    py::array a(py::dtype(std::string(dtype_name(f.dtype))),
                std::vector<py::ssize_t>(f.shape.begin(), f.shape.end()));
    bytes.push_back(f.bytes());
    bases.push_back(static_cast<std::byte*>(a.mutable_data()));
    out.append(a);
  }
  {
    py::gil_scoped_release nogil;
    dataset.dataset->read(index, SampleOut(bytes, bases.data(), 0, seed));
  }
  return out;
}

py::array to_tensor(const py::array& pixels, const std::vector<float>& mean,
                    const std::vector<float>& std) {
  if (pixels.ndim() != 3 || pixels.shape(2) != 3 ||
      !pixels.dtype().is(py::dtype::of<std::uint8_t>())) {
    throw py::type_error("stoker: to_tensor takes uint8 RGB pixels of shape [H, W, 3]");
  }
  if (pixels.strides(2) != 1 || pixels.strides(1) != 3) {
    throw py::value_error("stoker: to_tensor takes pixels whose rows are contiguous");
  }
  const auto height = static_cast<int>(pixels.shape(0));
  const auto width = static_cast<int>(pixels.shape(1));
  py::array_t<float> out({py::ssize_t{3}, pixels.shape(0), pixels.shape(1)});
  std::array<float, 3> m{0, 0, 0};  // ToTensor alone
  std::array<float, 3> s{1, 1, 1};
  if (mean.size() == 3 && std.size() == 3) {
    m = {mean[0], mean[1], mean[2]};
    s = {std[0], std[1], std[2]};
  } else if (!mean.empty() || !std.empty()) {
    throw py::value_error("stoker: to_tensor's mean and std have 3 values each, or none");
  }
  const auto* in = static_cast<const std::uint8_t*>(pixels.data());
  const auto row_stride = static_cast<std::size_t>(pixels.strides(0));
  const std::span<float> chw(out.mutable_data(), static_cast<std::size_t>(out.size()));
  {
    py::gil_scoped_release nogil;
    detail::pixels_to_tensor(in, row_stride, width, height, m, s, chw);
  }
  return out;
}

}  // namespace stoker::python
