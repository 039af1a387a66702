#include "py_workers.h"

#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <iterator>
#include <string_view>
#include <utility>

#include "gil.h"
#include "py_dataset.h"
#include "row_reader.h"
#include "stoker/frontend/log.h"
#include "stoker/frontend/schedstat.h"
#include "stoker/frontend/tracer.h"
#include "worker_socket.h"

namespace stoker::python {
namespace {

using namespace wire;

PyObject* g_worker_error_type = nullptr;

std::string rows_text(std::span<const std::size_t> indices) {
  std::string s;
  for (std::size_t k = 0; k < indices.size() && k < 16; ++k) {
    if (k) s += ", ";
    s += std::to_string(indices[k]);
  }
  if (indices.size() > 16) s += ", ... (" + std::to_string(indices.size()) + " in all)";
  return s;
}

}  // namespace

void set_worker_error_type(py::handle type) {
  Py_XINCREF(type.ptr());
  Py_XDECREF(g_worker_error_type);
  g_worker_error_type = type.ptr();
}

py::handle worker_error_type() { return g_worker_error_type; }

// --- ProcessPool ---------------------------------------------------------------------------

ProcessPool::ProcessPool(py::object spawn, py::object decode, py::object reap, py::object exitcode,
                         std::size_t workers)
    : workers_(std::max<std::size_t>(workers, 1)),
      owner_pid_(getpid()),
      spawn_(std::move(spawn)),
      decode_(std::move(decode)),
      reap_(std::move(reap)),
      exitcode_(std::move(exitcode)),
      memory_(std::make_unique<detail::AnonMemorySampler>()) {
  for (std::size_t i = 0; i < workers_; ++i) {
    auto link = std::make_unique<Link>();
    link->id = i;
    link->dead = true;  // not started yet
    links_.push_back(std::move(link));
  }
}

ProcessPool::~ProcessPool() {
  if (getpid() != owner_pid_) {
    // A forked worker's copy: the sockets are the parent's (closed by the worker at start);
    // nothing here is ours to stop. The memory sampler's thread is not in this process:
    // destroying its std::thread, joinable in the copy, would abort.
    (void)spawn_.release();
    (void)decode_.release();
    (void)reap_.release();
    (void)exitcode_.release();
    (void)memory_.release();
    return;
  }
  try {
    finish();
  } catch (...) {
    // A destructor must not throw; reap() failing leaves the rest to multiprocessing's exit
    // handler, which terminates daemonic children.
  }
}

void ProcessPool::start() {
  std::vector<Link*> dead;
  {
    detail::MutexLock lock(mu_);
    for (auto& link : links_) {
      if (link->dead) dead.push_back(link.get());
    }
  }
  for (Link* link : dead) respawn(*link);
}

py::list ProcessPool::pids() {
  py::list out;
  detail::MutexLock lock(mu_);
  for (const auto& link : links_) out.append(link->dead ? 0 : link->pid);
  return out;
}

std::vector<int> ProcessPool::all_fds() { return tracked_fds(); }

void ProcessPool::respawn(Link& link) {
  if (stopping()) throw std::runtime_error("stoker: the loader is closing");
  py::tuple started;
  {
    std::optional<ForkGate::Closed> closed;  // no engine thread inside Python (gil.h, rule 5)
    {
      py::gil_scoped_release unlocked;
      closed.emplace();
    }
    started = spawn_(link.id);
  }
  const int fd = started[0].cast<int>();
  const pid_t pid = started[1].cast<pid_t>();
  // Its memory at start (a fork's: all shared with the training process), read at once.
  if (link.pid > 0) memory_->remove(link.pid);
  memory_->add(pid);
  track_fd(fd);
  close_fd(std::exchange(link.fd, -1));
  detail::MutexLock lock(mu_);
  link.fd = fd;
  link.pid = pid;
  link.dead = false;
  link.regions.clear();
  link.has_layout = false;
  if (stopped_) {
    // stop() ran while this worker started: it was not among those it told to stop.
    shutdown(fd, SHUT_RDWR);
    kill(pid, SIGTERM);
  }
}

ProcessPool::Link* ProcessPool::lease(std::optional<std::size_t> only) {
  Link* dead = nullptr;
  {
    detail::MutexLock lock(mu_);
    while (dead == nullptr) {
      if (stopped_) throw std::runtime_error("stoker: the loader is closing");
      for (auto& link : links_) {
        if (link->busy || (only && link->id != *only)) continue;
        if (!link->dead) {
          link->busy = true;
          return link.get();
        }
        if (dead == nullptr) dead = link.get();
      }
      if (dead == nullptr) lock.wait(free_cv_);
    }
    dead->busy = true;
  }
  try {
    EngineThreadGil gil;
    respawn(*dead);
  } catch (...) {
    give_back(dead, true);
    throw;
  }
  return dead;
}

void ProcessPool::give_back(Link* link, bool dead) {
  {
    detail::MutexLock lock(mu_);
    link->busy = false;
    if (dead) link->dead = true;
  }
  free_cv_.notify_all();  // a call may wait for this worker in particular
}

bool ProcessPool::exchange(Link& link, const std::vector<std::uint8_t>& job,
                           std::uint32_t region_id, int region_fd, std::size_t region_bytes,
                           std::vector<std::uint8_t>& status, std::vector<std::int64_t>& times,
                           std::vector<std::uint8_t>& blob) {
  // Regions freed since this worker mapped them (slabs trimmed): let it unmap them.
  for (auto it = link.regions.begin(); it != link.regions.end();) {
    if (detail::shared_region_alive(*it)) {
      ++it;
      continue;
    }
    std::vector<std::uint8_t> payload;
    put(payload, *it);
    const auto m = message(kDrop, payload);
    if (!send_all(link.fd, m.data(), m.size())) return false;
    it = link.regions.erase(it);
  }
  if (region_fd >= 0 && !link.regions.contains(region_id)) {
    std::vector<std::uint8_t> payload;
    put(payload, region_id);
    put(payload, std::uint32_t{0});
    put(payload, static_cast<std::uint64_t>(region_bytes));
    const auto m = message(kMap, payload);
    if (!send_all(link.fd, m.data(), m.size(), region_fd)) return false;
    link.regions.insert(region_id);
  }
  if (region_fd >= 0 && !link.has_layout) {  // a call (no region) writes no rows
    std::vector<std::uint8_t> layout;
    {
      detail::MutexLock lock(mu_);
      layout = layout_message_;
    }
    const auto m = message(kLayout, layout);
    if (!send_all(link.fd, m.data(), m.size())) return false;
    link.has_layout = true;
  }
  const auto m = message(kJob, job);
  if (!send_all(link.fd, m.data(), m.size())) return false;
  return receive_result(link, status, times, blob);
}

bool ProcessPool::receive_result(Link& link, std::vector<std::uint8_t>& status,
                                 std::vector<std::int64_t>& times,
                                 std::vector<std::uint8_t>& blob) {
  std::uint8_t header[kHeaderBytes];
  if (!recv_all(link.fd, header, sizeof header)) return false;
  if (get<std::uint32_t>(header) != kResult) return false;
  std::vector<std::uint8_t> payload(get<std::uint32_t>(header + 4));
  if (!recv_all(link.fd, payload.data(), payload.size())) return false;
  if (payload.size() < kResultBytes) return false;
  const std::size_t rows = get<std::uint32_t>(payload.data() + 8);
  const std::size_t blob_bytes = get<std::uint32_t>(payload.data() + 12);
  const std::size_t time_bytes =
      payload.size() - std::min(payload.size(), kResultBytes + rows + blob_bytes);
  if (payload.size() != kResultBytes + rows + blob_bytes + time_bytes) return false;
  if (time_bytes != 0 && time_bytes != kTimeBytes * rows) return false;
  const auto at = payload.begin() + static_cast<std::ptrdiff_t>(kResultBytes);
  status.assign(at, at + static_cast<std::ptrdiff_t>(rows));
  times.resize(time_bytes / 8);
  if (time_bytes != 0) std::memcpy(times.data(), payload.data() + kResultBytes + rows, time_bytes);
  blob.assign(payload.end() - static_cast<std::ptrdiff_t>(blob_bytes), payload.end());
  return true;
}

detail::ExecutorStats ProcessPool::times() {
  std::vector<pid_t> pids;
  {
    detail::MutexLock lock(mu_);
    for (const auto& link : links_) pids.push_back(link->pid);
  }
  // Read without the lock, which the engine's threads take per chunk.
  std::vector<std::optional<detail::SchedStat>> read(pids.size());
  for (std::size_t k = 0; k < pids.size(); ++k) {
    if (pids[k] <= 0) continue;
    read[k] = detail::read_schedstat(("/proc/" + std::to_string(pids[k]) + "/schedstat").c_str());
  }
  std::vector<pid_t> started;
  for (const pid_t pid : pids) {
    if (pid > 0) started.push_back(pid);
  }
  const std::uint64_t resident = memory_->estimate(started);
  detail::MutexLock lock(mu_);
  times_.resident_bytes = resident;  // a level, now; not summed
  // retire() may have let links go since they were read.
  for (std::size_t k = 0; k < pids.size() && k < links_.size(); ++k) {
    Link& link = *links_[k];
    if (!read[k] || link.pid != pids[k]) continue;  // gone, or started afresh since
    if (link.timed_pid != link.pid) {  // a new process: its counters start at its start
      link.timed_pid = link.pid;
      link.timed_cpu_ns = link.timed_delay_ns = 0;
    }
    const detail::SchedStat& now = *read[k];
    times_.cpu +=
        std::chrono::nanoseconds(std::max<std::int64_t>(0, now.on_cpu_ns - link.timed_cpu_ns));
    times_.run_delay +=
        std::chrono::nanoseconds(std::max<std::int64_t>(0, now.run_delay_ns - link.timed_delay_ns));
    link.timed_cpu_ns = std::max(link.timed_cpu_ns, now.on_cpu_ns);
    link.timed_delay_ns = std::max(link.timed_delay_ns, now.run_delay_ns);
  }
  return times_;
}

void ProcessPool::set_layout(py::bytes message) {
  const std::string_view bytes = message;
  detail::MutexLock lock(mu_);
  layout_message_.assign(bytes.begin(), bytes.end());
}

void ProcessPool::fail_lost(Link* link, std::span<const std::size_t> indices,
                            std::span<std::exception_ptr> errors, const char* items) {
  const pid_t pid = link->pid;
  const bool closing = stopping();
  give_back(link, true);
  const auto error =
      closing ? std::make_exception_ptr(std::runtime_error("stoker: the loader is closing"))
              : std::make_exception_ptr(WorkerDiedError(
                    pid, died(pid) + "; " + items + " lost: " + rows_text(indices)));
  for (auto& e : errors) e = error;
}

py::object ProcessPool::probe(const PyDataset& owner, std::size_t index, std::uint64_t seed) {
  Link* link = lease();
  std::vector<std::uint8_t> payload;
  put(payload, static_cast<std::uint64_t>(index));
  put(payload, seed);
  const auto m = message(kProbe, payload);
  std::vector<std::uint8_t> status;
  std::vector<std::int64_t> times;  // none: a probe is not timed
  std::vector<std::uint8_t> blob;
  if (!send_all(link->fd, m.data(), m.size()) || !receive_result(*link, status, times, blob) ||
      status.size() != 1 || blob.empty()) {
    std::exception_ptr error;
    fail_lost(link, {&index, 1}, {&error, 1}, "samples");
    std::rethrow_exception(error);
  }
  const pid_t pid = link->pid;
  const std::size_t worker_id = link->id;
  give_back(link, false);
  EngineThreadGil gil;
  std::exception_ptr error;
  try {
    py::list keys(1);
    keys[0] = py::int_(index);
    const py::object decoded = decode_(
        py::bytes(reinterpret_cast<const char*>(blob.data()), blob.size()), worker_id, pid, keys);
    const py::dict failures = decoded.attr("failures");
    if (status[0] == 0 && failures.empty()) return py::list(decoded.attr("objects"))[0];
    if (failures.empty())
      throw std::runtime_error("stoker: worker process failed without a reason");
    error = owner.keep_error(failures[py::int_(0)], index);
  } catch (...) {
    error = owner.keep_error(take_current_exception(), index);
  }
  std::rethrow_exception(error);
}

void ProcessPool::run(const PyDataset& owner, std::span<const std::size_t> indices,
                      std::span<const SampleOut> outs, std::span<std::exception_ptr> errors) {
  if (indices.empty()) return;
  auto fail_all = [&](const std::exception_ptr& e) {
    for (auto& error : errors) error = e;
  };
  // The chunk's rows, as (region, offset of the first row, bytes per row) per field.
  const SampleOut& first = outs.front();
  std::size_t first_offset = 0;
  const auto region = detail::find_shared_region(first.bytes(0).data(), &first_offset);
  if (!region) {
    fail_all(std::make_exception_ptr(
        std::runtime_error("stoker: the batch slab is not in shared memory, so worker processes "
                           "cannot write it")));
    return;
  }
  // The batch jobs' arguments (a collate_fn batch's keys) for `rows`; empty for samples. Sets
  // the rows' errors and returns nothing if making them raised.
  auto job_args = [&](std::span<const std::size_t> rows,
                      std::span<std::exception_ptr> row_errors) -> std::optional<std::string> {
    if (!owner.has_job_args()) return std::string();
    EngineThreadGil gil;
    try {
      return owner.job_args(rows, first.epoch());
    } catch (py::error_already_set& e) {
      e.restore();
      const py::object exception = take_python_error();
      for (std::size_t k = 0; k < rows.size(); ++k) {
        row_errors[k] = owner.keep_error(exception, rows[k]);
      }
      return std::nullopt;
    }
  };
  // The replies carry the rows' times only while tracing (the job's flags).
  detail::Tracer* tracer = detail::Tracer::current();
  const bool traced = tracer != nullptr && tracer->on();
  // The job for rows [k, k + n) of the chunk.
  auto make_job = [&](std::size_t k, std::size_t n,
                      const std::string& args) -> std::vector<std::uint8_t> {
    std::vector<std::uint64_t> offsets;
    for (std::size_t f = 0; f < first.num_fields(); ++f) {
      offsets.push_back(static_cast<std::uint64_t>(outs[k].bytes(f).data() - region->base));
    }
    return encode_job(region->id, offsets, indices.subspan(k, n), outs.subspan(k, n), args, traced);
  };
  const auto args = job_args(indices, errors);
  if (!args) return;
  const std::vector<std::uint8_t> job = make_job(0, indices.size(), *args);
  const char* items = owner.has_job_args() ? "batches" : "samples";

  // A worker that dies mid-chunk (the OOM killer, a crash in native code) is replaced and the
  // chunk read again by the new one: the epoch goes on with every sample once. A chunk that
  // kills its worker twice is read again row by row, so that only the rows that kill a worker
  // by themselves fail, each with a WorkerDiedError naming worker, signal and sample (the
  // skip policy replaces just those).
  std::optional<Reply> reply;
  std::exception_ptr lost;  // the last death's WorkerDiedError
  try {
    reply = attempt(*region, job, indices, traced, items, /*again=*/true, lost);
    if (!reply) {
      reply = attempt(*region, job, indices, traced, items, /*again=*/indices.size() > 1, lost);
    }
  } catch (...) {
    fail_all(std::current_exception());
    return;
  }
  if (reply) {
    take_reply(owner, indices, outs, errors, *reply);
    return;
  }
  if (indices.size() == 1) {
    errors[0] = lost;
    return;
  }
  for (std::size_t k = 0; k < indices.size(); ++k) {
    const auto row = indices.subspan(k, 1);
    const auto row_args = job_args(row, errors.subspan(k, 1));
    if (!row_args) continue;
    try {
      const auto read = attempt(*region, make_job(k, 1, *row_args), row, traced, items,
                                /*again=*/false, lost);
      if (read) {
        take_reply(owner, row, outs.subspan(k, 1), errors.subspan(k, 1), *read);
      } else {
        errors[k] = lost;
      }
    } catch (...) {
      errors[k] = std::current_exception();
    }
  }
}

std::optional<ProcessPool::Reply> ProcessPool::attempt(const detail::SharedRegion& region,
                                                       std::vector<std::uint8_t> job,
                                                       std::span<const std::size_t> indices,
                                                       bool traced, const char* items, bool again,
                                                       std::exception_ptr& lost) {
  Link* link = lease();
  Reply reply;
  const std::uint64_t job_id = link->next_job++;
  std::memcpy(job.data(), &job_id, sizeof job_id);
  const std::int64_t sent = traced ? detail::Tracer::now_ns() : 0;
  const bool ok = exchange(*link, job, region.id, region.fd, region.size, reply.status, reply.times,
                           reply.blob) &&
                  reply.status.size() == indices.size();
  reply.pid = link->pid;
  reply.worker_id = link->id;
  if (detail::Tracer* tracer = detail::Tracer::current(); traced && tracer != nullptr) {
    // On the worker process's own track: the job, from sending it to its reply, and each row
    // as the worker timed it (steady_clock is CLOCK_MONOTONIC, one clock for both processes).
    tracer->record({.start_ns = sent,
                    .end_ns = detail::Tracer::now_ns(),
                    .a = indices.size(),
                    .b = indices.front(),
                    .process = reply.pid,
                    .name = detail::TraceName::job});
    for (std::size_t k = 0; ok && 2 * k + 1 < reply.times.size(); ++k) {
      tracer->record({.start_ns = reply.times[2 * k],
                      .end_ns = reply.times[2 * k + 1],
                      .a = indices[k],
                      .process = reply.pid,
                      .name = detail::TraceName::read});
    }
  }
  if (ok) {
    give_back(link, false);
    return reply;
  }
  fail_lost(link, indices, {&lost, 1}, items);
  {
    detail::MutexLock lock(mu_);
    if (stopped_) std::rethrow_exception(lost);
    ++deaths_;
  }
  if (again) {
    detail::log(LogLevel::warning, died(reply.pid) + " reading " + items + " " +
                                       rows_text(indices) + "; a new worker reads them again");
  }
  return std::nullopt;
}

void ProcessPool::take_reply(const PyDataset& owner, std::span<const std::size_t> indices,
                             std::span<const SampleOut> outs, std::span<std::exception_ptr> errors,
                             const Reply& reply) {
  const auto& [status, times, blob, pid, worker_id] = reply;
  EngineThreadGil gil;
  merge_reply(
      owner, indices, outs, errors,
      [&] {
        ChunkReply decoded{std::string(status.begin(), status.end()), py::none(), py::dict()};
        if (blob.empty()) return decoded;
        // The sample indices only name the failures.
        const bool failed =
            std::any_of(status.begin(), status.end(), [](auto s) { return s != 0; });
        py::list keys(failed ? indices.size() : 0);
        for (std::size_t k = 0; failed && k < indices.size(); ++k) keys[k] = py::int_(indices[k]);
        const py::object got =
            decode_(py::bytes(reinterpret_cast<const char*>(blob.data()), blob.size()), worker_id,
                    pid, keys);
        decoded.objects = got.attr("objects");
        decoded.failures = got.attr("failures");
        return decoded;
      },
      "worker process");
}

py::tuple ProcessPool::call(std::size_t worker_id, std::uint64_t index, const py::bytes& args) {
  if (worker_id >= workers_) throw py::index_error("stoker: no such worker");
  std::vector<std::uint8_t> job = encode_call(index, args);

  std::vector<std::uint8_t> status;
  std::vector<std::uint8_t> blob;
  std::string failure;  // why there is no reply
  pid_t pid = 0;
  {
    py::gil_scoped_release nogil;  // rule 1: leasing and the exchange wait
    Link* link = nullptr;
    try {
      link = lease(worker_id);
    } catch (const std::exception& e) {
      failure = e.what();
    }
    if (link != nullptr) {
      const std::uint64_t job_id = link->next_job++;
      std::memcpy(job.data(), &job_id, sizeof job_id);
      pid = link->pid;
      std::vector<std::int64_t> times;  // a call asks for none
      const bool ok = exchange(*link, job, 0, -1, 0, status, times, blob) && status.size() == 1;
      give_back(link, !ok);
      if (!ok && stopping()) failure = "stoker: the loader is closing";
      if (!ok && failure.empty()) failure = died(pid);
    }
  }
  if (!failure.empty()) return py::make_tuple(false, failure);
  return py::make_tuple(true, status[0] != 0,
                        py::bytes(reinterpret_cast<const char*>(blob.data()), blob.size()), pid);
}

void ProcessPool::stop() noexcept {
  if (getpid() != owner_pid_) return;
  memory_->stop();  // its thread ends now; the destructor joins it
  detail::MutexLock lock(mu_);
  stopped_ = true;
  for (auto& link : links_) {
    if (link->fd >= 0) shutdown(link->fd, SHUT_RDWR);
  }
  free_cv_.notify_all();
}

void ProcessPool::finish() {
  if (finished_ || getpid() != owner_pid_) return;
  finished_ = true;
  stop();
  {
    detail::MutexLock lock(mu_);  // every lessee has returned (the engine is stopped)
    for (auto& link : links_) close_fd(std::exchange(link->fd, -1));
  }
  if (reap_ && !reap_.is_none()) reap_();
  memory_->join();  // stopped above, done reading long since
  // Let go of the Python side (it holds the data set) now rather than with the pool.
  spawn_ = py::none();
  decode_ = py::none();
  reap_ = py::none();
  exitcode_ = py::none();
}

std::string ProcessPool::died(pid_t pid) {
  if (auto message = death_message(pid)) return *message;
  std::optional<int> code;
  if (!interpreter_finalizing()) {
    EngineThreadGil gil;
    try {
      const py::object exitcode = exitcode_;  // finish() may let it go meanwhile
      if (exitcode && !exitcode.is_none()) {
        const py::object got = exitcode(pid);
        if (!got.is_none()) code = got.cast<int>();
      }
    } catch (py::error_already_set& e) {
      e.discard_as_unraisable("stoker: reading a worker process's exit code");
    }
  }
  return death_message(pid, code);
}

void ProcessPool::retire(std::size_t keep) {
  keep = std::max<std::size_t>(keep, 1);
  std::vector<std::unique_ptr<Link>> gone;
  {
    py::gil_scoped_release unlocked;  // a lessee may need the GIL to give its link back
    detail::MutexLock lock(mu_);
    if (keep >= links_.size()) return;
    while (std::any_of(links_.begin() + static_cast<std::ptrdiff_t>(keep), links_.end(),
                       [](const auto& link) { return link->busy; })) {
      lock.wait(free_cv_);
    }
    gone.assign(std::make_move_iterator(links_.begin() + static_cast<std::ptrdiff_t>(keep)),
                std::make_move_iterator(links_.end()));
    links_.resize(keep);
    workers_ = keep;
  }
  for (auto& link : gone) {
    if (link->fd >= 0) shutdown(link->fd, SHUT_RDWR);
    close_fd(std::exchange(link->fd, -1));
    if (link->pid > 0) memory_->remove(link->pid);
  }
}

}  // namespace stoker::python
