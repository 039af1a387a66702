#include "stoker/frontend/jpeg_encode.h"

// clang-format off
#include <cstdio>  // jpeglib.h needs FILE and size_t first
#include <jpeglib.h>
// clang-format on

#include <cstdlib>

namespace stoker::detail {

std::vector<std::byte> encode_jpeg(const std::vector<std::uint8_t>& pixels, int width, int height,
                                   int components, int quality, bool subsample, bool progressive,
                                   int orientation) {
  jpeg_compress_struct cinfo;
  jpeg_error_mgr jerr;
  cinfo.err = jpeg_std_error(&jerr);
  jpeg_create_compress(&cinfo);
  unsigned char* buffer = nullptr;
  unsigned long size = 0;
  jpeg_mem_dest(&cinfo, &buffer, &size);
  cinfo.image_width = static_cast<JDIMENSION>(width);
  cinfo.image_height = static_cast<JDIMENSION>(height);
  cinfo.input_components = components;
  cinfo.in_color_space = components == 1 ? JCS_GRAYSCALE : components == 3 ? JCS_RGB : JCS_CMYK;
  jpeg_set_defaults(&cinfo);
  jpeg_set_quality(&cinfo, quality, TRUE);
  if (progressive) jpeg_simple_progression(&cinfo);
  if (components == 3 && !subsample) {
    for (int c = 0; c < 3; ++c) {
      cinfo.comp_info[c].h_samp_factor = cinfo.comp_info[c].v_samp_factor = 1;
    }
  }
  jpeg_start_compress(&cinfo, TRUE);
  if (orientation) {
    // "Exif\0\0", a little-endian TIFF header, one IFD with one entry: Orientation (0x0112),
    // type SHORT, count 1, the value.
    const unsigned char exif[] = {'E', 'x',  'i',  'f', 0,
                                  0,   'I',  'I',  42,  0,
                                  8,   0,    0,    0,   1,
                                  0,   0x12, 0x01, 3,   0,
                                  1,   0,    0,    0,   static_cast<unsigned char>(orientation),
                                  0,   0,    0,    0,   0,
                                  0,   0};
    jpeg_write_marker(&cinfo, JPEG_APP0 + 1, exif, sizeof exif);
  }
  while (cinfo.next_scanline < cinfo.image_height) {
    auto* row = const_cast<JSAMPROW>(pixels.data() + static_cast<std::size_t>(cinfo.next_scanline) *
                                                         static_cast<std::size_t>(width) *
                                                         static_cast<std::size_t>(components));
    jpeg_write_scanlines(&cinfo, &row, 1);
  }
  jpeg_finish_compress(&cinfo);
  std::vector<std::byte> out(reinterpret_cast<std::byte*>(buffer),
                             reinterpret_cast<std::byte*>(buffer) + size);
  jpeg_destroy_compress(&cinfo);
  std::free(buffer);
  return out;
}

}  // namespace stoker::detail
