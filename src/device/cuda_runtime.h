// The CUDA runtime, loaded with dlopen: stoker builds without a CUDA toolkit and finds a GPU at
// run time, from the system's libcudart or the one a PyTorch wheel ships. Only the entry points
// the CUDA backend uses are resolved; their signatures are declared here (the runtime API's C
// ABI: enums are ints, streams and events opaque pointers), so no toolkit header is needed.
#pragma once

#include <cstddef>
#include <memory>
#include <string>
#include <vector>

#include "stoker/frontend/cuda_runtime.h"  // add_cuda_runtime_hints
#include "stoker/info.h"

namespace stoker::detail {

// The runtime API's values that the backend passes or tests (cuda_runtime_api.h, stable
// across CUDA 11 to 13).
using CudaError = int;
using CudaStream = void*;
using CudaEvent = void*;
inline constexpr CudaError kCudaSuccess = 0;
inline constexpr CudaError kCudaErrorNotReady = 600;
inline constexpr int kCudaMemcpyHostToDevice = 1;
inline constexpr unsigned kCudaEventDisableTiming = 0x02;
inline constexpr unsigned kCudaHostAllocPortable = 0x01;
inline constexpr unsigned kCudaHostRegisterPortable = 0x01;
inline constexpr unsigned kCudaStreamNonBlocking = 0x01;

// X(name, return type, parameters): every entry point resolved, in one list.
#define STOKER_CUDA_FUNCTIONS(X)                                                    \
  X(cudaGetDeviceCount, CudaError, (int*))                                          \
  X(cudaGetErrorString, const char*, (CudaError))                                   \
  X(cudaGetLastError, CudaError, ())                                                \
  X(cudaGetDevice, CudaError, (int*))                                               \
  X(cudaSetDevice, CudaError, (int))                                                \
  X(cudaRuntimeGetVersion, CudaError, (int*))                                       \
  X(cudaDriverGetVersion, CudaError, (int*))                                        \
  X(cudaMalloc, CudaError, (void**, std::size_t))                                   \
  X(cudaFree, CudaError, (void*))                                                   \
  X(cudaHostAlloc, CudaError, (void**, std::size_t, unsigned))                      \
  X(cudaFreeHost, CudaError, (void*))                                               \
  X(cudaHostRegister, CudaError, (void*, std::size_t, unsigned))                    \
  X(cudaHostUnregister, CudaError, (void*))                                         \
  X(cudaMemcpyAsync, CudaError, (void*, const void*, std::size_t, int, CudaStream)) \
  X(cudaStreamCreateWithFlags, CudaError, (CudaStream*, unsigned))                  \
  X(cudaStreamDestroy, CudaError, (CudaStream))                                     \
  X(cudaStreamSynchronize, CudaError, (CudaStream))                                 \
  X(cudaStreamWaitEvent, CudaError, (CudaStream, CudaEvent, unsigned))              \
  X(cudaEventCreateWithFlags, CudaError, (CudaEvent*, unsigned))                    \
  X(cudaEventDestroy, CudaError, (CudaEvent))                                       \
  X(cudaEventRecord, CudaError, (CudaEvent, CudaStream))                            \
  X(cudaEventQuery, CudaError, (CudaEvent))                                         \
  X(cudaEventSynchronize, CudaError, (CudaEvent))

// A loaded runtime: its entry points (all set, or `info.library` is empty and none is) and
// what it reported when loaded. The library is never unloaded (cudart's exit handlers must
// find it mapped).
struct CudaRuntime {
#define STOKER_CUDA_POINTER(name, result, params) result(*name) params = nullptr;
  STOKER_CUDA_FUNCTIONS(STOKER_CUDA_POINTER)
#undef STOKER_CUDA_POINTER

  CudaInfo info;
  bool loaded() const { return !info.library.empty(); }
};

// Where to look, in order: each place is a directory (libcudart.so.13, .so.12, .so.11.0 and
// libcudart.so in it), a library file, or "" (those names through the dynamic linker's own
// search: libraries already loaded, LD_LIBRARY_PATH, the ld.so cache).
// The first runtime, in the order of `places`, that loads, has every entry point and sees a
// device; if none sees one, the first that loaded (`info.why` says why it sees none); if none
// loaded, an empty one whose `info.why` lists the places and what was wrong with the files
// found there.
std::shared_ptr<const CudaRuntime> load_cuda_runtime(const std::vector<std::string>& places);

// The places the process-wide runtime is searched in (see stoker::CudaInfo): `hint_dirs`
// after $STOKER_CUDA_RUNTIME, before the system's.
std::vector<std::string> default_cuda_runtime_places(const std::vector<std::string>& hint_dirs);

// The process-wide runtime, loaded on the first call. Thread safety: any thread.
std::shared_ptr<const CudaRuntime> cuda_runtime();

}  // namespace stoker::detail
