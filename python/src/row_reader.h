// One row reader: how a row of a Python map-style data set is read, by every kind of worker.
// The engine's threads (PyDataset, py_dataset.cc), worker processes and Ray actors (both
// through SampleWriter, below) read rows here, each handing the samples to a sink of its own.
//
// Fetch: a data set that has __getitems__ is read only through it, as torch's fetcher reads
// it: a chunk (rows of one batch) with one __getitems__(indices) call, a row alone (the first
// samples, which teach the layout) with __getitems__([index]). __getitem__ is then never
// called, so a data set may have __getitems__ alone. Without __getitems__ each row is
// dataset[index].
//
// Fallback, the one: a chunk's __getitems__ call that raises an Exception, or returns anything
// but a sequence of one sample per index, is followed by one __getitems__([index]) per row, so
// that a bad row fails alone with its own error (and the skip policy replaces only it). A
// one-row call that returns other than one sample fails its row with a ValueError. A
// BaseException that is no Exception (KeyboardInterrupt, SystemExit) fails the whole chunk.
//
// Seed: stoker.sample_seed() is the row's seed inside __getitem__, and the seed of the call's
// first row inside __getitems__ (a one-row call's: its row's own), so that a pass-through
// __getitems__ (torch's Subset over a data set that seeds from it) still draws anew each epoch.
// The rows of one call share that seed, and which rows share a call depends on the chunking:
// a __getitems__ whose rows must draw apart seeds from its indices as well.
// stoker.sample_epoch() is the read's epoch where the reader knows it (threads), else None.
//
// Visit and copy: visit_sample() checks a sample against the layout, writes its numbers and
// notes its arrays' copies; a thread makes them once it released the GIL, a process at once,
// into the slab it shares with the training process.
//
// Thread safety: everything here needs the GIL, but current_sample_seed()/epoch() (the
// calling thread's).
#pragma once

#include <pybind11/pybind11.h>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "py_layout.h"
#include "stoker/dataset.h"

namespace stoker::python {

namespace py = pybind11;

class PyDataset;

// The seed of the row being read on this thread (see above); empty outside a read.
std::optional<std::uint64_t> current_sample_seed();
// The epoch it is read for (SampleOut::epoch()): a batch job reads that epoch's batch (the
// next epoch's first ones are read before the current one ends). Empty outside a read.
std::optional<std::uint64_t> current_sample_epoch();

// The Python error that is set, taken as an exception object with its traceback attached;
// the error indicator is cleared. GIL held, an error set.
py::object take_python_error();
// The exception being handled (inside a catch block), as a Python exception object: a Python
// error as it was, a C++ one as RuntimeError with its message. GIL held.
py::object take_current_exception();

// A row to read: its sample index, its seed, and the epoch it is read for if known.
struct Row {
  std::size_t index = 0;
  std::uint64_t seed = 0;
  std::optional<std::uint64_t> epoch;
};

// Where the rows a RowReader reads go; row k is rows[k] of RowReader::read. GIL held in all.
class RowSink {
 public:
  // Row k's sample: check it and write it; an exception fails the row (fail(k, k + 1)).
  virtual void take(std::size_t k, py::handle sample) = 0;
  // Rows [first, end) failed with the exception being handled (called inside a catch).
  virtual void fail(std::size_t first, std::size_t end) = 0;
  // Before row k is read alone: false stops the read there (the loader closing, Ctrl-C).
  // A thread may release the GIL in here to copy the rows it took.
  virtual bool next(std::size_t /*k*/) { return true; }

 protected:
  ~RowSink() = default;
};

class RowReader {
 public:
  // `dataset` must outlive the reader; `batched`: it has __getitems__ (looked up once).
  RowReader(py::handle dataset, bool batched) : dataset_(dataset), batched_(batched) {}
  explicit RowReader(py::handle dataset);

  // Reads `rows` into `sink`, in order, by the rules above. Returns how many rows got a take
  // or a fail: rows.size() unless sink.next() stopped it.
  std::size_t read(std::span<const Row> rows, RowSink& sink) const;
  // One row alone: its sample, or its error thrown.
  py::object read_one(const Row& row) const;

