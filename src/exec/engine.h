// The scheduler behind Loader: worker threads fill slabs, chunk by chunk, for a bounded window
// of batches in sample order, and the consumer takes them from the head in order.
//
// How work is split: a batch is opened (given a slab and its sample indices) when fewer than
// `depth` batches are in flight; its rows are cut into chunks, about one per worker, and idle
// workers claim chunks from the oldest open batch first. So the first batch is read by all
// workers at once (low first-batch latency) and later batches pipeline behind it. A batch is
// ready when its last chunk finishes; the consumer only ever takes the oldest batch, so
// delivery is in order whatever the timing.
//
// Epochs: batches are numbered (epoch, number). Workers may run one epoch ahead of the
// consumer, which hides the epoch boundary; set_epoch/restore to anything other than the
// current position cancels what is in flight (workers stop at the next row) and reopens from
// the new position. Nothing is ever reordered, because opening follows the sample order.
//
// Layout learned from the samples (Dataset::fields_known() false, a Python data set): the
// slab pool has no layout, so no batch can open. Until it has one, each worker (or the inline
// consumer) probes one sample of the next batches' order at a time (Dataset::probe, mu_
// released), and the first probe that returns gives the pool its layout; batches open once
// no probe is running (a late one's sample may be in them). Probes take sample
// positions in order from the next batch to open, as many at once as there are workers, so
// data sets whose workers wait for one another (a barrier in __getitem__) get all of them.
// The data set keeps what each probe read for that row's read, failures included: an error
// in a probed sample surfaces with its batch. Under ErrorPolicy::raise probes go no further
// than the batches that may open, and a batch whose samples all failed their probes opens
// without a slab (it has nothing to hold): its rows are read only to fail with their kept
// failures, so each such batch raises its own sample's exception in its place in the order
// and the epoch ends, as with any failed batch. Under skip (a failed sample is replaced by
// any other) probes go on through the epoch; if no sample of it reads (or kMaxProbes fail),
// the last failure is the consumer's error, as a SampleError. An exception a probe throws
// (not the sample's: Ctrl-C on an inline consumer) is the consumer's error at once.
//
// Each batch in flight has a Ticket: the slab it is written into, which batch it is, how its
// rows are split into chunks, and what failed. Tickets stay with the engine; take() hands the
// consumer's stage the slab and what the batch is (Batch::Info), and the stage makes a Batch.
//
// Thread safety: as Loader's (loader.h). All scheduling state is guarded by mu_; a slab's
// rows are written only by the worker that claimed their chunk, outside the lock.
#pragma once

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <thread>
#include <utility>
#include <vector>

#include "memory/recycling_pool.h"
#include "memory/slab_pool.h"
#include "sampler/sampler.h"
#include "stoker/batch.h"
#include "stoker/frontend/executor.h"
#include "stoker/frontend/mutex.h"
#include "stoker/frontend/tracer.h"
#include "stoker/options.h"
#include "stoker/stats.h"

namespace stoker::detail {

// A slab handed from the engine to a stage: given back to its pool unless the stage hands it
// on (to a Batch, or to a device slot).
struct GiveBack {
  void operator()(Slab* slab) const noexcept { slab->give_back(); }
};
using SlabLease = std::unique_ptr<Slab, GiveBack>;

// A failed sample under ErrorPolicy::raise (or past the skip budget).
struct SampleFailure {
  std::size_t row = 0;
  std::size_t index = 0;
  std::exception_ptr cause;
  std::string reason;
};

// One batch in flight. The scheduling fields are guarded by the engine's mutex; `cancelled`
// is read by workers without it; the failure fields are guarded by `failure_mu` (several
// workers may fail on the same batch).
struct Ticket {
  Slab* slab = nullptr;
  std::uint64_t epoch = 0;
  std::size_t number = 0;
  std::size_t size = 0;
  // Work split: rows [c * chunk_rows, (c + 1) * chunk_rows) form chunk c.
  std::size_t chunk_rows = 0;
  std::size_t chunks = 0;
  std::size_t next_chunk = 0;   // first unclaimed
  std::size_t chunks_done = 0;  // finished
  std::atomic<bool> cancelled{false};
  Ticket* next = nullptr;  // the engine's in-flight queue
  // While tracing (Tracer::now_ns(); 0: not traced): when the batch was opened and completed.
  std::int64_t opened_ns = 0;
  std::int64_t ready_ns = 0;

