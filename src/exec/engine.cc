#include "exec/engine.h"

#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <stdexcept>
#include <string>
#include <utility>

#include "stoker/frontend/log.h"
#include "stoker/frontend/schedstat.h"

namespace stoker::detail {
namespace {

// A failed sample is replaced by another at most this many times in a row before the row
// counts as failed (a data set where most samples fail should not spin).
constexpr std::size_t kMaxReplacements = 16;
constexpr std::uint64_t kReplacementSalt = 0x5bd1e9955bd1e995ULL;
// Probes that fail in a row before the layout is given up on (engine.h).
constexpr std::size_t kMaxProbes = 4096;

std::string describe(const std::exception_ptr& error) {
  try {
    std::rethrow_exception(error);
  } catch (const std::exception& e) {
    return e.what();
  } catch (...) {
    return "unknown exception";
  }
}

// CPU time of the calling thread: with the wall time of the same reads, it tells the tuner
// whether workers compute or wait (I/O, sleeps, the GIL).
std::int64_t thread_cpu_ns() {
  timespec t{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
  return std::int64_t{t.tv_sec} * 1'000'000'000 + t.tv_nsec;
}

// How long thread `tid` of this process (0: the calling thread) has waited on a run queue,
// runnable but without a core (the second field of its schedstat), or -1 if it cannot be read
// (no such thread any more, or a kernel without schedstats). With CPU and wall time, it tells
// a worker that waits for a core (oversubscribed) from one that waits for I/O or sleeps.
std::int64_t run_delay_ns(int tid) {
  char path[64];
  if (tid == 0) {
    std::snprintf(path, sizeof path, "/proc/thread-self/schedstat");
  } else {
    std::snprintf(path, sizeof path, "/proc/self/task/%d/schedstat", tid);
  }
  const auto stat = read_schedstat(path);
  return stat ? stat->run_delay_ns : -1;
}

// Sample reads shorter than this are not traced one by one, only their chunk: timing each
// costs a clock read (0.03-0.15 us on the 2-core VM, under load), which on `tiny`'s 3 KB rows
// (~0.7 us) cost a quarter of the throughput, and a read this short is too thin to see next
// to a training step anyway. Past it, the clock costs at most ~1.5% of a read.
constexpr std::int64_t kMinTracedReadNs = 10'000;

std::int64_t to_ns(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(t.time_since_epoch()).count();
}

std::int64_t ns_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() -
                                                              start)
      .count();
}

}  // namespace

Engine::Engine(EngineConfig config, std::shared_ptr<SlabPool> pool)
    : config_(std::move(config)),
      storage_start_(config_.dataset->object_storage_counters()),
      pool_(std::move(pool)),
      samples_per_epoch_(samples_per_rank(config_.order)),
      batches_per_epoch_(batch_count(samples_per_epoch_, config_.batch_size, config_.drop_last)),
      reads_chunks_(config_.dataset->reads_chunks() || config_.executors != nullptr) {
  memory_budget_.store(config_.memory_budget, std::memory_order_relaxed);
  bool layout_known = pool_->has_layout();
  std::size_t depth = config_.depth;
  if (layout_known) depth = fit_depth(depth);
  {
    MutexLock lock(mu_);
    depth_ = depth;
    layout_known_ = layout_known;
  }
  if (layout_known) pool_->reserve(depth + 1);
  tickets_.reserve(config_.depth + 1);
  set_workers(config_.workers);
}

Engine::~Engine() {
  {
    MutexLock lock(mu_);
    stop_ = true;
    cancel_in_flight();
    wake_all();
  }
  MutexLock threads_lock(threads_mu_);
  for (auto& w : threads_) w->thread.join();
}

void Engine::wake_all() {
  work_cv_.notify_all();
  ready_cv_.notify_all();
}

void Engine::set_workers(std::size_t workers) {
  MutexLock threads_lock(threads_mu_);
  std::size_t spawn = 0;
  {
    MutexLock lock(mu_);
    target_workers_ = workers;
    if (workers > running_workers_) spawn = workers - running_workers_;
    running_workers_ += spawn;
    wake_all();  // surplus workers retire; an inline consumer may take over
  }
  std::erase_if(threads_, [](const std::unique_ptr<Worker>& w) {
    if (!w->done.load(std::memory_order_acquire)) return false;
    w->thread.join();
    return true;
  });
  for (std::size_t i = 0; i < spawn; ++i) {
    try {
      auto worker = std::make_unique<Worker>();
      worker->thread = std::thread(&Engine::worker_main, this, worker.get());
      threads_.push_back(std::move(worker));
    } catch (...) {
      MutexLock lock(mu_);
      running_workers_ -= spawn - i;  // the ones that never started
      throw;
    }
  }
}

