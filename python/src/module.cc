// stoker._stoker: the bindings behind the `stoker` package. The package (python/stoker/) is
// the public API; this module is its private engine room.
#include <pthread.h>
#include <pybind11/chrono.h>
#include <pybind11/numpy.h>
#include <pybind11/operators.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <deque>
#include <memory>
#include <mutex>
#include <new>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "gil.h"
#include "native_datasets.h"
#include "parquet_dataset.h"
#ifdef STOKER_HAVE_VIDEO
#include "token_dataset.h"
#include "video_dataset.h"
#endif
#include "py_dataset.h"
#include "py_loader.h"
#include "py_seeding.h"
#include "py_workers.h"
#include "row_reader.h"
#include "stoker/device.h"
#include "stoker/encoded.h"
#include "stoker/frontend/cuda_runtime.h"
#include "stoker/frontend/environment.h"
#include "stoker/frontend/host_allocator.h"
#include "stoker/frontend/host_share.h"
#include "stoker/frontend/log.h"
#include "stoker/frontend/memory_cap.h"
#include "stoker/frontend/object_files.h"
#include "stoker/frontend/shared_memory.h"
#include "stoker/frontend/shuffle_choice.h"
#include "stoker/frontend/stream_copy.h"
#include "stoker/frontend/worker_kind.h"
#include "stoker/info.h"
#include "stoker/log.h"
#include "stoker/webdataset.h"

namespace py = pybind11;
using namespace stoker;
using namespace stoker::python;

namespace {

// The C++ log lines of a process whose Python side routes them to the `stoker` logger
// (stoker/logs.py): whichever thread logs queues the line here and asks the interpreter for a
// pending call (Py_AddPendingCall: any thread, no GIL needed), which hands the queue to the
// logger on the main thread at its next bytecode; a loader also takes the queue at each batch.
// The handler never takes the GIL itself: it runs under the log's lock, and a thread holding
// the GIL could be waiting for that lock. A child forked after routing started writes its
// lines to stderr, as an unrouted process does (nothing would take them there).
class LogQueue {
 public:
  static constexpr std::size_t kMostLines = 1000;

  void route(bool on) {
    {
      std::lock_guard lock(mu_);
      pid_ = on ? getpid() : 0;
    }
    if (on) {
      set_log_handler([this](LogLevel level, std::string_view message) { push(level, message); });
    } else {
      set_log_handler({});
    }
  }
  // In a forked child: the parent's lines are the parent's to hand over. The child starts
  // with none (it would otherwise print them again at its first bytecode: the parent's
  // pending call is copied with it), and with the lock free: at fork no thread held it
  // (push runs inside the engine's log, whose lock fork takes first: src/util/log.cc; take
  // and route hold the GIL, which the forking thread has).
  void forget_after_fork() {
    new (&mu_) std::mutex;
    lines_.clear();
    dropped_ = 0;
    pending_.store(false, std::memory_order_relaxed);
    scheduled_.store(false, std::memory_order_relaxed);
  }
  bool pending() const { return pending_.load(std::memory_order_acquire); }
  // The lines queued since the last call, oldest first; a last line says how many were
  // dropped past kMostLines.
  std::vector<std::pair<LogLevel, std::string>> take() {
    scheduled_.store(false, std::memory_order_release);
    std::lock_guard lock(mu_);
    std::vector<std::pair<LogLevel, std::string>> out(std::make_move_iterator(lines_.begin()),
                                                      std::make_move_iterator(lines_.end()));
    lines_.clear();
    if (dropped_ != 0) {
      out.emplace_back(LogLevel::warning, std::to_string(dropped_) +
                                              " log lines dropped (more than " +
                                              std::to_string(kMostLines) + " between batches)");
      dropped_ = 0;
    }
    pending_.store(false, std::memory_order_release);
    return out;
  }

 private:
  void push(LogLevel level, std::string_view message) {
    {
      std::lock_guard lock(mu_);
      if (pid_ == getpid()) {
        if (lines_.size() < kMostLines) {
          lines_.emplace_back(level, std::string(message));
        } else {
          ++dropped_;
        }
        pending_.store(true, std::memory_order_release);
        if (!scheduled_.exchange(true, std::memory_order_acq_rel) &&
            Py_AddPendingCall(&LogQueue::drain, nullptr) != 0) {
          scheduled_.store(false, std::memory_order_release);  // the next line asks again
        }
        return;
      }
    }
    std::fprintf(stderr, "stoker: %.*s\n", static_cast<int>(message.size()), message.data());
  }

  // The pending call: stoker.logs.drain() on the main thread, the GIL held. An error there is
  // reported as unraisable, never raised into whatever code the main thread was running.
  static int drain(void*) {
    try {
      py::module_::import("stoker.logs").attr("drain")();
    } catch (py::error_already_set& e) {
      e.discard_as_unraisable("stoker: handing C++ log lines to the stoker logger");
    }
    return 0;
  }