  // The rows of a batch opened without a slab (every sample failed its probe, see above).
  std::vector<std::size_t> slabless_rows;

  Mutex failure_mu;
  std::optional<SampleFailure> failure STOKER_GUARDED_BY(failure_mu);  // the first failed row
  std::vector<SkippedSample> skipped STOKER_GUARDED_BY(failure_mu);

  bool ready() const { return chunks_done == chunks; }
  std::span<std::size_t> rows() { return slab != nullptr ? slab->rows() : slabless_rows; }
};

struct EngineConfig {
  std::shared_ptr<const Dataset> dataset;
  SampleOrder order;
  std::size_t batch_size = 1;
  bool drop_last = false;
  std::size_t workers = 0;
  std::size_t depth = 1;
  ErrorPolicy on_error = ErrorPolicy::raise;
  std::size_t max_skipped = 0;
  std::vector<std::string> keep_on_host;  // marked once the layout is known
  // Slab bytes for the batches in flight (depth + 1 slabs); 0: no limit. A depth that does
  // not fit is lowered (said once in the log).
  std::size_t memory_budget = 0;
  // The kinds of worker chunks are offered to before the engine's threads read them
  // (executor.h); null: none, the threads read everything. The front end may add to it while
  // the engine runs.
  std::shared_ptr<Executors> executors;
  // Where workers and take() stamp their work while tracing is on; null: never traced. It
  // outlives the engine.
  Tracer* tracer = nullptr;
};

// The batches the engine hints to the data set ahead of the one it opens (Engine::hint_ahead),
// in prefetch depths: what it fetches ahead is bounded by the data set (an object cache gives
// half of itself, at most 256 MiB; a data set without one holds the bytes in memory, counted by
// the memory cap as its resident bytes), not by this. A fetch from object storage is a round
// trip of tens of milliseconds whatever its size, so the reads run as fast as the bytes in
// flight allow: with one depth ahead, 20,000 rows of 5 KB over S3 (+20 ms a request) read
// 3,200 samples/s shuffled through a window and 4,770 in order; with four, 5,400 (bound by
// the server's CPU a GET on 2 cores) and 14,600; with eight, 4,550 and 10,400.
inline constexpr std::size_t kHintLead = 4;

// Marks the fields named in `names` host_only (LoaderOptions::keep_on_host). Throws
// std::invalid_argument for a name the data set does not have, with the names it has.
void mark_host_only(std::vector<FieldSpec>& fields, const std::vector<std::string>& names);

class Engine {
 public:
  Engine(EngineConfig config, std::shared_ptr<SlabPool> pool);
  ~Engine();
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  using Clock = std::chrono::steady_clock;
  // How long take() waits: std::nullopt for as long as it takes, kNoWait not at all (and no
  // inline reading), or until a time.
  using Deadline = std::optional<Clock::time_point>;
  static constexpr Clock::time_point kNoWait = Clock::time_point::min();