void Engine::set_depth(std::size_t depth) {
  depth = std::max<std::size_t>(depth, 1);
  bool layout_known = false;
  {
    MutexLock lock(mu_);
    if (layout_known_) depth = fit_depth(depth);
    depth_ = depth;
    layout_known = layout_known_;
    work_cv_.notify_all();
  }
  // Before the layout is learned there are no slabs to size: the probe that learns it
  // reserves depth_ + 1 with the depth set here.
  if (!layout_known) return;
  // One slab beyond the window covers the batch the consumer holds; more are made on demand.
  pool_->reserve(depth + 1);
  pool_->trim(depth + 1);
}

void Engine::set_memory_budget(std::size_t bytes, std::size_t held) {
  memory_budget_.store(bytes, std::memory_order_relaxed);
  std::size_t depth = 0;
  {
    MutexLock lock(mu_);
    if (!layout_known_) return;  // the probe that learns the layout fits the depth
    depth_ = depth = fit_depth(depth_);
  }
  pool_->trim(depth + held);
}

void Engine::count_run_delay(Worker& worker, std::int64_t now_ns) const {
  std::int64_t counted = worker.run_delay_counted.load(std::memory_order_relaxed);
  while (now_ns > counted && !worker.run_delay_counted.compare_exchange_weak(
                                 counted, now_ns, std::memory_order_relaxed)) {
  }
  if (now_ns > counted) run_delay_ns_.fetch_add(now_ns - counted, std::memory_order_relaxed);
}

std::int64_t Engine::sample_run_delay() const {
  // A file read per worker: not on every stats() call (some take them per batch).
  const std::int64_t now =
      std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now().time_since_epoch()).count();
  std::int64_t last = run_delay_sampled_at_.load(std::memory_order_relaxed);
  if (now - last < kRunDelayPeriod.count() ||
      !run_delay_sampled_at_.compare_exchange_strong(last, now, std::memory_order_relaxed)) {
    return run_delay_ns_.load(std::memory_order_relaxed);
  }
  MutexLock lock(threads_mu_);
  for (const auto& w : threads_) {
    const int tid = w->tid.load(std::memory_order_relaxed);
    if (tid == 0 || w->done.load(std::memory_order_acquire)) continue;
    if (const std::int64_t ns = run_delay_ns(tid); ns >= 0) count_run_delay(*w, ns);
  }
  return run_delay_ns_.load(std::memory_order_relaxed);
}

void Engine::worker_main(Worker* self) {
  // What the thread waited for a core before its first read is not the reads'.
  if (const std::int64_t ns = run_delay_ns(0); ns >= 0) {
    self->run_delay_counted.store(ns, std::memory_order_relaxed);
  }
  self->tid.store(static_cast<int>(gettid()), std::memory_order_relaxed);
  Tracer::name_thread("worker " + std::to_string(workers_started_.fetch_add(1) + 1));
  Tracer::set_current(config_.tracer);  // a worker process's reads are timed on this thread
  {
    MutexLock lock(mu_);
    while (!stop_ && running_workers_ <= target_workers_) {
      bool look_again = false;
      Ticket* ticket = find_work(/*head_only=*/false, look_again);
      if (ticket != nullptr) {
        run_chunk(ticket, worker_busy_ns_);
      } else if (!look_again) {
        lock.wait(work_cv_);
      }
    }
    --running_workers_;
  }
  if (const std::int64_t ns = run_delay_ns(0); ns >= 0) count_run_delay(*self, ns);
  self->done.store(true, std::memory_order_release);
}

Ticket* Engine::find_work(bool head_only, bool& look_again) {
  look_again = false;
  if (Ticket* ticket = claimable(head_only)) return ticket;
  if ((head_only && head_ != nullptr) || !can_open()) return nullptr;
  if (!layout_known_) {
    if (config_.on_error == ErrorPolicy::raise && probes_running_ == 0 && order_ready() &&
        probes_started_ >= batch_rows(open_batch_)) {
      return open_next();  // every sample of it failed its probe
    }
    look_again = probe();
    return nullptr;
  }
  // A probe still running may be of a sample in the batch this would open: its row must find
  // the probe's sample kept when it is read. The probe's end wakes the workers.
  if (probes_running_ > 0) return nullptr;
  if (order_ready()) return open_next();
  // One thread computes the epoch's order; the others wait for its wake-up.
  if (!order_busy_) {
    compute_order();
    look_again = true;  // the lock was released meanwhile
  }
  return nullptr;
}

Ticket* Engine::claimable(bool head_only) const {
  for (Ticket* s = head_; s != nullptr; s = s->next) {
    if (s->next_chunk < s->chunks) return s;
    if (head_only) break;
  }
  return nullptr;
}