  std::mutex mu_;
  std::deque<std::pair<LogLevel, std::string>> lines_;
  std::size_t dropped_ = 0;
  pid_t pid_ = 0;
  std::atomic<bool> pending_{false};
  std::atomic<bool> scheduled_{false};  // a pending call is asked for and has not taken yet
};

LogQueue& log_queue() {
  static auto* queue = [] {
    auto* made = new LogQueue;  // never destroyed: a thread may log during exit
    pthread_atfork(nullptr, nullptr, [] { log_queue().forget_after_fork(); });
    return made;
  }();
  return *queue;
}

std::vector<std::size_t> to_indices(const py::object& obj, const char* what) {
  const auto a = py::array_t<std::int64_t, py::array::c_style | py::array::forcecast>::ensure(obj);
  if (!a || a.ndim() != 1) throw py::type_error(std::string(what) + " must be 1-d integers");
  std::vector<std::size_t> out(static_cast<std::size_t>(a.size()));
  const std::int64_t* p = a.data();
  for (std::size_t i = 0; i < out.size(); ++i) {
    if (p[i] < 0) throw py::index_error(std::string(what) + " holds a negative index");
    out[i] = static_cast<std::size_t>(p[i]);
  }
  return out;
}

// The loader over a data set handle (a Python or a native data set), optionally through a
// custom sampler's order; with shared_slabs, batch slabs live in shared memory that worker
// processes write into.
std::unique_ptr<PyLoader> make_loader(const py::object& dataset, const LoaderOptions& options,
                                      const py::object& order, bool shared_slabs) {
  PyLoaderOptions o;
  o.loader = options;
  if (py::isinstance<PyDataset>(dataset)) {
    o.py_dataset = dataset.cast<std::shared_ptr<PyDataset>>();
    o.loader.dataset = o.py_dataset;
  } else if (py::isinstance<NativeDataset>(dataset)) {
    o.loader.dataset = dataset.cast<const NativeDataset&>().dataset;
  } else {
    throw py::type_error("stoker: not a data set handle");
  }
  if (!order.is_none()) {
    o.remap = std::make_shared<RemappedDataset>(o.loader.dataset, to_indices(order, "order"));
    o.loader.dataset = o.remap;
  }
  if (shared_slabs) o.internals.slab_allocator = detail::shared_allocator();  // worker processes
  return std::make_unique<PyLoader>(std::move(o));
}

// LoaderOptions and what it is made of, field by field (the data set is passed to Loader on
// its own, as a handle). A new option is one more line here;
// python/stoker/loader/engine_pipeline.py passes its arguments by name.
void bind_options(py::module_& m) {
  py::enum_<ErrorPolicy>(m, "ErrorPolicy")
      .value("raise", ErrorPolicy::raise)
      .value("skip", ErrorPolicy::skip);
  py::enum_<ShuffleMode>(m, "ShuffleMode")
      .value("auto", ShuffleMode::automatic)
      .value("global", ShuffleMode::global)
      .value("window", ShuffleMode::window);
  py::enum_<PinMemory>(m, "PinMemory")
      .value("auto", PinMemory::automatic)
      .value("on", PinMemory::on)
      .value("off", PinMemory::off);
  py::class_<Shard>(m, "Shard")
      .def(py::init<>())
      .def_readwrite("rank", &Shard::rank)
      .def_readwrite("world_size", &Shard::world_size)
      .def_readwrite("drop_last", &Shard::drop_last);
  py::class_<SimDevice>(m, "SimDevice")
      .def(py::init<>())
      .def_readwrite("bandwidth_gb_per_s", &SimDevice::bandwidth_gb_per_s)
      .def_readwrite("latency", &SimDevice::latency)
      .def_readwrite("time_scale", &SimDevice::time_scale);
  py::class_<LoaderOptions>(m, "LoaderOptions")
      .def(py::init<>())
      .def_readwrite("batch_size", &LoaderOptions::batch_size)
      .def_readwrite("shuffle", &LoaderOptions::shuffle)
      .def_readwrite("seed", &LoaderOptions::seed)
      .def_readwrite("shuffle_mode", &LoaderOptions::shuffle_mode)
      .def_readwrite("drop_last", &LoaderOptions::drop_last)
      .def_readwrite("shard", &LoaderOptions::shard)
      .def_readwrite("workers", &LoaderOptions::workers)
      .def_readwrite("depth", &LoaderOptions::depth)
      .def_readwrite("tune_workers", &LoaderOptions::tune_workers)
      .def_readwrite("max_workers", &LoaderOptions::max_workers)
      .def_readwrite("cpu_cores", &LoaderOptions::cpu_cores)
      .def_readwrite("memory_limit", &LoaderOptions::memory_limit)
      .def_readwrite("memory_budget", &LoaderOptions::memory_budget)
      .def_readwrite("device", &LoaderOptions::device)
      .def_readwrite("device_depth", &LoaderOptions::device_depth)
      .def_property(
          "stream",  // an integer (torch's Stream.cuda_stream)
          [](const LoaderOptions& o) { return reinterpret_cast<std::uintptr_t>(o.stream); },
          [](LoaderOptions& o, std::uintptr_t s) { o.stream = reinterpret_cast<void*>(s); })
      .def_readwrite("pin_memory", &LoaderOptions::pin_memory)
      .def_readwrite("pin_budget", &LoaderOptions::pin_budget)
      .def_readwrite("sim", &LoaderOptions::sim)
      .def_readwrite("keep_on_host", &LoaderOptions::keep_on_host)
      .def_readwrite("on_error", &LoaderOptions::on_error)
      .def_readwrite("max_skipped", &LoaderOptions::max_skipped);
}

// The keys of Loader.stats(), from stats.h's field table (derived rates not included).
py::list stats_fields() {
  py::list out;
  Stats s;
  for_each_stat(
      s, [&](const char* name, const auto& value) { out.append(py_stat_name(name, value)); });
  return out;
}

py::list fields_of(const Dataset& d, const std::vector<std::string>& types) {
  py::list out;
  const auto fields = d.fields();
  for (std::size_t i = 0; i < fields.size(); ++i) {
    out.append(py::make_tuple(fields[i].name, i < types.size() ? types[i] : "",
                              py::tuple(py::cast(fields[i].shape))));
  }
  return out;
}

}  // namespace