 private:
  py::handle dataset_;
  bool batched_;
};

// Checks `sample` (of sample `index`) against the layout `root` with `slots` object slots,
// writes its numbers into `out` and notes its arrays' copies in `copies` (the caller makes
// them: copy_pending). Returns its object values, a tuple with one item per slot, or None
// without slots. Throws like SampleVisitor.
py::object visit_sample(const LayoutNode& root, std::size_t slots, std::size_t index,
                        py::handle sample, const SampleOut& out, std::vector<PendingCopy>& copies);

// A chunk's reply from a worker process or a Ray actor (docs/worker_protocol.md): a status
// byte per row (0: read), each row's object values (a list, or None without object slots),
// and the failed rows' exceptions (a dict {row: exception}).
struct ChunkReply {
  std::string status;
  py::object objects;
  py::object failures;
};

// Merges the reply `decode()` gives into the rows of `owner`: row k failed if failures has k,
// or if status[k] is not 0 (`who` names the worker in that error without a reason); else its
// object values are objects[k]. An error from decode() (an object value that does not
// unpickle here) fails every row with it. GIL held.
void merge_reply(const PyDataset& owner, std::span<const std::size_t> indices,
                 std::span<const SampleOut> outs, std::span<std::exception_ptr> errors,
                 const std::function<ChunkReply()>& decode, const char* who);

// A kJob payload for a chunk (consecutive rows of one slab: `outs`): field f of its first row
// at byte `offsets[f]` of region `region`, the rows' (index, seed), `args`; the job id is left
// 0, for the sender to set. Worker processes get it over their socket, remote workers
// (python/stoker/remote/actor.py) through Ray, with the offsets of a buffer of their own.
std::vector<std::uint8_t> encode_job(std::uint32_t region, std::span<const std::uint64_t> offsets,
                                     std::span<const std::size_t> indices,
                                     std::span<const SampleOut> outs, const std::string& args,
                                     bool time_rows);
// A call's kJob (ProcessPool::call): no region, no fields, one row (`index`, seed 0), `args`.
std::vector<std::uint8_t> encode_call(std::uint64_t index, std::string_view args);

// The worker process's half (and a Ray actor's): the slab regions it was sent, mapped, and
// the layout to check and write samples with (layout_from_description of the parent's data
// set, sent once the parent learned it); its rows are read by a RowReader, and written at once.
//
// Thread safety: one thread (the worker's), GIL held.
class SampleWriter {
 public:
  SampleWriter() = default;
  ~SampleWriter();
  void set_layout(py::handle description, std::size_t slots);
  SampleWriter(const SampleWriter&) = delete;
  SampleWriter& operator=(const SampleWriter&) = delete;

  void map(std::uint32_t region, int fd, std::size_t bytes);  // closes fd
  void drop(std::uint32_t region);
  // Runs a kJob payload: reads its rows from `dataset` (RowReader; `use_getitems`: it has
  // __getitems__) and writes them into the slab. Returns (job id, status bytes: 0 ok, 1
  // failed; object values per row, a list of tuples, or None without object slots; [(row,
  // exception)]; the rows' (start, end) times as bytes for the reply if the job asked for
  // them, else empty).
  py::tuple run_job(py::bytes job, py::handle dataset, bool use_getitems);
  // The sample of a kProbe (RowReader::read_one); raises its error.
  static py::object read_sample(py::handle dataset, std::size_t index, std::uint64_t seed,
                                bool use_getitems);

 private:
  class Rows;
  // The rows of the job: field f of row r is at offsets[f] + r * row_bytes[f].
  void begin(std::uint32_t region, std::vector<std::uint64_t> offsets,
             std::vector<std::uint64_t> row_bytes, std::size_t rows);
  // Checks `sample` against the layout and writes it into row `row`; returns its object
  // values (a tuple, one per slot) or None.
  py::object write(py::handle sample, std::size_t index, std::size_t row, std::uint64_t seed);

  std::optional<LayoutNode> root_;
  std::size_t slots_ = 0;
  std::map<std::uint32_t, std::pair<std::byte*, std::size_t>> regions_;
  std::vector<std::size_t> row_bytes_;
  std::vector<std::byte*> bases_;
  std::vector<PendingCopy> copies_;  // write()'s, kept for its capacity
};

}  // namespace stoker::python
