// The kinds of worker a Python data set is read by, as the engine's chunk executors
// (stoker/frontend/executor.h): the engine's worker thread that claimed a chunk offers it to them
// in turn (remote workers, then worker processes, then the thread itself), so scheduling, order,
// exactly-once delivery, cancellation and the error policy are the engine's for every kind.
//
//   RemoteExecutor   a remote worker on Ray, when one is free (python/stoker/remote/pool.py);
//                    declines otherwise, and the chunk goes on to the next kind
//   ProcessExecutor  a worker process of a ProcessPool (py_workers.h); takes every chunk, and
//                    bounds the engine's threads to the pool's size
//   PyThreads        the offering thread, holding the GIL: declines every chunk, which the
//                    engine's thread then reads through PyDataset::read_rows, and declares the
//                    GIL time those reads held (Stats::worker_lock_held)
//
// The chunk's indices are the engine's data set's: through a custom sampler's order
// (RemappedDataset) they are mapped to the Python data set's before they leave.
//
// Thread safety: as ChunkExecutor's; offers take the GIL themselves, as needed.
#pragma once

#include <pybind11/pybind11.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <vector>

#include "py_dataset.h"
#include "py_workers.h"
#include "stoker/frontend/executor.h"

namespace stoker::python {

namespace py = pybind11;

// Through a custom sampler's order (remap, if any), the data set's indices of a chunk.
class PyExecutorBase : public detail::ChunkExecutor {
 protected:
  PyExecutorBase(std::shared_ptr<const PyDataset> dataset,
                 std::shared_ptr<const RemappedDataset> remap)
      : dataset_(std::move(dataset)), remap_(std::move(remap)) {}
  // The job's indices in the Python data set's numbering: `storage` holds them if mapped.
  std::span<const std::size_t> indices(const detail::ChunkJob& job,
                                       std::vector<std::size_t>& storage) const;

  const std::shared_ptr<const PyDataset> dataset_;
  const std::shared_ptr<const RemappedDataset> remap_;
};

class PyThreads final : public PyExecutorBase {
 public:
  explicit PyThreads(std::shared_ptr<const PyDataset> dataset)
      : PyExecutorBase(std::move(dataset), nullptr) {}
  Kind kind() const override { return Kind::thread; }
  bool offer(const detail::ChunkJob&) override { return false; }
  detail::ExecutorStats stats() const override;
};

class ProcessExecutor final : public PyExecutorBase {
 public:
  // From now on probes go to the pool too (PyDataset::use_processes). GIL held.
  ProcessExecutor(std::shared_ptr<PyDataset> dataset, std::shared_ptr<const RemappedDataset> remap,
                  std::shared_ptr<ProcessPool> pool);
  Kind kind() const override { return Kind::process; }
  // The rows probed on this side are written here, the others read by one worker (a worker
  // that dies is replaced and its chunk read again: ProcessPool::run).
  bool offer(const detail::ChunkJob& job) override;
  std::size_t limit() const override { return pool_->size(); }
  detail::ExecutorStats stats() const override { return pool_->times(); }
  void stop() noexcept override { pool_->stop(); }

 private:
  const std::shared_ptr<ProcessPool> pool_;
};

class RemoteExecutor final : public PyExecutorBase {
 public:
  // `remote.run(job)` takes a kJob payload (py_workers.h) whose region 1 is the worker's own
  // buffer, waits for its reply (Ray releases the GIL while waiting) and returns (status
  // bytes, the rows as a buffer, object values per row or None, {row: exception}, seconds
  // the call waited for the reply, seconds the remote worker read the chunk, seconds it
  // idled before), or None when no remote worker is free or left (a unit lost with its
  // worker is issued again by run() itself). `remote.set_layout(message)` gets the layout
  // message once it is known. GIL held.
  RemoteExecutor(std::shared_ptr<PyDataset> dataset, std::shared_ptr<const RemappedDataset> remap,
                 py::object remote);
  ~RemoteExecutor() override;  // takes the GIL to let go of `remote`
  Kind kind() const override { return Kind::remote; }
  // Declines until the layout is known, and when no remote worker is free.
  bool offer(const detail::ChunkJob& job) override;
  detail::ExecutorStats stats() const override;

 private:
  // Reads a run of rows through a remote worker and copies them into the slab; false if
  // none was free (nothing read).
  bool read(std::span<const std::size_t> indices, std::span<const SampleOut> outs,
            std::span<std::exception_ptr> errors);
  void count_reply(std::uint64_t bytes, double wait_s, double read_s, double idle_s);

  py::object remote_;  // GIL-guarded
  std::atomic<std::uint64_t> units_{0};
  std::atomic<std::uint64_t> bytes_{0};
  std::atomic<std::int64_t> wait_ns_{0};
  std::atomic<std::int64_t> read_ns_{0};
  std::atomic<std::int64_t> idle_ns_{0};
};

}  // namespace stoker::python
