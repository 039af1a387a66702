#include "image/resample.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace stoker::image {
namespace {

double triangle(double x) {
  x = std::fabs(x);
  return x < 1.0 ? 1.0 - x : 0.0;
}

// A sum of weighted 8-bit values with `Bits` fraction bits, rounded down to a level in 0..255.
template <int Bits = kPrecisionBits>
std::uint8_t clip8(std::int32_t v) {
  v >>= Bits;
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
    // Drop taps whose fixed-point weight is zero (Pillow's support often ends on one): same
    // result, less work.
    int lead = 0;
    while (lead < xmax && w[lead] == 0) ++lead;
    while (xmax > lead && w[xmax - 1] == 0) --xmax;
    if (lead > 0) {
      for (int x = lead; x < xmax; ++x) w[x - lead] = w[x];
      xmin += lead;
      xmax -= lead;
    }
    for (int x = xmax; x < taps; ++x) w[x] = 0;
    c.start[o] = xmin;
    c.count[o] = xmax;
    c.first = std::min(c.first, xmin);
    c.last = std::max(c.last, xmin + xmax);
  }
  if (c.last < c.first) c.last = c.first;
}

namespace {

// Scalar horizontal pass, the reference and the fallback.
void resample_row_scalar(const std::uint8_t* in, const AxisCoeffs& cx, std::uint8_t* out) {
  const auto n = cx.start.size();
  const std::int32_t* w = cx.weights.data();
  for (std::size_t o = 0; o < n; ++o, w += cx.taps) {
    const std::uint8_t* p = in + static_cast<std::ptrdiff_t>(cx.start[o] - cx.first) * 3;
    std::int32_t r = kHalf, g = kHalf, b = kHalf;
    const int count = cx.count[o];
    for (int k = 0; k < count; ++k, p += 3) {
      r += p[0] * w[k];
      g += p[1] * w[k];
      b += p[2] * w[k];
    }
    out[o * 4] = clip8(r);
    out[o * 4 + 1] = clip8(g);
    out[o * 4 + 2] = clip8(b);
    out[o * 4 + 3] = 0;
  }
}

#if defined(__x86_64__)
// One pixel (R, G, B and the next byte) per 4-lane multiply-add: a third of the scalar
// instructions. Reads one byte past each pixel, which callers provide.
__attribute__((target("sse4.1"))) void resample_row_sse41(const std::uint8_t* in,
                                                          const AxisCoeffs& cx, std::uint8_t* out) {
  const auto n = cx.start.size();
  const std::int32_t* w = cx.weights.data();
  for (std::size_t o = 0; o < n; ++o, w += cx.taps) {
    const std::uint8_t* p = in + static_cast<std::ptrdiff_t>(cx.start[o] - cx.first) * 3;
    __m128i acc = _mm_set1_epi32(kHalf);
    const int count = cx.count[o];
    for (int k = 0; k < count; ++k, p += 3) {
      std::int32_t v;
      std::memcpy(&v, p, 4);
      const __m128i px = _mm_cvtepu8_epi32(_mm_cvtsi32_si128(v));
      acc = _mm_add_epi32(acc, _mm_mullo_epi32(px, _mm_set1_epi32(w[k])));
    }
    acc = _mm_srai_epi32(acc, kPrecisionBits);
    const __m128i s16 = _mm_packs_epi32(acc, acc);
    // The fourth lane holds the byte after the pixel times the weights; zero it.
    const auto rgbx = static_cast<std::uint32_t>(_mm_cvtsi128_si32(_mm_packus_epi16(s16, s16)));
    const std::uint32_t rgb0 = rgbx & 0x00FFFFFFu;
    std::memcpy(out + o * 4, &rgb0, 4);
  }
}

// Two outputs per 8-lane multiply-add: lanes 0-3 accumulate output o (R G B x), lanes 4-7
// output o + 1, over max(count[o], count[o + 1]) taps (weights past an output's count are zero,
// so the extra taps add nothing; they may read up to taps pixels past cx.last, which callers
// provide, see row_padding()).
__attribute__((target("avx2"))) void resample_row_avx2(const std::uint8_t* in, const AxisCoeffs& cx,
                                                       std::uint8_t* out) {
  const auto n = cx.start.size();
  const auto taps = static_cast<std::size_t>(cx.taps);
  const __m256i half = _mm256_set1_epi32(kHalf);
  std::size_t o = 0;
  for (; o + 1 < n; o += 2) {
    const std::uint8_t* p0 = in + static_cast<std::ptrdiff_t>(cx.start[o] - cx.first) * 3;
    const std::uint8_t* p1 = in + static_cast<std::ptrdiff_t>(cx.start[o + 1] - cx.first) * 3;
    const std::int32_t* w0 = cx.weights.data() + o * taps;
    const std::int32_t* w1 = w0 + taps;
    const int count = std::max(cx.count[o], cx.count[o + 1]);
    __m256i acc = half;
    for (int k = 0; k < count; ++k) {
      std::int32_t a, b;
      std::memcpy(&a, p0 + 3 * k, 4);
      std::memcpy(&b, p1 + 3 * k, 4);
      const __m256i px = _mm256_cvtepu8_epi32(_mm_insert_epi32(_mm_cvtsi32_si128(a), b, 1));
      const __m256i wv = _mm256_set_m128i(_mm_set1_epi32(w1[k]), _mm_set1_epi32(w0[k]));
      acc = _mm256_add_epi32(acc, _mm256_mullo_epi32(px, wv));
    }
    acc = _mm256_srai_epi32(acc, kPrecisionBits);
    const __m128i s16 =
        _mm_packs_epi32(_mm256_castsi256_si128(acc), _mm256_extracti128_si256(acc, 1));
    const auto two = static_cast<std::uint64_t>(_mm_cvtsi128_si64(_mm_packus_epi16(s16, s16))) &
                     0x00FFFFFF00FFFFFFull;
    std::memcpy(out + o * 4, &two, 8);
  }
  if (o < n) {  // an odd last output
    AxisCoeffs last = cx;
    last.start = cx.start.subspan(o, 1);
    last.count = cx.count.subspan(o, 1);
    last.weights = cx.weights.subspan(o * taps, taps);
    resample_row_sse41(in, last, out + o * 4);
  }
}
#endif

// One channel, scalar: the reference, the fallback and the last outputs of a row (those
// whose taps would reach past it).
constexpr std::int32_t kPlaneHalf = 1 << (kPlaneBits - 1);

void plane_row_scalar(const std::uint8_t* in, const AxisCoeffs& cx, const std::int16_t* w16,
                      std::size_t from, std::uint8_t* out) {
  const auto n = cx.start.size();
  const auto taps = static_cast<std::size_t>(cx.taps);
  for (std::size_t o = from; o < n; ++o) {
    const std::int16_t* w = w16 + o * taps;
    const std::uint8_t* p = in + (cx.start[o] - cx.first);
    std::int32_t v = kPlaneHalf;
    for (int k = 0; k < cx.count[o]; ++k) v += p[k] * w[k];
    out[o] = clip8<kPlaneBits>(v);
  }
}

#if defined(__x86_64__)
// Eight outputs at a time, two per 16-lane multiply-add of 16-bit pixels and weights (eight
// taps each), their partial sums gathered by two rounds of horizontal adds. Needs taps a
// multiple of 8 (weights past an output's count are zero) and, for each output, taps bytes
// of the row from its start.
__attribute__((target("avx2"))) std::size_t plane_row_avx2(const std::uint8_t* in, int avail,
                                                           const AxisCoeffs& cx,
                                                           const std::int16_t* w16,
                                                           std::uint8_t* out) {
  // Locals, not cx's members: stores through a byte pointer may alias anything, which would
  // have the compiler load them again for each output.
  const std::size_t n = cx.start.size();
  const auto taps = static_cast<std::size_t>(cx.taps);
  if (taps % 8 != 0) return 0;
  const std::int32_t* start = cx.start.data();
  const std::int32_t first = cx.first;
  const std::int32_t last = avail + first - cx.taps;  // the last start with taps readable
  // Lanes come out as outputs 0 2 4 6 1 3 5 7.
  const __m128i order = _mm_setr_epi8(0, 4, 1, 5, 2, 6, 3, 7, 8, 12, 9, 13, 10, 14, 11, 15);
  const __m256i half = _mm256_set1_epi32(kPlaneHalf);
  std::size_t o = 0;
  for (; o + 8 <= n && start[o + 7] <= last; o += 8) {
    __m256i m[4];
    for (std::size_t j = 0; j < 4; ++j) {
      const std::uint8_t* p0 = in + (start[o + 2 * j] - first);
      const std::uint8_t* p1 = in + (start[o + 2 * j + 1] - first);
      const std::int16_t* w0 = w16 + (o + 2 * j) * taps;
      __m256i acc = _mm256_setzero_si256();
      for (std::size_t k = 0; k < taps; k += 8) {
        const __m128i bytes =
            _mm_unpacklo_epi64(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p0 + k)),
                               _mm_loadl_epi64(reinterpret_cast<const __m128i*>(p1 + k)));
        // Eight taps: the two outputs' weights lie side by side, one load.
        const __m256i wv =
            taps == 8 ? _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w0))
                      : _mm256_loadu2_m128i(reinterpret_cast<const __m128i*>(w0 + taps + k),
                                            reinterpret_cast<const __m128i*>(w0 + k));
        acc = _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_cvtepu8_epi16(bytes), wv));
      }
      m[j] = acc;  // low half: output 2j's four partial sums; high half: 2j + 1's
    }
    __m256i v = _mm256_hadd_epi32(_mm256_hadd_epi32(m[0], m[1]), _mm256_hadd_epi32(m[2], m[3]));
    v = _mm256_srai_epi32(_mm256_add_epi32(v, half), kPlaneBits);
    const __m128i s16 = _mm_packs_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    const __m128i eight = _mm_shuffle_epi8(_mm_packus_epi16(s16, s16), order);
    _mm_storel_epi64(reinterpret_cast<__m128i*>(out + o), eight);
  }
  return o;
}
#endif

