#include "py_executors.h"

#include <cstring>
#include <optional>
#include <string>
#include <utility>

#include "gil.h"
#include "row_reader.h"

namespace stoker::python {

std::span<const std::size_t> PyExecutorBase::indices(const detail::ChunkJob& job,
                                                     std::vector<std::size_t>& storage) const {
  if (remap_ == nullptr) return job.indices;
  storage = remap_->map(job.indices);
  return storage;
}

detail::ExecutorStats PyThreads::stats() const {
  detail::ExecutorStats s;
  s.lock_held = dataset_->gil_cpu();
  return s;
}

// --- ProcessExecutor -----------------------------------------------------------------------

ProcessExecutor::ProcessExecutor(std::shared_ptr<PyDataset> dataset,
                                 std::shared_ptr<const RemappedDataset> remap,
                                 std::shared_ptr<ProcessPool> pool)
    : PyExecutorBase(dataset, std::move(remap)), pool_(std::move(pool)) {
  dataset->use_processes(pool_);
}

bool ProcessExecutor::offer(const detail::ChunkJob& job) {
  if (dataset_->closed() || interpreter_finalizing()) {
    const auto closing =
        std::make_exception_ptr(std::runtime_error("stoker: the loader is closing"));
    for (auto& e : job.errors) e = closing;
    return true;
  }
  std::vector<std::size_t> storage;
  const auto rows = indices(job, storage);
  dataset_->read_around_probed(rows, job.outs, job.errors,
                               [this](auto run_indices, auto run_outs, auto run_errors) {
                                 pool_->run(*dataset_, run_indices, run_outs, run_errors);
                               });
  return true;
}

// --- RemoteExecutor ------------------------------------------------------------------------

RemoteExecutor::RemoteExecutor(std::shared_ptr<PyDataset> dataset,
                               std::shared_ptr<const RemappedDataset> remap, py::object remote)
    : PyExecutorBase(dataset, std::move(remap)), remote_(std::move(remote)) {
  dataset->on_layout(remote_.attr("set_layout"));
}

RemoteExecutor::~RemoteExecutor() {
  if (!Py_IsInitialized() || interpreter_finalizing()) {
    (void)remote_.release();  // too late: the interpreter's teardown has it
    return;
  }
  py::gil_scoped_acquire gil;
  remote_ = py::object();
}

bool RemoteExecutor::offer(const detail::ChunkJob& job) {
  if (!dataset_->fields_known() || dataset_->closed() || interpreter_finalizing()) return false;
  std::vector<std::size_t> storage;
  const auto rows = indices(job, storage);
  if (!dataset_->has_pending()) return read(rows, job.outs, job.errors);
  // Rows probed on this side are written here; a run that finds no remote worker free is
  // read on this thread, as the chunk's other rows already are here.
  dataset_->read_around_probed(rows, job.outs, job.errors,
                               [this](auto run_indices, auto run_outs, auto run_errors) {
                                 if (!read(run_indices, run_outs, run_errors)) {
                                   dataset_->read_rows(run_indices, run_outs, run_errors);
                                 }
                               });
  return true;
}

void RemoteExecutor::count_reply(std::uint64_t bytes, double wait_s, double read_s, double idle_s) {
  const auto ns = [](double seconds) { return static_cast<std::int64_t>(seconds * 1e9); };
  units_.fetch_add(1, std::memory_order_relaxed);
  bytes_.fetch_add(bytes, std::memory_order_relaxed);
  wait_ns_.fetch_add(ns(wait_s), std::memory_order_relaxed);
  read_ns_.fetch_add(ns(read_s), std::memory_order_relaxed);
  idle_ns_.fetch_add(ns(idle_s), std::memory_order_relaxed);
}

detail::ExecutorStats RemoteExecutor::stats() const {
  using std::chrono::nanoseconds;
  detail::ExecutorStats s;
  s.remote_units = units_.load(std::memory_order_relaxed);
  s.remote_bytes = bytes_.load(std::memory_order_relaxed);
  s.remote_wait = nanoseconds(wait_ns_.load(std::memory_order_relaxed));
  s.remote_read = nanoseconds(read_ns_.load(std::memory_order_relaxed));
  s.remote_idle = nanoseconds(idle_ns_.load(std::memory_order_relaxed));
  return s;
}

bool RemoteExecutor::read(std::span<const std::size_t> indices, std::span<const SampleOut> outs,
                          std::span<std::exception_ptr> errors) {
  // The worker's buffer holds the fields one after another, each the chunk's rows.
  std::vector<std::uint64_t> offsets;
  std::uint64_t total = 0;
  for (std::size_t f = 0; f < outs.front().num_fields(); ++f) {
    offsets.push_back(total);
    total += outs.size() * outs.front().bytes(f).size();
  }
  // The reply and the view of its rows live from the call to the end of the copy, which is
  // made without the GIL; they are let go with it.
  struct Reply {
    py::object value;
    std::optional<py::buffer_info> rows;
    ~Reply() {
      if (!value && !rows) return;
      EngineThreadGil gil;
      rows.reset();
      value = py::object();
    }
  } reply;
  const auto fail_all = [&] {
    const py::object exception = take_python_error();
    for (std::size_t k = 0; k < indices.size(); ++k) {
      errors[k] = dataset_->keep_error(exception, indices[k]);
    }
  };
  {
    EngineThreadGil gil;
    try {
      // A batch job's batches travel with it, as to worker processes.
      const std::vector<std::uint8_t> job = encode_job(
          1, offsets, indices, outs,
          dataset_->has_job_args() ? dataset_->job_args(indices, outs[0].epoch()) : std::string(),
          false);
      reply.value =
          remote_.attr("run")(py::bytes(reinterpret_cast<const char*>(job.data()), job.size()));
      if (reply.value.is_none()) return false;
      const py::object& v = reply.value;  // a RemoteReply (docs/worker_protocol.md)
      count_reply(total, v.attr("wait_s").cast<double>(), v.attr("read_s").cast<double>(),
                  v.attr("idle_s").cast<double>());
      reply.rows.emplace(py::buffer(v.attr("rows")).request());
      const auto got = static_cast<std::uint64_t>(reply.rows->size * reply.rows->itemsize);
      if (got < total) {
        throw py::value_error("stoker: a remote worker returned " + std::to_string(got) +
                              " bytes of rows for " + std::to_string(total));
      }
    } catch (py::error_already_set& e) {
      e.restore();
      fail_all();
      return true;
    }
  }
  // The one copy of the rows on this node: from Ray's object store into the slab.
  const auto* rows = static_cast<const std::byte*>(reply.rows->ptr);
  for (std::size_t f = 0; f < offsets.size(); ++f) {
    std::memcpy(outs.front().bytes(f).data(), rows + offsets[f],
                outs.size() * outs.front().bytes(f).size());
  }
  EngineThreadGil gil;
  merge_reply(
      *dataset_, indices, outs, errors,
      [&] {
        const py::object& v = reply.value;
        return ChunkReply{py::bytes(v.attr("status")).cast<std::string>(), v.attr("objects"),
                          v.attr("failures")};
      },
      "remote worker");
  return true;
}

}  // namespace stoker::python
