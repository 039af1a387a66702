// The one place that wires sampler, slab pool and worker engine into a Loader.
#include "stoker/loader.h"

#include <algorithm>
#include <set>
#include <string>
#include <thread>
#include <utility>

#include "device/device_stage.h"
#include "exec/engine.h"
#include "memory/slab_pool.h"
#include "sampler/sampler.h"
#include "tune/tuner.h"
#include "util/log.h"

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
  if (fields.empty()) invalid("the dataset declares no fields");
  std::set<std::string> names;
  for (const auto& f : fields) {
    if (!names.insert(f.name).second) invalid("the dataset declares field '" + f.name + "' twice");
    for (auto d : f.shape) {
      if (d < 0) invalid("field '" + f.name + "' has a negative dimension");
    }
  }
}

// The backend named by `device`, or null for the CPU (asked for, or no CUDA device answers).
std::unique_ptr<detail::DeviceBackend> open_device(const LoaderOptions& o) {
  if (o.device == "cpu") return nullptr;
  if (o.device == "sim") return detail::open_sim(o.sim);
  int ordinal = 0;
  if (o.device.starts_with("cuda:")) {
    const std::string n = o.device.substr(5);
    if (n.empty() || n.find_first_not_of("0123456789") != std::string::npos) {
      invalid("device '" + o.device + "': expected cuda:N");
    }
    ordinal = std::stoi(n);
  } else if (o.device != "cuda") {
    invalid("device '" + o.device + "' is not one of cpu, cuda, cuda:N, sim");
  }
  std::string why;
  auto backend = detail::open_cuda(ordinal, why);
  if (!backend) {
    detail::log(LogLevel::warning, "device '" + o.device + "' asked for, but no CUDA device " +
                                       "answers (" + why + "); batches stay in host memory");
  }
  return backend;
}

detail::SlabMemory slab_memory(const LoaderOptions& o, detail::DeviceBackend* backend) {
  detail::SlabMemory memory;
  memory.lock_limit = o.pin_budget ? o.pin_budget : detail::default_pin_budget();
  if (o.slab_allocator) {
    // Shared slabs (worker processes write into them): page-locked by registering them with
    // the device, within the same budget, where batches go to one (or pin_memory is on and a
    // CUDA device answers); never mlock'ed.
    memory.pageable = o.slab_allocator;
    if (o.pin_memory == PinMemory::off) return memory;
    if (backend) {
      memory.locked = backend->registered_allocator(o.slab_allocator);
    } else if (o.pin_memory == PinMemory::on) {
      std::string why;
      auto cuda = detail::open_cuda(0, why);
      if (cuda) memory.locked = cuda->registered_allocator(o.slab_allocator);
    }
    return memory;
  }
  if (o.pin_memory == PinMemory::off) return memory;
  if (backend) {
    memory.locked = backend->pinned_allocator();
  } else if (o.pin_memory == PinMemory::on) {
    // Batches stay on the host, and the caller copies them to a GPU itself (torch's
    // pin_memory=True, then .to("cuda", non_blocking=True)): CUDA-pinned if a device answers,
    // so that copy is a DMA that overlaps compute; else mlock'ed.
    std::string why;
    auto cuda = detail::open_cuda(0, why);
    memory.locked = cuda ? cuda->pinned_allocator() : detail::locked_allocator();
  }
  return memory;
}

}  // namespace

Loader::Loader(LoaderOptions options) {
  const auto fields = options.dataset ? options.dataset->fields() : std::vector<FieldSpec>{};
  validate(options, fields);
  auto backend = open_device(options);
  auto pool = std::make_shared<detail::SlabPool>(fields, options.batch_size,
                                                 slab_memory(options, backend.get()));
  stage_ = backend ? detail::make_copy_stage(std::move(backend), pool, options.device_depth,
                                             options.stream)
                   : detail::make_host_stage();

  detail::EngineConfig config;
  config.order = {options.dataset->size(), options.shuffle, options.seed, options.shard};
  config.dataset = std::move(options.dataset);
  config.batch_size = options.batch_size;
  config.drop_last = options.drop_last;
  config.workers = options.workers;
  config.depth = options.depth;
  config.on_error = options.on_error;
  config.max_skipped = options.max_skipped;
  engine_ = std::make_unique<detail::Engine>(std::move(config), std::move(pool));
  if (options.tune_workers) {
    const std::size_t cores = std::max(1u, std::thread::hardware_concurrency());
    std::size_t max = options.max_workers ? options.max_workers : 4 * cores;
    max = std::clamp(max, options.workers, kMaxWorkers);
    tuner_ = std::make_unique<detail::WorkerTuner>(detail::TuneLimits{cores, max});
  }
}

Loader::~Loader() {
  stage_.reset();  // batches taken ahead go back before the engine stops
  engine_.reset();
}

