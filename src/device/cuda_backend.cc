// The CUDA backend, over the runtime API loaded at run time (cuda_runtime.h): no toolkit at
// build time, no device code. Without a runtime, a driver or a device, open_cuda says why and
// the loader falls back to host batches.
#include <new>
#include <stdexcept>
#include <string>
#include <utility>

#include "device/backend.h"
#include "device/cuda_runtime.h"

namespace stoker::detail {
namespace {

using Runtime = std::shared_ptr<const CudaRuntime>;

void check(const CudaRuntime& rt, CudaError status, const char* what) {
  if (status != kCudaSuccess) {
    throw std::runtime_error(std::string("stoker: CUDA ") + what + ": " +
                             rt.cudaGetErrorString(status));
  }
}

// Selects the backend's device on the calling thread for the call's scope: the consumer may
// be using another device, and every thread has its own current device.
class DeviceScope {
 public:
  DeviceScope(const CudaRuntime& rt, int device) : rt_(rt) {
    check(rt_, rt_.cudaGetDevice(&previous_), "cudaGetDevice");
    if (previous_ != device) check(rt_, rt_.cudaSetDevice(device), "cudaSetDevice");
    changed_ = previous_ != device;
  }
  ~DeviceScope() {
    if (changed_) rt_.cudaSetDevice(previous_);
  }
  DeviceScope(const DeviceScope&) = delete;
  DeviceScope& operator=(const DeviceScope&) = delete;

 private:
  const CudaRuntime& rt_;
  int previous_ = 0;
  bool changed_ = false;
};

class CudaDeviceEvent final : public DeviceEvent {
 public:
  CudaDeviceEvent(Runtime rt, int device) : rt_(std::move(rt)) {
    DeviceScope scope(*rt_, device);
    check(*rt_, rt_->cudaEventCreateWithFlags(&event, kCudaEventDisableTiming), "cudaEventCreate");
  }
  ~CudaDeviceEvent() override { rt_->cudaEventDestroy(event); }
  CudaEvent event = nullptr;

 private:
  Runtime rt_;
};

// cudaHostAlloc'ed memory: the copy engine reads it by DMA, no staging copy.
class PinnedAllocator final : public HostAllocator {
 public:
  PinnedAllocator(Runtime rt, int device) : rt_(std::move(rt)), device_(device) {}
  MemoryKind kind() const override { return MemoryKind::pinned; }
  std::byte* allocate(std::size_t bytes) override {
    DeviceScope scope(*rt_, device_);
    void* p = nullptr;
    if (rt_->cudaHostAlloc(&p, bytes, kCudaHostAllocPortable) != kCudaSuccess) {
      rt_->cudaGetLastError();  // clear it: the caller falls back to pageable memory
      throw std::bad_alloc();
    }
    return static_cast<std::byte*>(p);
  }
  void deallocate(std::byte* memory, std::size_t) noexcept override { rt_->cudaFreeHost(memory); }

 private:
  Runtime rt_;
  int device_;
};

// Memory from another allocator (shared slabs), registered with the device for DMA.
class RegisteredAllocator final : public HostAllocator {
 public:
  RegisteredAllocator(Runtime rt, int device, std::shared_ptr<HostAllocator> base)
      : rt_(std::move(rt)), device_(device), base_(std::move(base)) {}
  MemoryKind kind() const override { return MemoryKind::pinned; }
  std::byte* allocate(std::size_t bytes) override {
    std::byte* p = base_->allocate(bytes);
    DeviceScope scope(*rt_, device_);
    if (rt_->cudaHostRegister(p, bytes, kCudaHostRegisterPortable) != kCudaSuccess) {
      rt_->cudaGetLastError();  // clear it: the caller falls back to unregistered memory
      base_->deallocate(p, bytes);
      throw std::bad_alloc();
    }
    return p;
  }
  void deallocate(std::byte* memory, std::size_t bytes) noexcept override {
    {
      DeviceScope scope(*rt_, device_);
      rt_->cudaHostUnregister(memory);
    }
    base_->deallocate(memory, bytes);
  }

