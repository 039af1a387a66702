// JPEG decoding through the libjpeg API (libjpeg-turbo): region-of-interest decode (rows above
// the region skipped with jpeg_skip_scanlines, columns outside it cropped with
// jpeg_crop_scanline, rows below never decoded) and DCT-domain scaling by 1/2, 1/4, 1/8.
// Grayscale, RGB and YCbCr come out as RGB, CMYK and YCCK are converted to RGB as Pillow does.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

namespace stoker::image {

// Receives decoded rows, top to bottom: `rgb` holds the region's columns as RGB triples,
// followed by the `padding` bytes decode() was asked for, readable.
struct RowSink {
  void (*fn)(void* context, const std::uint8_t* rgb, int row) = nullptr;
  void* context = nullptr;
};

// One decoder per thread, reused across images so that libjpeg's per-decoder state is made
// once. Errors are thrown as std::runtime_error carrying the reason only (the caller adds the
// file's name). Thread safety: none; confine an instance to one thread.
class JpegDecoder {
 public:
  JpegDecoder();
  ~JpegDecoder();
  JpegDecoder(const JpegDecoder&) = delete;
  JpegDecoder& operator=(const JpegDecoder&) = delete;

  struct Header {
    int width = 0;
    int height = 0;
  };
  // Reads the header of `data`, which must stay valid until decode() returns.
  Header read_header(std::span<const std::byte> data);

  // The image's size when decoded at 1/denom (denom 1, 2, 4 or 8). After read_header().
  Header scaled_size(int denom);

  // Decodes columns [x0, x1) of rows [y0, y1) of the image scaled by 1/denom, calling `sink`
  // once per row. After read_header(); ends the image (the next call is read_header()).
  void decode(int denom, int x0, int x1, int y0, int y1, std::size_t padding, RowSink sink);

 private:
  struct State;
  State* state_;
  std::vector<std::uint8_t> row_;  // one decoded row (CMYK: 4 channels)
  std::vector<std::uint8_t> rgb_;  // one converted row (CMYK input only)
};

// True if `data` starts with a JPEG signature (SOI followed by a marker).
bool is_jpeg(std::span<const std::byte> data);

}  // namespace stoker::image