// Output row y of `args` from `l`, the row as RGBx (`args.width` pixels; mirrored in place
// when flipping, so the writes go left to right): u8 or v * scale + bias, CHW or HWC.
[[gnu::always_inline]] inline void store_row(std::uint8_t* l, std::size_t y,
                                             const OutputArgs& args) {
  const auto width = static_cast<std::size_t>(args.width);
  const std::size_t plane = width * static_cast<std::size_t>(args.height);
  if (args.flip) {
    auto* px = reinterpret_cast<std::uint32_t*>(l);
    std::reverse(px, px + width);
  }
  if (args.dtype == DType::u8) {
    auto* out = reinterpret_cast<std::uint8_t*>(args.out.data());
    if (args.layout == ImageLayout::chw) {
      for (std::size_t c = 0; c < 3; ++c) {
        std::uint8_t* dst = out + c * plane + y * width;
        for (std::size_t x = 0; x < width; ++x) dst[x] = l[x * 4 + c];
      }
    } else {
      std::uint8_t* dst = out + y * width * 3;
      for (std::size_t x = 0; x < width; ++x) {
        for (std::size_t c = 0; c < 3; ++c) dst[x * 3 + c] = l[x * 4 + c];
      }
    }
  } else {
    // v * scale + bias (a fused multiply-add, vectorized) rather than a table lookup per
    // value: equal to (v / 255 - mean) / std to within a few ulps.
    auto* out = reinterpret_cast<float*>(args.out.data());
    if (args.layout == ImageLayout::chw) {
      for (std::size_t c = 0; c < 3; ++c) {
        float* dst = out + c * plane + y * width;
        const float scale = args.scale[c], bias = args.bias[c];
        for (std::size_t x = 0; x < width; ++x) {
          dst[x] = static_cast<float>(l[x * 4 + c]) * scale + bias;
        }
      }
    } else {
      float* dst = out + y * width * 3;
      for (std::size_t x = 0; x < width; ++x) {
        for (std::size_t c = 0; c < 3; ++c) {
          dst[x * 3 + c] = static_cast<float>(l[x * 4 + c]) * args.scale[c] + args.bias[c];
        }
      }
    }
  }
}

