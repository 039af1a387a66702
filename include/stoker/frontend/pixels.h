// ToTensor (+ Normalize) on pixels that Python code produced (the hybrid torchvision pipeline's
// tail, stoker.transforms), through the image pipeline's own kernel (src/image/resample.h), so
// both paths give the same floats. Installed for front ends, unstable
// (include/stoker/frontend/README.md).
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <span>

namespace stoker::detail {

// Writes the width x height RGB image `hwc` (u8, `row_stride` bytes a row) into `chw` (3 x
// height x width floats) as (v / 255 - mean[c]) / std[c]. Throws std::invalid_argument if
// `chw` is too small. Any thread; no GIL needed.
void pixels_to_tensor(const std::uint8_t* hwc, std::size_t row_stride, int width, int height,
                      const std::array<float, 3>& mean, const std::array<float, 3>& std,
                      std::span<float> chw);

}  // namespace stoker::detail
