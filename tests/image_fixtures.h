// Generated test images: JPEG through libjpeg (gray, RGB with or without chroma subsampling,
// CMYK), PNG through libpng, and temporary directories to put them in.
#pragma once

// clang-format off
#include <cstdio>
#include <jpeglib.h>
// clang-format on
#include <png.h>
#include <unistd.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "stoker/frontend/jpeg_encode.h"

namespace stoker::testing {

// A smooth, photo-like pattern plus a little noise: channel c of pixel (x, y).
inline std::vector<std::uint8_t> pattern(int width, int height, int channels,
                                         std::uint32_t seed = 1) {
  std::mt19937 rng(seed);
  std::vector<std::uint8_t> px(static_cast<std::size_t>(width) * height * channels);
  for (int y = 0; y < height; ++y) {
    for (int x = 0; x < width; ++x) {
      for (int c = 0; c < channels; ++c) {
        const double v = 128 + 90 * std::sin(x / 13.0 + c) * std::cos(y / 17.0 - c) +
                         static_cast<double>(rng() % 9) - 4;
        px[(static_cast<std::size_t>(y) * width + x) * channels + c] =
            static_cast<std::uint8_t>(std::clamp(v, 0.0, 255.0));
      }
    }
  }
  return px;
}

inline std::vector<std::byte> make_jpeg(int width, int height, int components = 3,
                                        std::uint32_t seed = 1, bool subsample = true) {
  return detail::encode_jpeg(pattern(width, height, components, seed), width, height, components,
                             90, subsample);
}

// Full decode with libjpeg, RGB, for reference.
inline std::vector<std::uint8_t> decode_jpeg_full(const std::vector<std::byte>& data, int& width,
                                                  int& height) {
  jpeg_decompress_struct cinfo;
  jpeg_error_mgr jerr;
  cinfo.err = jpeg_std_error(&jerr);
  jpeg_create_decompress(&cinfo);
  jpeg_mem_src(&cinfo, reinterpret_cast<const unsigned char*>(data.data()), data.size());
  jpeg_read_header(&cinfo, TRUE);
  cinfo.out_color_space = JCS_RGB;
  jpeg_start_decompress(&cinfo);
  width = static_cast<int>(cinfo.output_width);
  height = static_cast<int>(cinfo.output_height);
  std::vector<std::uint8_t> px(static_cast<std::size_t>(width) * height * 3);
  while (cinfo.output_scanline < cinfo.output_height) {
    JSAMPROW row = px.data() + static_cast<std::size_t>(cinfo.output_scanline) * width * 3;
    jpeg_read_scanlines(&cinfo, &row, 1);
  }
  jpeg_finish_decompress(&cinfo);
  jpeg_destroy_decompress(&cinfo);
  return px;
}

// Encodes 8-bit pixels (1 gray, 3 RGB, 4 RGBA) as PNG.
inline std::vector<std::byte> encode_png(const std::vector<std::uint8_t>& pixels, int width,
                                         int height, int channels) {
  png_image image;
  std::memset(&image, 0, sizeof image);
  image.version = PNG_IMAGE_VERSION;
  image.width = static_cast<png_uint_32>(width);
  image.height = static_cast<png_uint_32>(height);
  image.format = channels == 1 ? PNG_FORMAT_GRAY : channels == 3 ? PNG_FORMAT_RGB : PNG_FORMAT_RGBA;
  png_alloc_size_t size = 0;
  if (!png_image_write_to_memory(&image, nullptr, &size, 0, pixels.data(), 0, nullptr)) {
    throw std::runtime_error("png size");
  }
  std::vector<std::byte> out(size);
  if (!png_image_write_to_memory(&image, out.data(), &size, 0, pixels.data(), 0, nullptr)) {
    throw std::runtime_error(std::string("png write: ") + image.message);
  }
  out.resize(size);
  return out;
}

inline void write_file(const std::filesystem::path& path, const std::vector<std::byte>& data) {
  std::filesystem::create_directories(path.parent_path());
  std::ofstream f(path, std::ios::binary);
  f.write(reinterpret_cast<const char*>(data.data()), static_cast<std::streamsize>(data.size()));
}

inline std::vector<std::byte> read_file(const std::filesystem::path& path) {
  std::ifstream f(path, std::ios::binary);
  std::vector<char> c((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  std::vector<std::byte> out(c.size());
  if (!c.empty()) std::memcpy(out.data(), c.data(), c.size());  // an empty file: no data()
  return out;
}

// A fresh directory under the system temp dir, removed with its contents on destruction.
class TempDir {
 public:
  TempDir() {
    std::random_device rd;
    path_ = std::filesystem::temp_directory_path() /
            ("stoker-test-" + std::to_string(::getpid()) + "-" + std::to_string(rd()));
    std::filesystem::create_directories(path_);
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::filesystem::path& path() const { return path_; }
  std::filesystem::path operator/(const std::string& p) const { return path_ / p; }

 private:
  std::filesystem::path path_;
};

}  // namespace stoker::testing