// The vertical pass and the output, for one build target (the compiler vectorizes the
// multiply-adds over the contiguous planar rows with whatever the target offers).
[[gnu::always_inline]] inline void columns_impl(const std::uint8_t* rows, std::size_t row_stride,
                                                const AxisCoeffs& cy, const OutputArgs& args,
                                                std::int32_t* a, std::uint8_t* l) {
  const auto width = static_cast<std::size_t>(args.width);
  const auto height = static_cast<std::size_t>(args.height);
  const std::size_t row_values = width * 4;  // RGBx
  for (std::size_t y = 0; y < height; ++y) {
    for (std::size_t i = 0; i < row_values; ++i) a[i] = kHalf;
    const std::int32_t* w = cy.weights.data() + y * static_cast<std::size_t>(cy.taps);
    const std::uint8_t* src = rows + static_cast<std::size_t>(cy.start[y] - cy.first) * row_stride;
    for (int k = 0; k < cy.count[y]; ++k, src += row_stride) {
      const std::int32_t wk = w[k];
      for (std::size_t i = 0; i < row_values; ++i) a[i] += src[i] * wk;
    }
    for (std::size_t i = 0; i < row_values; ++i) {
      const std::int32_t v = a[i] >> kPrecisionBits;
      l[i] = static_cast<std::uint8_t>(v < 0 ? 0 : (v > 255 ? 255 : v));
    }

    store_row(l, y, args);
  }
}