  struct Taken {
    SlabLease slab;  // the consumer's next batch, filled
    Batch::Info info;
    bool end_of_epoch = false;  // neither: not ready by the deadline
  };
  // The consumer's next batch. Throws SampleError for a batch with a failed sample (in its
  // place in the order), or a failure not tied to a sample (no memory for a slab).
  Taken take(Deadline deadline) STOKER_EXCLUDES(mu_);
  // The next batch on the host (for tests of the engine alone).
  std::optional<Batch> next() STOKER_EXCLUDES(mu_);
  void restart(Position position) STOKER_EXCLUDES(mu_);
  // Elastic resume: epoch `epoch` reads `order` (this rank's samples for the rest of that
  // epoch, from resumed_order) instead of its own order, from batch `batch` of it; the epochs
  // after it follow config.order again. Replaces an earlier resumed epoch.
  void resume(std::uint64_t epoch, std::vector<std::size_t> order, std::size_t batch)
      STOKER_EXCLUDES(mu_);
  // The order of a later epoch given before it opens, by a front end that draws its epochs'
  // orders itself and ahead of them (every epoch's samples, samples_per_epoch() of them): that
  // epoch reads it unless resume() gives it another, and what is prefetched across the
  // boundary is read in it. False, changing nothing, when it is too late (that epoch's order
  // is computed or it has begun opening: resume() it instead). Throws std::invalid_argument
  // for an order of another length, std::out_of_range for a sample past the data set's.
  bool order_ahead(std::uint64_t epoch, std::vector<std::size_t> order) STOKER_EXCLUDES(mu_);
  // Batches in `epoch`: batches_per_epoch(), or the resumed epoch's.
  std::size_t batches_in(std::uint64_t epoch) const STOKER_EXCLUDES(mu_);
  Position position() const STOKER_EXCLUDES(mu_);
  void set_workers(std::size_t workers) STOKER_EXCLUDES(mu_, threads_mu_);
  void set_depth(std::size_t depth) STOKER_EXCLUDES(mu_);
  // Slab bytes allowed from now on (EngineConfig::memory_budget; the loader's memory cap
  // moves it as the other holders of memory grow or shrink): a depth that no longer fits is
  // lowered at once; free slabs past depth + `held` (the batches the consumer holds) are freed
  // on every call, so those still in use when the depth was lowered go once they are back.
  void set_memory_budget(std::size_t bytes, std::size_t held) STOKER_EXCLUDES(mu_);
  Stats stats() const STOKER_EXCLUDES(mu_, bad_mu_);
  // Each distinct sample that failed in a batch handed out (skip policy), by index, with its
  // first reason.
  std::vector<SkippedSample> skipped_samples() const STOKER_EXCLUDES(bad_mu_);
  // The most worker threads that can read at once (the executors' bound); 0: no limit.
  std::size_t worker_limit() const {
    return config_.executors != nullptr ? config_.executors->limit() : 0;
  }

  std::size_t batches_per_epoch() const { return batches_per_epoch_; }
  std::size_t samples_per_epoch() const { return samples_per_epoch_; }
  const SampleOrder& order() const { return config_.order; }
  std::span<const FieldSpec> fields() const { return pool_->fields(); }
  const std::shared_ptr<SlabPool>& pool() const { return pool_; }

 private:
  struct Worker {
    std::thread thread;
    std::atomic<bool> done{false};
    std::atomic<int> tid{0};  // the kernel's id of the thread, once it runs
    // Of the thread's run-queue delay (its schedstat), what run_delay_ns_ already counts.
    std::atomic<std::int64_t> run_delay_counted{0};
  };