void mark_host_only(std::vector<FieldSpec>& fields, const std::vector<std::string>& names) {
  for (const auto& name : names) {
    auto it = std::ranges::find(fields, name, &FieldSpec::name);
    if (it != fields.end()) {
      it->host_only = true;
      continue;
    }
    std::string known;
    for (const auto& f : fields) known += (known.empty() ? "'" : ", '") + f.name + "'";
    throw std::invalid_argument("stoker::LoaderOptions: keep_on_host names field '" + name +
                                "', which the dataset does not declare (it declares " + known +
                                ")");
  }
}

bool Engine::probe() {
  if (!order_ready()) {
    if (order_busy_) return false;
    compute_order();
    return true;
  }
  const std::size_t position = open_batch_ * config_.batch_size + probes_started_;
  if (config_.on_error == ErrorPolicy::raise) {
    // No further than the batches that may open: the failed ones open as they are probed.
    const std::size_t batches =
        std::min(open_batch_ + depth_ - in_flight_, batches_of(open_epoch_));
    if (position >= std::min(batches * config_.batch_size, samples_of(open_epoch_))) return false;
  } else if (position >= samples_of(open_epoch_) || probes_failed_ >= kMaxProbes) {
    // Nothing left to probe: once the last probes are back, their failure is the consumer's.
    if (probes_running_ == 0 && probe_error_) fail(probe_error_);
    return false;
  }
  const std::size_t index = order_[position];
  const std::uint64_t seed = mix(config_.order.seed, open_epoch_, index);
  ++probes_started_;
  ++probes_running_;
  std::vector<FieldSpec> fields;
  std::exception_ptr failure;
  std::exception_ptr aborted;
  {
    MutexUnlock unlocked(mu_);
    try {
      fields = config_.dataset->probe(index, seed, failure);
      if (fields.empty() && !failure) {
        throw std::runtime_error("the data set's sample holds no values");
      }
    } catch (...) {
      aborted = std::current_exception();
    }
  }
  --probes_running_;
  if (aborted) {
    fail(std::make_exception_ptr(SampleError(index, aborted, describe(aborted))));
  } else if (failure) {
    ++probes_failed_;
    probe_error_ = std::make_exception_ptr(SampleError(index, failure, describe(failure)));
  } else if (!layout_known_) {
    try {
      mark_host_only(fields, config_.keep_on_host);
    } catch (...) {  // the consumer's error, at each next()
      fail(std::current_exception());
      wake_all();
      return true;
    }
    pool_->set_fields(std::move(fields));
    layout_known_ = true;
    probe_error_ = nullptr;
    depth_ = fit_depth(depth_);
    // The first slabs, made by this worker for all (as the constructor does when the layout
    // is known up front).
    const std::size_t slabs = depth_ + 1;
    MutexUnlock unlocked(mu_);
    pool_->reserve(slabs);
  }
  wake_all();
  return true;
}

std::size_t Engine::fit_depth(std::size_t depth) const {
  const std::size_t slab = pool_->slab_bytes();
  const std::size_t budget = memory_budget_.load(std::memory_order_relaxed);
  if (budget == 0 || slab == 0) return depth;
  // One slab beyond the window is the batch the consumer holds; depth 1 is the least (a cap
  // too small for it is the loader's error to raise, with what would fit).
  const std::size_t fits = std::max<std::size_t>(budget / slab, 2) - 1;
  if (depth <= fits) return depth;
  if (!budget_said_.exchange(true)) {
    const auto mib = [](std::size_t bytes) { return std::to_string(bytes >> 20) + " MiB"; };
    log(LogLevel::warning, "memory for batch slabs (memory_limit, less what the RAM cache, " +
                               std::string("worker processes and device slots hold) of ") +
                               mib(budget) + " holds " + std::to_string(fits + 1) +
                               " batch slabs of " + mib(slab) +
                               ": batches in flight lowered from " + std::to_string(depth) +
                               " to " + std::to_string(fits));
  }
  return fits;
}

bool Engine::can_open() const {
  return !stop_ && !fatal_ && batches_of(open_epoch_) > 0 && in_flight_ < depth_ &&
         open_epoch_ <= epoch_ + 1;
}

bool Engine::order_ready() const { return has_order_ && order_epoch_ == open_epoch_; }