void columns_default(const std::uint8_t* rows, std::size_t row_stride, const AxisCoeffs& cy,
                     const OutputArgs& args, std::int32_t* a, std::uint8_t* l) {
  columns_impl(rows, row_stride, cy, args, a, l);
}

#if defined(__x86_64__)
__attribute__((target("avx2"))) void columns_avx2(const std::uint8_t* rows, std::size_t row_stride,
                                                  const AxisCoeffs& cy, const OutputArgs& args,
                                                  std::int32_t* a, std::uint8_t* l) {
  columns_impl(rows, row_stride, cy, args, a, l);
}
#endif

// The vertical pass over one channel (vectorized by the compiler for each build target).
[[gnu::always_inline]] inline void plane_columns_impl(const std::uint8_t* rows,
                                                      std::size_t row_stride, const AxisCoeffs& cy,
                                                      std::size_t width, std::uint8_t* out,
                                                      std::size_t out_stride, std::int32_t* a) {
  const auto height = cy.start.size();
  for (std::size_t y = 0; y < height; ++y) {
    for (std::size_t i = 0; i < width; ++i) a[i] = kHalf;
    const std::int32_t* w = cy.weights.data() + y * static_cast<std::size_t>(cy.taps);
    const std::uint8_t* src = rows + static_cast<std::size_t>(cy.start[y] - cy.first) * row_stride;
    for (int k = 0; k < cy.count[y]; ++k, src += row_stride) {
      const std::int32_t wk = w[k];
      for (std::size_t i = 0; i < width; ++i) a[i] += src[i] * wk;
    }
    std::uint8_t* dst = out + y * out_stride;
    for (std::size_t i = 0; i < width; ++i) {
      const std::int32_t v = a[i] >> kPrecisionBits;
      dst[i] = static_cast<std::uint8_t>(v < 0 ? 0 : (v > 255 ? 255 : v));
    }
  }
}

void plane_columns_default(const std::uint8_t* rows, std::size_t row_stride, const AxisCoeffs& cy,
                           std::size_t width, std::uint8_t* out, std::size_t out_stride,
                           std::int32_t* a) {
  plane_columns_impl(rows, row_stride, cy, width, out, out_stride, a);
}

#if defined(__x86_64__)
__attribute__((target("avx2"))) void plane_columns_avx2(const std::uint8_t* rows,
                                                        std::size_t row_stride,
                                                        const AxisCoeffs& cy, std::size_t width,
                                                        std::uint8_t* out, std::size_t out_stride,
                                                        std::int32_t* a) {
  plane_columns_impl(rows, row_stride, cy, width, out, out_stride, a);
}
#endif

