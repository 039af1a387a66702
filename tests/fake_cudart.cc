// A stand-in for libcudart with one "device" whose memory is host memory: the CUDA backend
// loads it with dlopen like the real runtime (cuda_fake_test.cc), so the entry points it
// resolves, their signatures and the calls it makes are checked on machines without a GPU.
// Copies run at once and events are always complete; the counters say what is still alive.
#include <atomic>
#include <cstddef>
#include <cstdlib>
#include <cstring>

namespace {

std::atomic<long> device_buffers{0}, host_buffers{0}, registered{0}, streams{0}, events{0},
    copies{0}, waits{0};
thread_local int current_device = 0;

constexpr int kSuccess = 0, kInvalidValue = 1, kMemoryAllocation = 2, kInvalidDevice = 101;

void* host_memory(std::size_t bytes) {
  // Page-aligned, as cudaHostAlloc's is.
  return std::aligned_alloc(4096, (bytes + 4095) / 4096 * 4096);
}

}  // namespace

extern "C" {

struct FakeCudartCounters {
  long device_buffers, host_buffers, registered, streams, events, copies, waits;
};

FakeCudartCounters fake_cudart_counters() {
  return {device_buffers.load(), host_buffers.load(), registered.load(), streams.load(),
          events.load(),         copies.load(),       waits.load()};
}

int cudaGetDeviceCount(int* count) {
  *count = 1;
  return kSuccess;
}
const char* cudaGetErrorString(int) { return "fake cudart error"; }
int cudaGetLastError() { return kSuccess; }
int cudaGetDevice(int* device) {
  *device = current_device;
  return kSuccess;
}
int cudaSetDevice(int device) {
  if (device != 0) return kInvalidDevice;
  current_device = device;
  return kSuccess;
}
int cudaRuntimeGetVersion(int* version) {
  *version = 12040;
  return kSuccess;
}
int cudaDriverGetVersion(int* version) {
  *version = 12080;
  return kSuccess;
}
int cudaMalloc(void** p, std::size_t bytes) {
  *p = std::malloc(bytes);
  if (!*p) return kMemoryAllocation;
  ++device_buffers;
  return kSuccess;
}
int cudaFree(void* p) {
  if (p) --device_buffers;
  std::free(p);
  return kSuccess;
}
int cudaHostAlloc(void** p, std::size_t bytes, unsigned) {
  *p = host_memory(bytes);
  if (!*p) return kMemoryAllocation;
  ++host_buffers;
  return kSuccess;
}
int cudaFreeHost(void* p) {
  if (p) --host_buffers;
  std::free(p);
  return kSuccess;
}
int cudaHostRegister(void*, std::size_t, unsigned) {
  ++registered;
  return kSuccess;
}
int cudaHostUnregister(void*) {
  --registered;
  return kSuccess;
}
int cudaMemcpyAsync(void* dst, const void* src, std::size_t bytes, int kind, void* stream) {
  if (kind != 1 /* host to device */ || !stream) return kInvalidValue;  // always the side stream
  std::memcpy(dst, src, bytes);
  ++copies;
  return kSuccess;
}
int cudaStreamCreateWithFlags(void** stream, unsigned) {
  *stream = new int;
  ++streams;
  return kSuccess;
}
int cudaStreamDestroy(void* stream) {
  delete static_cast<int*>(stream);
  --streams;
  return kSuccess;
}
int cudaStreamSynchronize(void*) { return kSuccess; }
int cudaStreamWaitEvent(void*, void* event, unsigned) {
  if (!event) return kInvalidValue;
  ++waits;
  return kSuccess;
}
int cudaEventCreateWithFlags(void** event, unsigned) {
  *event = new int;
  ++events;
  return kSuccess;
}
int cudaEventDestroy(void* event) {
  delete static_cast<int*>(event);
  --events;
  return kSuccess;
}
int cudaEventRecord(void* event, void*) { return event ? kSuccess : kInvalidValue; }
int cudaEventQuery(void* event) { return event ? kSuccess : kInvalidValue; }
int cudaEventSynchronize(void* event) { return event ? kSuccess : kInvalidValue; }

}  // extern "C"
