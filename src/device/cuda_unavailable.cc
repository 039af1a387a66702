// Built where CMake found no CUDA toolkit: asking for a CUDA device falls back to the CPU.
#include "device/backend.h"

namespace stoker::detail {

std::unique_ptr<DeviceBackend> open_cuda(int /*ordinal*/, std::string& why) {
  why = "stoker was built without CUDA (no toolkit found at build time)";
  return nullptr;
}

}  // namespace stoker::detail