// YUV to RGB, 16.16 fixed point rounded (vectorized by the compiler for each build target).
[[gnu::always_inline]] inline void yuv_to_rgb_impl(const std::uint8_t* const yuv[3], std::size_t n,
                                                   const YuvMatrix& m, std::uint8_t* const rgb[3]) {
  // Locals and restrict: the output planes alias neither the inputs nor the matrix.
  const std::uint8_t* __restrict y = yuv[0];
  const std::uint8_t* __restrict u = yuv[1];
  const std::uint8_t* __restrict v = yuv[2];
  std::uint8_t* __restrict r = rgb[0];
  std::uint8_t* __restrict g = rgb[1];
  std::uint8_t* __restrict b = rgb[2];
  const std::int32_t cy = m.cy, oy = m.oy, crv = m.crv, cbu = m.cbu, cgu = m.cgu, cgv = m.cgv;
  auto clip = [](std::int32_t x) {
    x = (x + (1 << 15)) >> 16;
    return static_cast<std::uint8_t>(x < 0 ? 0 : (x > 255 ? 255 : x));
  };
  for (std::size_t i = 0; i < n; ++i) {
    const std::int32_t l = cy * (y[i] - oy), cu = u[i] - 128, cv = v[i] - 128;
    r[i] = clip(l + crv * cv);
    g[i] = clip(l - cgu * cu - cgv * cv);
    b[i] = clip(l + cbu * cu);
  }
}

void yuv_to_rgb_default(const std::uint8_t* const yuv[3], std::size_t n, const YuvMatrix& m,
                        std::uint8_t* const rgb[3]) {
  yuv_to_rgb_impl(yuv, n, m, rgb);
}

#if defined(__x86_64__)
// Eight pixels a step in 32-bit lanes (the compiler does not vectorize the loop above: its
// clamps through a lambda and three output streams), the rest as above.
__attribute__((target("avx2"))) void yuv_to_rgb_avx2(const std::uint8_t* const yuv[3],
                                                     std::size_t n, const YuvMatrix& m,
                                                     std::uint8_t* const rgb[3]) {
  const std::uint8_t *y = yuv[0], *u = yuv[1], *v = yuv[2];
  const __m256i cy = _mm256_set1_epi32(m.cy), oy = _mm256_set1_epi32(m.oy);
  const __m256i crv = _mm256_set1_epi32(m.crv), cbu = _mm256_set1_epi32(m.cbu);
  const __m256i cgu = _mm256_set1_epi32(m.cgu), cgv = _mm256_set1_epi32(m.cgv);
  const __m256i mid = _mm256_set1_epi32(128), half = _mm256_set1_epi32(1 << 15);
  std::size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256i py =
        _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(y + i)));
    const __m256i pu =
        _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(u + i)));
    const __m256i pv =
        _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(v + i)));
    const __m256i l = _mm256_add_epi32(_mm256_mullo_epi32(_mm256_sub_epi32(py, oy), cy), half);
    const __m256i cu = _mm256_sub_epi32(pu, mid), cv = _mm256_sub_epi32(pv, mid);
    const __m256i out[3] = {_mm256_add_epi32(l, _mm256_mullo_epi32(cv, crv)),
                            _mm256_sub_epi32(_mm256_sub_epi32(l, _mm256_mullo_epi32(cu, cgu)),
                                             _mm256_mullo_epi32(cv, cgv)),
                            _mm256_add_epi32(l, _mm256_mullo_epi32(cu, cbu))};
    for (int c = 0; c < 3; ++c) {
      const __m256i x = _mm256_srai_epi32(out[c], 16);
      const __m128i s16 =
          _mm_packs_epi32(_mm256_castsi256_si128(x), _mm256_extracti128_si256(x, 1));
      _mm_storel_epi64(reinterpret_cast<__m128i*>(rgb[c] + i), _mm_packus_epi16(s16, s16));
    }
  }
  const std::uint8_t* const rest_in[3] = {y + i, u + i, v + i};
  std::uint8_t* const rest_out[3] = {rgb[0] + i, rgb[1] + i, rgb[2] + i};
  yuv_to_rgb_impl(rest_in, n - i, m, rest_out);
}
#endif

struct Kernels {
  void (*row)(const std::uint8_t*, const AxisCoeffs&, std::uint8_t*) = resample_row_scalar;
  void (*columns)(const std::uint8_t*, std::size_t, const AxisCoeffs&, const OutputArgs&,
                  std::int32_t*, std::uint8_t*) = columns_default;
  std::size_t (*plane_row)(const std::uint8_t*, int, const AxisCoeffs&, const std::int16_t*,
                           std::uint8_t*) = nullptr;
  void (*plane_columns)(const std::uint8_t*, std::size_t, const AxisCoeffs&, std::size_t,
                        std::uint8_t*, std::size_t, std::int32_t*) = plane_columns_default;
  void (*yuv_to_rgb)(const std::uint8_t* const[3], std::size_t, const YuvMatrix&,
                     std::uint8_t* const[3]) = yuv_to_rgb_default;
  Kernels() {
#if defined(__x86_64__)
    if (__builtin_cpu_supports("sse4.1")) row = resample_row_sse41;
    if (__builtin_cpu_supports("avx2")) row = resample_row_avx2;
    if (__builtin_cpu_supports("avx2")) columns = columns_avx2;
    if (__builtin_cpu_supports("avx2")) plane_row = plane_row_avx2;
    if (__builtin_cpu_supports("avx2")) plane_columns = plane_columns_avx2;
    if (__builtin_cpu_supports("avx2")) yuv_to_rgb = yuv_to_rgb_avx2;
#endif
  }
};