  void worker_main(Worker* self) STOKER_EXCLUDES(mu_);
  // Adds what `worker`'s run-queue delay grew to `now_ns` since it was last counted (the
  // sampler and the exiting thread may both report; only growth counts).
  void count_run_delay(Worker& worker, std::int64_t now_ns) const;
  // Counts the run-queue delay of every live worker, and returns the total so far.
  std::int64_t sample_run_delay() const STOKER_EXCLUDES(threads_mu_);
  // Waits for the head batch (reading it inline when there are no workers) and takes it out
  // of the queue; null at the end of the epoch, which it also steps past (and says so in
  // `end_of_epoch`), or when the head is not ready by the deadline.
  // `traced` asks for the queue right after the take, in `queue` (in flight, ready).
  Ticket* take_head(Deadline deadline, bool& end_of_epoch, bool traced,
                    std::pair<std::size_t, std::size_t>& queue) STOKER_EXCLUDES(mu_);
  // A batch with a chunk to run: an open one (only the head, for the inline consumer), or the
  // next one opened. Null if there is none now; sets `look_again` if the lock was released
  // meanwhile (to compute an epoch's order), so the caller must look again before waiting.
  Ticket* find_work(bool head_only, bool& look_again) STOKER_REQUIRES(mu_);
  // Before the layout is known: probes the next sample position with mu_ released (see the
  // top of this file), or computes the order it needs. Returns whether the lock was released.
  bool probe() STOKER_REQUIRES(mu_);
  // A batch with an unclaimed chunk: the head only, or the oldest in the queue.
  Ticket* claimable(bool head_only) const STOKER_REQUIRES(mu_);
  bool can_open() const STOKER_REQUIRES(mu_);
  // Whether order_ holds the order of the epoch the next batch to open belongs to.
  bool order_ready() const STOKER_REQUIRES(mu_);
  // Computes that order with mu_ released (callers look at the state again afterwards).
  void compute_order() STOKER_REQUIRES(mu_);
  // Opens the next batch in sample order; requires can_open() and order_ready(). Returns null
  // if no slab could be had (see fail()). Before the layout is known it opens a batch whose
  // samples all failed their probes, without a slab.
  Ticket* open_next() STOKER_REQUIRES(mu_);
  // A failure not tied to a sample (no memory for a slab or an order): no more batches are
  // opened, and the consumer gets the error once nothing in flight is left to hand out; its
  // following next() clears it and opening resumes.
  void fail(std::exception_ptr error) STOKER_REQUIRES(mu_);
  // Samples and batches of `epoch`: the resumed epoch's or every epoch's.
  std::size_t samples_of(std::uint64_t epoch) const STOKER_REQUIRES(mu_) {
    return resumed_ && resumed_->epoch == epoch ? resumed_->order.size() : samples_per_epoch_;
  }
  std::size_t batches_of(std::uint64_t epoch) const STOKER_REQUIRES(mu_) {
    return resumed_ && resumed_->epoch == epoch ? resumed_->batches : batches_per_epoch_;
  }
  // The rows of batch `number` of the epoch being opened (the last may be short).
  std::size_t batch_rows(std::size_t number) const STOKER_REQUIRES(mu_) {
    return std::min(config_.batch_size, samples_of(open_epoch_) - number * config_.batch_size);
  }
  // Steps the opening position past the end of its epoch (several, for empty resumed ones).
  void roll_open_epoch() STOKER_REQUIRES(mu_);
  // Hints the data set (Dataset::will_read) at the rows of the batches from the one being
  // opened to kHintLead depths past it, each batch once per order. A batch opens only when the
  // workers run out of chunks, so a hint given as it opens comes one batch before its reads:
  // too late for a fetch from object storage (20-100 ms), which then leaves the workers waiting.
  void hint_ahead() STOKER_REQUIRES(mu_);
  // Where SampleOut writes a ticket's rows: nowhere for a batch without a slab.
  static std::byte* const* field_bases(const Ticket& ticket) {
    return ticket.slab != nullptr ? ticket.slab->fields() : nullptr;
  }
  // Returns a ticket that nobody reads any more, with its slab.
  void retire(Ticket* ticket) noexcept;
  // Claims one chunk of `ticket`, reads its rows with mu_ released, and marks it done.
  void run_chunk(Ticket* ticket, std::atomic<std::int64_t>& busy_ns) STOKER_REQUIRES(mu_);
  void read_row(Ticket* ticket, std::size_t row);
  // Row `row` from sample `index` on, `first_attempt` replacements already made.
  void read_row(Ticket* ticket, std::size_t row, std::size_t index, std::size_t first_attempt);
  // Rows [begin, end) in one chunk read (read_rows); failed rows go through on_failure.
  void read_chunk(Ticket* ticket, std::size_t begin, std::size_t end);
  // A chunk offered to the executors, else read by this thread (Dataset::read_rows).
  void read_rows(std::span<const std::size_t> indices, std::span<const SampleOut> outs,
                 std::span<std::exception_ptr> errors) const;
  // The sample that replaces failed sample `index` after `attempt` replacements.
  std::size_t replacement(const Ticket* ticket, std::size_t index, std::size_t attempt) const;
  // Records a failed read. Returns true if the row should be retried with another sample.
  bool on_failure(Ticket* ticket, std::size_t row, std::size_t index, std::size_t attempt);
  std::string sample_name(std::size_t index) const noexcept;
  void cancel_in_flight() STOKER_REQUIRES(mu_);
  // `depth`, lowered so that depth + 1 slabs fit the memory budget once the layout is known.
  std::size_t fit_depth(std::size_t depth) const;
  // One relaxed load while tracing is off.
  bool tracing() const { return config_.tracer != nullptr && config_.tracer->on(); }
  void wake_all() STOKER_REQUIRES(mu_);