void Engine::compute_order() {
  order_busy_ = true;
  const std::uint64_t epoch = open_epoch_;
  const std::uint64_t resumes = resumes_;
  try {
    const auto ahead = std::find_if(ahead_.begin(), ahead_.end(),
                                    [&](const AheadOrder& a) { return a.epoch == epoch; });
    if (resumed_ && resumed_->epoch == epoch) {
      order_scratch_ = resumed_->order;
    } else if (ahead != ahead_.end()) {
      order_scratch_ = ahead->order;  // kept: a restart() into that epoch reads it again
    } else {
      MutexUnlock unlocked(mu_);
      epoch_order(config_.order, epoch, order_scratch_);
    }
  } catch (...) {
    order_busy_ = false;
    fail(std::current_exception());
    return;
  }
  order_busy_ = false;
  // A resume() or order_ahead() while the lock was released may have given this epoch
  // another order: this one is then dropped (the next look computes that one).
  if (resumes_ == resumes) {
    std::swap(order_, order_scratch_);
    order_epoch_ = epoch;
    has_order_ = true;
  }
  wake_all();
}

void Engine::fail(std::exception_ptr error) {
  if (!fatal_) fatal_ = std::move(error);
  wake_all();
}

Ticket* Engine::open_next() {
  const std::size_t size = batch_rows(open_batch_);
  Ticket* ticket = nullptr;
  try {
    ticket = tickets_.acquire();
    try {
      if (layout_known_) {
        ticket->slab = pool_->acquire();
      } else {
        ticket->slabless_rows.resize(size);
      }
    } catch (...) {
      tickets_.release(ticket);
      throw;
    }
  } catch (...) {
    fail(std::current_exception());
    return nullptr;
  }
  if (!layout_known_) probes_started_ -= size;  // the probes of the next batch on
  const std::size_t first = open_batch_ * config_.batch_size;
  ticket->epoch = open_epoch_;
  ticket->number = open_batch_;
  ticket->size = size;
  ticket->next_chunk = 0;
  ticket->chunks_done = 0;
  ticket->cancelled.store(false, std::memory_order_relaxed);
  ticket->next = nullptr;
  ticket->opened_ns = tracing() ? Tracer::now_ns() : 0;
  ticket->ready_ns = 0;
  {
    MutexLock failures(ticket->failure_mu);
    ticket->failure.reset();
    ticket->skipped.clear();
  }
  std::copy_n(order_.begin() + static_cast<std::ptrdiff_t>(first), size, ticket->rows().begin());
  hint_ahead();
  ticket->chunk_rows = (size + std::max<std::size_t>(target_workers_, 1) - 1) /
                       std::max<std::size_t>(target_workers_, 1);
  ticket->chunks = (size + ticket->chunk_rows - 1) / ticket->chunk_rows;

  if (tail_ != nullptr) {
    tail_->next = ticket;
  } else {
    head_ = ticket;
  }
  tail_ = ticket;
  ++in_flight_;
  ++open_batch_;
  roll_open_epoch();
  if (ticket->chunks > 1) work_cv_.notify_all();
  return ticket;
}

void Engine::retire(Ticket* ticket) noexcept {
  if (ticket->slab != nullptr) pool_->release(std::exchange(ticket->slab, nullptr));
  ticket->slabless_rows.clear();
  tickets_.release(ticket);
}

void Engine::run_chunk(Ticket* ticket, std::atomic<std::int64_t>& busy_ns) {
  const std::size_t begin = ticket->next_chunk++ * ticket->chunk_rows;
  const std::size_t end = std::min(begin + ticket->chunk_rows, ticket->size);
  const std::span<const std::size_t> rows = ticket->rows();
  bool traced = false;
  {
    MutexUnlock unlocked(mu_);
    traced = tracing();  // once per chunk: a trace begun mid-chunk starts with the next one
    const auto start = Clock::now();
    const std::int64_t cpu_start = thread_cpu_ns();
    if (reads_chunks_) {
      if (!ticket->cancelled.load(std::memory_order_relaxed)) read_chunk(ticket, begin, end);
    } else {
      // While tracing, one clock read per row (a read ends where the next begins), unless the
      // chunk's first row was too quick to draw: then only the chunk is.
      bool per_row = traced;
      std::int64_t read_start = traced ? to_ns(start) : 0;
      for (std::size_t row = begin; row < end; ++row) {
        // Cancelled (restart or shutdown): stop at the next row, not at the end of the chunk.
        if (ticket->cancelled.load(std::memory_order_relaxed)) break;
        if (row + 1 < end) config_.dataset->prefetch(rows[row + 1]);
        read_row(ticket, row);
        if (per_row) {
          const std::int64_t read_end = Tracer::now_ns();
          if (row == begin && read_end - read_start < kMinTracedReadNs) {
            per_row = false;
            continue;
          }
          config_.tracer->record({.start_ns = read_start,
                                  .end_ns = read_end,
                                  .a = rows[row],
                                  .name = TraceName::read});
          read_start = read_end;
        }
      }
    }
    const std::int64_t busy = ns_since(start);
    busy_ns.fetch_add(busy, std::memory_order_relaxed);
    if (&busy_ns == &worker_busy_ns_) {
      worker_cpu_ns_.fetch_add(thread_cpu_ns() - cpu_start, std::memory_order_relaxed);
    }
    if (traced) {
      config_.tracer->record({.start_ns = to_ns(start),
                              .end_ns = to_ns(start) + busy,
                              .a = ticket->epoch,
                              .b = ticket->number,
                              .c = end - begin,
                              .name = TraceName::chunk});
    }
  }
  ++ticket->chunks_done;
  if (ticket->cancelled.load(std::memory_order_relaxed)) {
    // Already out of the queue; the last chunk in progress returns the ticket.
    if (ticket->chunks_done == ticket->next_chunk) retire(ticket);
    return;
  }
  if (ticket->ready()) {
    if (traced) ticket->ready_ns = Tracer::now_ns();
    ++ready_;
    if (ticket == head_) ready_cv_.notify_one();
  }
}