 private:
  Runtime rt_;
  int device_;
  std::shared_ptr<HostAllocator> base_;
};

class CudaBackend final : public DeviceBackend {
 public:
  CudaBackend(Runtime rt, int device)
      : rt_(std::move(rt)),
        device_(device),
        pinned_(std::make_shared<PinnedAllocator>(rt_, device)) {
    DeviceScope scope(*rt_, device_);
    check(*rt_, rt_->cudaStreamCreateWithFlags(&side_, kCudaStreamNonBlocking), "cudaStreamCreate");
  }
  ~CudaBackend() override {
    DeviceScope scope(*rt_, device_);
    rt_->cudaStreamSynchronize(side_);
    rt_->cudaStreamDestroy(side_);
  }

  std::string name() const override { return "cuda:" + std::to_string(device_); }
  std::shared_ptr<HostAllocator> pinned_allocator() override { return pinned_; }
  std::shared_ptr<HostAllocator> registered_allocator(
      std::shared_ptr<HostAllocator> base) override {
    return std::make_shared<RegisteredAllocator>(rt_, device_, std::move(base));
  }

  std::byte* allocate(std::size_t bytes) override {
    DeviceScope scope(*rt_, device_);
    void* p = nullptr;
    check(*rt_, rt_->cudaMalloc(&p, bytes), "cudaMalloc");
    return static_cast<std::byte*>(p);
  }
  void deallocate(std::byte* memory, std::size_t) noexcept override { rt_->cudaFree(memory); }
  std::unique_ptr<DeviceEvent> make_event() override {
    return std::make_unique<CudaDeviceEvent>(rt_, device_);
  }

  void copy_wait(DeviceEvent& event) override {
    check(*rt_, rt_->cudaStreamWaitEvent(side_, cuda(event), 0), "cudaStreamWaitEvent");
  }
  void copy(std::byte* device, const std::byte* host, std::size_t bytes) override {
    DeviceScope scope(*rt_, device_);
    check(*rt_, rt_->cudaMemcpyAsync(device, host, bytes, kCudaMemcpyHostToDevice, side_),
          "cudaMemcpyAsync");
  }
  void copy_record(DeviceEvent& event) override {
    check(*rt_, rt_->cudaEventRecord(cuda(event), side_), "cudaEventRecord");
  }
  void stream_wait(Stream stream, DeviceEvent& event) override {
    check(*rt_, rt_->cudaStreamWaitEvent(stream, cuda(event), 0), "cudaStreamWaitEvent");
  }
  void stream_record(Stream stream, DeviceEvent& event) override {
    check(*rt_, rt_->cudaEventRecord(cuda(event), stream), "cudaEventRecord");
  }
  bool query(DeviceEvent& event) override {
    const CudaError status = rt_->cudaEventQuery(cuda(event));
    if (status == kCudaErrorNotReady) return false;
    check(*rt_, status, "cudaEventQuery");
    return true;
  }
  void synchronize(DeviceEvent& event) override {
    check(*rt_, rt_->cudaEventSynchronize(cuda(event)), "cudaEventSynchronize");
  }

 private:
  static CudaEvent cuda(DeviceEvent& event) { return static_cast<CudaDeviceEvent&>(event).event; }

  Runtime rt_;
  int device_;
  CudaStream side_ = nullptr;
  std::shared_ptr<HostAllocator> pinned_;
};

}  // namespace

std::unique_ptr<DeviceBackend> open_cuda(std::shared_ptr<const CudaRuntime> runtime, int ordinal,
                                         std::string& why) {
  if (!runtime->loaded() || !runtime->info.available()) {
    why = runtime->info.why;
    return nullptr;
  }
  const int count = runtime->info.devices;
  if (ordinal < 0 || ordinal >= count) {
    why = "no device cuda:" + std::to_string(ordinal) + " (" + std::to_string(count) + " visible)";
    return nullptr;
  }
  return std::make_unique<CudaBackend>(std::move(runtime), ordinal);
}

std::unique_ptr<DeviceBackend> open_cuda(int ordinal, std::string& why) {
  return open_cuda(cuda_runtime(), ordinal, why);
}

}  // namespace stoker::detail