  const EngineConfig config_;
  // The data set's object-storage counters when the engine was made (Stats::storage_* count
  // from there: the store is the process's, shared with other loaders).
  const ObjectStorageCounters storage_start_;
  const std::shared_ptr<SlabPool> pool_;
  const std::size_t samples_per_epoch_;
  const std::size_t batches_per_epoch_;
  // Chunks are read whole (Dataset::reads_chunks(), or executors to offer them to).
  const bool reads_chunks_;

  mutable Mutex mu_;
  std::condition_variable work_cv_;   // workers: a chunk may be claimable, or stop
  std::condition_variable ready_cv_;  // consumer: the head may be ready
  bool stop_ STOKER_GUARDED_BY(mu_) = false;
  std::size_t target_workers_ STOKER_GUARDED_BY(mu_) = 0;
  std::size_t running_workers_ STOKER_GUARDED_BY(mu_) = 0;
  std::size_t depth_ STOKER_GUARDED_BY(mu_) = 1;

  // The consumer's position: `delivered_` batches of `epoch_` handed out.
  std::uint64_t epoch_ STOKER_GUARDED_BY(mu_) = 0;
  std::size_t delivered_ STOKER_GUARDED_BY(mu_) = 0;
  // The next batch to open.
  std::uint64_t open_epoch_ STOKER_GUARDED_BY(mu_) = 0;
  std::size_t open_batch_ STOKER_GUARDED_BY(mu_) = 0;
  // Batches [0, hinted_through_) of epoch hinted_epoch_'s order (that after resume number
  // hinted_resumes_) were hinted (hint_ahead).
  std::uint64_t hinted_epoch_ STOKER_GUARDED_BY(mu_) = 0;
  std::uint64_t hinted_resumes_ STOKER_GUARDED_BY(mu_) = 0;
  std::size_t hinted_through_ STOKER_GUARDED_BY(mu_) = 0;
  // Batches in flight, oldest (the consumer's next) first.
  Ticket* head_ STOKER_GUARDED_BY(mu_) = nullptr;
  Ticket* tail_ STOKER_GUARDED_BY(mu_) = nullptr;
  std::size_t in_flight_ STOKER_GUARDED_BY(mu_) = 0;
  std::size_t ready_ STOKER_GUARDED_BY(mu_) = 0;
  std::exception_ptr fatal_ STOKER_GUARDED_BY(mu_);

  // Learning the layout from the samples (see the top of this file).
  bool layout_known_ STOKER_GUARDED_BY(mu_) = false;
  std::size_t probes_started_ STOKER_GUARDED_BY(mu_) = 0;  // sample positions handed out
  std::size_t probes_running_ STOKER_GUARDED_BY(mu_) = 0;
  std::size_t probes_failed_ STOKER_GUARDED_BY(mu_) = 0;
  std::exception_ptr probe_error_ STOKER_GUARDED_BY(mu_);  // the last probe's SampleError
  bool fatal_reported_ STOKER_GUARDED_BY(mu_) = false;     // thrown from next(): retry on the next

