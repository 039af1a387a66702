// The CUDA backend: compiled only where CMake finds a CUDA toolkit (it needs the runtime API
// headers and cudart, no device code). Without a driver or a device, open_cuda says why and
// the loader falls back to host batches.
#include <cuda_runtime_api.h>

#include <new>
#include <stdexcept>
#include <string>

#include "device/backend.h"

namespace stoker::detail {
namespace {

void check(cudaError_t status, const char* what) {
  if (status != cudaSuccess) {
    throw std::runtime_error(std::string("stoker: CUDA ") + what + ": " +
                             cudaGetErrorString(status));
  }
}

// Selects the backend's device on the calling thread for the call's scope: the consumer may
// be using another device, and every thread has its own current device.
class DeviceScope {
 public:
  explicit DeviceScope(int device) {
    check(cudaGetDevice(&previous_), "cudaGetDevice");
    if (previous_ != device) check(cudaSetDevice(device), "cudaSetDevice");
    changed_ = previous_ != device;
  }
  ~DeviceScope() {
    if (changed_) cudaSetDevice(previous_);
  }
  DeviceScope(const DeviceScope&) = delete;
  DeviceScope& operator=(const DeviceScope&) = delete;

 private:
  int previous_ = 0;
  bool changed_ = false;
};

class CudaEvent final : public DeviceEvent {
 public:
  explicit CudaEvent(int device) {
    DeviceScope scope(device);
    check(cudaEventCreateWithFlags(&event, cudaEventDisableTiming), "cudaEventCreate");
  }
  ~CudaEvent() override { cudaEventDestroy(event); }
  cudaEvent_t event = nullptr;
};

// cudaHostAlloc'ed memory: the copy engine reads it by DMA, no staging copy.
class PinnedAllocator final : public HostAllocator {
 public:
  explicit PinnedAllocator(int device) : device_(device) {}
  MemoryKind kind() const override { return MemoryKind::pinned; }
  std::byte* allocate(std::size_t bytes) override {
    DeviceScope scope(device_);
    void* p = nullptr;
    if (cudaHostAlloc(&p, bytes, cudaHostAllocPortable) != cudaSuccess) {
      cudaGetLastError();  // clear it: the caller falls back to pageable memory
      throw std::bad_alloc();
    }
    return static_cast<std::byte*>(p);
  }
  void deallocate(std::byte* memory, std::size_t) noexcept override { cudaFreeHost(memory); }

 private:
  int device_;
};

// Memory from another allocator (shared slabs), registered with the device for DMA.
class RegisteredAllocator final : public HostAllocator {
 public:
  RegisteredAllocator(int device, std::shared_ptr<HostAllocator> base)
      : device_(device), base_(std::move(base)) {}
  MemoryKind kind() const override { return MemoryKind::pinned; }
  std::byte* allocate(std::size_t bytes) override {
    std::byte* p = base_->allocate(bytes);
    DeviceScope scope(device_);
    if (cudaHostRegister(p, bytes, cudaHostRegisterPortable) != cudaSuccess) {
      cudaGetLastError();  // clear it: the caller falls back to unregistered memory
      base_->deallocate(p, bytes);
      throw std::bad_alloc();
    }
    return p;
  }
  void deallocate(std::byte* memory, std::size_t bytes) noexcept override {
    {
      DeviceScope scope(device_);
      cudaHostUnregister(memory);
    }
    base_->deallocate(memory, bytes);
  }

 private:
  int device_;
  std::shared_ptr<HostAllocator> base_;
};

class CudaBackend final : public DeviceBackend {
 public:
  explicit CudaBackend(int device)
      : device_(device), pinned_(std::make_shared<PinnedAllocator>(device)) {
    DeviceScope scope(device_);
    check(cudaStreamCreateWithFlags(&side_, cudaStreamNonBlocking), "cudaStreamCreate");
  }
  ~CudaBackend() override {
    DeviceScope scope(device_);
    cudaStreamSynchronize(side_);
    cudaStreamDestroy(side_);
  }

  std::string name() const override { return "cuda:" + std::to_string(device_); }
  std::shared_ptr<HostAllocator> pinned_allocator() override { return pinned_; }
  std::shared_ptr<HostAllocator> registered_allocator(
      std::shared_ptr<HostAllocator> base) override {
    return std::make_shared<RegisteredAllocator>(device_, std::move(base));
  }

  std::byte* allocate(std::size_t bytes) override {
    DeviceScope scope(device_);
    void* p = nullptr;
    check(cudaMalloc(&p, bytes), "cudaMalloc");
    return static_cast<std::byte*>(p);
  }
  void deallocate(std::byte* memory, std::size_t) noexcept override { cudaFree(memory); }
  std::unique_ptr<DeviceEvent> make_event() override {
    return std::make_unique<CudaEvent>(device_);
  }

  void copy_wait(DeviceEvent& event) override {
    check(cudaStreamWaitEvent(side_, cuda(event), 0), "cudaStreamWaitEvent");
  }
  void copy(std::byte* device, const std::byte* host, std::size_t bytes) override {
    DeviceScope scope(device_);
    check(cudaMemcpyAsync(device, host, bytes, cudaMemcpyHostToDevice, side_), "cudaMemcpyAsync");
  }
  void copy_record(DeviceEvent& event) override {
    check(cudaEventRecord(cuda(event), side_), "cudaEventRecord");
  }
  void stream_wait(Stream stream, DeviceEvent& event) override {
    check(cudaStreamWaitEvent(static_cast<cudaStream_t>(stream), cuda(event), 0),
          "cudaStreamWaitEvent");
  }
  void stream_record(Stream stream, DeviceEvent& event) override {
    check(cudaEventRecord(cuda(event), static_cast<cudaStream_t>(stream)), "cudaEventRecord");
  }
  bool query(DeviceEvent& event) override {
    const cudaError_t status = cudaEventQuery(cuda(event));
    if (status == cudaErrorNotReady) return false;
    check(status, "cudaEventQuery");
    return true;
  }
  void synchronize(DeviceEvent& event) override {
    check(cudaEventSynchronize(cuda(event)), "cudaEventSynchronize");
  }

 private:
  static cudaEvent_t cuda(DeviceEvent& event) { return static_cast<CudaEvent&>(event).event; }

  int device_;
  cudaStream_t side_ = nullptr;
  std::shared_ptr<HostAllocator> pinned_;
};

}  // namespace

std::unique_ptr<DeviceBackend> open_cuda(int ordinal, std::string& why) {
  int count = 0;
  const cudaError_t status = cudaGetDeviceCount(&count);
  if (status != cudaSuccess) {
    cudaGetLastError();
    why = cudaGetErrorString(status);
    return nullptr;
  }
  if (ordinal < 0 || ordinal >= count) {
    why = "no device cuda:" + std::to_string(ordinal) + " (" + std::to_string(count) + " visible)";
    return nullptr;
  }
  return std::make_unique<CudaBackend>(ordinal);
}

}  // namespace stoker::detail
