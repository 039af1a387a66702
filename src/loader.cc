// The one place that wires sampler, slab pool and worker engine into a Loader.
#include "stoker/loader.h"

#include <algorithm>
#include <cstdlib>
#include <set>
#include <string>
#include <utility>

#include "device/device_stage.h"
#include "exec/engine.h"
#include "memory/batch_owner.h"
#include "memory/slab_pool.h"
#include "stoker/device.h"
#include "stoker/frontend/environment.h"
#include "stoker/frontend/host_allocator.h"
#include "stoker/frontend/loader_internals.h"
#include "stoker/frontend/log.h"
#include "stoker/frontend/memory_cap.h"
#include "stoker/frontend/shuffle_choice.h"
#include "stoker/frontend/tracer.h"
#include "tune/tuner.h"

namespace stoker {
namespace {

// Generous: more threads than this is a configuration mistake, not a tuning choice.
constexpr std::size_t kMaxWorkers = 1024;

[[noreturn]] void invalid(const std::string& what) {
  throw std::invalid_argument("stoker::LoaderOptions: " + what);
}

void validate(const LoaderOptions& o, const std::vector<FieldSpec>& fields) {
  if (!o.dataset) invalid("dataset is null");
  if (o.batch_size == 0) invalid("batch_size must be at least 1");
  if (o.depth == 0) invalid("depth must be at least 1");
  if (o.device_depth == 0) invalid("device_depth must be at least 1");
  if (o.workers > kMaxWorkers) {
    invalid("workers = " + std::to_string(o.workers) + " is more than " +
            std::to_string(kMaxWorkers));
  }
  if (o.shard.world_size == 0) invalid("shard.world_size must be at least 1");
  if (o.shard.rank >= o.shard.world_size) {
    invalid("shard.rank = " + std::to_string(o.shard.rank) +
            " is not below world_size = " + std::to_string(o.shard.world_size));
  }
  if (fields.empty() && o.dataset->fields_known()) invalid("the dataset declares no fields");
  std::set<std::string> names;
  for (const auto& f : fields) {
    if (!names.insert(f.name).second) invalid("the dataset declares field '" + f.name + "' twice");
    for (auto d : f.shape) {
      if (d < 0) invalid("field '" + f.name + "' has a negative dimension");
    }
  }
}

// The data set's fields, with those named in keep_on_host marked host_only (a data set that
// learns its layout from its samples: none yet, the engine marks them then).
std::vector<FieldSpec> batch_fields(const LoaderOptions& o) {
  auto fields = o.dataset ? o.dataset->fields() : std::vector<FieldSpec>{};
  if (o.dataset && o.dataset->fields_known()) detail::mark_host_only(fields, o.keep_on_host);
  return fields;
}

// The backend named by `device`, or null for the CPU (asked for, or no CUDA device answers).
std::unique_ptr<detail::DeviceBackend> open_device(const LoaderOptions& o) {
  Device device;
  try {
    device = parse_device(o.device);
  } catch (const std::invalid_argument& e) {
    invalid(e.what());
  }
  if (device.kind == DeviceKind::cpu) return nullptr;
  if (device.kind == DeviceKind::sim) return detail::open_sim(o.sim);
  std::string why;
  auto backend = detail::open_cuda(device.index < 0 ? 0 : device.index, why);
  if (!backend) {
    detail::log(LogLevel::warning, "device '" + o.device + "' asked for, but no CUDA device " +
                                       "answers (" + why + "); batches stay in host memory");
  }
  return backend;
}

detail::SlabMemory slab_memory(const LoaderOptions& o, const detail::LoaderInternals& internals,
                               detail::DeviceBackend* backend) {
  detail::SlabMemory memory;
  memory.lock_limit = o.pin_budget ? o.pin_budget : detail::default_pin_budget();
  // Slabs from elsewhere (shared memory that worker processes write into) are page-locked by
  // registering them with the device, within the same budget; never mlock'ed.
  const auto& shared = internals.slab_allocator;
  if (shared) memory.pageable = shared;
  if (o.pin_memory == PinMemory::off) return memory;
  if (backend) {  // the copy stage reads the slabs
    memory.locked = shared ? backend->registered_allocator(shared) : backend->pinned_allocator();
    return memory;
  }
  if (o.pin_memory != PinMemory::on) return memory;
  // Batches stay on the host, and the caller copies them to a GPU itself (torch's
  // pin_memory=True, then .to("cuda", non_blocking=True)): CUDA-pinned if a device answers,
  // so that copy is a DMA that overlaps compute, with a fence per slab so that the slab is
  // not refilled under that DMA; else mlock'ed.
  std::shared_ptr<detail::DeviceBackend> device = internals.host_device;
  if (!device) {
    std::string why;
    device = detail::open_cuda(0, why);
  }
  if (device) {
    memory.locked = shared ? device->registered_allocator(shared) : device->pinned_allocator();
    if (memory.locked) memory.make_fence = detail::release_fences(device, o.stream);
  } else if (!shared) {
    memory.locked = detail::locked_allocator();
  }
  return memory;
}

}  // namespace

Loader::Loader(LoaderOptions options) : Loader(std::move(options), detail::LoaderInternals{}) {}

Loader::Loader(LoaderOptions options, const detail::LoaderInternals& internals)
    : tracer_(std::make_unique<detail::Tracer>()) {
  const auto fields = batch_fields(options);
  validate(options, fields);
  auto backend = open_device(options);
  // A data set that learns its layout from its samples gets it from the engine's first probe.
  auto memory = slab_memory(options, internals, backend.get());
  auto pool =
      options.dataset->fields_known()
          ? std::make_shared<detail::SlabPool>(fields, options.batch_size, std::move(memory))
          : std::make_shared<detail::SlabPool>(options.batch_size, std::move(memory));
  device_depth_ = backend ? options.device_depth : 0;
  stage_ = backend ? detail::make_copy_stage(std::move(backend), pool, options.device_depth,
                                             options.stream, *tracer_)
                   : detail::make_host_stage();

  detail::EngineConfig config;
  config.order = {options.dataset->size(), options.shuffle, options.seed, options.shard};
  if (options.shuffle) {
    const Dataset::StorageLayout layout = options.dataset->storage_layout();
    detail::ShuffleEvidence evidence;
    evidence.asked = options.shuffle_mode;
    evidence.samples = options.dataset->size();
    evidence.lookahead_samples =
        detail::lookahead_samples(options.batch_size, options.depth, layout.fetches_ahead);
    // The ranks that share the cache, and the runs of blocks a windowed order is laid out for.
    const std::size_t world = options.shard.world_size;
    const std::optional<std::string> local_world = detail::env_var("LOCAL_WORLD_SIZE");
    const std::size_t local_ranks =
        detail::local_ranks(local_world ? local_world->c_str() : nullptr);  // 1 where not set
    const NodeLayout nodes = layout.cache_per_process
                                 ? NodeLayout{world, 1}
                                 : detail::node_layout(world, local_world ? local_ranks : 0);
    evidence.node_ranks = layout.cache_per_process ? 1 : std::min(local_ranks, world);
    if (layout.blocks != nullptr && layout.read_whole) {
      evidence.blocks = layout.blocks->ends.size();
      evidence.data_bytes = layout.blocks->total_bytes();
      evidence.cache_bytes = layout.cache_bytes;
      evidence.cache = layout.cache;
      evidence.cache_option = layout.cache_option;
      evidence.ahead_apart = layout.ahead_apart;
      evidence.sharded = options.shard.world_size > 1;
    }
    detail::ShuffleChoice choice = detail::choose_shuffle(evidence);
    if (choice.window > 0) {
      config.order.blocks = layout.blocks;
      config.order.window = choice.window;
      config.order.nodes = nodes;
      if (nodes.nodes > 1) {
        choice.reason += "; each of the " + std::to_string(nodes.nodes) +
                         (nodes.ranks > 1 ? " nodes" : " ranks") + " reads its own blocks";
      }
    }
    shuffle_ = std::move(choice.reason);
  }
  cheaper_reads_ = options.dataset->cheaper_reads();
  config.dataset = std::move(options.dataset);
  config.batch_size = options.batch_size;
  config.drop_last = options.drop_last;
  config.workers = options.workers;
  config.depth = options.depth;
  config.on_error = options.on_error;
  config.keep_on_host = options.keep_on_host;
  memory_ = std::make_unique<detail::MemoryGuard>(
      options.memory_limit ? options.memory_limit
                           : detail::default_memory_limit(detail::mem_available()),
      options.memory_budget);
  // What the cap leaves the slabs before anything else holds memory (the cache may hold some
  // already); check_memory() moves it as the rest grows.
  const auto slab_share = [&](const detail::SlabPool& slabs) {
    detail::MemoryUse others;
    others.cache = config.dataset->resident_bytes();
    others.device_slots = device_depth_ * slabs.slab_bytes();
    const std::size_t slab = slabs.slab_bytes();
    const auto share = detail::divide_memory_cap(memory_->limit(), memory_->slab_budget(), slab,
                                                 others, detail::kHeldBatches);
    if (slabs.has_layout() && share.max_depth == 0) {
      throw std::invalid_argument(
          "stoker::Loader: " +
          detail::memory_cap_too_small(memory_->limit(), slab, others, detail::kHeldBatches));
    }
    return share.depth_budget;
  };
  config.memory_budget = slab_share(*pool);
  const std::size_t config_memory_budget = config.memory_budget;
  config.max_skipped = options.max_skipped;
  config.tracer = tracer_.get();
  config.executors = internals.executors;
  engine_ = std::make_unique<detail::Engine>(std::move(config), std::move(pool));
  detail::TuneLimits limits;
  limits.cores = options.cpu_cores > 0 ? options.cpu_cores : detail::host_share().cpu_share;
  const std::size_t max = options.max_workers
                              ? options.max_workers
                              : detail::default_max_workers(limits.cores, /*python_reads=*/false);
  limits.max_workers = std::clamp(max, options.workers, kMaxWorkers);
  // Counted against each window's slab size: a data set may learn its layout from its first
  // sample, after this.
  limits.memory_budget = config_memory_budget;
  tuner_ = std::make_unique<detail::WorkerTuner>(limits, !options.tune_workers);
}

Loader::~Loader() {
  stage_.reset();  // batches taken ahead go back before the engine stops
  engine_.reset();
  // tracer_ writes a trace still recording when it goes, now that nothing records into it.
}

void Loader::add_memory(Stats& s) const {
  const std::size_t slab = s.slabs ? s.slab_bytes / s.slabs : 0;
  s.memory_device_slots = device_depth_ * slab;
  s.memory_used = s.memory_slabs + s.memory_device_slots + s.memory_cache + s.memory_workers;
  s.memory_limit = memory_->limit();
  s.memory_peak = std::max(memory_->peak(), s.memory_used);
}

void Loader::check_memory() {
  if (!memory_->due()) return;
  Stats s = engine_->stats();
  add_memory(s);
  const std::size_t slab = s.slabs ? s.slab_bytes / s.slabs : 0;
  memory_->saw(s.memory_used, slab != 0);
  if (slab == 0) return;  // the layout is not known yet: nothing to divide
  detail::MemoryUse others;
  others.device_slots = s.memory_device_slots;
  others.cache = s.memory_cache;
  others.workers = s.memory_workers;
  others.reserve = memory_->growth_reserve(others.cache + others.workers);
  using detail::kHeldBatches;
  auto share = detail::divide_memory_cap(memory_->limit(), memory_->slab_budget(), slab, others,
                                         kHeldBatches);
  if (share.max_depth == 0) {
    // Not one batch in flight fits beside what the rest holds. Beside the device slots alone
    // (fixed from the start) it never will: refused. Outgrown by the worker processes or the
    // RAM cache, which cannot give memory back at once, the run goes on with one batch in
    // flight rather than end a run of hours, said once in the log.
    detail::MemoryUse fixed;
    fixed.device_slots = others.device_slots;
    const std::string too_small =
        detail::memory_cap_too_small(memory_->limit(), slab, others, kHeldBatches);
    if (detail::divide_memory_cap(memory_->limit(), memory_->slab_budget(), slab, fixed,
                                  kHeldBatches)
            .max_depth == 0) {
      throw std::invalid_argument("stoker::Loader: " + too_small);
    }
    if (memory_->first_overrun()) {
      detail::log(LogLevel::warning,
                  "stoker::Loader: " + too_small + "; going on with one batch in flight");
    }
    share.max_depth = 1;
    share.depth_budget = 2 * slab;  // (depth + 1) slabs, as the engine and the tuner count
  }
  engine_->set_memory_budget(share.depth_budget, kHeldBatches);
  tuner_->set_memory_budget(share.depth_budget);
}

void Loader::tune() {
  if (!tuner_->due()) return;
  const Stats now = engine_->stats();
  if (auto d = tuner_->observe(now, engine_->worker_limit())) {
    if (d->workers != now.workers) engine_->set_workers(d->workers);
    if (d->depth != now.depth) engine_->set_depth(d->depth);
  }
}

std::optional<Batch> Loader::next() {
  return std::move(next_for(std::chrono::nanoseconds::max()).batch);
}

NextResult Loader::next_for(std::chrono::nanoseconds timeout) {
  using Clock = detail::Engine::Clock;
  const bool traced = tracer_->on();
  if (traced) trace_call();
  check_memory();
  tune();
  detail::Engine::Deadline deadline;
  if (timeout != std::chrono::nanoseconds::max()) {
    // A timeout past the clock's range waits for as long as it takes, as next() does.
    const auto now = Clock::now();
    if (timeout < Clock::time_point::max() - now) deadline = now + timeout;
  }
  NextResult result;
  try {
    result = stage_->next(*engine_, deadline);
  } catch (...) {
    if (traced) trace_return(false);
    throw;
  }
  if (traced && result.status != NextResult::Status::timed_out) {
    trace_return(result.status == NextResult::Status::batch);
  }
  return result;
}

void Loader::trace_call() {
  const std::int64_t now = detail::Tracer::now_ns();
  detail::Tracer::name_thread_once("consumer");
  if (taken_at_ != 0) {
    tracer_->record({.start_ns = taken_at_, .end_ns = now, .name = detail::TraceName::step});
    taken_at_ = 0;
  }
  if (wait_since_ == 0) wait_since_ = now;  // a timed-out call's wait goes on
}

void Loader::trace_return(bool batch) {
  const std::int64_t now = detail::Tracer::now_ns();
  if (wait_since_ != 0) {
    tracer_->record({.start_ns = wait_since_, .end_ns = now, .name = detail::TraceName::wait});
  }
  wait_since_ = 0;
  taken_at_ = batch ? now : 0;
}

void Loader::trace(const std::string& path, const TraceOptions& options) {
  tracer_->start(path, options);
  wait_since_ = taken_at_ = 0;
}

void Loader::stop_trace() { tracer_->stop(); }
void Loader::set_epoch(std::uint64_t epoch) { restart({epoch, 0}); }
Position Loader::position() const { return stage_->position(*engine_); }

void Loader::restart(Position position) {
  const Position now = this->position();
  if (now.epoch == position.epoch && now.batch == position.batch) return;  // keep the prefetch
  stage_->reset(position);
  engine_->restart(position);
}

void Loader::restore(const Position& position) {
  const std::size_t batches = engine_->batches_in(position.epoch);
  if (position.batch > batches) {
    throw std::invalid_argument("stoker::Loader::restore: batch " + std::to_string(position.batch) +
                                " is past the " + std::to_string(batches) + " batches of epoch " +
                                std::to_string(position.epoch));
  }
  restart(position);
}

void Loader::resume(std::uint64_t epoch, std::vector<std::size_t> order, std::size_t batch) {
  engine_->resume(epoch, std::move(order), batch);  // checks before anything changes
  stage_->reset({epoch, batch});
}

bool Loader::order_ahead(std::uint64_t epoch, std::vector<std::size_t> order) {
  return engine_->order_ahead(epoch, std::move(order));
}

std::size_t Loader::batches_in(std::uint64_t epoch) const { return engine_->batches_in(epoch); }

std::size_t Loader::batches_per_epoch() const { return engine_->batches_per_epoch(); }
std::size_t Loader::samples_per_epoch() const { return engine_->samples_per_epoch(); }
std::span<const FieldSpec> Loader::fields() const { return engine_->fields(); }
void Loader::set_workers(std::size_t workers) {
  if (workers > kMaxWorkers) {
    throw std::invalid_argument("stoker::Loader::set_workers: " + std::to_string(workers) +
                                " is more than " + std::to_string(kMaxWorkers));
  }
  engine_->set_workers(workers);
}
void Loader::set_depth(std::size_t depth) { engine_->set_depth(depth); }
std::vector<SkippedSample> Loader::skipped_samples() const { return engine_->skipped_samples(); }
const SampleOrder& Loader::order() const { return engine_->order(); }
Stats Loader::stats() const {
  Stats s = engine_->stats();
  s.shuffle = shuffle_;
  s.shuffle_window = engine_->order().window;
  stage_->add_stats(s);
  tuner_->add_stats(s);
  add_memory(s);
  return s;
}
Report Loader::report() const {
  return diagnose(stats(), engine_->worker_limit() != 0, cheaper_reads_);
}

// --- Batch ---------------------------------------------------------------------------------

Batch::Batch(std::shared_ptr<detail::BatchOwner> owner, Info info) noexcept
    : owner_(std::move(owner)), info_(std::move(info)) {}

Batch& Batch::operator=(Batch&& other) noexcept {
  if (this != &other) {
    release();
    owner_ = std::move(other.owner_);
    info_ = std::move(other.info_);
  }
  return *this;
}

void Batch::release() noexcept {
  if (owner_ != nullptr) {
    owner_->give_back();
    owner_.reset();
  }
}

std::span<const FieldSpec> Batch::fields() const noexcept { return owner_->layout().fields; }

std::size_t Batch::field_index(std::string_view name) const {
  const auto f = fields();
  for (std::size_t i = 0; i < f.size(); ++i) {
    if (f[i].name == name) return i;
  }
  throw std::out_of_range("stoker::Batch: no field named '" + std::string(name) + "'");
}

std::span<std::byte> Batch::bytes(std::size_t field) const noexcept {
  const auto& layout = owner_->layout();
  return {owner_->host() + layout.field_offsets[field], info_.size * layout.field_bytes[field]};
}

void* Batch::data(std::size_t field) const noexcept {
  std::byte* base = on_device(field) ? owner_->device_memory() : owner_->host();
  return base + owner_->layout().field_offsets[field];
}

bool Batch::on_device(std::size_t field) const noexcept {
  return owner_->device_memory() != nullptr && !owner_->layout().fields[field].host_only;
}

std::string_view Batch::device() const noexcept { return owner_->device(); }
void Batch::wait(void* stream) { owner_->wait(stream); }
void Batch::synchronize() { owner_->synchronize(); }

std::span<const std::size_t> Batch::indices() const noexcept {
  return owner_->indices().first(info_.size);
}

// --- errors --------------------------------------------------------------------------------

SampleError::SampleError(std::size_t index, std::exception_ptr cause, const std::string& reason)
    : std::runtime_error("sample " + std::to_string(index) + ": " + reason),
      index_(index),
      cause_(std::move(cause)) {}

}  // namespace stoker