void Engine::read_chunk(Ticket* ticket, std::size_t begin, std::size_t end) {
  const std::span<const std::size_t> indices = ticket->rows().subspan(begin, end - begin);
  std::vector<SampleOut> outs;
  outs.reserve(indices.size());
  for (std::size_t row = begin; row < end; ++row) {
    const std::uint64_t seed = mix(config_.order.seed, ticket->epoch, indices[row - begin]);
    outs.emplace_back(pool_->field_bytes(), field_bases(*ticket), row, seed, ticket->epoch);
  }
  std::vector<std::exception_ptr> errors(indices.size());
  try {
    read_rows(indices, outs, errors);
  } catch (...) {
    // Not tied to one row (the data set is closing, ...): every row failed with it.
    for (auto& e : errors) {
      if (!e) e = std::current_exception();
    }
  }
  for (std::size_t k = 0; k < errors.size(); ++k) {
    if (!errors[k]) continue;
    const std::size_t row = begin + k;
    const std::size_t index = indices[k];
    bool retry = false;
    try {
      std::rethrow_exception(errors[k]);
    } catch (...) {
      retry = on_failure(ticket, row, index, 0);
    }
    if (retry && !ticket->cancelled.load(std::memory_order_relaxed)) {
      read_row(ticket, row, replacement(ticket, index, 0), 1);
    }
  }
}

void Engine::read_rows(std::span<const std::size_t> indices, std::span<const SampleOut> outs,
                       std::span<std::exception_ptr> errors) const {
  if (config_.executors != nullptr && config_.executors->offer({indices, outs, errors})) return;
  config_.dataset->read_rows(indices, outs, errors);
}

std::size_t Engine::replacement(const Ticket* ticket, std::size_t index,
                                std::size_t attempt) const {
  return mix(config_.order.seed ^ kReplacementSalt, ticket->epoch, index + attempt) %
         config_.order.samples;
}

void Engine::read_row(Ticket* ticket, std::size_t row) {
  read_row(ticket, row, ticket->rows()[row], 0);
}

void Engine::read_row(Ticket* ticket, std::size_t row, std::size_t index,
                      std::size_t first_attempt) {
  for (std::size_t attempt = first_attempt;; ++attempt) {
    try {
      const std::uint64_t seed = mix(config_.order.seed, ticket->epoch, index);
      const SampleOut out(pool_->field_bytes(), field_bases(*ticket), row, seed, ticket->epoch);
      if (config_.executors != nullptr) {
        // A replacement goes where the chunk's other rows went (to a worker process: a
        // sample that kills its reader must not kill this one).
        std::exception_ptr error;
        read_rows({&index, 1}, {&out, 1}, {&error, 1});
        if (error) std::rethrow_exception(error);
      } else {
        config_.dataset->read(index, out);
      }
      ticket->rows()[row] = index;
      return;
    } catch (...) {
      if (!on_failure(ticket, row, index, attempt)) return;
    }
    index = replacement(ticket, index, attempt);
  }
}

bool Engine::on_failure(Ticket* ticket, std::size_t row, std::size_t index, std::size_t attempt) {
  std::exception_ptr cause = std::current_exception();
  std::string reason = describe(cause);
  if (config_.on_error == ErrorPolicy::skip) {
    const std::uint64_t used = skip_budget_used_.fetch_add(1, std::memory_order_relaxed) + 1;
    if (used <= config_.max_skipped && attempt < kMaxReplacements) {
      MutexLock guard(ticket->failure_mu);
      ticket->skipped.push_back({index, std::move(reason), sample_name(index)});
      return true;
    }
    skip_budget_used_.fetch_sub(1, std::memory_order_relaxed);  // raised, not skipped
    reason += attempt < kMaxReplacements
                  ? " (skip budget of " + std::to_string(config_.max_skipped) + " used up)"
                  : " (and " + std::to_string(kMaxReplacements) + " replacements failed too)";
  }
  MutexLock guard(ticket->failure_mu);
  if (!ticket->failure || row < ticket->failure->row) {
    ticket->failure = SampleFailure{row, index, std::move(cause), std::move(reason)};
  }
  return false;
}

