// Resampling kernels with Pillow's antialiased filters (ImagingResample, libImaging/Resample.c):
// separable, a horizontal pass then a vertical pass, fixed-point coefficients with
// kPrecisionBits fraction bits, rounding to 8 bits between and after the passes, so results
// match Pillow's resize (and so torchvision's transforms on PIL images) to within rounding.
//
// Pure functions over caller-owned buffers: nothing here allocates, locks or keeps state.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <span>

#include "stoker/dataset.h"
#include "stoker/image.h"

namespace stoker::image {

inline constexpr int kPrecisionBits = 32 - 8 - 2;

// Filter weights along one axis: output position o (of a window of outputs) reads inputs
// start[o] .. start[o] + count[o] - 1 with weights[o * taps ...]. Inputs used by the whole
// window are [first, last).
struct AxisCoeffs {
  int taps = 0;
  std::span<std::int32_t> start;
  std::span<std::int32_t> count;
  std::span<std::int32_t> weights;  // start.size() * taps
  int first = 0;
  int last = 0;
};

// Coefficients per output of Pillow's bilinear (triangle) filter, support scaled by the
// reduction factor, for resizing the span [in0, in1) of an axis of `in_size` pixels to
// `out_size` pixels (Pillow's resize with a box).
int bilinear_taps(double in0, double in1, int out_size);

// Fills `c` (spans sized by the caller: start/count for the window, weights for window * taps
// with taps = bilinear_taps(...)) for outputs [window_begin, window_begin + c.start.size()).
void bilinear_axis(int in_size, double in0, double in1, int out_size, int window_begin,
                   AxisCoeffs& c);

// Horizontal pass over one RGB row: `in` holds input pixels from index cx.first on, and must
// be readable for row_padding(cx) bytes past the last pixel it uses (cx.last - 1: SIMD loads
// whole words, and pairs of outputs run over the longer one's taps). Writes n = cx.start.size()
// outputs as RGBx (4 bytes each, the fourth zero), which keeps every store and the vertical pass's
// vectors aligned to pixels. Uses SSE4.1 where the CPU has it (AVX2: two taps per instruction).
void resample_row(const std::uint8_t* in, const AxisCoeffs& cx, std::uint8_t* out);
std::size_t row_padding(const AxisCoeffs& cx);
// The portable scalar version, for checking the SIMD one.
void resample_row_reference(const std::uint8_t* in, const AxisCoeffs& cx, std::uint8_t* out);

// One-channel passes over an image plane (a video frame's Y, U or V before its colour
// conversion), each output rounded to 8 bits as the RGB passes round theirs.
// Horizontal weights are 16-bit with kPlaneBits fraction bits (Pillow's rounded: a weight is
// off by at most 2^-15, a sum of eight by 2^-12 of a level's worth), so that two outputs go
// through one 16-lane multiply-add.
inline constexpr int kPlaneBits = 14;
// bilinear_taps rounded up to a multiple of 8, for a plane's horizontal coefficients.
int plane_taps(double in0, double in1, int out_size);
// cx's weights as 16-bit ones (w16: cx.weights.size() values).
void plane_weights(const AxisCoeffs& cx, std::span<std::int16_t> w16);
// Horizontal: `in` holds a row's pixels from cx.first on, `avail` of them readable (at least
// cx.last - cx.first); writes cx.start.size() bytes. Reads nothing past `avail`. Eight outputs
// at a time (AVX2) where cx.taps is a multiple of 8 (plane_taps()).
void resample_plane_row(const std::uint8_t* in, int avail, const AxisCoeffs& cx,
                        std::span<const std::int16_t> w16, std::uint8_t* out);
// The portable scalar version, for checking the SIMD one.
void resample_plane_row_reference(const std::uint8_t* in, const AxisCoeffs& cx,
                                  std::span<const std::int16_t> w16, std::uint8_t* out);
// Vertical: row r of `rows` (input row cy.first + r, `width` bytes) at rows + r * row_stride;
// writes cy.start.size() rows of `width` bytes at out + y * out_stride. `acc`: width values.
void resample_plane_columns(const std::uint8_t* rows, std::size_t row_stride, const AxisCoeffs& cy,
                            std::size_t width, std::uint8_t* out, std::size_t out_stride,
                            std::span<std::int32_t> acc);

// A YUV to RGB matrix in 16.16 fixed point: R = cy (Y - oy) + crv V', G = cy (Y - oy) - cgu U'
// - cgv V', B = cy (Y - oy) + cbu U' (U' = U - 128, V' = V - 128), as libswscale derives it from
// its coefficient tables and the range (sws_setColorspaceDetails).
struct YuvMatrix {
  std::int32_t cy = 1 << 16, oy = 0, crv = 0, cbu = 0, cgu = 0, cgv = 0;
};
// n pixels of Y, U and V planes to R, G and B planes, rounded to the nearest level.
void yuv_to_rgb(const std::uint8_t* const yuv[3], std::size_t n, const YuvMatrix& m,
                std::uint8_t* const rgb[3]);

// Where and how the vertical pass writes: a width x height image of 3 channels into `out`,
// u8 as is or f32 as v * scale[c] + bias[c], CHW or HWC, mirrored left-right if `flip`.
struct OutputArgs {
  std::span<std::byte> out;
  DType dtype = DType::u8;
  ImageLayout layout = ImageLayout::chw;
  bool flip = false;
  std::array<float, 3> scale{1.0f, 1.0f, 1.0f};
  std::array<float, 3> bias{};
  int width = 0;
  int height = 0;
};

// Vertical pass fused with flip, normalize and layout change. `rows` holds the horizontally
// resampled rows as resample_row writes them: row r (input row cy.first + r) at
// rows + r * row_stride, `width` RGBx pixels. `acc` (width * 4) and `line` (width * 4) are
// scratch. Vectorized with AVX2 where the CPU has it.
void resample_columns(const std::uint8_t* rows, std::size_t row_stride, const AxisCoeffs& cy,
                      const OutputArgs& args, std::span<std::int32_t> acc,
                      std::span<std::uint8_t> line);

// No resampling: writes a width x height RGB image, u8 HWC with `row_stride` bytes a row, as
// `args` says (dtype, layout, flip, scale and bias). What ToTensor (+ Normalize) does to an
// image that Python code produced, in one pass.
void write_pixels(const std::uint8_t* hwc, std::size_t row_stride, const OutputArgs& args);

// ToTensor + Normalize as a multiply-add: scale = 1 / (255 std), bias = -mean / std, so that
// v * scale + bias = (v / 255 - mean) / std up to float rounding.
void normalize_args(const std::array<float, 3>& mean, const std::array<float, 3>& std,
                    OutputArgs& args);

}  // namespace stoker::image
