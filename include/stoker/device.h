// Where batches are delivered, as a value. LoaderOptions::device, Stats::device and
// Batch::device() name it ("cpu", "cuda", "cuda:N", "sim"); parse_device is the one place that
// reads those names, for the loader and for the front ends (the Python package gets the
// Device, not the string to take apart).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace stoker {

enum class DeviceKind : std::uint8_t {
  cpu,   // host memory
  cuda,  // a CUDA device
  sim,   // the simulated device (LoaderOptions::sim)
};

struct Device {
  DeviceKind kind = DeviceKind::cpu;
  int index = -1;  // the CUDA device's number; -1: "cuda" (the current device), or not CUDA

  bool is_cuda() const { return kind == DeviceKind::cuda; }
  friend bool operator==(const Device&, const Device&) = default;
};

// The device `name` names. Throws std::invalid_argument "device '<name>' is not one of cpu,
// cuda, cuda:N, sim" (or "... expected cuda:N" for a bad number) for any other.
Device parse_device(std::string_view name);

// Its name, as parse_device reads it: "cpu", "cuda", "cuda:0", "sim".
std::string to_string(const Device& device);

}  // namespace stoker