  // An epoch resumed on another topology: its own order and batch count.
  struct ResumedEpoch {
    std::uint64_t epoch = 0;
    std::vector<std::size_t> order;
    std::size_t batches = 0;
  };
  std::optional<ResumedEpoch> resumed_ STOKER_GUARDED_BY(mu_);
  // Orders given ahead for later epochs (order_ahead), every sample of each: two at most
  // (the next epoch's, and the one after it given before the next opened).
  struct AheadOrder {  // every epoch's batch count: only its order is its own
    std::uint64_t epoch = 0;
    std::vector<std::size_t> order;
  };
  std::vector<AheadOrder> ahead_ STOKER_GUARDED_BY(mu_);
  // resume() and order_ahead() calls, for compute_order()
  std::uint64_t resumes_ STOKER_GUARDED_BY(mu_) = 0;
  // The sample order of epoch order_epoch_ (valid when has_order_).
  std::vector<std::size_t> order_ STOKER_GUARDED_BY(mu_);
  std::uint64_t order_epoch_ STOKER_GUARDED_BY(mu_) = 0;
  bool has_order_ STOKER_GUARDED_BY(mu_) = false;
  bool order_busy_ STOKER_GUARDED_BY(mu_) = false;
  // Written only by the thread that set order_busy_, with mu_ released; swapped under mu_.
  std::vector<std::size_t> order_scratch_;

  Clock::time_point started_ STOKER_GUARDED_BY(mu_){};
  bool started_set_ STOKER_GUARDED_BY(mu_) = false;

  std::atomic<std::uint64_t> batches_{0};
  std::atomic<std::uint64_t> samples_{0};
  std::atomic<std::uint64_t> bytes_{0};
  std::atomic<std::int64_t> wait_ns_{0};
  std::atomic<std::int64_t> consumer_cpu_ns_{0};  // Stats::consumer_cpu
  std::atomic<std::int64_t> worker_busy_ns_{0};
  std::atomic<std::int64_t> inline_busy_ns_{0};
  std::atomic<std::int64_t> worker_cpu_ns_{0};  // CPU time of the workers' reads
  // Time the workers were runnable but waited for a core (schedstat); see sample_run_delay.
  mutable std::atomic<std::int64_t> run_delay_ns_{0};
  static constexpr std::chrono::nanoseconds kRunDelayPeriod{std::chrono::milliseconds(10)};
  mutable std::atomic<std::int64_t> run_delay_sampled_at_{0};  // ns of Clock; 0: never
  std::atomic<std::uint64_t> skipped_{0};                      // in batches handed out
  std::atomic<std::uint64_t> skip_budget_used_{0};             // at read time, prefetch included
  std::atomic<std::uint64_t> ready_seen_sum_{0};  // ready batches seen by waiting takes
  std::atomic<std::uint64_t> waiting_takes_{0};
  std::atomic<std::size_t> workers_started_{0};  // numbers the worker threads' trace tracks
  // The pinned bytes last traced, and in which recording: take()'s, the consumer's.
  std::size_t pinned_traced_ = 0;
  std::uint64_t pinned_trace_ = 0;

  // The report of bad samples: bounded by max_skipped, as every entry used up the budget.
  mutable Mutex bad_mu_;
  std::map<std::size_t, SkippedSample> bad_ STOKER_GUARDED_BY(bad_mu_);

  std::atomic<std::size_t> memory_budget_{0};     // EngineConfig::memory_budget, as set since
  mutable std::atomic<bool> budget_said_{false};  // the memory budget's log line was written

  RecyclingPool<Ticket> tickets_{[] { return std::make_unique<Ticket>(); }};

  mutable Mutex threads_mu_;  // serializes set_workers, shutdown and run-delay sampling
  std::vector<std::unique_ptr<Worker>> threads_ STOKER_GUARDED_BY(threads_mu_);
};

}  // namespace stoker::detail