PYBIND11_MODULE(_stoker, m) {
  m.doc() = "stoker's C++ bindings; use the `stoker` package.";

  // os.environ is written with the GIL held, from any thread: the library's reads of the
  // environment take it where the reading thread is a Python thread that released it (a data
  // set's constructor resolving URLs). Threads that never ran Python read as they are (taking
  // the GIL there could wait on a thread that waits for them).
  detail::set_environment_guard([](const std::function<void()>& read) {
    if (!Py_IsInitialized() || interpreter_finalizing() || PyGILState_Check() ||
        PyGILState_GetThisThreadState() == nullptr) {
      read();
      return;
    }
    py::gil_scoped_acquire gil;
    read();
  });

  py::object sample_error = py::reinterpret_steal<py::object>(PyErr_NewExceptionWithDoc(
      "stoker.SampleError",
      "A sample failed to read in native code. `index` is the data set index; the message "
      "names the sample and the reason. (Exceptions raised by a Python __getitem__ keep their "
      "own type instead, with a note naming the sample.)",
      PyExc_RuntimeError, nullptr));
  m.attr("SampleError") = sample_error;
  set_sample_error_type(sample_error);

  py::class_<NativeDataset>(m, "NativeDataset")
      .def("__len__", [](const NativeDataset& d) { return d.dataset->size(); })
      .def_readonly("element_types", &NativeDataset::element_types)
      .def("fields", [](const NativeDataset& d) { return fields_of(*d.dataset, d.element_types); })
      .def("read", &read_sample, py::arg("index"), py::arg("seed") = 0)
      .def("counters", &source_counters)
      .def("object_storage", &object_storage_counters)
      .def("objects", &webdataset_objects)
      .def("storage_layout",
           [](const NativeDataset& d) -> py::object {
             const Dataset::StorageLayout layout = d.dataset->storage_layout();
             if (layout.blocks == nullptr) return py::none();
             py::dict out;
             out["block_ends"] = layout.blocks->ends;
             out["block_bytes"] = layout.blocks->bytes;
             out["shard_ends"] = layout.blocks->object_ends;
             out["cache_bytes"] = layout.cache_bytes;
             return out;
           })
      .def("sample_name",
           [](const NativeDataset& d, std::size_t index) { return d.dataset->sample_name(index); })
      .def("classes", [](const NativeDataset& d) {
        if (!d.source) throw py::type_error("stoker: not an image data set");
        return d.source->classes();
      });

  m.def("array_dataset", &make_array_dataset, py::arg("names"), py::arg("arrays"));
  m.def("to_tensor", &to_tensor, py::arg("pixels"), py::arg("mean") = std::vector<float>{},
        py::arg("std") = std::vector<float>{});
  m.def("image_dataset", &make_image_dataset, py::arg("kind"), py::arg("path"),
        py::arg("transform"), py::arg("cache_bytes"), py::arg("max_pixels"),
        py::arg("index_cache_dir") = "", py::arg("index_cache") = true,
        py::arg("object_cache_dir") = "", py::arg("object_cache_bytes") = 10ull << 30,
        py::arg("known_objects") =
            std::vector<std::tuple<std::string, std::uint64_t, std::string>>{});
  m.def("decode_image", &decode_image_bytes, py::arg("data"), py::arg("transform"), py::arg("seed"),
        py::arg("max_pixels"), py::arg("name"));
  m.def("webdataset", &make_webdataset, py::arg("shards"), py::arg("fields"), py::arg("transform"),
        py::arg("cache_bytes"), py::arg("max_pixels"), py::arg("index_cache_dir"),
        py::arg("index_cache"), py::arg("object_cache_dir"), py::arg("object_cache_bytes"),
        py::arg("known_objects"));
  m.def("webdataset_member", &webdataset_member, py::arg("name"),
        "A tar member's (key, field) as WebDataset groups it, or None for one left out.");
  bind_object_files(m);
  m.def(
      "pack",
      [](const std::string& src, const std::string& dest, std::uint64_t shard_bytes, bool overwrite,
         const py::object& on_progress) {
        PackResult r;
        {
          py::gil_scoped_release nogil;
          PackOptions o;
          o.shard_bytes = shard_bytes;
          o.overwrite = overwrite;
          o.progress = [&on_progress](std::size_t done, std::size_t total, std::uint64_t) {
            // Ctrl-C: KeyboardInterrupt, once pack_image_folder removed its temporary output.
            if (done % 64 != 0 && done != total) return;
            py::gil_scoped_acquire gil;
            if (PyErr_CheckSignals() != 0) throw py::error_already_set();
            if (!on_progress.is_none()) on_progress(done, total);  // (files done, files)
          };
          r = pack_image_folder(src, dest, o);
        }
        return fields_dict(r);
      },
      py::arg("src"), py::arg("dest"), py::arg("shard_bytes"), py::arg("overwrite"),
      py::arg("on_progress") = py::none());
  bind_parquet(m);
  bind_tokens(m);
#ifdef STOKER_HAVE_VIDEO
  bind_video(m);
#endif
  m.def("synthetic_dataset", &make_synthetic_dataset, py::arg("samples"), py::arg("fields"),
        py::arg("latency_s"), py::arg("cpu_work_s"), py::arg("classes"));

  py::class_<PyDataset, std::shared_ptr<PyDataset>>(m, "PyDataset")
      .def(py::init(&PyDataset::make), py::arg("dataset"), py::arg("whole_sample"),
           py::arg("on_worker_start"))
      .def("__len__", &PyDataset::size)
      .def_property_readonly("fields_known", &PyDataset::fields_known)
      .def("structure", &PyDataset::structure)
      .def("fields", [](const PyDataset& d) { return fields_of(d, {}); })
      .def("row_bytes",
           [](const PyDataset& d) {
             std::vector<std::size_t> bytes;
             for (const auto& f : d.fields()) bytes.push_back(f.bytes());
             return bytes;
           })
      .def("layout_message", &PyDataset::layout_message)
      .def("gil_stats", &PyDataset::gil_stats)
      .def("set_batch_jobs", &PyDataset::set_batch_jobs, py::arg("job_args"));

  // Worker processes (py_workers.h): the parent's pool and the worker's writer.
  py::object worker_error = py::reinterpret_steal<py::object>(PyErr_NewExceptionWithDoc(
      "stoker.WorkerError",
      "A DataLoader worker process died (killed, crashed, exited) reading samples that had "
      "already killed the worker before it (a worker that dies once is replaced and its "
      "samples read again); the message names its pid, the signal or exit code, and the "
      "samples lost. `pid` is set.",
      sample_error.ptr(), nullptr));
  m.attr("WorkerError") = worker_error;
  set_worker_error_type(worker_error);
  py::class_<ProcessPool, std::shared_ptr<ProcessPool>>(m, "ProcessPool")
      .def(py::init<py::object, py::object, py::object, py::object, std::size_t>(),
           py::arg("spawn"), py::arg("decode"), py::arg("reap"), py::arg("exitcode"),
           py::arg("workers"))
      .def("start", &ProcessPool::start)
      .def("pids", &ProcessPool::pids)
      .def("deaths", &ProcessPool::deaths, py::call_guard<py::gil_scoped_release>())
      .def("finish", &ProcessPool::finish)
      .def("call", &ProcessPool::call, py::arg("worker_id"), py::arg("index"), py::arg("args"))
      .def("stop", &ProcessPool::stop)
      .def("retire", &ProcessPool::retire, py::arg("keep"))
      .def(
          "resident_bytes", [](ProcessPool& pool) { return pool.times().resident_bytes; },
          py::call_guard<py::gil_scoped_release>(),
          "The workers' own memory now: the sum of their Pss_Anon estimates.")
      .def_property_readonly("size", &ProcessPool::size);
  // The worker protocol's numbers (docs/worker_protocol.md), for the Python end.
  {
    py::dict kinds, bytes;
    kinds["kJob"] = +wire::kJob;
    kinds["kMap"] = +wire::kMap;
    kinds["kDrop"] = +wire::kDrop;
    kinds["kLayout"] = +wire::kLayout;
    kinds["kProbe"] = +wire::kProbe;
    kinds["kResult"] = +wire::kResult;
    bytes["header"] = wire::kHeaderBytes;
    bytes["kJob"] = wire::kJobBytes;
    bytes["job field"] = wire::kFieldBytes;
    bytes["job row"] = wire::kRowBytes;
    bytes["kMap"] = wire::kMapBytes;
    bytes["kDrop"] = wire::kDropBytes;
    bytes["kProbe"] = wire::kProbeBytes;
    bytes["kResult"] = wire::kResultBytes;
    bytes["result time"] = wire::kTimeBytes;
    py::dict w;
    w["kinds"] = kinds;
    w["bytes"] = bytes;
    w["kTimeRows"] = wire::kTimeRows;
    w["kArgsShift"] = wire::kArgsShift;
    m.attr("WORKER_WIRE") = w;
  }
  py::class_<SampleWriter>(m, "SampleWriter")
      .def(py::init<>())
      .def("set_layout", &SampleWriter::set_layout, py::arg("description"), py::arg("slots"))
      .def_static("read_sample", &SampleWriter::read_sample, py::arg("dataset"), py::arg("index"),
                  py::arg("seed"), py::arg("use_getitems"))
      .def("map", &SampleWriter::map, py::arg("region"), py::arg("fd"), py::arg("bytes"))
      .def("drop", &SampleWriter::drop, py::arg("region"))
      .def("run_job", &SampleWriter::run_job, py::arg("job"), py::arg("dataset"),
           py::arg("use_getitems"));
  m.def(
      "inherited_fds",
      [] {
        std::vector<int> out = detail::shared_region_fds();
        const auto sockets = ProcessPool::all_fds();
        out.insert(out.end(), sockets.begin(), sockets.end());
        return out;
      },
      "The slab memfds and worker sockets of this process, which a forked worker closes.");
  m.def(
      "stream_copy",
      [](const py::buffer& dest, std::size_t offset, std::uintptr_t src, std::size_t bytes) {
        const py::buffer_info info = dest.request(/*writable=*/true);
        const auto size = static_cast<std::size_t>(info.size * info.itemsize);
        if (offset > size || bytes > size - offset) {
          throw py::value_error("stoker: stream_copy past the end of its destination");
        }
        py::gil_scoped_release unlocked;
        detail::stream_copy(static_cast<std::byte*>(info.ptr) + offset,
                            reinterpret_cast<const std::byte*>(src), bytes);
      },
      py::arg("dest"), py::arg("offset"), py::arg("src"), py::arg("bytes"),
      "Copies `bytes` from address `src` (a contiguous array's data, which the caller keeps "
      "alive) to `offset` of the writable buffer `dest`, bypassing the cache (a batch written "
      "into shared memory is read by another process, later).");

  py::class_<RawBatch>(m, "RawBatch")
      .def_property_readonly("epoch", &RawBatch::epoch)
      .def_property_readonly("number", &RawBatch::number)
      .def_property_readonly("size", &RawBatch::size)
      .def("capsules", &RawBatch::capsules)
      .def("arrays", &RawBatch::arrays)
      .def_property_readonly("objects", &RawBatch::objects)
      .def("indices", &RawBatch::indices)
      .def("skipped", &RawBatch::skipped)
      .def("release", &RawBatch::release)
      .def("take", &RawBatch::take, py::arg("as_arrays"))
      .def_property_readonly("released", &RawBatch::released);

  bind_options(m);
  py::enum_<LogLevel>(m, "LogLevel")
      .value("debug", LogLevel::debug)
      .value("info", LogLevel::info)
      .value("warning", LogLevel::warning);
  m.def("set_log_level", &set_log_level, py::arg("level"),
        "Drops stoker's C++ log lines below `level` (default info, debug with "
        "STOKER_LOG=debug).");
  m.def("log_level", &log_level);
  m.def(
      "route_log_lines", [](bool on) { log_queue().route(on); }, py::arg("on"),
      py::call_guard<py::gil_scoped_release>(),
      "True: C++ log lines are queued for take_log_lines() (stoker/logs.py hands them to the "
      "`stoker` logger); False: written to stderr (the default).");
  m.def(
      "log_lines_pending", [] { return log_queue().pending(); },
      "Whether take_log_lines() has lines (one atomic read).");
  m.def(
      "log_line", [](LogLevel level, const std::string& message) { detail::log(level, message); },
      py::arg("level"), py::arg("message"), py::call_guard<py::gil_scoped_release>(),
      "One line to stoker's C++ log, as the engine logs (for tests).");
  m.def(
      "take_log_lines", [] { return log_queue().take(); },
      "The queued C++ log lines as (LogLevel, message), oldest first.");
  m.def("stats_fields", &stats_fields);
  // Every struct that crosses as a dict, by the keys of its field table (fields.h).
  py::dict tables;
  tables["Stats"] = stats_fields();
  tables["Report"] = field_names<Report>();
  tables["CudaInfo"] = field_names<CudaInfo>();
  tables["PackResult"] = field_names<PackResult>();
  tables["SourceCounters"] = field_names<EncodedSource::Counters>();
  tables["ObjectStorageCounters"] = field_names<ObjectStorageCounters>();
  m.attr("FIELDS") = tables;

  // This process's share of the machine and the workers `auto` may grow to on it: one rule
  // with the engine's tuner (stoker/frontend/host_share.h).
  m.def(
      "host_share",
      [] {
        const auto h = detail::host_share();
        return py::make_tuple(h.cores, h.cpu_share);
      },
      "(the cores this process may run on, its share of them among LOCAL_WORLD_SIZE ranks).");
  m.def("default_max_workers", &detail::default_max_workers, py::arg("cpu_share"),
        py::arg("python_reads"), "The most worker threads num_workers='auto' may grow to.");
  m.def("share_object_caches", &detail::share_object_caches,
        "This process reads its object caches beside others that read the same blocks "
        "(stoker/frontend/object_files.h).");

  // The front end's decisions about kinds of worker (src/tune/worker_kind.cc).
  m.def(
      "gil_bound",
      [](double busy, double on_cpu, double delayed) {
        const auto v = detail::gil_bound(busy, on_cpu, delayed);
        return py::make_tuple(v.bound, v.scale);
      },
      py::arg("busy"), py::arg("on_cpu"), py::arg("delayed"),
      "(GIL-bound, the scale applied for the threads' waits for a core).");
  m.def(
      "choose_worker_kind",
      [](double busy, double on_cpu, double delayed, bool whole_batches, std::size_t threads,
         std::size_t cores) {
        const auto c =
            detail::choose_worker_kind(busy, on_cpu, delayed, whole_batches, threads, cores);
        return py::make_tuple(c.processes, c.reason);
      },
      py::arg("busy"), py::arg("on_cpu"), py::arg("delayed"), py::arg("whole_batches"),
      py::arg("threads"), py::arg("cores"), "worker_type='auto': (processes, the reason).");
  m.def(
      "choose_stream_workers",
      [](double read, double step, double pack, double unpack, std::size_t cores, bool shards) {
        const auto c = detail::choose_stream_workers(
            {.read = read, .step = step, .pack = pack, .unpack = unpack}, cores, shards);
        return py::make_tuple(c.workers, c.reason);
      },
      py::arg("read"), py::arg("step"), py::arg("pack"), py::arg("unpack"), py::arg("cores"),
      py::arg("shards"),
      "A stream on auto, from epoch 1 read in-line: (workers from epoch 2, the reason).");
  m.def(
      "choose_stream_threads",
      [](double read, double step, double pack, double unpack, double read_wait, std::size_t cores,
         bool shards) {
        const auto t = detail::choose_stream_threads(
            {.read = read, .step = step, .pack = pack, .unpack = unpack}, read_wait, cores, shards);
        return py::make_tuple(t.threads, t.reason);
      },
      py::arg("read"), py::arg("step"), py::arg("pack"), py::arg("unpack"), py::arg("read_wait"),
      py::arg("cores"), py::arg("shards"),
      "A stream on auto whose reads wait, from epoch 1 read in-line: (worker threads from "
      "epoch 2, 0 for none; the reason).");
  m.def(
      "stream_thread_trial",
      [](double read, double step, double pack, double unpack, std::size_t cores,
         std::size_t workers) {
        const auto t = detail::stream_thread_trial(
            {.read = read, .step = step, .pack = pack, .unpack = unpack}, cores, workers);
        return py::make_tuple(t.threads, t.reason);
      },
      py::arg("read"), py::arg("step"), py::arg("pack"), py::arg("unpack"), py::arg("cores"),
      py::arg("workers"),
      "Where the models leave a stream in-line, for good (workers 0) or for now (`workers` "
      "processes not yet worth their start): (1 to try one worker thread from the next epoch, "
      "else 0; the reason).");
  m.def(
      "deeper_stream_depth",
      [](std::size_t depth, std::size_t batches, std::size_t blocked) {
        const auto d = detail::deeper_stream_depth(depth, batches, blocked);
        return py::make_tuple(d.depth, d.reason);
      },
      py::arg("depth"), py::arg("batches"), py::arg("blocked"),
      "A stream's queue depth after a window of `batches` taken, `blocked` of them waited for "
      "while another worker had batches ready: (depth from now on, why it grew or '').");
  m.attr("STREAM_DEPTH_WINDOW") = detail::kStreamDepthWindow;
  m.attr("STREAM_MIN_BATCHES") = detail::kStreamMinBatches;
  m.def(
      "stream_worth_starting",
      [](double read, double step, double pack, double unpack, std::size_t workers,
         std::size_t cores, double batches_per_epoch, std::size_t epochs, double start_s) {
        const auto v =
            detail::worth_starting({.read = read, .step = step, .pack = pack, .unpack = unpack},
                                   workers, cores, batches_per_epoch, epochs, start_s);
        return py::make_tuple(v.start, v.reason);
      },
      py::arg("read"), py::arg("step"), py::arg("pack"), py::arg("unpack"), py::arg("workers"),
      py::arg("cores"), py::arg("batches_per_epoch"), py::arg("epochs"), py::arg("start_s"),
      "Whether the epochs read in-line lost, by the model, what starting `workers` processes "
      "costs: (start, the reason's clause).");
  m.attr("PROCESS_START_SECONDS") = detail::kProcessStartSeconds;
  m.attr("BACKGROUND_START_SECONDS") = detail::kBackgroundStartSeconds;
  m.attr("CHECK_MIN_BATCHES") = detail::kCheckMinBatches;
  m.attr("CHECK_MIN_SECONDS") = detail::kCheckMinSeconds;
  m.attr("CHECK_START_SECONDS") = detail::kCheckStartSeconds;
  m.def(
      "learn_handover",
      [](double read, double step, double pack, double unpack, std::size_t workers,
         std::size_t cores, double measured) {
        const auto l = detail::learn_handover(
            {.read = read, .step = step, .pack = pack, .unpack = unpack}, workers, cores, measured);
        return py::make_tuple(l.pack, l.unpack);
      },
      py::arg("read"), py::arg("step"), py::arg("pack"), py::arg("unpack"), py::arg("workers"),
      py::arg("cores"), py::arg("measured"),
      "The hand-over (pack, unpack) a batch that makes the model's time with `workers` "
      "processes the `measured` one (unchanged when the model was not too fast).");
  // Measure after deciding: a setting's delivered batches, and the check of a switch.
  py::class_<detail::Window>(m, "Window")
      .def(py::init<>())
      .def("add", &detail::Window::add, py::arg("seconds"),
           "A batch delivered `seconds` after the one before it.")
      .def_readonly("batches", &detail::Window::batches)
      .def_readonly("seconds", &detail::Window::seconds)
      .def("mean", &detail::Window::mean)
      .def("longest", &detail::Window::longest,
           "kCheckMostWindows windows: a setting left is measured no further.");
  py::class_<detail::SettingWindows>(m, "SettingWindows")
      .def(py::init<>())
      .def("add", &detail::SettingWindows::add, py::arg("seconds"))
      .def("epoch_end", &detail::SettingWindows::epoch_end)
      .def_readonly("epochs", &detail::SettingWindows::epochs)
      .def_property_readonly(
          "warm", [](const detail::SettingWindows& s) { return s.warm; },
          "Its batches after its first epoch (a copy).")
      .def_property_readonly(
          "compared", [](const detail::SettingWindows& s) { return s.compared(); },
          "The window a check compares with: from the second epoch on once it holds enough "
          "batches, else all (a copy).");
  const auto verdict_tuple = [](const detail::SwitchCheck& c) {
    const char* verdict = c.verdict == detail::SwitchVerdict::measuring ? "measuring"
                          : c.verdict == detail::SwitchVerdict::keep    ? "keep"
                                                                        : "go back";
    return py::make_tuple(verdict, c.reason);
  };
  m.def(
      "check_switch",
      [verdict_tuple](const detail::Window& before, const detail::Window& after,
                      const std::string& left, const std::string& now) {
        return verdict_tuple(detail::check_switch(before, after, left, now));
      },
      py::arg("before"), py::arg("after"), py::arg("left"), py::arg("now"),
      "After a switch from `left` to `now`: ('measuring' | 'keep' | 'go back', the reason, "
      "naming both measured times a batch).");
  m.def(
      "check_switch",
      [verdict_tuple](const detail::SettingWindows& before, const detail::Window& after,
                      const std::string& left, const std::string& now) {
        return verdict_tuple(detail::check_switch(before, after, left, now));
      },
      py::arg("before"), py::arg("after"), py::arg("left"), py::arg("now"),
      "The same, `left` compared warm: from its second epoch on (SettingWindows).");
  m.def(
      "inline_trial",
      [](double read_s, double step_s, const detail::Window& now, const std::string& now_name) {
        const auto t = detail::inline_trial(read_s, step_s, now, now_name);
        return py::make_tuple(t.trial, t.reason);
      },
      py::arg("read_s"), py::arg("step_s"), py::arg("now"), py::arg("now_name"),
      "After auto settled on `now_name` with GIL-bound reads: (whether to try in-line, the "
      "reason's clause).");
  // A stream's share of the memory cap (stoker/frontend/memory_cap.h; stream_pipeline.py).
  m.attr("HELD_BATCHES") = detail::kHeldBatches;
  py::class_<detail::StreamMemoryCap>(m, "StreamMemoryCap")
      .def(py::init([](std::size_t limit, std::size_t depth) {
             return std::make_unique<detail::StreamMemoryCap>(
                 limit != 0 ? limit : detail::default_memory_limit(detail::mem_available()), depth);
           }),
           py::arg("limit"), py::arg("depth"), "limit 0: half of MemAvailable, as the engine's.")
      .def_property_readonly("limit", &detail::StreamMemoryCap::limit)
      .def("want", &detail::StreamMemoryCap::want, py::arg("depth"),
           "The depth asked for from now on (prefetch_factor, or deeper_stream_depth's); the "
           "cap may hold each queue lower.")
      .def("due", &detail::StreamMemoryCap::due)
      .def("set_workers", &detail::StreamMemoryCap::set_workers, py::arg("workers"),
           py::arg("processes"))
      .def(
          "look",
          [](detail::StreamMemoryCap& cap, std::size_t batch_bytes, std::size_t batches,
             std::size_t workers, std::size_t buffers) {
            const auto look = cap.look(batch_bytes, batches, workers, buffers);
            py::dict out;
            out["depth"] = look.depth;
            out["too_small"] = look.too_small;
            out["warn"] = look.warn;
            out["message"] = look.message;
            out["line"] = cap.line(look);
            out["memory_limit"] = cap.limit();
            out["memory_used"] = look.used;
            out["memory_peak"] = std::max(cap.peak(), look.used);
            out["memory_batches"] = look.use.slabs;
            out["memory_workers"] = look.use.workers;
            out["memory_buffers"] = look.use.buffers;
            return out;
          },
          py::arg("batch_bytes"), py::arg("batches"), py::arg("workers"), py::arg("buffers"),
          "A look at what the stream holds: its queues' depth from now on, and the numbers.");
  m.def("next_remote_workers", &detail::next_remote_workers, py::arg("active"), py::arg("count"),
        py::arg("wait_fraction"), py::arg("local_load"), py::arg("remote_busy") = py::none());
  py::class_<detail::WorkerKindChooser>(m, "WorkerKindChooser")
      .def(py::init<bool>(), py::arg("whole_batches"))
      .def(
          "observe",
          [](detail::WorkerKindChooser& c, PyLoader& loader, std::optional<std::size_t> threads,
             std::size_t cores, double pack, double unpack, double measuring) -> py::object {
            const Stats s = loader.typed_stats();
            const auto d = c.observe(s, loader.thread_reads(), threads.value_or(s.workers), cores,
                                     pack, unpack, measuring);
            if (!d) return py::none();
            const auto& k = d->costs;
            return py::make_tuple(d->processes, d->reason, d->workers, d->workers_reason,
                                  py::make_tuple(k.read, k.step, k.pack, k.unpack), d->gil_bound);
          },
          py::arg("loader"), py::arg("threads"), py::arg("cores"), py::arg("pack") = 0.0,
          py::arg("unpack") = 0.0, py::arg("measuring") = 0.0,
          "After each batch handed out: None while measuring, then (processes, the reason, how "
          "many processes, why so many, the costs per batch measured on the threads: (read, "
          "step, pack, unpack), whether the reads are GIL-bound). `threads`: the threads "
          "reading here (None: the loader's workers); `pack`, `unpack`: a batch's hand-over, "
          "seconds (batch jobs'); `measuring`: the loop's CPU seconds spent timing it.");
  m.def(
      "processes_to_keep",
      [](py::tuple costs, double warm_read, std::size_t started, std::size_t cores) {
        return detail::processes_to_keep({.read = costs[0].cast<double>(),
                                          .step = costs[1].cast<double>(),
                                          .pack = costs[2].cast<double>(),
                                          .unpack = costs[3].cast<double>()},
                                         warm_read, started, cores);
      },
      py::arg("costs"), py::arg("warm_read"), py::arg("started"), py::arg("cores"),
      "After the worker processes' warm-up: (how many of the `started` to keep, the reason's "
      "clause). `costs`: WorkerKindChooser.observe's; `warm_read`: a warm process's CPU "
      "seconds a batch.");
  py::class_<detail::RemoteWorkerTuner>(m, "RemoteWorkerTuner")
      .def(py::init<>())
      .def("due", &detail::RemoteWorkerTuner::due)
      .def(
          "observe",
          [](detail::RemoteWorkerTuner& t, PyLoader& loader, std::size_t local_workers,
             std::size_t active, std::size_t count) -> py::object {
            const auto d = t.observe(loader.typed_stats(), local_workers, active, count);
            if (!d) return py::none();
            return py::make_tuple(d->active, d->wait, d->load);
          },
          py::arg("loader"), py::arg("local_workers"), py::arg("active"), py::arg("count"),
          "(remote workers to use, the loop's wait share, the local workers' load), or None.");
  m.attr("TRACE_MAX_EVENTS") = TraceOptions{}.max_events;

  // Where batches are delivered, as a value (stoker/device.h): Python asks it, never parses
  // the name itself.
  py::enum_<DeviceKind>(m, "DeviceKind")
      .value("cpu", DeviceKind::cpu)
      .value("cuda", DeviceKind::cuda)
      .value("sim", DeviceKind::sim);
  py::class_<Device>(m, "Device")
      .def(py::init(&parse_device), py::arg("name"))
      .def_readonly("kind", &Device::kind)
      .def_readonly("index", &Device::index)
      .def_property_readonly("is_cuda", &Device::is_cuda)
      .def(py::self == py::self)  // NOLINT(misc-redundant-expression)
      .def("__str__", [](const Device& d) { return to_string(d); })
      .def("__repr__", [](const Device& d) { return "Device('" + to_string(d) + "')"; });
  py::class_<PyLoader>(m, "Loader")
      .def(py::init(&make_loader), py::arg("dataset"), py::arg("options"), py::arg("order"),
           py::arg("shared_slabs") = false)
      .def("next", &PyLoader::next, py::arg("timeout") = 0.0)
      .def("device", [](PyLoader& l) { return parse_device(l.typed_stats().device); })
      .def("set_epoch", &PyLoader::set_epoch, py::arg("epoch"))
      .def("restore", &PyLoader::restore, py::arg("epoch"), py::arg("batch"))
      .def("restart_fresh", &PyLoader::restart_fresh, py::arg("epoch"))
      .def(
          "resume",
          [](PyLoader& l, std::uint64_t epoch, const py::object& order, std::size_t batch) {
            l.resume(epoch, to_indices(order, "order"), batch);
          },
          py::arg("epoch"), py::arg("order"), py::arg("batch"))
      .def(
          "order_ahead",
          [](PyLoader& l, std::uint64_t epoch, const py::object& order) {
            return l.order_ahead(epoch, to_indices(order, "order"));
          },
          py::arg("epoch"), py::arg("order"),
          "A later epoch's order given before it opens (Loader::order_ahead); False if late.")
      .def("thread_reads", &PyLoader::thread_reads,
           "Samples (or batch jobs) read on this process's threads so far.")
      .def("batches_in", &PyLoader::batches_in, py::arg("epoch"))
      .def_property_readonly("shuffle_window", &PyLoader::shuffle_window)
      .def_property_readonly("shuffle_nodes",
                             [](const PyLoader& l) {
                               const NodeLayout n = l.shuffle_nodes();
                               return py::make_tuple(n.nodes, n.ranks);
                             })
      .def(
          "resumed_order",
          [](PyLoader& l, std::uint64_t epoch, const PositionRanges& consumed,
             std::pair<std::size_t, std::size_t> nodes) {
            if (nodes.first == 0 || nodes.second == 0) {
              throw py::value_error("stoker: a state's shuffle_nodes must be positive");
            }
            const auto order = l.resumed_order(epoch, consumed, {nodes.first, nodes.second});
            py::array_t<std::int64_t> out(static_cast<py::ssize_t>(order.size()));
            std::copy(order.begin(), order.end(), out.mutable_data());
            return out;
          },
          py::arg("epoch"), py::arg("consumed"), py::arg("nodes"),
          "This rank's rest of `epoch` after `consumed`, the order laid out over `nodes` "
          "(nodes, ranks a node): the layout the epoch began on.")
      .def("position", &PyLoader::position)
      .def("set_order",
           [](PyLoader& l, const py::object& order) {
             if (!l.remap()) throw py::value_error("stoker: this loader has no custom order");
             l.remap()->set_order(to_indices(order, "order"));
           })
      .def_property_readonly("batches_per_epoch", &PyLoader::batches_per_epoch)
      .def_property_readonly("samples_per_epoch", &PyLoader::samples_per_epoch)
      .def("set_workers", &PyLoader::set_workers, py::arg("workers"))
      .def("use_processes", &PyLoader::use_processes, py::arg("pool"))
      .def("use_threads", &PyLoader::use_threads)
      .def("use_remote", &PyLoader::use_remote, py::arg("remote"))
      .def("set_depth", &PyLoader::set_depth, py::arg("depth"))
      .def("stats", &PyLoader::stats)
      .def("report", &PyLoader::report)
      .def("skipped_samples", &PyLoader::skipped_samples)
      .def("trace", &PyLoader::trace, py::arg("path"),
           py::arg("max_events") = TraceOptions{}.max_events)
      .def("close", &PyLoader::close)
      .def_property_readonly("closed", &PyLoader::closed);

  m.def(
      "epoch_order",
      [](std::size_t size, bool shuffle, std::uint64_t seed, std::uint64_t epoch, std::size_t rank,
         std::size_t world_size, bool drop_last) {
        std::vector<std::size_t> order;
        {
          py::gil_scoped_release nogil;
          order =
              epoch_order(SampleOrder{size, shuffle, seed, {rank, world_size, drop_last}}, epoch);
        }
        py::array_t<std::int64_t> out(static_cast<py::ssize_t>(order.size()));
        std::copy(order.begin(), order.end(), out.mutable_data());
        return out;
      },
      py::arg("size"), py::arg("shuffle"), py::arg("seed"), py::arg("epoch"), py::arg("rank"),
      py::arg("world_size"), py::arg("drop_last"));

  // Elastic resume (stoker/sampler.h): position ranges as lists of (begin, end) pairs.
  m.def(
      "consumed_positions",
      [](std::size_t samples, const PositionRanges& before, const std::vector<std::size_t>& taken,
         bool drop_last) { return consumed_positions(samples, before, taken, drop_last); },
      py::arg("samples"), py::arg("before"), py::arg("taken"), py::arg("drop_last"));
  m.def(
      "resumed_order",
      [](std::size_t size, bool shuffle, std::uint64_t seed, std::uint64_t epoch, std::size_t rank,
         std::size_t world_size, bool drop_last, const PositionRanges& consumed) {
        std::vector<std::size_t> order;
        {
          py::gil_scoped_release nogil;
          resumed_order(SampleOrder{size, shuffle, seed, {rank, world_size, drop_last}}, epoch,
                        consumed, order);
        }
        py::array_t<std::int64_t> out(static_cast<py::ssize_t>(order.size()));
        std::copy(order.begin(), order.end(), out.mutable_data());
        return out;
      },
      py::arg("size"), py::arg("shuffle"), py::arg("seed"), py::arg("epoch"), py::arg("rank"),
      py::arg("world_size"), py::arg("drop_last"), py::arg("consumed"));

  // What a user trades between shuffles (stoker/frontend/shuffle_choice.h).
  m.def(
      "shuffle_quality",
      [](const std::vector<std::size_t>& order, const std::vector<std::size_t>& shard_ends,
         const std::vector<std::int64_t>& labels, std::size_t batch_size) {
        ShuffleQuality q;
        {
          py::gil_scoped_release nogil;
          q = shuffle_quality(order, shard_ends, labels, batch_size);
        }
        py::dict out;
        out["sample_entropy"] = q.sample_entropy;
        out["shard_entropy"] = q.shard_entropy;
        out["labels_per_batch"] = q.labels_per_batch;
        out["iid_labels_per_batch"] = q.iid_labels_per_batch;
        return out;
      },
      py::arg("order"), py::arg("shard_ends") = std::vector<std::size_t>{},
      py::arg("labels") = std::vector<std::int64_t>{}, py::arg("batch_size") = 0);
  m.def(
      "shuffle_report",
      [](const py::object& dataset, std::size_t samples, ShuffleMode asked, std::uint64_t seed,
         std::uint64_t epoch, std::size_t batch_size, std::vector<std::int64_t> labels,
         std::vector<std::size_t> buffers, std::optional<std::uint64_t> cache_bytes) {
        const Dataset::StorageLayout layout =
            dataset.is_none() ? Dataset::StorageLayout{}
                              : dataset.cast<const NativeDataset&>().dataset->storage_layout();
        detail::ShuffleReportOptions o;
        o.asked = asked;
        o.seed = seed;
        o.epoch = epoch;
        o.batch_size = batch_size;
        o.labels = std::move(labels);
        o.buffers = std::move(buffers);
        if (cache_bytes) o.cache_bytes = *cache_bytes;
        detail::ShuffleReport r;
        {
          py::gil_scoped_release nogil;
          r = detail::shuffle_report(layout, samples, o);
        }
        py::list rows;
        for (const auto& row : r.rows) {
          py::dict d;
          d["order"] = row.name;
          d["sample_entropy"] = row.quality.sample_entropy;
          d["shard_entropy"] = row.quality.shard_entropy;
          d["labels_per_batch"] = row.quality.labels_per_batch;
          d["iid_labels_per_batch"] = row.quality.iid_labels_per_batch;
          rows.append(d);
        }
        py::dict out;
        out["samples"] = r.samples;
        out["shards"] = r.shards;
        out["blocks"] = r.blocks;
        out["data_bytes"] = r.data_bytes;
        out["cache_bytes"] = r.cache_bytes;
        out["window"] = r.choice.window;
        out["shuffle"] = r.choice.reason;
        out["rows"] = rows;
        out["text"] = detail::to_string(r);
        return out;
      },
      py::arg("dataset"), py::arg("samples"), py::arg("asked"), py::arg("seed"), py::arg("epoch"),
      py::arg("batch_size"), py::arg("labels"), py::arg("buffers"), py::arg("cache_bytes"));

  bind_seeding(m);
  m.def("sample_seed", &current_sample_seed,
        "The seed of the sample being read on this thread: inside __getitem__ the sample's, "
        "inside __getitems__ the call's first sample's; None outside a read.");
  m.def("sample_epoch", &current_sample_epoch,
        "The epoch the sample being read on this thread is for, or None outside a read.");
  m.def(
      "version", [] { return std::string(stoker::version()); },
      "The C++ library's version (CMake's project version).");
  m.def(
      "cuda_info",
      [] {
        CudaInfo info;
        {
          // The first call loads the runtime and initializes the driver: seconds, at worst.
          py::gil_scoped_release release;
          info = stoker::cuda_info();
        }
        return fields_dict(info, EmptyString::none);  // no library, no reason: None
      },
      "What the search for the CUDA runtime found (stoker::cuda_info), loading it on the first "
      "call.");
  m.def("add_cuda_runtime_hints", &detail::add_cuda_runtime_hints, py::arg("dirs"),
        "Directories to search for libcudart before the system's, if no search was made yet.");
  m.def("close_all", &PyLoader::close_all,
        "Closes every open loader (the package calls it at exit).");
  m.def("abandon_all_after_fork", &PyLoader::abandon_all_after_fork,
        "Forgets every loader without stopping it (in a forked child, whose threads are gone).");
}
