// The loader: samples a data set into batches with a pool of worker threads, each sample
// written once, straight into its slot of a recycled batch slab, batches delivered in order.
//
// The types it speaks in have headers of their own, included here so that users include only
// this one: options.h (LoaderOptions), batch.h (Batch, SampleError, Position), stats.h (Stats),
// sampler.h (the epoch order), trace.h (TraceOptions), report.h (Report).
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "stoker/batch.h"
#include "stoker/dataset.h"
#include "stoker/options.h"
#include "stoker/report.h"
#include "stoker/sampler.h"
#include "stoker/stats.h"
#include "stoker/trace.h"

namespace stoker {

namespace detail {
class Engine;
class DeviceStage;
class WorkerTuner;
class MemoryGuard;
class Tracer;
struct LoaderInternals;
}  // namespace detail

// Thread safety: next(), next_for(), set_epoch(), restore(), position(), trace() and
// stop_trace() belong to one consumer thread. set_workers(), set_depth(), stats() and the const
// accessors may be called from any thread, concurrently with next(). Destroying the loader with
// batches in flight is allowed: it stops the workers (each finishes at most the sample it is
// reading) and returns.
class Loader {
 public:
  // Throws std::invalid_argument for an impossible option (no dataset, batch size 0, rank
  // outside world size, ...), with the option named.
  explicit Loader(LoaderOptions options);
  // With the internal options of stoker/frontend/loader_internals.h (how slabs are allocated, ...).
  Loader(LoaderOptions options, const detail::LoaderInternals& internals);
  ~Loader();
  Loader(const Loader&) = delete;
  Loader& operator=(const Loader&) = delete;

  // The next batch of the current epoch, or nullopt at its end; the call after that starts
  // the following epoch (already being prefetched). Throws SampleError for a failed sample
  // (see ErrorPolicy); the loader stays usable and the next call returns the next batch.
  std::optional<Batch> next();
  // As next(), waiting at most about `timeout` for the batch. A call that times out changes
  // nothing the consumer can see: the next call returns that batch. With workers = 0 the
  // consumer reads inline and looks at the clock between chunks of rows.
  NextResult next_for(std::chrono::nanoseconds timeout);

  // Starts epoch `epoch` from its first batch. Batches already prefetched for it are kept;
  // anything else in flight is discarded.
  void set_epoch(std::uint64_t epoch);
  Position position() const;
  void restore(const Position& position);  // throws std::invalid_argument if out of range
  // Elastic resume (a checkpoint of other ranks, workers or batch size; sampler.h): epoch
  // `epoch` reads `order`, this rank's samples for the rest of it (resumed_order), from batch
  // `batch` of it; the epochs after it follow the loader's own order. Throws
  // std::invalid_argument for a batch past the order's end, std::out_of_range for a sample
  // past the data set's.
  void resume(std::uint64_t epoch, std::vector<std::size_t> order, std::size_t batch = 0);
  // A later epoch's order, every sample of it, given before that epoch opens (a front end
  // that draws each epoch's order itself, ahead of it, so that batches are read across the
  // boundary): that epoch reads it unless resume() gives it another. False, changing nothing,
  // when that epoch's order is already computed or it has begun opening. Throws
  // std::invalid_argument for an order of another length, std::out_of_range for a sample past
  // the data set's.
  bool order_ahead(std::uint64_t epoch, std::vector<std::size_t> order);

  // The epoch order this loader follows, its shuffle resolved (SampleOrder::blocks and window
  // where the data set does not fit its object cache): resumed_order() of it gives a resumed
  // epoch's order.
  const SampleOrder& order() const;
  std::size_t batches_per_epoch() const;
  std::size_t batches_in(std::uint64_t epoch) const;  // a resumed epoch's, else the above
  std::size_t samples_per_epoch() const;              // for this rank, before batching
  std::span<const FieldSpec> fields() const;

  void set_workers(std::size_t workers);
  void set_depth(std::size_t depth);  // clamped to at least 1
  Stats stats() const;
  // A verdict on the run so far (input- or compute-bound, the busiest stage, whether more
  // workers would help, what to try), from stats(): see report.h.
  Report report() const;
  // Each distinct sample that failed under ErrorPolicy::skip in the batches handed out so far,
  // in index order: index, reason (its first failure's) and name (a file or record).
  std::vector<SkippedSample> skipped_samples() const;

  // Records a timeline of the loader's work from the next batch on, written to `path` as
  // Chrome trace-event JSON (Perfetto, chrome://tracing) by stop_trace() or the destructor:
  // each worker's sample reads and chunks, each batch from opened to ready to taken, the
  // consumer's waits and steps, device copies, queue depth and pinned bytes. Throws
  // std::system_error if `path` cannot be created; a trace already recording is written
  // first. Off until called; while off every event site costs one relaxed atomic load.
  void trace(const std::string& path, const TraceOptions& options = {});
  // Stops recording and writes the file; throws std::system_error if writing fails. Nothing
  // if no trace is recording. (The destructor writes it too, logging a failure.)
  void stop_trace();

 private:
  void restart(Position position);
  void tune();
  // The memory cap: what counts against it now (into `s`, from the engine's stats) and, from
  // next() at most every kMemoryCheckPeriod, the slab budget it leaves.
  void add_memory(Stats& s) const;
  void check_memory();
  // The consumer's side of the trace: a step ends where next() is called, a wait where it
  // hands out a batch or the end of an epoch.
  void trace_call();
  void trace_return(bool batch);

  std::unique_ptr<detail::Tracer> tracer_;  // first: the engine and the stage record into it
  // While tracing (detail::Tracer::now_ns(); 0: none): when the current wait began, and when
  // the last batch was handed out.
  std::int64_t wait_since_ = 0;
  std::int64_t taken_at_ = 0;
  std::unique_ptr<detail::Engine> engine_;
  std::unique_ptr<detail::DeviceStage> stage_;
  std::unique_ptr<detail::WorkerTuner> tuner_;  // with LoaderOptions::tune_workers
  std::unique_ptr<detail::MemoryGuard> memory_;
  std::string shuffle_;                     // the shuffle chosen and why (Stats::shuffle)
  std::vector<std::string> cheaper_reads_;  // the data set's (Dataset::cheaper_reads)
  std::size_t device_depth_ = 0;            // device slots counted against the cap (0: on the host)
};

}  // namespace stoker
