#include "device/sim_backend.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <new>

namespace stoker::detail {

SimStream::SimStream(double time_scale) : time_scale_(time_scale), thread_([this] { run(); }) {}

SimStream::~SimStream() {
  {
    MutexLock lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

void SimStream::push(Op op) {
  {
    MutexLock lock(mu_);
    queue_.push_back(std::move(op));
    ++pushed_;
  }
  cv_.notify_all();
}

void SimStream::wait(SimEvent& event) {
  Op op;
  op.kind = Op::kWait;
  op.event = &event;
  MutexLock lock(event.mu);
  op.generation = event.recorded;
  push(std::move(op));
}

void SimStream::record(SimEvent& event) {
  Op op;
  op.kind = Op::kRecord;
  op.event = &event;
  MutexLock lock(event.mu);
  op.generation = ++event.recorded;
  push(std::move(op));
}

void SimStream::copy(std::byte* dst, const std::byte* src, std::size_t bytes, double seconds) {
  Op op;
  op.kind = Op::kCopy;
  op.dst = dst;
  op.src = src;
  op.bytes = bytes;
  op.seconds = seconds;
  push(std::move(op));
}

void SimStream::compute(double seconds, std::function<void()> body) {
  Op op;
  op.kind = Op::kCompute;
  op.seconds = seconds;
  op.body = std::move(body);
  push(std::move(op));
}

void SimStream::synchronize() {
  MutexLock lock(mu_);
  const std::uint64_t target = pushed_;
  while (done_ < target) lock.wait(cv_);
}

double SimStream::now() {
  MutexLock lock(mu_);
  return now_;
}

void SimStream::run() {
  MutexLock lock(mu_);
  for (;;) {
    while (!stop_ && queue_.empty()) lock.wait(cv_);
    if (queue_.empty()) return;  // stopping, and everything queued has run
    Op op = std::move(queue_.front());
    queue_.pop_front();
    {
      MutexUnlock unlocked(mu_);
      execute(op);
    }
    ++done_;
    cv_.notify_all();
  }
}

void SimStream::execute(Op& op) {
  double now;
  {
    MutexLock lock(mu_);
    now = now_;
  }
  switch (op.kind) {
    case Op::kWait: {
      MutexLock lock(op.event->mu);
      while (op.event->completed < op.generation) lock.wait(op.event->cv);
      if (op.generation > 0) now = std::max(now, op.event->time);
      break;
    }
    case Op::kRecord: {
      MutexLock lock(op.event->mu);
      if (op.generation > op.event->completed) {
        op.event->completed = op.generation;
        op.event->time = now;
      }
      op.event->cv.notify_all();
      break;
    }
    case Op::kCopy:
    case Op::kCompute:
      if (time_scale_ > 0) {
        std::this_thread::sleep_for(std::chrono::duration<double>(op.seconds * time_scale_));
      }
      if (op.kind == Op::kCopy) std::memcpy(op.dst, op.src, op.bytes);
      if (op.body) op.body();
      now += op.seconds;
      break;
  }
  MutexLock lock(mu_);
  now_ = now;
}

namespace {

// Stands in for pinned memory: ordinary pages that count against the page-locked budget.
class SimPinnedAllocator final : public HostAllocator {
 public:
  MemoryKind kind() const override { return MemoryKind::pinned; }
  std::byte* allocate(std::size_t bytes) override { return pageable_allocator()->allocate(bytes); }
  void deallocate(std::byte* memory, std::size_t bytes) noexcept override {
    pageable_allocator()->deallocate(memory, bytes);
  }
};

// The simulated device "registers" any memory: it reads host memory directly.
class SimRegisteredAllocator final : public HostAllocator {
 public:
  explicit SimRegisteredAllocator(std::shared_ptr<HostAllocator> base) : base_(std::move(base)) {}
  MemoryKind kind() const override { return MemoryKind::pinned; }
  std::byte* allocate(std::size_t bytes) override { return base_->allocate(bytes); }
  void deallocate(std::byte* memory, std::size_t bytes) noexcept override {
    base_->deallocate(memory, bytes);
  }

 private:
  std::shared_ptr<HostAllocator> base_;
};

class SimBackend final : public DeviceBackend {
 public:
  explicit SimBackend(const SimDevice& options)
      : options_(options),
        side_(options.time_scale),
        default_stream_(options.time_scale),
        pinned_(std::make_shared<SimPinnedAllocator>()) {}

  std::string name() const override { return "sim"; }
  std::shared_ptr<HostAllocator> pinned_allocator() override { return pinned_; }
  std::shared_ptr<HostAllocator> registered_allocator(
      std::shared_ptr<HostAllocator> base) override {
    return std::make_shared<SimRegisteredAllocator>(std::move(base));
  }

  std::byte* allocate(std::size_t bytes) override { return new std::byte[bytes]; }
  void deallocate(std::byte* memory, std::size_t) noexcept override { delete[] memory; }
  std::unique_ptr<DeviceEvent> make_event() override { return std::make_unique<SimEvent>(); }

  void copy_wait(DeviceEvent& event) override { side_.wait(sim(event)); }
  void copy(std::byte* device, const std::byte* host, std::size_t bytes) override {
    const double seconds = std::chrono::duration<double>(options_.latency).count() +
                           static_cast<double>(bytes) / (options_.bandwidth_gb_per_s * 1e9);
    side_.copy(device, host, bytes, seconds);
  }
  void copy_record(DeviceEvent& event) override { side_.record(sim(event)); }

  void stream_wait(Stream stream, DeviceEvent& event) override { of(stream).wait(sim(event)); }
  void stream_record(Stream stream, DeviceEvent& event) override { of(stream).record(sim(event)); }

  bool query(DeviceEvent& event) override {
    SimEvent& e = sim(event);
    MutexLock lock(e.mu);
    return e.completed >= e.recorded;
  }
  void synchronize(DeviceEvent& event) override {
    SimEvent& e = sim(event);
    MutexLock lock(e.mu);
    const std::uint64_t target = e.recorded;
    while (e.completed < target) lock.wait(e.cv);
  }

 private:
  static SimEvent& sim(DeviceEvent& event) { return static_cast<SimEvent&>(event); }
  SimStream& of(Stream stream) {
    return stream ? *static_cast<SimStream*>(stream) : default_stream_;
  }

  const SimDevice options_;
  SimStream side_;
  SimStream default_stream_;
  std::shared_ptr<HostAllocator> pinned_;
};

}  // namespace

std::unique_ptr<DeviceBackend> open_sim(const SimDevice& options) {
  if (!(options.bandwidth_gb_per_s > 0)) {
    throw std::invalid_argument("stoker::SimDevice: bandwidth_gb_per_s must be positive");
  }
  return std::make_unique<SimBackend>(options);
}

}  // namespace stoker::detail