const Kernels& kernels() {
  static const Kernels k;
  return k;
}

}  // namespace

std::size_t row_padding(const AxisCoeffs& cx) { return static_cast<std::size_t>(cx.taps) * 3 + 16; }

void resample_row(const std::uint8_t* in, const AxisCoeffs& cx, std::uint8_t* out) {
  kernels().row(in, cx, out);
}

void resample_row_reference(const std::uint8_t* in, const AxisCoeffs& cx, std::uint8_t* out) {
  resample_row_scalar(in, cx, out);
}

void resample_columns(const std::uint8_t* rows, std::size_t row_stride, const AxisCoeffs& cy,
                      const OutputArgs& args, std::span<std::int32_t> acc,
                      std::span<std::uint8_t> line) {
  kernels().columns(rows, row_stride, cy, args, acc.data(), line.data());
}

int plane_taps(double in0, double in1, int out_size) {
  return (bilinear_taps(in0, in1, out_size) + 7) / 8 * 8;
}

void plane_weights(const AxisCoeffs& cx, std::span<std::int16_t> w16) {
  constexpr int kShift = kPrecisionBits - kPlaneBits;
  for (std::size_t i = 0; i < w16.size(); ++i) {
    w16[i] = static_cast<std::int16_t>((cx.weights[i] + (1 << (kShift - 1))) >> kShift);
  }
}

void resample_plane_row(const std::uint8_t* in, int avail, const AxisCoeffs& cx,
                        std::span<const std::int16_t> w16, std::uint8_t* out) {
  const auto simd = kernels().plane_row;
  const std::size_t done = simd != nullptr ? simd(in, avail, cx, w16.data(), out) : 0;
  plane_row_scalar(in, cx, w16.data(), done, out);
}

void resample_plane_row_reference(const std::uint8_t* in, const AxisCoeffs& cx,
                                  std::span<const std::int16_t> w16, std::uint8_t* out) {
  plane_row_scalar(in, cx, w16.data(), 0, out);
}

void yuv_to_rgb(const std::uint8_t* const yuv[3], std::size_t n, const YuvMatrix& m,
                std::uint8_t* const rgb[3]) {
  kernels().yuv_to_rgb(yuv, n, m, rgb);
}

void resample_plane_columns(const std::uint8_t* rows, std::size_t row_stride, const AxisCoeffs& cy,
                            std::size_t width, std::uint8_t* out, std::size_t out_stride,
                            std::span<std::int32_t> acc) {
  kernels().plane_columns(rows, row_stride, cy, width, out, out_stride, acc.data());
}

void write_pixels(const std::uint8_t* hwc, std::size_t row_stride, const OutputArgs& args) {
  const auto width = static_cast<std::size_t>(args.width);
  std::vector<std::uint8_t> line(width * 4);  // RGBx, as the resampling passes leave a row
  for (std::size_t y = 0; y < static_cast<std::size_t>(args.height); ++y) {
    const std::uint8_t* in = hwc + y * row_stride;
    for (std::size_t x = 0; x < width; ++x) std::memcpy(&line[x * 4], in + x * 3, 3);
    store_row(line.data(), y, args);
  }
}

void normalize_args(const std::array<float, 3>& mean, const std::array<float, 3>& std,
                    OutputArgs& args) {
  for (std::size_t c = 0; c < 3; ++c) {
    args.scale[c] = static_cast<float>(1.0 / (255.0 * std[c]));
    args.bias[c] = static_cast<float>(-static_cast<double>(mean[c]) / std[c]);
  }
}

}  // namespace stoker::image