std::optional<Batch> Loader::next() {
  if (tuner_ && tuner_->due()) {
    if (auto workers = tuner_->observe(stats())) {
      const std::size_t limit = engine_->worker_limit();
      if (limit != 0) workers = std::min(*workers, limit);
      if (*workers != engine_->stats().workers) engine_->set_workers(*workers);
    }
  }
  return stage_->next(*engine_);
}
void Loader::set_epoch(std::uint64_t epoch) { restart({epoch, 0}); }
Position Loader::position() const { return stage_->position(*engine_); }

void Loader::restart(Position position) {
  const Position now = this->position();
  if (now.epoch == position.epoch && now.batch == position.batch) return;  // keep the prefetch
  stage_->reset(position);
  engine_->restart(position);
}

void Loader::restore(const Position& position) {
  if (position.batch > engine_->batches_per_epoch()) {
    throw std::invalid_argument("stoker::Loader::restore: batch " + std::to_string(position.batch) +
                                " is past the " + std::to_string(engine_->batches_per_epoch()) +
                                " batches of an epoch");
  }
  restart(position);
}

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
Stats Loader::stats() const {
  Stats s = engine_->stats();
  stage_->add_stats(s);
  return s;
}

// --- Batch ---------------------------------------------------------------------------------

Batch::Batch(Batch&& other) noexcept
    : pool_(std::move(other.pool_)),
      slab_(std::exchange(other.slab_, nullptr)),
      device_(std::move(other.device_)),
      slot_(std::exchange(other.slot_, nullptr)) {}

Batch& Batch::operator=(Batch&& other) noexcept {
  if (this != &other) {
    release();
    pool_ = std::move(other.pool_);
    slab_ = std::exchange(other.slab_, nullptr);
    device_ = std::move(other.device_);
    slot_ = std::exchange(other.slot_, nullptr);
  }
  return *this;
}

void Batch::release() noexcept {
  if (slot_ != nullptr) {
    device_->release(std::exchange(slot_, nullptr));  // the slot owns the host slab
    slab_ = nullptr;
  } else if (slab_ != nullptr) {
    pool_->release(std::exchange(slab_, nullptr));
  }
  device_.reset();
  pool_.reset();
}

std::uint64_t Batch::epoch() const noexcept { return slab_->epoch; }
std::size_t Batch::number() const noexcept { return slab_->number; }
std::size_t Batch::size() const noexcept { return slab_->size; }
std::span<const FieldSpec> Batch::fields() const noexcept { return pool_->fields(); }

std::size_t Batch::field_index(std::string_view name) const {
  const auto f = fields();
  for (std::size_t i = 0; i < f.size(); ++i) {
    if (f[i].name == name) return i;
  }
  throw std::out_of_range("stoker::Batch: no field named '" + std::string(name) + "'");
}

std::span<std::byte> Batch::bytes(std::size_t field) const noexcept {
  return {slab_->field_bases[field], slab_->size * pool_->field_bytes()[field]};
}

void* Batch::data(std::size_t field) const noexcept {
  std::byte* host = slab_->field_bases[field];
  if (!on_device(field)) return host;
  return slot_->memory + (host - slab_->memory);
}

bool Batch::on_device(std::size_t field) const noexcept {
  return slot_ != nullptr && !pool_->fields()[field].host_only;
}

std::string_view Batch::device() const noexcept {
  return device_ ? std::string_view(device_->name()) : std::string_view("cpu");
}

void Batch::wait(void* stream) {
  if (slot_ == nullptr) return;
  device_->backend().stream_wait(stream, *slot_->copied);
  slot_->stream = stream;
}

void Batch::synchronize() {
  if (slot_ != nullptr) device_->backend().synchronize(*slot_->copied);
}

std::span<const std::size_t> Batch::indices() const noexcept {
  return {slab_->indices.data(), slab_->size};
}

std::span<const SkippedSample> Batch::skipped() const noexcept { return slab_->skipped; }

// --- errors and stats ----------------------------------------------------------------------

SampleError::SampleError(std::size_t index, std::exception_ptr cause, const std::string& reason)
    : std::runtime_error("sample " + std::to_string(index) + ": " + reason),
      index_(index),
      cause_(std::move(cause)) {}

namespace {
double seconds(std::chrono::nanoseconds ns) { return std::chrono::duration<double>(ns).count(); }
}  // namespace

double Stats::samples_per_second() const {
  return elapsed.count() > 0 ? static_cast<double>(samples) / seconds(elapsed) : 0.0;
}
double Stats::bytes_per_second() const {
  return elapsed.count() > 0 ? static_cast<double>(bytes) / seconds(elapsed) : 0.0;
}
double Stats::wait_fraction() const {
  return elapsed.count() > 0 ? seconds(consumer_wait) / seconds(elapsed) : 0.0;
}

}  // namespace stoker
