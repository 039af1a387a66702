#include "row_reader.h"

#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <string>
#include <system_error>

#include "py_dataset.h"
#include "py_workers.h"
#include "stoker/frontend/tracer.h"

namespace stoker::python {
namespace {

thread_local std::optional<std::uint64_t> t_sample_seed;
thread_local std::optional<std::uint64_t> t_sample_epoch;

// What stoker.sample_seed() and sample_epoch() return on this thread while a row's Python
// code runs: the row's seed inside __getitem__, the call's first row's inside __getitems__.
struct SeedScope {
  SeedScope(std::optional<std::uint64_t> seed, std::optional<std::uint64_t> epoch) {
    t_sample_seed = seed;
    t_sample_epoch = epoch;
  }
  ~SeedScope() {
    t_sample_seed.reset();
    t_sample_epoch.reset();
  }
  SeedScope(const SeedScope&) = delete;
  SeedScope& operator=(const SeedScope&) = delete;
};

// __getitems__, interned: PyObject_HasAttr looks a str up without raising for a plain object
// (py::hasattr made the C string a str and raised and cleared an AttributeError each time).
PyObject* getitems_name() {
  static PyObject* const name = PyUnicode_InternFromString("__getitems__");
  return name;
}

// dataset.__getitems__(keys) as a list.
py::list call_getitems(py::handle dataset, const py::list& keys) {
  const auto method =
      py::reinterpret_steal<py::object>(PyObject_GetAttr(dataset.ptr(), getitems_name()));
  if (!method) throw py::error_already_set();
  return py::list(method(keys));
}

}  // namespace

std::optional<std::uint64_t> current_sample_seed() { return t_sample_seed; }

std::optional<std::uint64_t> current_sample_epoch() { return t_sample_epoch; }

RowReader::RowReader(py::handle dataset)
    : dataset_(dataset), batched_(PyObject_HasAttr(dataset.ptr(), getitems_name()) == 1) {}

py::object RowReader::read_one(const Row& row) const {
  if (!batched_) {
    const SeedScope scope(row.seed, row.epoch);
    const auto key = py::reinterpret_steal<py::object>(PyLong_FromSize_t(row.index));
    if (!key) throw py::error_already_set();
    auto sample = py::reinterpret_steal<py::object>(PyObject_GetItem(dataset_.ptr(), key.ptr()));
    if (!sample) throw py::error_already_set();
    return sample;
  }
  py::list keys(1);
  keys[0] = py::int_(row.index);
  const SeedScope scope(row.seed, row.epoch);
  const py::list got = call_getitems(dataset_, keys);
  if (got.size() != 1) {
    throw py::value_error("stoker: __getitems__ returned " + std::to_string(got.size()) +
                          " samples for 1 index");
  }
  return got[0];
}

std::size_t RowReader::read(std::span<const Row> rows, RowSink& sink) const {
  if (batched_ && rows.size() > 1) {
    py::list keys(rows.size());
    for (std::size_t k = 0; k < rows.size(); ++k) keys[k] = py::int_(rows[k].index);
    std::optional<py::list> got;
    try {
      const SeedScope scope(rows[0].seed, rows[0].epoch);
      got = call_getitems(dataset_, keys);
    } catch (py::error_already_set& e) {
      if (!e.matches(PyExc_Exception)) {  // Ctrl-C, SystemExit: the chunk ends with it
        sink.fail(0, rows.size());
        return rows.size();
      }
      // Which row failed is unknown: each is read alone below, to fail alone.
    }
    if (got && got->size() == rows.size()) {
      for (std::size_t k = 0; k < rows.size(); ++k) {
        try {
          sink.take(k, (*got)[k]);
        } catch (...) {
          sink.fail(k, k + 1);
        }
      }
      return rows.size();
    }
  }
  for (std::size_t k = 0; k < rows.size(); ++k) {
    if (!sink.next(k)) return k;
    try {
      sink.take(k, read_one(rows[k]));
    } catch (...) {
      sink.fail(k, k + 1);
    }
  }
  return rows.size();
}

py::object visit_sample(const LayoutNode& root, std::size_t slots, std::size_t index,
                        py::handle sample, const SampleOut& out, std::vector<PendingCopy>& copies) {
  py::object objects = py::none();
  if (slots > 0) {
    objects = py::reinterpret_steal<py::object>(PyTuple_New(static_cast<Py_ssize_t>(slots)));
    if (!objects) throw py::error_already_set();
    for (std::size_t s = 0; s < slots; ++s) {
      Py_INCREF(Py_None);
      PyTuple_SET_ITEM(objects.ptr(), static_cast<Py_ssize_t>(s), Py_None);
    }
  }
  SampleVisitor{index, out, copies, slots > 0 ? objects.ptr() : nullptr}.visit(root, sample);
  return objects;
}

void merge_reply(const PyDataset& owner, std::span<const std::size_t> indices,
                 std::span<const SampleOut> outs, std::span<std::exception_ptr> errors,
                 const std::function<ChunkReply()>& decode, const char* who) {
  try {
    const auto [status, objects, failures] = decode();
    const auto failed = py::reinterpret_borrow<py::dict>(failures);
    if (failed.empty() && status.size() == indices.size() &&
        status.find_first_not_of('\0') == std::string_view::npos &&
        (objects.is_none() ||
         (PyList_Check(objects.ptr()) &&
          static_cast<std::size_t>(PyList_GET_SIZE(objects.ptr())) == indices.size()))) {
      if (!objects.is_none()) owner.store_objects(outs, objects);
      return;
    }
    for (std::size_t k = 0; k < indices.size(); ++k) {
      const py::int_ row(k);
      if (failed.contains(row)) {
        errors[k] = owner.keep_error(failed[row], indices[k]);
      } else if (k >= status.size() || status[k] != 0) {
        errors[k] = std::make_exception_ptr(
            std::runtime_error(std::string("stoker: ") + who + " failed without a reason"));
      } else if (!objects.is_none()) {
        owner.store_objects(outs[k], py::reinterpret_borrow<py::list>(objects)[k]);
      }
    }
  } catch (py::error_already_set& e) {
    e.restore();
    const py::object exception = take_python_error();
    for (std::size_t k = 0; k < indices.size(); ++k) {
      errors[k] = owner.keep_error(exception, indices[k]);
    }
  }
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

// --- The job, both ends (docs/worker_protocol.md) ----------------------------------------

namespace {

std::uint32_t job_flags(std::size_t args_bytes, bool time_rows) {
  if (args_bytes >= (std::size_t{1} << (32 - wire::kArgsShift))) {
    throw std::length_error("stoker: a job's arguments are too large");
  }
  return static_cast<std::uint32_t>(args_bytes << wire::kArgsShift) |
         (time_rows ? wire::kTimeRows : 0);
}

}  // namespace

std::vector<std::uint8_t> encode_job(std::uint32_t region, std::span<const std::uint64_t> offsets,
                                     std::span<const std::size_t> indices,
                                     std::span<const SampleOut> outs, const std::string& args,
                                     bool time_rows) {
  std::vector<std::uint8_t> job;
  const std::size_t fields = offsets.size();
  job.reserve(wire::kJobBytes + wire::kFieldBytes * fields + wire::kRowBytes * indices.size() +
              args.size());
  wire::put(job, std::uint64_t{0});  // the job id: the sender's
  wire::put(job, region);
  wire::put(job, static_cast<std::uint32_t>(fields));
  wire::put(job, static_cast<std::uint32_t>(indices.size()));
  wire::put(job, job_flags(args.size(), time_rows));
  for (std::size_t f = 0; f < fields; ++f) {
    const auto bytes = outs.front().bytes(f);
    for (std::size_t k = 1; k < outs.size(); ++k) {
      // The engine's chunks are consecutive rows of one slab.
      if (outs[k].bytes(f).data() != bytes.data() + k * bytes.size()) {
        throw std::logic_error("stoker: a chunk's rows are not consecutive");
      }
    }
    wire::put(job, offsets[f]);
    wire::put(job, static_cast<std::uint64_t>(bytes.size()));
  }
  for (std::size_t k = 0; k < indices.size(); ++k) {
    wire::put(job, static_cast<std::uint64_t>(indices[k]));
    wire::put(job, outs[k].seed());
  }
  job.insert(job.end(), args.begin(), args.end());
  return job;
}

std::vector<std::uint8_t> encode_call(std::uint64_t index, std::string_view args) {
  using namespace wire;
  std::vector<std::uint8_t> job;
  job.reserve(kJobBytes + kRowBytes + args.size());
  put(job, std::uint64_t{0});  // the job id: the sender's
  put(job, std::uint32_t{0});  // no region
  put(job, std::uint32_t{0});  // no fields
  put(job, std::uint32_t{1});
  put(job, job_flags(args.size(), false));
  put(job, index);
  put(job, std::uint64_t{0});
  job.insert(job.end(), args.begin(), args.end());
  return job;
}

// --- SampleWriter --------------------------------------------------------------------------

// A job's rows read in a worker process: each written into the shared slab at once, its object
// values and errors kept for the reply, and its (start, end) times if the job asked for them
// (a row starts where the previous one ended, the first one with the job, so that it carries
// a __getitems__ call).
class SampleWriter::Rows final : public RowSink {
 public:
  Rows(SampleWriter& writer, std::span<const Row> rows, bool timed)
      : writer_(writer),
        rows_(rows),
        status_(rows.size(), '\0'),
        objects_(writer.slots_ > 0 ? py::object(py::list(rows.size())) : py::none()),
        timed_(timed),
        start_(timed ? detail::Tracer::now_ns() : 0) {
    for (std::size_t k = 0; k < rows.size() && writer.slots_ > 0; ++k) {
      Py_INCREF(Py_None);  // PyList_New leaves the items NULL
      PyList_SET_ITEM(objects_.ptr(), static_cast<Py_ssize_t>(k), Py_None);
    }
  }

  void take(std::size_t k, py::handle sample) override {
    py::object values = writer_.write(sample, rows_[k].index, k, rows_[k].seed);
    if (writer_.slots_ > 0) {
      PyList_SetItem(objects_.ptr(), static_cast<Py_ssize_t>(k), values.release().ptr());
    }
    time(1);
  }
  void fail(std::size_t first, std::size_t end) override {
    const py::object exception = take_current_exception();
    for (std::size_t k = first; k < end; ++k) {
      status_[k] = 1;
      errors_.append(py::make_tuple(k, exception));
    }
    time(end - first);
  }

  py::tuple reply(std::uint64_t id) {
    return py::make_tuple(id, py::bytes(status_), objects_, errors_,
                          py::bytes(reinterpret_cast<const char*>(times_.data()),
                                    times_.size() * sizeof(std::int64_t)));
  }

 private:
  void time(std::size_t rows) {
    if (!timed_) return;
    const std::int64_t end = detail::Tracer::now_ns();
    for (std::size_t k = 0; k < rows; ++k) times_.insert(times_.end(), {k ? end : start_, end});
    start_ = end;
  }

  SampleWriter& writer_;
  std::span<const Row> rows_;
  std::string status_;
  py::object objects_;
  py::list errors_;
  bool timed_;
  std::int64_t start_;
  std::vector<std::int64_t> times_;
};

void SampleWriter::set_layout(py::handle description, std::size_t slots) {
  root_ = layout_from_description(description);
  slots_ = slots;
}

SampleWriter::~SampleWriter() {
  for (auto& [id, region] : regions_) munmap(region.first, region.second);
}

void SampleWriter::map(std::uint32_t region, int fd, std::size_t bytes) {
  void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  const int error = errno;
  close(fd);  // the mapping keeps the memory
  if (p == MAP_FAILED) {
    throw std::system_error(error, std::generic_category(), "stoker worker: mmap of a slab");
  }
  drop(region);
  regions_[region] = {static_cast<std::byte*>(p), bytes};
}

void SampleWriter::drop(std::uint32_t region) {
  auto it = regions_.find(region);
  if (it == regions_.end()) return;
  munmap(it->second.first, it->second.second);
  regions_.erase(it);
}

void SampleWriter::begin(std::uint32_t region, std::vector<std::uint64_t> offsets,
                         std::vector<std::uint64_t> row_bytes, std::size_t rows) {
  auto it = regions_.find(region);
  if (it == regions_.end()) {
    throw std::runtime_error("stoker worker: job for region " + std::to_string(region) +
                             ", which was never sent");
  }
  if (offsets.size() != row_bytes.size()) throw std::invalid_argument("stoker worker: bad job");
  bases_.clear();
  row_bytes_.assign(row_bytes.begin(), row_bytes.end());
  for (std::size_t f = 0; f < offsets.size(); ++f) {
    if (offsets[f] + rows * row_bytes[f] > it->second.second) {
      throw std::out_of_range("stoker worker: job rows past the end of region " +
                              std::to_string(region));
    }
    bases_.push_back(it->second.first + offsets[f]);
  }
}

py::tuple SampleWriter::run_job(py::bytes job, py::handle dataset, bool use_getitems) {
  using namespace wire;
  char* data = nullptr;
  Py_ssize_t size = 0;
  if (PyBytes_AsStringAndSize(job.ptr(), &data, &size) != 0) throw py::error_already_set();
  const auto* p = reinterpret_cast<const std::uint8_t*>(data);
  const auto bytes = static_cast<std::size_t>(size);
  if (bytes < kJobBytes) throw std::invalid_argument("stoker worker: bad job");
  const auto id = get<std::uint64_t>(p);
  const auto region = get<std::uint32_t>(p + 8);
  const auto fields = get<std::uint32_t>(p + 12);
  const auto count = get<std::uint32_t>(p + 16);
  const bool timed = (get<std::uint32_t>(p + 20) & kTimeRows) != 0;
  if (bytes != kJobBytes + kFieldBytes * std::size_t{fields} + kRowBytes * std::size_t{count}) {
    throw std::invalid_argument("stoker worker: bad job");
  }
  std::vector<std::uint64_t> offsets(fields), row_bytes(fields);
  for (std::size_t f = 0; f < fields; ++f) {
    offsets[f] = get<std::uint64_t>(p + kJobBytes + kFieldBytes * f);
    row_bytes[f] = get<std::uint64_t>(p + kJobBytes + kFieldBytes * f + 8);
  }
  const std::uint8_t* row_at = p + kJobBytes + kFieldBytes * std::size_t{fields};
  if (!root_) throw std::logic_error("stoker worker: a job before the layout");
  begin(region, std::move(offsets), std::move(row_bytes), count);
  std::vector<Row> rows(count);
  for (std::size_t k = 0; k < count; ++k) {
    rows[k].index = static_cast<std::size_t>(get<std::uint64_t>(row_at + kRowBytes * k));
    rows[k].seed = get<std::uint64_t>(row_at + kRowBytes * k + 8);
  }
  Rows sink(*this, rows, timed);
  RowReader(dataset, use_getitems).read(rows, sink);
  return sink.reply(id);
}

py::object SampleWriter::read_sample(py::handle dataset, std::size_t index, std::uint64_t seed,
                                     bool use_getitems) {
  return RowReader(dataset, use_getitems)
      .read_one({.index = index, .seed = seed, .epoch = std::nullopt});
}

py::object SampleWriter::write(py::handle sample, std::size_t index, std::size_t row,
                               std::uint64_t seed) {
  // bases_ already point at the chunk's first row: rows are numbered within the job.
  const SampleOut out(row_bytes_, bases_.data(), row, seed);
  copies_.clear();
  py::object objects = visit_sample(*root_, slots_, index, sample, out, copies_);
  copy_pending(copies_, out);
  copies_.clear();  // lets go of the arrays
  return objects;
}

}  // namespace stoker::python