void Engine::cancel_in_flight() {
  for (Ticket* s = head_; s != nullptr;) {
    Ticket* next = s->next;
    s->cancelled.store(true, std::memory_order_relaxed);
    if (s->ready()) --ready_;
    if (s->chunks_done == s->next_chunk) retire(s);  // nobody is reading it
    s = next;
  }
  head_ = tail_ = nullptr;
  in_flight_ = 0;
}

Engine::Taken Engine::take(Deadline deadline) {
  // The calling thread's CPU time since its last take() from this engine is the training
  // loop's work: marked when take() returns, however it returns.
  thread_local const Engine* t_engine = nullptr;
  thread_local std::int64_t t_mark = 0;
  if (t_engine == this) {
    consumer_cpu_ns_.fetch_add(thread_cpu_ns() - t_mark, std::memory_order_relaxed);
  }
  struct Mark {
    const Engine* engine;
    ~Mark() {
      t_engine = engine;
      t_mark = thread_cpu_ns();
    }
  } mark{this};
  Taken taken;
  const bool traced = tracing();
  std::pair<std::size_t, std::size_t> queue;
  Ticket* ticket = take_head(deadline, taken.end_of_epoch, traced, queue);
  if (ticket == nullptr) return taken;
  if (traced) {
    const std::int64_t now = Tracer::now_ns();
    config_.tracer->record({.start_ns = ticket->opened_ns,
                            .end_ns = now,
                            .a = static_cast<std::uint64_t>(ticket->ready_ns),
                            .b = ticket->epoch,
                            .c = ticket->number,
                            .name = TraceName::batch});
    config_.tracer->record(
        {.start_ns = now, .a = queue.first, .b = queue.second, .name = TraceName::queue});
    // Counting this loader's locked slabs takes the pool's lock: only when the process's
    // total moved, or at a trace's first batch.
    const std::size_t pinned = LockedBytes::in_use();
    if (pinned != pinned_traced_ || config_.tracer->recording() != pinned_trace_) {
      pinned_traced_ = pinned;
      pinned_trace_ = config_.tracer->recording();
      config_.tracer->record({.start_ns = now,
                              .a = pool_->locked_slabs() * pool_->slab_bytes(),
                              .b = pinned,
                              .name = TraceName::pinned});
    }
  }
  std::optional<SampleFailure> failure;
  {
    MutexLock failures(ticket->failure_mu);
    failure = std::move(ticket->failure);
    taken.info = {ticket->epoch, ticket->number, ticket->size, std::move(ticket->skipped)};
  }
  if (!taken.info.skipped.empty()) {
    MutexLock bad(bad_mu_);
    for (const auto& s : taken.info.skipped) bad_.try_emplace(s.index, s);
  }
  taken.slab.reset(std::exchange(ticket->slab, nullptr));
  tickets_.release(ticket);
  if (failure) throw SampleError(failure->index, failure->cause, failure->reason);
  std::size_t bytes = 0;
  for (std::size_t b : pool_->field_bytes()) bytes += b * taken.info.size;
  batches_.fetch_add(1, std::memory_order_relaxed);
  samples_.fetch_add(taken.info.size, std::memory_order_relaxed);
  bytes_.fetch_add(bytes, std::memory_order_relaxed);
  skipped_.fetch_add(taken.info.skipped.size(), std::memory_order_relaxed);
  return taken;
}

std::optional<Batch> Engine::next() {
  Taken taken = take(std::nullopt);
  if (!taken.slab) return std::nullopt;
  return Batch(std::shared_ptr<BatchOwner>(pool_, taken.slab.release()), std::move(taken.info));
}

std::vector<SkippedSample> Engine::skipped_samples() const {
  MutexLock bad(bad_mu_);
  std::vector<SkippedSample> out;
  out.reserve(bad_.size());
  for (const auto& [index, sample] : bad_) out.push_back(sample);
  return out;
}

std::string Engine::sample_name(std::size_t index) const noexcept {
  try {
    return config_.dataset->sample_name(index);
  } catch (...) {
    return {};  // a report without the name rather than a lost failure
  }
}

