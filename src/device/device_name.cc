#include <stdexcept>
#include <string>

#include "stoker/device.h"

namespace stoker {

Device parse_device(std::string_view name) {
  if (name == "cpu") return {DeviceKind::cpu, -1};
  if (name == "sim") return {DeviceKind::sim, -1};
  if (name == "cuda") return {DeviceKind::cuda, -1};
  if (name.starts_with("cuda:")) {
    const std::string_view n = name.substr(5);
    // At most 9 digits: any CUDA device number fits an int.
    if (n.empty() || n.size() > 9 || n.find_first_not_of("0123456789") != std::string::npos) {
      throw std::invalid_argument("device '" + std::string(name) + "': expected cuda:N");
    }
    return {DeviceKind::cuda, std::stoi(std::string(n))};
  }
  throw std::invalid_argument("device '" + std::string(name) +
                              "' is not one of cpu, cuda, cuda:N, sim");
}

std::string to_string(const Device& device) {
  switch (device.kind) {
    case DeviceKind::cpu:
      return "cpu";
    case DeviceKind::sim:
      return "sim";
    case DeviceKind::cuda:
      return device.index < 0 ? "cuda" : "cuda:" + std::to_string(device.index);
  }
  return "cpu";
}

}  // namespace stoker
