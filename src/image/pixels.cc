#include "stoker/frontend/pixels.h"

#include <stdexcept>
#include <string>

#include "image/resample.h"

namespace stoker::detail {

void pixels_to_tensor(const std::uint8_t* hwc, std::size_t row_stride, int width, int height,
                      const std::array<float, 3>& mean, const std::array<float, 3>& std,
                      std::span<float> chw) {
  const auto need = std::size_t{3} * static_cast<std::size_t>(width) * height;
  if (chw.size() < need) {
    throw std::invalid_argument("stoker: to_tensor's output holds " + std::to_string(chw.size()) +
                                " floats, not 3 x " + std::to_string(height) + " x " +
                                std::to_string(width));
  }
  image::OutputArgs args;
  args.out = std::as_writable_bytes(chw);
  args.dtype = DType::f32;
  args.width = width;
  args.height = height;
  image::normalize_args(mean, std, args);
  image::write_pixels(hwc, row_stride, args);
}

}  // namespace stoker::detail