Ticket* Engine::take_head(Deadline deadline, bool& end_of_epoch, bool traced,
                          std::pair<std::size_t, std::size_t>& queue) {
  MutexLock lock(mu_);
  if (!started_set_) {
    started_ = Clock::now();
    started_set_ = true;
  }
  if (delivered_ == batches_of(epoch_)) {
    ++epoch_;
    delivered_ = 0;
    work_cv_.notify_all();  // workers may now run one more epoch ahead
    end_of_epoch = true;
    return nullptr;
  }
  if (fatal_reported_) {
    fatal_ = nullptr;
    fatal_reported_ = false;
    work_cv_.notify_all();
  }
  const bool waits = !deadline || *deadline != kNoWait;
  if (waits) {
    ready_seen_sum_.fetch_add(ready_, std::memory_order_relaxed);
    waiting_takes_.fetch_add(1, std::memory_order_relaxed);
  }
  while (head_ == nullptr || !head_->ready()) {
    const bool time_left = !deadline || Clock::now() < *deadline;
    if (time_left && target_workers_ == 0) {
      // Inline: the consumer reads the head batch itself, a chunk at a time.
      bool look_again = false;
      Ticket* ticket = find_work(/*head_only=*/true, look_again);
      if (ticket != nullptr) run_chunk(ticket, inline_busy_ns_);
      if (ticket != nullptr || look_again) continue;
    }
    if (!waits) return nullptr;
    if (head_ == nullptr && fatal_) {
      // Nothing in flight can complete: report the failure; the next call tries again.
      fatal_reported_ = true;
      std::rethrow_exception(fatal_);
    }
    if (!time_left) return nullptr;
    const auto start = Clock::now();
    if (deadline) {
      lock.wait_until(ready_cv_, *deadline);
    } else {
      lock.wait(ready_cv_);
    }
    wait_ns_.fetch_add(ns_since(start), std::memory_order_relaxed);
  }

  Ticket* ticket = head_;
  head_ = ticket->next;
  if (head_ == nullptr) tail_ = nullptr;
  ticket->next = nullptr;
  --in_flight_;
  --ready_;
  ++delivered_;
  if (traced) queue = {in_flight_, ready_};
  work_cv_.notify_one();
  return ticket;
}

void Engine::restart(Position position) {
  MutexLock lock(mu_);
  if (position.epoch == epoch_ && position.batch == delivered_) return;
  cancel_in_flight();
  probes_started_ = 0;  // before the layout is known, probe from the new position
  epoch_ = position.epoch;
  delivered_ = position.batch;
  open_epoch_ = epoch_;
  open_batch_ = delivered_;
  roll_open_epoch();
  wake_all();
}

void Engine::hint_ahead() {
  if (hinted_epoch_ != open_epoch_ || hinted_resumes_ != resumes_) {
    hinted_epoch_ = open_epoch_;
    hinted_resumes_ = resumes_;
    hinted_through_ = 0;
  }
  const std::size_t end =
      std::min(batches_of(open_epoch_), open_batch_ + std::max<std::size_t>(depth_, 1) * kHintLead);
  // A hint: fetches start before the reads. A batch the data set had no room for (what it may
  // fetch ahead is full until reads take some) is hinted again as the next batch opens.
  for (std::size_t b = std::max(hinted_through_, open_batch_); b < end; ++b) {
    const auto rows =
        std::span<const std::size_t>(order_).subspan(b * config_.batch_size, batch_rows(b));
    if (!config_.dataset->will_read(rows)) break;
    hinted_through_ = b + 1;
  }
}

void Engine::roll_open_epoch() {
  // An epoch with no batches (a resumed one with nothing left) is stepped over too; one
  // resumed epoch at most, so this ends.
  while (open_batch_ == batches_of(open_epoch_) && batches_per_epoch_ > 0) {
    ++open_epoch_;
    open_batch_ = 0;
  }
}

void Engine::resume(std::uint64_t epoch, std::vector<std::size_t> order, std::size_t batch) {
  const std::size_t size = config_.dataset->size();
  for (std::size_t index : order) {
    if (index >= size) {
      throw std::out_of_range("stoker: the resumed order has sample " + std::to_string(index) +
                              ", past the data set's " + std::to_string(size));
    }
  }
  const std::size_t batches = batch_count(order.size(), config_.batch_size, config_.drop_last);
  if (batch > batches) {
    throw std::invalid_argument("stoker: batch " + std::to_string(batch) +
                                " is past the resumed epoch's " + std::to_string(batches) +
                                " batches");
  }
  MutexLock lock(mu_);
  cancel_in_flight();
  resumed_ = ResumedEpoch{epoch, std::move(order), batches};
  ++resumes_;
  if (has_order_ && order_epoch_ == epoch) has_order_ = false;
  probes_started_ = 0;
  epoch_ = epoch;
  delivered_ = batch;
  open_epoch_ = epoch;
  open_batch_ = batch;
  roll_open_epoch();
  wake_all();
}

