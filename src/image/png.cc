#include "image/png.h"

#include <png.h>

#include <cstring>
#include <stdexcept>
#include <string>

namespace stoker::image {
namespace {

// Owns a png_image between begin_read and finish_read (or an error).
struct Image {
  png_image image;
  Image() {
    std::memset(&image, 0, sizeof image);
    image.version = PNG_IMAGE_VERSION;
  }
  ~Image() { png_image_free(&image); }
  [[noreturn]] void fail(const char* what) const {
    throw std::runtime_error(std::string(what) + ": " + image.message);
  }
};

void begin(Image& im, std::span<const std::byte> data) {
  if (!png_image_begin_read_from_memory(&im.image, data.data(), data.size())) {
    im.fail("corrupt PNG");
  }
}

}  // namespace

bool is_png(std::span<const std::byte> data) {
  static constexpr unsigned char kSignature[8] = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1A, '\n'};
  return data.size() >= 8 && std::memcmp(data.data(), kSignature, 8) == 0;
}

PngHeader png_size(std::span<const std::byte> data) {
  Image im;
  begin(im, data);
  return {static_cast<int>(im.image.width), static_cast<int>(im.image.height)};
}

PngHeader decode_png(std::span<const std::byte> data, std::uint64_t max_pixels,
                     std::vector<std::uint8_t>& rgba) {
  Image im;
  begin(im, data);
  const std::uint64_t pixels = std::uint64_t{im.image.width} * im.image.height;
  if (pixels > max_pixels) {
    throw std::runtime_error("image of " + std::to_string(im.image.width) + "x" +
                             std::to_string(im.image.height) + " pixels is over the limit of " +
                             std::to_string(max_pixels) + " pixels");
  }
  im.image.format = PNG_FORMAT_RGBA;
  rgba.resize(static_cast<std::size_t>(pixels) * 4);
  if (!png_image_finish_read(&im.image, nullptr, rgba.data(), 0, nullptr)) {
    im.fail("corrupt or truncated PNG");
  }
  return {static_cast<int>(im.image.width), static_cast<int>(im.image.height)};
}

}  // namespace stoker::image
