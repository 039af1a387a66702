// The corrupt-data corpus: bad files of every kind a data set accumulates (truncated at
// several points, empty, random, text named .jpg, headers claiming 60000x60000 or 0x0 pixels)
// next to valid but odd ones (grayscale, CMYK, progressive, 1x1, very wide, EXIF-rotated, a
// PNG named .jpg, a JPEG missing only its end marker), generated with libjpeg and libpng.
#pragma once

// clang-format off
#include <cstdio>
#include <jpeglib.h>
// clang-format on
#include <zlib.h>

#include <cstdint>
#include <cstring>
#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include "image_fixtures.h"
#include "stoker/frontend/jpeg_encode.h"

namespace stoker::testing {

// The JPEG with its frame header (SOF0 or SOF2) claiming width x height.
inline std::vector<std::byte> with_jpeg_size(std::vector<std::byte> jpeg, int width, int height) {
  for (std::size_t i = 2; i + 9 < jpeg.size(); ++i) {
    const auto m = static_cast<unsigned char>(jpeg[i + 1]);
    if (jpeg[i] == std::byte{0xFF} && (m == 0xC0 || m == 0xC2)) {
      jpeg[i + 5] = static_cast<std::byte>(height >> 8);
      jpeg[i + 6] = static_cast<std::byte>(height & 0xFF);
      jpeg[i + 7] = static_cast<std::byte>(width >> 8);
      jpeg[i + 8] = static_cast<std::byte>(width & 0xFF);
      return jpeg;
    }
  }
  throw std::runtime_error("no SOF marker");
}

// The PNG with its IHDR claiming width x height (and a matching CRC, so only the size is off).
inline std::vector<std::byte> with_png_size(std::vector<std::byte> png, std::uint32_t width,
                                            std::uint32_t height) {
  // Signature (8), length (4), "IHDR" (4), width (4), height (4), ... CRC over type and data.
  auto put = [&](std::size_t at, std::uint32_t v) {
    for (int b = 0; b < 4; ++b) png[at + b] = static_cast<std::byte>(v >> (24 - 8 * b));
  };
  put(16, width);
  put(20, height);
  const auto crc =
      static_cast<std::uint32_t>(crc32(0, reinterpret_cast<const Bytef*>(png.data() + 12), 4 + 13));
  put(29, crc);
  return png;
}

struct CorpusFile {
  std::filesystem::path path;
  bool bad = false;
  std::string reason;  // in the error message of a bad file
};

// Writes the corpus into root/x/ (one ImageFolder class), names chosen so that ImageFolder's
// order is the order returned.
inline std::vector<CorpusFile> make_corrupt_corpus(const std::filesystem::path& root) {
  const auto dir = root / "x";
  std::vector<CorpusFile> files;
  int n = 0;
  auto add = [&](const std::string& name, const std::vector<std::byte>& data, bool bad,
                 const std::string& reason = "") {
    char prefix[8];
    std::snprintf(prefix, sizeof prefix, "%02d_", n++);
    const auto path = dir / (prefix + name);
    write_file(path, data);
    files.push_back({path, bad, reason});
  };
  const auto rgb = pattern(160, 120, 3, 7);
  const auto jpeg = detail::encode_jpeg(rgb, 160, 120, 3, 90, true, false);
  const auto progressive = detail::encode_jpeg(rgb, 160, 120, 3, 90, true, true);
  const auto png = encode_png(pattern(90, 70, 3, 8), 90, 70, 3);
  std::mt19937 rng(5);
  std::vector<std::byte> noise(3000);
  for (auto& b : noise) b = static_cast<std::byte>(rng());
  const std::string text = "this is a text file, named .jpg\n";
  const std::vector<std::byte> text_bytes(
      reinterpret_cast<const std::byte*>(text.data()),
      reinterpret_cast<const std::byte*>(text.data()) + text.size());
  auto head = [](const std::vector<std::byte>& v, std::size_t n_bytes) {
    return std::vector<std::byte>(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(n_bytes));
  };

  add("good.jpg", jpeg, false);
  add("empty.jpg", {}, true, "empty file");
  add("random.jpg", noise, true, "not an image");
  add("text.jpg", text_bytes, true, "not an image");
  add("png_named.jpg", png, false);  // formats go by signature, not by name
  add("gray.jpg", detail::encode_jpeg(pattern(100, 80, 1, 9), 100, 80, 1, 90, true, false), false);
  add("cmyk.jpg", detail::encode_jpeg(pattern(100, 80, 4, 10), 100, 80, 4, 90, true, false), false);
  add("progressive.jpg", progressive, false);
  add("one_pixel.jpg", detail::encode_jpeg({200, 100, 50}, 1, 1, 3, 90, true, false), false);
  add("wide.jpg", detail::encode_jpeg(pattern(4000, 3, 3, 11), 4000, 3, 3, 90, true, false), false);
  add("exif_rotated.jpg", detail::encode_jpeg(rgb, 160, 120, 3, 90, true, false, 6), false);
  // Truncated: inside the header, and inside the scan data at a third and two thirds; those
  // lose rows every crop of the val pipeline needs. A file missing only its end marker has
  // every row: it is good data.
  add("truncated_header.jpg", head(jpeg, 100), true, "truncated JPEG");
  add("truncated_third.jpg", head(jpeg, jpeg.size() / 3), true, "truncated JPEG");
  add("truncated_two_thirds.jpg", head(jpeg, jpeg.size() * 2 / 3), true, "truncated JPEG");
  add("truncated_progressive.jpg", head(progressive, progressive.size() / 2), true,
      "truncated JPEG");
  add("no_end_marker.jpg", head(jpeg, jpeg.size() - 2), false);
  add("huge.jpg", with_jpeg_size(jpeg, 60000, 60000), true, "over the limit");
  add("zero.jpg", with_jpeg_size(jpeg, 0, 0), true, "Empty JPEG image");
  add("huge.png", with_png_size(png, 60000, 60000), true, "over the limit");
  add("zero.png", with_png_size(png, 0, 0), true, "corrupt PNG");
  add("truncated.png", head(png, png.size() / 2), true, "PNG");
  return files;
}

}  // namespace stoker::testing
