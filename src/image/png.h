// PNG decoding through libpng: any PNG (gray, palette, 16-bit, alpha, interlaced) comes out as
// 8-bit RGBA with Pillow's values (no gamma conversion, 16-bit samples to their high byte);
// the caller drops alpha, as Pillow's convert("RGB") does.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

namespace stoker::image {

bool is_png(std::span<const std::byte> data);

struct PngHeader {
  int width = 0;
  int height = 0;
};

// Reads the size from the header only. Throws std::runtime_error with the reason.
PngHeader png_size(std::span<const std::byte> data);

// Decodes the whole image into `rgba` (resized to width * height * 4; its capacity is reused)
// after checking width * height <= max_pixels. Throws std::runtime_error with the reason.
PngHeader decode_png(std::span<const std::byte> data, std::uint64_t max_pixels,
                     std::vector<std::uint8_t>& rgba);

}  // namespace stoker::image