bool Engine::order_ahead(std::uint64_t epoch, std::vector<std::size_t> order) {
  if (order.size() != samples_per_epoch_) {
    throw std::invalid_argument("stoker: an epoch's order given ahead has " +
                                std::to_string(order.size()) + " samples, not " +
                                std::to_string(samples_per_epoch_));
  }
  const std::size_t size = config_.dataset->size();
  for (std::size_t index : order) {
    if (index >= size) {
      throw std::out_of_range("stoker: an epoch's order given ahead has sample " +
                              std::to_string(index) + ", past the data set's " +
                              std::to_string(size));
    }
  }
  MutexLock lock(mu_);
  const bool begun = open_epoch_ > epoch || (open_epoch_ == epoch && open_batch_ > 0) ||
                     (has_order_ && order_epoch_ == epoch);
  if (begun) return false;
  // Orders of epochs the consumer has passed go; one not yet opened stays (the consumer may
  // give the next epoch's before the engine opened this one).
  const std::uint64_t consumed = epoch_;  // the consumer's epoch: those before it are passed
  std::erase_if(ahead_,
                [&](const AheadOrder& a) { return a.epoch < consumed || a.epoch == epoch; });
  ahead_.push_back(AheadOrder{epoch, std::move(order)});
  ++resumes_;  // an order of that epoch being computed now is dropped
  wake_all();
  return true;
}

std::size_t Engine::batches_in(std::uint64_t epoch) const {
  MutexLock lock(mu_);
  return batches_of(epoch);
}

Position Engine::position() const {
  MutexLock lock(mu_);
  return {epoch_, delivered_};
}

Stats Engine::stats() const {
  Stats s;
  {
    MutexLock lock(mu_);
    if (started_set_) s.elapsed = Clock::now() - started_;
    s.workers = target_workers_;
    s.depth = depth_;
    s.in_flight = in_flight_;
    s.ready = ready_;
  }
  s.batches = batches_.load(std::memory_order_relaxed);
  s.samples = samples_.load(std::memory_order_relaxed);
  s.bytes = bytes_.load(std::memory_order_relaxed);
  s.consumer_wait = std::chrono::nanoseconds(wait_ns_.load(std::memory_order_relaxed));
  s.consumer_cpu = std::chrono::nanoseconds(consumer_cpu_ns_.load(std::memory_order_relaxed));
  s.worker_busy = std::chrono::nanoseconds(worker_busy_ns_.load(std::memory_order_relaxed));
  s.inline_busy = std::chrono::nanoseconds(inline_busy_ns_.load(std::memory_order_relaxed));
  const ExecutorStats executors =
      config_.executors != nullptr ? config_.executors->stats() : ExecutorStats{};
  s.worker_cpu =
      std::chrono::nanoseconds(worker_cpu_ns_.load(std::memory_order_relaxed)) + executors.cpu;
  s.worker_run_delay = std::chrono::nanoseconds(sample_run_delay()) + executors.run_delay;
  s.worker_lock_held = executors.lock_held;
  s.network_units = executors.remote_units;
  s.network_bytes = executors.remote_bytes;
  s.network_wait = executors.remote_wait;
  s.network_read = executors.remote_read;
  s.network_idle = executors.remote_idle;
  s.skipped = skipped_.load(std::memory_order_relaxed);
  {
    MutexLock bad(bad_mu_);
    s.bad_samples = bad_.size();
  }
  const std::uint64_t calls = waiting_takes_.load(std::memory_order_relaxed);
  s.mean_ready_at_next =
      calls ? static_cast<double>(ready_seen_sum_.load(std::memory_order_relaxed)) / calls : 0.0;
  s.slabs = pool_->slabs();
  s.slab_bytes = pool_->has_layout() ? s.slabs * pool_->slab_bytes() : 0;
  s.locked_slabs = pool_->locked_slabs();
  s.memory_slabs = s.slab_bytes;
  s.memory_cache = config_.dataset->resident_bytes();
  s.memory_workers = executors.resident_bytes;
  const ObjectStorageCounters storage = config_.dataset->object_storage_counters();
  const ObjectStorageCounters& from = storage_start_;
  s.storage_fetches = storage.chunk_fetches - from.chunk_fetches;
  s.storage_fetch_time = std::chrono::nanoseconds(storage.fetch_ns - from.fetch_ns);
  s.storage_bytes = storage.bytes_fetched - from.bytes_fetched;
  s.storage_wait = std::chrono::nanoseconds(storage.wait_ns - from.wait_ns);
  s.storage_retries = storage.retries - from.retries;
  s.storage_cache_hits = storage.cache_hits - from.cache_hits;
  return s;
}

}  // namespace stoker::detail
