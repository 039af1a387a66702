#include "image/png.h"

#include <png.h>

#include <csetjmp>
#include <cstdio>
#include <cstring>
#include <stdexcept>
#include <string>

namespace stoker::image {
namespace {

// libpng reports errors through its error function, which must not return: it longjmps back
// to the setjmp in the function below that called into libpng. Only libpng's C frames lie
// between, so no destructor is skipped; that function then throws a C++ exception.
struct Reader {
  std::span<const std::byte> data;
  std::size_t at = 0;
  char message[200] = {};
  png_structp png = nullptr;
  png_infop info = nullptr;

  Reader() {
    png = png_create_read_struct(PNG_LIBPNG_VER_STRING, this, on_error, on_warning);
    if (png != nullptr) info = png_create_info_struct(png);
    if (png == nullptr || info == nullptr) {
      png_destroy_read_struct(&png, &info, nullptr);
      throw std::runtime_error("cannot create a PNG decoder");
    }
    png_set_read_fn(png, this, on_read);
  }
  ~Reader() { png_destroy_read_struct(&png, &info, nullptr); }
  Reader(const Reader&) = delete;
  Reader& operator=(const Reader&) = delete;

  static void on_error(png_structp png, png_const_charp what) {
    auto* r = static_cast<Reader*>(png_get_error_ptr(png));
    std::snprintf(r->message, sizeof r->message, "%s", what);
    png_longjmp(png, 1);
  }
  // Warnings (a bad CRC on an ancillary chunk, which libpng skips, and the like) lose no
  // pixels: ignored, as Pillow ignores them.
  static void on_warning(png_structp, png_const_charp) {}
  static void on_read(png_structp png, png_bytep out, png_size_t bytes) {
    auto* r = static_cast<Reader*>(png_get_io_ptr(png));
    if (bytes > r->data.size() - r->at) png_error(png, "unexpected end of file");
    std::memcpy(out, r->data.data() + r->at, bytes);
    r->at += bytes;
  }
};

}  // namespace

bool is_png(std::span<const std::byte> data) {
  static constexpr unsigned char kSignature[8] = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1A, '\n'};
  return data.size() >= 8 && std::memcmp(data.data(), kSignature, 8) == 0;
}

namespace {

// The steps that call into libpng, each with its own landing point; false (the reason in
// r.message) on an error. Kept apart from the C++ objects of their callers: a longjmp may
// only cross plain values.
bool read_header(Reader& r) {
  if (setjmp(png_jmpbuf(r.png))) return false;
  png_read_info(r.png, r.info);
  return true;
}

// Every flavour to 8-bit RGBA as Pillow's Image.open + convert("RGB") sees it (alpha is then
// dropped by the caller, not composited): palette and gray to RGB, 1/2/4-bit gray scaled to 8
// bits (x255, x85, x17), a tRNS chunk to alpha, 16-bit samples to their high byte (Pillow's
// "RGB;16B" and the like). No gamma: Pillow ignores gAMA, sRGB, iCCP and cHRM, so libpng is
// never asked to convert. (16-bit grayscale is the one difference: Pillow opens it as "I;16"
// and convert("RGB") clips it; docs/image.md.)
bool read_rgba(Reader& r, png_bytepp rows, std::size_t row_bytes) {
  if (setjmp(png_jmpbuf(r.png))) return false;
  const int color = png_get_color_type(r.png, r.info);
  if (color == PNG_COLOR_TYPE_PALETTE) png_set_palette_to_rgb(r.png);
  if (color == PNG_COLOR_TYPE_GRAY && png_get_bit_depth(r.png, r.info) < 8) {
    png_set_expand_gray_1_2_4_to_8(r.png);
  }
  if (png_get_valid(r.png, r.info, PNG_INFO_tRNS)) png_set_tRNS_to_alpha(r.png);
  png_set_strip_16(r.png);
  if (color == PNG_COLOR_TYPE_GRAY || color == PNG_COLOR_TYPE_GRAY_ALPHA) {
    png_set_gray_to_rgb(r.png);
  }
  png_set_add_alpha(r.png, 0xFF, PNG_FILLER_AFTER);  // no-op where there is alpha
  png_set_interlace_handling(r.png);
  png_read_update_info(r.png, r.info);
  if (png_get_rowbytes(r.png, r.info) != row_bytes) png_error(r.png, "unexpected row layout");
  png_read_image(r.png, rows);
  return true;
}

}  // namespace

PngHeader png_size(std::span<const std::byte> data) {
  Reader r;
  r.data = data;
  if (!read_header(r)) throw std::runtime_error(std::string("corrupt PNG: ") + r.message);
  return {static_cast<int>(png_get_image_width(r.png, r.info)),
          static_cast<int>(png_get_image_height(r.png, r.info))};
}

PngHeader decode_png(std::span<const std::byte> data, std::uint64_t max_pixels,
                     std::vector<std::uint8_t>& rgba) {
  Reader r;
  r.data = data;
  if (!read_header(r)) throw std::runtime_error(std::string("corrupt PNG: ") + r.message);
  const png_uint_32 width = png_get_image_width(r.png, r.info);
  const png_uint_32 height = png_get_image_height(r.png, r.info);
  const std::uint64_t pixels = std::uint64_t{width} * height;
  if (pixels > max_pixels) {
    throw std::runtime_error("image of " + std::to_string(width) + "x" + std::to_string(height) +
                             " pixels is over the limit of " + std::to_string(max_pixels) +
                             " pixels");
  }
  rgba.resize(static_cast<std::size_t>(pixels) * 4);
  std::vector<png_bytep> rows(height);
  for (png_uint_32 y = 0; y < height; ++y) rows[y] = rgba.data() + std::size_t{y} * width * 4;
  if (!read_rgba(r, rows.data(), std::size_t{width} * 4)) {
    throw std::runtime_error(std::string("corrupt or truncated PNG: ") + r.message);
  }
  return {static_cast<int>(width), static_cast<int>(height)};
}

}  // namespace stoker::image
