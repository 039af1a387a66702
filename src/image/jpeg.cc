#include "image/jpeg.h"

// clang-format off
#include <cstdio>  // jpeglib.h needs FILE and size_t first
#include <jpeglib.h>
#include <jerror.h>
// clang-format on

#include <algorithm>
#include <csetjmp>
#include <cstring>
#include <stdexcept>
#include <string>

namespace stoker::image {
namespace {

// libjpeg reports fatal errors through error_exit, which must not return: it longjmps back to
// the setjmp in the JpegDecoder method that called into libjpeg. Only libjpeg's C frames lie
// between, so no destructor is skipped; the method then throws a C++ exception.
struct Errors {
  jpeg_error_mgr mgr;  // first member: libjpeg's cinfo->err points here
  std::jmp_buf jump;
  char message[JMSG_LENGTH_MAX];
};

[[noreturn]] void on_error(j_common_ptr cinfo) {
  auto* e = reinterpret_cast<Errors*>(cinfo->err);
  cinfo->err->format_message(cinfo, e->message);
  std::longjmp(e->jump, 1);
}

// Warnings: where libjpeg would go on with made-up pixels, that is an error: running out of
// data (a truncated file), a marker where entropy-coded data should go on (the data segment
// was cut short: a partial download with an end marker, a corrupt byte that reads as a
// marker) and a lost restart marker (libjpeg skips ahead to resynchronize). Other warnings
// (extraneous bytes before a marker, and the like) lose no pixels and are ignored, as Pillow
// and torchvision ignore them.
void on_message(j_common_ptr cinfo, int level) {
  if (level >= 0) return;  // trace messages
  auto* e = reinterpret_cast<Errors*>(cinfo->err);
  switch (cinfo->err->msg_code) {
    case JWRN_JPEG_EOF:
      std::snprintf(e->message, sizeof e->message, "truncated JPEG (premature end of data)");
      break;
    case JWRN_HIT_MARKER:
    case JWRN_MUST_RESYNC: {
      char what[JMSG_LENGTH_MAX];
      cinfo->err->format_message(cinfo, what);
      std::snprintf(e->message, sizeof e->message, "corrupt JPEG (%.180s)", what);
      break;
    }
    default:
      return;
  }
  std::longjmp(e->jump, 1);
}

// Pillow's CMYK to RGB (Convert.c cmyk2rgb): r = (255 - c) * (255 - k) / 255, rounded. Adobe
// JPEGs store CMYK inverted (Pillow's "CMYK;I"), so their bytes are 255 - c and 255 - k.
void cmyk_to_rgb(const std::uint8_t* in, std::uint8_t* out, int width, bool inverted) {
  for (int x = 0; x < width; ++x, in += 4, out += 3) {
    const int k = inverted ? in[3] : 255 - in[3];
    for (int c = 0; c < 3; ++c) {
      const int v = inverted ? in[c] : 255 - in[c];
      const int t = v * k + 128;
      out[c] = static_cast<std::uint8_t>((t + (t >> 8)) >> 8);
    }
  }
}

}  // namespace

struct JpegDecoder::State {
  jpeg_decompress_struct cinfo;
  Errors errors;
  bool cmyk = false;
};

JpegDecoder::JpegDecoder() : state_(new State{}) {
  state_->cinfo.err = jpeg_std_error(&state_->errors.mgr);
  state_->errors.mgr.error_exit = on_error;
  state_->errors.mgr.emit_message = on_message;
  if (setjmp(state_->errors.jump)) {
    delete state_;
    throw std::runtime_error("cannot create a JPEG decoder");
  }
  jpeg_create_decompress(&state_->cinfo);
}

JpegDecoder::~JpegDecoder() {
  jpeg_destroy_decompress(&state_->cinfo);
  delete state_;
}

bool is_jpeg(std::span<const std::byte> data) {
  return data.size() >= 3 && data[0] == std::byte{0xFF} && data[1] == std::byte{0xD8} &&
         data[2] == std::byte{0xFF};
}

// Each method that calls into libjpeg sets its own landing point; on an error the image is
// aborted (the decoder is ready for the next one) and the reason thrown.
#define STOKER_JPEG_GUARD()                                        \
  if (setjmp(state_->errors.jump)) {                               \
    jpeg_abort_decompress(&state_->cinfo);                         \
    throw std::runtime_error(std::string(state_->errors.message)); \
  }

JpegDecoder::Header JpegDecoder::read_header(std::span<const std::byte> data) {
  jpeg_decompress_struct& cinfo = state_->cinfo;
  STOKER_JPEG_GUARD();
  jpeg_abort_decompress(&cinfo);  // whatever an earlier image left
  jpeg_mem_src(&cinfo, reinterpret_cast<const unsigned char*>(data.data()),
               static_cast<unsigned long>(data.size()));
  jpeg_read_header(&cinfo, TRUE);
  switch (cinfo.jpeg_color_space) {
    case JCS_GRAYSCALE:
    case JCS_RGB:
    case JCS_YCbCr:
      cinfo.out_color_space = JCS_RGB;
      state_->cmyk = false;
      break;
    case JCS_CMYK:
    case JCS_YCCK:
      cinfo.out_color_space = JCS_CMYK;
      state_->cmyk = true;
      break;
    default:
      std::snprintf(state_->errors.message, sizeof state_->errors.message,
                    "unsupported JPEG color space (%d components)", cinfo.num_components);
      jpeg_abort_decompress(&cinfo);
      throw std::runtime_error(state_->errors.message);
  }
  return {static_cast<int>(cinfo.image_width), static_cast<int>(cinfo.image_height)};
}

JpegDecoder::Header JpegDecoder::scaled_size(int denom) {
  jpeg_decompress_struct& cinfo = state_->cinfo;
  STOKER_JPEG_GUARD();
  cinfo.scale_num = 1;
  cinfo.scale_denom = static_cast<unsigned>(denom);
  jpeg_calc_output_dimensions(&cinfo);
  return {static_cast<int>(cinfo.output_width), static_cast<int>(cinfo.output_height)};
}

void JpegDecoder::decode(int denom, int x0, int x1, int y0, int y1, std::size_t padding,
                         RowSink sink) {
  jpeg_decompress_struct& cinfo = state_->cinfo;
  const bool cmyk = state_->cmyk;
  // Buffers are sized before any libjpeg call, so no allocation can be skipped by a longjmp.
  // Rows handed to the sink are readable for a few bytes past their end (SIMD loads).
  // Sized for the unscaled width, the most any scale needs, so they stop growing once every
  // image has been seen.
  const auto full_width = static_cast<std::size_t>(cinfo.image_width);
  const std::size_t channels = cmyk ? 4 : 3;
  const std::size_t row_bytes = full_width * channels + padding;
  if (row_.size() < row_bytes) row_.resize(row_bytes);
  if (cmyk && rgb_.size() < full_width * 3 + padding) rgb_.resize(full_width * 3 + padding);
  std::uint8_t* row = row_.data();
  std::uint8_t* rgb = rgb_.data();
  STOKER_JPEG_GUARD();
  cinfo.scale_num = 1;
  cinfo.scale_denom = static_cast<unsigned>(denom);
  jpeg_start_decompress(&cinfo);
  // Columns [x0, x1) with a margin on both sides: libjpeg's fancy (triangle) chroma
  // upsampling takes each chroma sample's neighbours, and at the edges of a cropped span it
  // repeats the edge sample instead, so the outermost columns of the span would not be those
  // of the whole image (up to 50 levels apart on 4:2:0 chroma edges). The margin, a chroma
  // sample and its neighbour, keeps [x0, x1) away from both edges.
  const int margin = 2 * cinfo.max_h_samp_factor;
  const int left = std::max(0, x0 - margin);
  const int right = std::min(static_cast<int>(cinfo.output_width), x1 + margin);
  JDIMENSION xoffset = static_cast<JDIMENSION>(left);
  JDIMENSION width = static_cast<JDIMENSION>(right - left);
  if (xoffset != 0 || width != cinfo.output_width) {
    // Widens the span to whole iMCUs: xoffset moves left, width grows.
    jpeg_crop_scanline(&cinfo, &xoffset, &width);
  }
  const std::size_t skip_columns = static_cast<std::size_t>(x0) - xoffset;
  if (y0 > 0) jpeg_skip_scanlines(&cinfo, static_cast<JDIMENSION>(y0));
  const bool inverted = cmyk && cinfo.saw_Adobe_marker;
  for (int y = y0; y < y1; ++y) {
    JSAMPROW rows[1] = {row};
    if (jpeg_read_scanlines(&cinfo, rows, 1) != 1) {
      std::snprintf(state_->errors.message, sizeof state_->errors.message,
                    "truncated JPEG (no data for row %d)", y);
      std::longjmp(state_->errors.jump, 1);
    }
    const std::uint8_t* out = row + skip_columns * channels;
    if (cmyk) {
      cmyk_to_rgb(out, rgb, x1 - x0, inverted);
      out = rgb;
    }
    sink.fn(sink.context, out, y - y0);
  }
  jpeg_abort_decompress(&cinfo);  // rows below the region are never decoded
}

#undef STOKER_JPEG_GUARD

}  // namespace stoker::image
