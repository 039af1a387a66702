// The image kernels, the crop rules and decode_image (JPEG, PNG, bad input).
#include "stoker/image.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>

#include "image/geometry.h"
#include "image/jpeg.h"
#include "image/resample.h"
#include "image_fixtures.h"

namespace stoker {
namespace {

using testing::make_jpeg;

std::vector<std::uint8_t> run(const std::vector<std::byte>& data, const ImageTransform& t,
                              std::uint64_t seed = 0, const CropBox* crop = nullptr,
                              std::uint64_t max_pixels = kDefaultMaxPixels) {
  std::vector<std::uint8_t> out(t.output_bytes());
  decode_image(data, "test.jpg", t, seed, std::as_writable_bytes(std::span(out)), crop, max_pixels);
  return out;
}

ImageTransform u8_hwc(ImageTransform t) {
  t.dtype = DType::u8;
  t.layout = ImageLayout::hwc;
  return t;
}

std::string error_of(const std::vector<std::byte>& data, const ImageTransform& t,
                     std::uint64_t max_pixels = kDefaultMaxPixels) {
  try {
    run(data, t, 0, nullptr, max_pixels);
  } catch (const std::runtime_error& e) {
    return e.what();
  }
  return "";
}

// ---------------------------------------------------------------- kernels

TEST(Resample, WeightsOfEachOutputSumToOne) {
  for (auto [in, out] : {std::pair{500, 224}, {224, 224}, {100, 224}, {3000, 224}, {37, 5}}) {
    const int taps = image::bilinear_taps(0, in, out);
    std::vector<std::int32_t> start(out), count(out), weights(out * taps);
    image::AxisCoeffs c{taps, start, count, weights};
    image::bilinear_axis(in, 0, in, out, 0, c);
    EXPECT_EQ(c.first, 0);
    EXPECT_EQ(c.last, in);
    for (int o = 0; o < out; ++o) {
      const auto sum =
          std::accumulate(weights.begin() + o * taps, weights.begin() + (o + 1) * taps, 0LL);
      // Rounding each weight to fixed point leaves the sum within a few units of one.
      EXPECT_NEAR(static_cast<double>(sum), 1 << image::kPrecisionBits, taps) << in << "->" << out;
      EXPECT_GE(start[o], 0);
      EXPECT_LE(start[o] + count[o], in);
    }
  }
}

TEST(Resample, SameSizeIsTheIdentityAndAWindowIsACrop) {
  const int n = 40;
  auto px = testing::pattern(n, n, 3);
  const int taps = image::bilinear_taps(0, n, n);
  std::vector<std::int32_t> start(n), count(n), weights(n * taps);
  image::AxisCoeffs c{taps, start, count, weights};
  image::bilinear_axis(n, 0, n, n, 0, c);
  px.resize(px.size() + 64);  // resample_row may read past the last pixel (row_padding)
  std::vector<std::uint8_t> row(n * 4);
  image::resample_row(px.data(), c, row.data());
  for (int x = 0; x < n; ++x) {  // RGBx out
    for (int ch = 0; ch < 3; ++ch) ASSERT_EQ(row[x * 4 + ch], px[x * 3 + ch]);
    ASSERT_EQ(row[x * 4 + 3], 0);
  }

  // A window of 10 outputs from 5 on reads exactly inputs 5..14 (Pillow's support also takes
  // in input 15, with weight zero; zero-weight taps are dropped).
  std::vector<std::int32_t> ws(10), wc(10), ww(10 * taps);
  image::AxisCoeffs w{taps, ws, wc, ww};
  image::bilinear_axis(n, 0, n, n, 5, w);
  EXPECT_EQ(w.first, 5);
  EXPECT_EQ(w.last, 15);
  image::resample_row(px.data() + 5 * 3, w, row.data());
  for (int x = 0; x < 10; ++x) {
    for (int ch = 0; ch < 3; ++ch) ASSERT_EQ(row[x * 4 + ch], px[(5 + x) * 3 + ch]);
  }
}

TEST(Resample, SimdRowPassEqualsTheScalarReference) {
  for (auto [in, out] : {std::pair{500, 224}, {224, 224}, {100, 224}, {1800, 224}, {301, 97}}) {
    auto px = testing::pattern(in, 1, 3, static_cast<std::uint32_t>(in));
    const int taps = image::bilinear_taps(0, in, out);
    std::vector<std::int32_t> start(out), count(out), weights(out * taps);
    image::AxisCoeffs c{taps, start, count, weights};
    image::bilinear_axis(in, 0, in, out, 0, c);
    px.resize(px.size() + image::row_padding(c));
    std::vector<std::uint8_t> a(out * 4), b(out * 4);
    image::resample_row(px.data(), c, a.data());
    image::resample_row_reference(px.data(), c, b.data());
    EXPECT_EQ(a, b) << in << "->" << out;
  }
}

TEST(Resample, SimdPlaneRowEqualsTheScalarReferenceAndReadsNothingPastTheRow) {
  // Downscales of 1x to 6x (taps 8 and 16), an upscale, boxes with fractional edges (a chroma
  // plane's), each row's pixels from the box's first one with nothing readable past the row.
  struct Case {
    int in;
    double in0, in1;
    int out;
  };
  for (auto [in, in0, in1, out] : {Case{640, 0, 640, 224},
                                   {320, 0.25, 320.25, 224},
                                   {1280, 0, 1280, 224},
                                   {224, 0, 224, 224},
                                   {100, 0, 100, 224},
                                   {1800, 0, 1800, 224},
                                   {301, 10, 290, 97},
                                   {37, 0, 37, 9}}) {
    const int taps = image::plane_taps(in0, in1, out);
    ASSERT_EQ(taps % 8, 0);
    std::vector<std::int32_t> start(out), count(out), weights(out * taps);
    image::AxisCoeffs c{taps, start, count, weights};
    image::bilinear_axis(in, in0, in1, out, 0, c);
    std::vector<std::int16_t> w16(weights.size());
    image::plane_weights(c, w16);
    const auto px = testing::pattern(in, 1, 1, static_cast<std::uint32_t>(in));
    const auto avail = static_cast<std::size_t>(in - c.first);
    // An exact-size copy from the box's first pixel: ASan reports any read past it.
    const std::vector<std::uint8_t> row(px.begin() + c.first, px.begin() + c.first + avail);
    std::vector<std::uint8_t> a(out), b(out);
    image::resample_plane_row(row.data(), static_cast<int>(avail), c, w16, a.data());
    image::resample_plane_row_reference(row.data(), c, w16, b.data());
    EXPECT_EQ(a, b) << in << "->" << out;
  }
}

TEST(Resample, PlanePassesStayWithinALevelOfTheRgbPassesOnAGrayImage) {
  // A gray image through the RGB passes (Pillow's) and through the one-channel passes in the
  // same order: the 16-bit horizontal weights move no value by more than one level.
  const int in_w = 150, in_h = 90, out_w = 64, out_h = 40;
  const auto gray = testing::pattern(in_w, in_h, 1, 7);
  std::vector<std::uint8_t> rgb(gray.size() * 3 + 256);
  for (std::size_t i = 0; i < gray.size(); ++i) std::memset(&rgb[i * 3], gray[i], 3);
  auto axis = [](int in, int out, int taps, std::vector<std::int32_t>& s,
                 std::vector<std::int32_t>& n, std::vector<std::int32_t>& w) {
    s.resize(out), n.resize(out), w.resize(static_cast<std::size_t>(out) * taps);
    image::AxisCoeffs c{taps, s, n, w};
    image::bilinear_axis(in, 0, in, out, 0, c);
    return c;
  };
  std::vector<std::int32_t> xs, xn, xw, ps, pn, pw, ys, yn, yw;
  const auto cx = axis(in_w, out_w, image::bilinear_taps(0, in_w, out_w), xs, xn, xw);
  const auto px = axis(in_w, out_w, image::plane_taps(0, in_w, out_w), ps, pn, pw);
  const auto cy = axis(in_h, out_h, image::bilinear_taps(0, in_h, out_h), ys, yn, yw);
  std::vector<std::int16_t> w16(pw.size());
  image::plane_weights(px, w16);

  std::vector<std::uint8_t> rows(static_cast<std::size_t>(in_h) * out_w * 4);
  for (int y = 0; y < in_h; ++y) {
    image::resample_row(&rgb[static_cast<std::size_t>(y) * in_w * 3], cx, &rows[y * out_w * 4]);
  }
  std::vector<std::uint8_t> want(static_cast<std::size_t>(3) * out_w * out_h), line(out_w * 4);
  std::vector<std::int32_t> acc(out_w * 4);
  image::OutputArgs args;
  args.out = std::as_writable_bytes(std::span(want));
  args.width = out_w;
  args.height = out_h;
  image::resample_columns(rows.data(), out_w * 4, cy, args, acc, line);

  std::vector<std::uint8_t> prow(static_cast<std::size_t>(in_h) * out_w);
  for (int y = 0; y < in_h; ++y) {
    image::resample_plane_row(&gray[static_cast<std::size_t>(y) * in_w], in_w, px, w16,
                              &prow[y * out_w]);
  }
  std::vector<std::uint8_t> got(static_cast<std::size_t>(out_w) * out_h);
  image::resample_plane_columns(prow.data(), out_w, cy, out_w, got.data(), out_w, acc);
  int most = 0;
  for (std::size_t c = 0; c < 3; ++c) {
    for (std::size_t i = 0; i < got.size(); ++i) {
      most = std::max(most, std::abs(got[i] - want[c * got.size() + i]));
    }
  }
  EXPECT_LE(most, 1);
}

TEST(Resample, YuvToRgbRoundsLibswscalesMatrixToTheNearestLevel) {
  // BT.601, limited range, as libswscale's table gives it (crv 104597, cbu 132201, cgu 25675,
  // cgv 53279) with cy = 255/219: black, white, grays and saturated colours against the
  // formula in doubles.
  image::YuvMatrix m;
  m.cy = (1 << 16) * 255 / 219, m.oy = 16;
  m.crv = 104597, m.cbu = 132201, m.cgu = 25675, m.cgv = 53279;
  std::vector<std::uint8_t> y, u, v;
  for (int a = 0; a < 256; a += 5) {
    for (int b = 0; b < 256; b += 17) {
      y.push_back(static_cast<std::uint8_t>(a));
      u.push_back(static_cast<std::uint8_t>(b));
      v.push_back(static_cast<std::uint8_t>(255 - b));
    }
  }
  const std::size_t n = y.size();
  std::vector<std::uint8_t> r(n), g(n), bl(n);
  const std::uint8_t* const in[3] = {y.data(), u.data(), v.data()};
  std::uint8_t* const out[3] = {r.data(), g.data(), bl.data()};
  image::yuv_to_rgb(in, n, m, out);
  auto level = [](double x) { return std::clamp(std::round(x), 0.0, 255.0); };
  for (std::size_t i = 0; i < n; ++i) {
    const double l = 255.0 / 219 * (y[i] - 16), cu = u[i] - 128.0, cv = v[i] - 128.0;
    EXPECT_NEAR(r[i], level(l + 104597 / 65536.0 * cv), 1) << i;
    EXPECT_NEAR(g[i], level(l - 25675 / 65536.0 * cu - 53279 / 65536.0 * cv), 1) << i;
    EXPECT_NEAR(bl[i], level(l + 132201 / 65536.0 * cu), 1) << i;
  }
  const std::uint8_t black[3] = {16, 128, 128}, white[3] = {235, 128, 128};
  std::uint8_t px[3];
  std::uint8_t* const one[3] = {&px[0], &px[1], &px[2]};
  const std::uint8_t* const k[3] = {&black[0], &black[1], &black[2]};
  image::yuv_to_rgb(k, 1, m, one);
  EXPECT_EQ(px[0] + px[1] + px[2], 0);
  const std::uint8_t* const w[3] = {&white[0], &white[1], &white[2]};
  image::yuv_to_rgb(w, 1, m, one);
  EXPECT_EQ(px[0] + px[1] + px[2], 3 * 255);
}

TEST(Resample, ColumnsPassWritesFlippedNormalizedLayouts) {
  // 2x2 output from 2 rows: the vertical pass is the identity, so the output is the rows in
  // the requested layout. Rows are RGBx: pixel 0 of row 0 is (10, 20, 30), pixel 1 is
  // (40, 50, 60); row 1 has (70, 80, 90) and (100, 110, 120).
  const int n = 2;
  std::vector<std::uint8_t> rows = {10, 20, 30, 0, 40, 50, 60, 0, 70, 80, 90, 0, 100, 110, 120, 0};
  const int taps = image::bilinear_taps(0, n, n);
  std::vector<std::int32_t> start(n), count(n), weights(n * taps);
  image::AxisCoeffs c{taps, start, count, weights};
  image::bilinear_axis(n, 0, n, n, 0, c);
  std::vector<std::int32_t> acc(8);
  std::vector<std::uint8_t> line(8);

  std::vector<std::uint8_t> chw(12);
  image::OutputArgs a;
  a.out = std::as_writable_bytes(std::span(chw));
  a.width = a.height = 2;
  image::resample_columns(rows.data(), 8, c, a, acc, line);
  EXPECT_EQ(chw, (std::vector<std::uint8_t>{10, 40, 70, 100, 20, 50, 80, 110, 30, 60, 90, 120}));

  std::vector<std::uint8_t> hwc(12);
  a.out = std::as_writable_bytes(std::span(hwc));
  a.layout = ImageLayout::hwc;
  a.flip = true;
  image::resample_columns(rows.data(), 8, c, a, acc, line);
  EXPECT_EQ(hwc, (std::vector<std::uint8_t>{40, 50, 60, 10, 20, 30, 100, 110, 120, 70, 80, 90}));

  const std::array<float, 3> mean{0.5f, 0.25f, 0.0f}, std{0.5f, 0.25f, 2.0f};
  std::vector<float> f(12);
  a.out = std::as_writable_bytes(std::span(f));
  a.dtype = DType::f32;
  a.layout = ImageLayout::chw;
  a.flip = false;
  image::normalize_args(mean, std, a);
  image::resample_columns(rows.data(), 8, c, a, acc, line);
  EXPECT_NEAR(f[0], (10 / 255.0f - 0.5f) / 0.5f, 1e-6);
  EXPECT_NEAR(f[4], (20 / 255.0f - 0.25f) / 0.25f, 1e-6);
  EXPECT_NEAR(f[11], (120 / 255.0f - 0.0f) / 2.0f, 1e-6);
  EXPECT_NEAR(f[3], (100 / 255.0f - 0.5f) / 0.5f, 1e-6);
}

TEST(Resample, WritePixelsConvertsWithoutResampling) {
  // The same 2x2 image as above, u8 HWC rows of 8 bytes (6 of pixels, 2 of padding): what
  // resample_columns writes, write_pixels writes from plain pixels.
  const std::vector<std::uint8_t> hwc_in = {10, 20, 30, 40,  50,  60,  0, 0,
                                            70, 80, 90, 100, 110, 120, 0, 0};
  std::vector<std::uint8_t> chw(12);
  image::OutputArgs a;
  a.out = std::as_writable_bytes(std::span(chw));
  a.width = a.height = 2;
  image::write_pixels(hwc_in.data(), 8, a);
  EXPECT_EQ(chw, (std::vector<std::uint8_t>{10, 40, 70, 100, 20, 50, 80, 110, 30, 60, 90, 120}));

  std::vector<std::uint8_t> hwc(12);
  a.out = std::as_writable_bytes(std::span(hwc));
  a.layout = ImageLayout::hwc;
  a.flip = true;
  image::write_pixels(hwc_in.data(), 8, a);
  EXPECT_EQ(hwc, (std::vector<std::uint8_t>{40, 50, 60, 10, 20, 30, 100, 110, 120, 70, 80, 90}));

  std::vector<float> f(12);
  a.out = std::as_writable_bytes(std::span(f));
  a.dtype = DType::f32;
  a.layout = ImageLayout::chw;
  a.flip = false;
  image::normalize_args({0.5f, 0.25f, 0.0f}, {0.5f, 0.25f, 2.0f}, a);
  image::write_pixels(hwc_in.data(), 8, a);
  EXPECT_NEAR(f[0], (10 / 255.0f - 0.5f) / 0.5f, 1e-6);
  EXPECT_NEAR(f[4], (20 / 255.0f - 0.25f) / 0.25f, 1e-6);
  EXPECT_NEAR(f[11], (120 / 255.0f - 0.0f) / 2.0f, 1e-6);
  EXPECT_NEAR(f[3], (100 / 255.0f - 0.5f) / 0.5f, 1e-6);
}

// ---------------------------------------------------------------- crop rules

TEST(RandomResizedCrop, DrawIsAPureFunctionOfTheSeedAndInBounds) {
  const auto t = ImageTransform::train();
  int flips = 0;
  for (std::uint64_t seed = 0; seed < 2000; ++seed) {
    const auto d = draw_random_crop(t, 400, 300, seed);
    EXPECT_EQ(d.box, draw_random_crop(t, 400, 300, seed).box);
    ASSERT_GT(d.box.width, 0);
    ASSERT_GT(d.box.height, 0);
    ASSERT_LE(d.box.x + d.box.width, 400);
    ASSERT_LE(d.box.y + d.box.height, 300);
    const double area = static_cast<double>(d.box.width) * d.box.height / (400.0 * 300.0);
    const double ratio = static_cast<double>(d.box.width) / d.box.height;
    // Rounding a side to whole pixels moves area and ratio a little past the ranges.
    EXPECT_GE(area, 0.08 * 0.98);
    EXPECT_LE(area, 1.0);
    EXPECT_GE(ratio, 0.75 * 0.97);
    EXPECT_LE(ratio, 4.0 / 3.0 * 1.03);
    flips += d.flip;
  }
  EXPECT_GT(flips, 850);  // p = 0.5 over 2000 draws
  EXPECT_LT(flips, 1150);
}

TEST(RandomResizedCrop, FallsBackToTheCenterCropClampedToTheRatio) {
  // A 1000x10 strip: no crop with ratio <= 4/3 and area >= 8% fits, so every try fails.
  auto t = ImageTransform::train();
  const auto d = draw_random_crop(t, 1000, 10, 7);
  EXPECT_EQ(d.box.height, 10);
  EXPECT_EQ(d.box.width, 13);  // round(10 * 4/3)
  EXPECT_EQ(d.box.x, (1000 - 13) / 2);
  EXPECT_EQ(d.box.y, 0);
}

TEST(ResizeCenterCrop, GeometryFollowsTorchvision) {
  const auto t = ImageTransform::val();
  auto g = image::plan_geometry(t, 500, 375, 0, nullptr);
  EXPECT_EQ(g.out_width, 341);  // int(256 * 500 / 375)
  EXPECT_EQ(g.out_height, 256);
  EXPECT_EQ(g.window_x, 58);  // round((341 - 224) / 2) = round(58.5), halves to even
  EXPECT_EQ(g.window_y, 16);
  g = image::plan_geometry(t, 300, 451, 0, nullptr);
  EXPECT_EQ(g.out_width, 256);
  EXPECT_EQ(g.out_height, 384);  // int(256 * 451 / 300) = int(384.85)
  EXPECT_EQ(image::dct_denominator(g, false), 1);
  // The decoded image stays at least kDctGap (3) times the resized one: 1100 / 256 = 4.3, so
  // no scaling (1/2 would leave 550 rows, 2.1 times 256).
  static_assert(ImageTransform::kDctGap == 3);
  g = image::plan_geometry(t, 2000, 1100, 0, nullptr);
  EXPECT_EQ(image::dct_denominator(g, false), 1);
  g = image::plan_geometry(t, 4000, 1600, 0, nullptr);
  EXPECT_EQ(image::dct_denominator(g, false), 2);  // 1600 / 2 = 800 rows >= 3 * 256
  EXPECT_EQ(image::dct_denominator(g, true), 1);
  g = image::plan_geometry(t, 12000, 6200, 0, nullptr);
  EXPECT_EQ(image::dct_denominator(g, false), 8);  // 6200 / 8 = 775 rows >= 3 * 256
  EXPECT_EQ(image::dct_denominator(g, true), 1);
  g = image::plan_geometry(t, 12000, 6100, 0, nullptr);
  EXPECT_EQ(image::dct_denominator(g, false), 4);  // 6100 / 8 = 762 rows < 3 * 256
}

TEST(TransformSpec, ParsesOverTheTrainDefaultsAndRoundTrips) {
  EXPECT_EQ(ImageTransform::parse(""), ImageTransform::train(224));
  const auto t = ImageTransform::parse(
      " crop=resize_center\tresize=300 size=256 flip=0 dtype=u8 layout=hwc exact=1\n "
      "mean=0.5,0.25,0 ");
  auto expected = ImageTransform::val(300, 256);
  expected.dtype = DType::u8;
  expected.layout = ImageLayout::hwc;
  expected.exact = true;
  expected.mean = {0.5f, 0.25f, 0.0f};
  EXPECT_EQ(t, expected);
  EXPECT_EQ(ImageTransform::parse(t.spec()), t);
  auto odd = ImageTransform::train(97);
  odd.scale = {0.1 + 1e-12, 0.3};
  odd.ratio = {1.0 / 3.0, 2.75};
  odd.std = {0.1f, 1e-7f, 3.5f};
  EXPECT_EQ(ImageTransform::parse(odd.spec()), odd);  // numbers printed exactly
}

TEST(TransformSpec, BadTextIsRefusedNamingTheKey) {
  auto error = [](const char* spec) -> std::string {
    try {
      ImageTransform::parse(spec);
    } catch (const std::invalid_argument& e) {
      return e.what();
    }
    return "";
  };
  EXPECT_NE(error("size=12x").find("size: '12x' is not a number"), std::string::npos);
  EXPECT_NE(error("size=").find("is not a number"), std::string::npos);
  EXPECT_NE(error("colour=red").find("unknown key 'colour'"), std::string::npos);
  EXPECT_NE(error("size=3 size=4").find("'size' given twice"), std::string::npos);
  EXPECT_NE(error("scale=0.5").find("scale takes 2 comma-separated numbers"), std::string::npos);
  EXPECT_NE(error("mean=1,2,3,4").find("mean takes 3"), std::string::npos);
  EXPECT_NE(error("flip=yes").find("flip: 'yes'"), std::string::npos);
  EXPECT_NE(error("crop").find("is not key=value"), std::string::npos);
  EXPECT_NE(error("size=99999999999").find("not a number"), std::string::npos);  // past int
  // Values that parse but would overflow the crop arithmetic are refused by validate().
  EXPECT_NE(error("ratio=1,1e300").find("ratio"), std::string::npos);
  EXPECT_NE(error("ratio=1e-300,1").find("ratio"), std::string::npos);
  EXPECT_NE(error("mean=nan,0,0").find("mean must be finite"), std::string::npos);
  EXPECT_NE(error("std=inf,1,1").find("std must be finite"), std::string::npos);
  EXPECT_NE(error("scale=nan,1").find("scale"), std::string::npos);
  EXPECT_NE(error("size=0").find("size must be in"), std::string::npos);
}

TEST(ResizeCenterCrop, AThinImageResizedPastAnyIntIsRefused) {
  const auto t = ImageTransform::val(256, 224);
  EXPECT_THROW(image::plan_geometry(t, 60000, 1, 0, nullptr), std::runtime_error);
  EXPECT_NO_THROW(image::plan_geometry(t, 4000, 1, 0, nullptr));
}

// ---------------------------------------------------------------- decoding

TEST(DecodeImage, RegionDecodeEqualsFullDecodeThenCrop) {
  // 4:4:4 chroma, so the cropped columns' colors do not depend on their neighbours; the crop
  // is the output size, so the resize is the identity.
  const auto jpeg = make_jpeg(480, 360, 3, 5, /*subsample=*/false);
  int w = 0, h = 0;
  const auto full = testing::decode_jpeg_full(jpeg, w, h);
  auto t = u8_hwc(ImageTransform::train(224));
  for (CropBox box : {CropBox{0, 0, 224, 224}, CropBox{100, 70, 224, 224},
                      CropBox{256, 136, 224, 224}, CropBox{13, 101, 224, 224}}) {
    const auto out = run(jpeg, t, 0, &box);
    for (int y = 0; y < 224; ++y) {
      ASSERT_EQ(std::memcmp(out.data() + y * 224 * 3, full.data() + ((box.y + y) * w + box.x) * 3,
                            224 * 3),
                0)
          << "box " << box.x << "," << box.y << " row " << y;
    }
  }
}

double mean_abs_diff(const std::vector<std::uint8_t>& a, const std::vector<std::uint8_t>& b) {
  double s = 0;
  for (std::size_t i = 0; i < a.size(); ++i) s += std::abs(int(a[i]) - int(b[i]));
  return s / static_cast<double>(a.size());
}

TEST(DecodeImage, DctScalingStaysCloseToTheFullResolutionResize) {
  // Crop of 1200x960 to 224: decoded at 1/4 scale, then resized. Reference: the same resize
  // from a PNG of the decoded image (no DCT scaling there).
  const auto jpeg = make_jpeg(1280, 1024, 3, 9);
  int w = 0, h = 0;
  const auto full = testing::decode_jpeg_full(jpeg, w, h);
  const auto png = testing::encode_png(full, w, h, 3);
  const auto t = u8_hwc(ImageTransform::train(224));
  const CropBox box{40, 30, 1200, 960};
  EXPECT_LT(mean_abs_diff(run(jpeg, t, 0, &box), run(png, t, 0, &box)), 2.0);
  const auto v = u8_hwc(ImageTransform::val());
  EXPECT_LT(mean_abs_diff(run(jpeg, v), run(png, v)), 2.0);
}

TEST(DecodeImage, GrayAndCmykBecomeRgb) {
  const int w = 64, h = 48;
  const auto t = u8_hwc(ImageTransform::val(64, 48));
  const auto gray = run(make_jpeg(w, h, 1), t);
  for (std::size_t i = 0; i < gray.size(); i += 3) {
    ASSERT_EQ(gray[i], gray[i + 1]);
    ASSERT_EQ(gray[i], gray[i + 2]);
  }
  // libjpeg writes CMYK (as YCCK) with an Adobe marker, and Adobe CMYK is stored inverted, so
  // decoders (Pillow's "CMYK;I", ours) invert it back: stored 255/0/0/255 is c=0, m=255,
  // y=255, k=0, which is red.
  std::vector<std::uint8_t> cmyk(w * h * 4);
  for (std::size_t i = 0; i < cmyk.size(); i += 4) {
    cmyk[i] = 255;
    cmyk[i + 1] = 0;
    cmyk[i + 2] = 0;
    cmyk[i + 3] = 255;
  }
  const auto red = run(detail::encode_jpeg(cmyk, w, h, 4), t);
  for (std::size_t i = 0; i < red.size(); i += 3) {
    ASSERT_GE(red[i], 250) << i;
    ASSERT_LE(red[i + 1], 5) << i;
    ASSERT_LE(red[i + 2], 5) << i;
  }
}

TEST(DecodeImage, PngWithAlphaAndGrayDecode) {
  const int w = 90, h = 70;
  auto rgba = testing::pattern(w, h, 4);
  const auto t = u8_hwc(ImageTransform::val(90, 70));
  const auto out = run(testing::encode_png(rgba, w, h, 4), t);
  // val(90, 70) on 90x70: Resize(90) of the shorter side 70 gives 115x90, crop 70... so just
  // check against the RGB-only PNG: alpha is dropped, not composited.
  std::vector<std::uint8_t> rgb(w * h * 3);
  for (int i = 0; i < w * h; ++i) std::memcpy(&rgb[i * 3], &rgba[i * 4], 3);
  EXPECT_EQ(out, run(testing::encode_png(rgb, w, h, 3), t));
  const auto gray = run(testing::encode_png(testing::pattern(w, h, 1), w, h, 1), t);
  for (std::size_t i = 0; i < gray.size(); i += 3) ASSERT_EQ(gray[i], gray[i + 2]);
}

TEST(DecodeImage, SameSeedSameOutputAndF32IsNormalizedU8) {
  const auto jpeg = make_jpeg(300, 260);
  auto t = ImageTransform::train();
  t.layout = ImageLayout::chw;
  auto u = t;
  u.dtype = DType::u8;
  for (std::uint64_t seed : {1u, 2u, 99u}) {
    const auto a = run(jpeg, u, seed);
    EXPECT_EQ(a, run(jpeg, u, seed));
    const auto f = run(jpeg, t, seed);
    const auto* fv = reinterpret_cast<const float*>(f.data());
    for (std::size_t i = 0; i < a.size(); i += 97) {
      const std::size_t c = i / (224 * 224);
      EXPECT_NEAR(fv[i], (a[i] / 255.0f - t.mean[c]) / t.std[c], 1e-5);
    }
  }
  EXPECT_NE(run(jpeg, u, 1), run(jpeg, u, 2));
}

// ---------------------------------------------------------------- bad input

TEST(DecodeImage, BadInputNamesTheFileAndTheReason) {
  const auto t = ImageTransform::val();
  const auto good = make_jpeg(320, 240);
  EXPECT_EQ(error_of({}, t), "test.jpg: empty file");
  std::vector<std::byte> text(100, std::byte{'a'});
  EXPECT_NE(error_of(text, t).find("test.jpg: not an image"), std::string::npos);
  std::vector<std::byte> gif = {std::byte{'G'}, std::byte{'I'}, std::byte{'F'},
                                std::byte{'8'}, std::byte{'9'}, std::byte{'a'}};
  EXPECT_NE(error_of(gif, t).find("unsupported image format GIF"), std::string::npos);

  auto truncated = good;
  truncated.resize(good.size() / 2);
  EXPECT_NE(error_of(truncated, t).find("test.jpg: truncated JPEG"), std::string::npos)
      << error_of(truncated, t);
  auto header_only = good;
  header_only.resize(200);
  EXPECT_NE(error_of(header_only, t).find("test.jpg: "), std::string::npos);

  // Garbage in place of the entropy-coded data: libjpeg warns (ignored) and, where a marker
  // is broken, fails; either way no crash. Breaking the SOS marker is always an error.
  auto corrupt = good;
  for (std::size_t i = 0; i + 1 < corrupt.size(); ++i) {
    if (corrupt[i] == std::byte{0xFF} && corrupt[i + 1] == std::byte{0xDA}) {
      corrupt[i + 1] = std::byte{0x02};
      break;
    }
  }
  EXPECT_NE(error_of(corrupt, t).find("test.jpg: "), std::string::npos);

  auto png = testing::encode_png(testing::pattern(50, 50, 3), 50, 50, 3);
  png.resize(png.size() - 30);
  EXPECT_NE(error_of(png, t).find("test.jpg: corrupt or truncated PNG"), std::string::npos)
      << error_of(png, t);
}

// Sets the height and width fields of a JPEG's SOF0 marker.
std::vector<std::byte> with_claimed_size(std::vector<std::byte> jpeg, int width, int height) {
  for (std::size_t i = 0; i + 9 < jpeg.size(); ++i) {
    if (jpeg[i] == std::byte{0xFF} && jpeg[i + 1] == std::byte{0xC0}) {
      jpeg[i + 5] = std::byte(height >> 8);
      jpeg[i + 6] = std::byte(height & 255);
      jpeg[i + 7] = std::byte(width >> 8);
      jpeg[i + 8] = std::byte(width & 255);
      return jpeg;
    }
  }
  throw std::runtime_error("no SOF0");
}

TEST(DecodeImage, AbsurdDimensionsAreRefusedBeforeAllocation) {
  const auto huge = with_claimed_size(make_jpeg(64, 64), 60000, 60000);
  const auto msg = error_of(huge, ImageTransform::train());
  EXPECT_NE(msg.find("test.jpg: image of 60000x60000 pixels is over the limit"), std::string::npos)
      << msg;
  const auto small = make_jpeg(64, 64);
  EXPECT_NE(error_of(small, ImageTransform::val(), 1000).find("over the limit of 1000"),
            std::string::npos);
  // PNG: a 50000x50000 header.
  auto png = testing::encode_png(testing::pattern(8, 8, 3), 8, 8, 3);
  EXPECT_NE(error_of(png, ImageTransform::val(), 63).find("image of 8x8 pixels is over"),
            std::string::npos);
}

TEST(DecodeImage, DecoderIsReusableAfterAnError) {
  const auto t = u8_hwc(ImageTransform::val());
  const auto good = make_jpeg(320, 240);
  const auto before = run(good, t);
  auto truncated = good;
  truncated.resize(good.size() / 3);
  EXPECT_THROW(run(truncated, t), std::runtime_error);
  EXPECT_EQ(run(good, t), before);
}

TEST(ImageCheaperReads, RecordShardsAreSuggestedOnlyForAFolderOfFiles) {
  const auto folder = image_cheaper_reads(true);
  ASSERT_FALSE(folder.empty());
  EXPECT_NE(folder[0].find("record shards"), std::string::npos);
  for (const auto& s : image_cheaper_reads(false)) {
    EXPECT_EQ(s.find("record shards"), std::string::npos) << s;
  }
  EXPECT_EQ(image_cheaper_reads(false).size() + 1, folder.size());
}

}  // namespace
}  // namespace stoker
