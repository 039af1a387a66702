#include "image/resample.h"

#include <algorithm>
#include <cmath>
#include <cstring>

namespace stoker::image {
namespace {

double triangle(double x) {
  x = std::fabs(x);
  return x < 1.0 ? 1.0 - x : 0.0;
}

std::uint8_t clip8(std::int32_t v) {
  v >>= kPrecisionBits;
  return static_cast<std::uint8_t>(v < 0 ? 0 : (v > 255 ? 255 : v));
}

constexpr std::int32_t kHalf = 1 << (kPrecisionBits - 1);

}  // namespace

int bilinear_taps(double in0, double in1, int out_size) {
  const double scale = (in1 - in0) / out_size;
  const double support = 1.0 * std::max(scale, 1.0);
  return static_cast<int>(std::ceil(support)) * 2 + 1;
}

// Pillow's precompute_coeffs and normalize_coeffs_8bpc, restricted to a window of outputs.
void bilinear_axis(int in_size, double in0, double in1, int out_size, int window_begin,
                   AxisCoeffs& c) {
  const double scale = (in1 - in0) / out_size;
  const double filterscale = std::max(scale, 1.0);
  const double support = 1.0 * filterscale;
  const double ss = 1.0 / filterscale;
  const int taps = c.taps;
  const auto n = static_cast<int>(c.start.size());
  c.first = in_size;
  c.last = 0;
  for (int o = 0; o < n; ++o) {
    const double center = in0 + (window_begin + o + 0.5) * scale;
    int xmin = static_cast<int>(center - support + 0.5);
    if (xmin < 0) xmin = 0;
    int xmax = static_cast<int>(center + support + 0.5);
    if (xmax > in_size) xmax = in_size;
    xmax -= xmin;
    xmax = std::min(xmax, taps);
    // Two passes over the (cheap) filter instead of a temporary array of any length.
    double ww = 0.0;
    for (int x = 0; x < xmax; ++x) ww += triangle((x + xmin - center + 0.5) * ss);
    std::int32_t* w = c.weights.data() + static_cast<std::size_t>(o) * taps;
    for (int x = 0; x < xmax; ++x) {
      const double k = triangle((x + xmin - center + 0.5) * ss);
      const double v = ww != 0.0 ? k / ww : k;
      w[x] = static_cast<std::int32_t>(v < 0 ? std::trunc(-0.5 + v * (1 << kPrecisionBits))
                                             : std::trunc(0.5 + v * (1 << kPrecisionBits)));
    }
    for (int x = xmax; x < taps; ++x) w[x] = 0;
    c.start[o] = xmin;
    c.count[o] = xmax;
    c.first = std::min(c.first, xmin);
    c.last = std::max(c.last, xmin + xmax);
  }
  if (c.last < c.first) c.last = c.first;
}

void resample_row(const std::uint8_t* in, const AxisCoeffs& cx, std::uint8_t* out) {
  const auto n = cx.start.size();
  const std::int32_t* w = cx.weights.data();
  for (std::size_t o = 0; o < n; ++o, w += cx.taps, out += 3) {
    const std::uint8_t* p = in + static_cast<std::ptrdiff_t>(cx.start[o] - cx.first) * 3;
    std::int32_t r = kHalf, g = kHalf, b = kHalf;
    const int count = cx.count[o];
    for (int k = 0; k < count; ++k, p += 3) {
      r += p[0] * w[k];
      g += p[1] * w[k];
      b += p[2] * w[k];
    }
    out[0] = clip8(r);
    out[1] = clip8(g);
    out[2] = clip8(b);
  }
}

void resample_columns(const std::uint8_t* rows, std::size_t row_stride, const AxisCoeffs& cy,
                      const OutputArgs& args, std::span<std::int32_t> acc,
                      std::span<std::uint8_t> line) {
  const auto width = static_cast<std::size_t>(args.width);
  const auto height = static_cast<std::size_t>(args.height);
  const std::size_t row_values = width * 3;
  std::int32_t* a = acc.data();
  std::uint8_t* l = line.data();
  const std::size_t plane = width * height;
  for (std::size_t y = 0; y < height; ++y) {
    for (std::size_t i = 0; i < row_values; ++i) a[i] = kHalf;
    const std::int32_t* w = cy.weights.data() + y * static_cast<std::size_t>(cy.taps);
    const std::uint8_t* src = rows + static_cast<std::size_t>(cy.start[y] - cy.first) * row_stride;
    for (int k = 0; k < cy.count[y]; ++k, src += row_stride) {
      const std::int32_t wk = w[k];
      for (std::size_t i = 0; i < row_values; ++i) a[i] += src[i] * wk;
    }
    for (std::size_t i = 0; i < row_values; ++i) l[i] = clip8(a[i]);

    // Output column of line pixel x: x, or width - 1 - x when flipped.
    if (args.dtype == DType::u8) {
      auto* out = reinterpret_cast<std::uint8_t*>(args.out.data());
      if (args.layout == ImageLayout::hwc) {
        std::uint8_t* dst = out + y * row_values;
        if (!args.flip) {
          std::memcpy(dst, l, row_values);
        } else {
          for (std::size_t x = 0; x < width; ++x) {
            std::memcpy(dst + (width - 1 - x) * 3, l + x * 3, 3);
          }
        }
      } else {
        for (std::size_t c = 0; c < 3; ++c) {
          std::uint8_t* dst = out + c * plane + y * width;
          if (!args.flip) {
            for (std::size_t x = 0; x < width; ++x) dst[x] = l[x * 3 + c];
          } else {
            for (std::size_t x = 0; x < width; ++x) dst[width - 1 - x] = l[x * 3 + c];
          }
        }
      }
    } else {
      auto* out = reinterpret_cast<float*>(args.out.data());
      const float* lut = args.lut;
      if (args.layout == ImageLayout::hwc) {
        float* dst = out + y * row_values;
        for (std::size_t x = 0; x < width; ++x) {
          const std::size_t ox = args.flip ? width - 1 - x : x;
          for (std::size_t c = 0; c < 3; ++c) dst[ox * 3 + c] = lut[c * 256 + l[x * 3 + c]];
        }
      } else {
        for (std::size_t c = 0; c < 3; ++c) {
          float* dst = out + c * plane + y * width;
          const float* t = lut + c * 256;
          if (!args.flip) {
            for (std::size_t x = 0; x < width; ++x) dst[x] = t[l[x * 3 + c]];
          } else {
            for (std::size_t x = 0; x < width; ++x) dst[width - 1 - x] = t[l[x * 3 + c]];
          }
        }
      }
    }
  }
}

void normalize_table(const std::array<float, 3>& mean, const std::array<float, 3>& std,
                     std::span<float> lut) {
  for (std::size_t c = 0; c < 3; ++c) {
    for (int v = 0; v < 256; ++v) {
      lut[c * 256 + static_cast<std::size_t>(v)] =
          (static_cast<float>(v) / 255.0f - mean[c]) / std[c];
    }
  }
}

}  // namespace stoker::image
