// decode_image and ImageDataset: the glue between an EncodedSource, the decoders and the
// resampling kernels. Per-thread scratch buffers make steady-state decoding allocation-free
// on our side (libjpeg still takes its per-image working memory from malloc).
#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "image/geometry.h"
#include "image/jpeg.h"
#include "image/png.h"
#include "image/resample.h"
#include "stoker/image.h"

namespace stoker {
namespace {

using image::AxisCoeffs;

// Buffers a thread reuses from one image to the next; they only grow.
struct Scratch {
  std::unique_ptr<image::JpegDecoder> jpeg;
  std::vector<std::int32_t> x_start, x_count, x_weights, y_start, y_count, y_weights;
  std::vector<std::uint8_t> rows;  // horizontally resampled rows
  std::vector<std::int32_t> acc;
  std::vector<std::uint8_t> line;
  std::vector<std::uint8_t> rgba;  // a whole decoded PNG
  std::vector<std::uint8_t> rgb;   // one PNG row without alpha
  EncodedBytes encoded;
};

Scratch& scratch() {
  thread_local Scratch s;
  return s;
}

template <class T>
std::span<T> sized(std::vector<T>& v, std::size_t n) {
  if (v.size() < n) v.resize(n);
  return {v.data(), n};
}

// Coefficients of one axis: the region [0, in_size) with the resize box [in0, in1) to
// out_size, for `window` outputs from window_begin.
AxisCoeffs axis(std::vector<std::int32_t>& start, std::vector<std::int32_t>& count,
                std::vector<std::int32_t>& weights, int in_size, double in0, double in1,
                int out_size, int window_begin, int window) {
  AxisCoeffs c;
  c.taps = image::bilinear_taps(in0, in1, out_size);
  c.start = sized(start, static_cast<std::size_t>(window));
  c.count = sized(count, static_cast<std::size_t>(window));
  c.weights = sized(weights, static_cast<std::size_t>(window) * static_cast<std::size_t>(c.taps));
  image::bilinear_axis(in_size, in0, in1, out_size, window_begin, c);
  return c;
}

// The span of a region [pos, pos + len) of an axis of `full` source pixels after scaling the
// image to `scaled` pixels: the whole pixels it touches, and the box inside them.
struct ScaledSpan {
  int begin = 0;
  int size = 0;
  double box0 = 0;
  double box1 = 0;
};
ScaledSpan scale_span(int pos, int len, int full, int scaled) {
  if (scaled == full) return {pos, len, 0.0, static_cast<double>(len)};
  const double s = static_cast<double>(scaled) / full;
  const double a = pos * s;
  const double b = (pos + len) * s;
  const int begin = static_cast<int>(std::floor(a));
  const int end = std::min(scaled, std::max(begin + 1, static_cast<int>(std::ceil(b))));
  return {begin, end - begin, a - begin, std::min(b, static_cast<double>(end)) - begin};
}

struct RowTarget {
  const AxisCoeffs* cx;
  std::uint8_t* rows;
  std::size_t stride;
};

void resample_into_rows(void* context, const std::uint8_t* rgb, int row) {
  const auto* t = static_cast<const RowTarget*>(context);
  image::resample_row(rgb, *t->cx, t->rows + static_cast<std::size_t>(row) * t->stride);
}

void check_pixels(int width, int height, std::uint64_t max_pixels) {
  if (width <= 0 || height <= 0) throw std::runtime_error("image has no pixels");
  const auto pixels = static_cast<std::uint64_t>(width) * static_cast<std::uint64_t>(height);
  if (pixels > max_pixels) {
    throw std::runtime_error("image of " + std::to_string(width) + "x" + std::to_string(height) +
                             " pixels is over the limit of " + std::to_string(max_pixels) +
                             " pixels");
  }
}

[[noreturn]] void throw_unknown_format(std::span<const std::byte> data) {
  if (data.empty()) throw std::runtime_error("empty file");
  auto starts = [&](std::string_view magic) {
    return data.size() >= magic.size() && std::memcmp(data.data(), magic.data(), magic.size()) == 0;
  };
  const char* format = nullptr;
  if (starts("GIF8")) format = "GIF";
  if (starts("BM")) format = "BMP";
  if (starts("II*") || starts("MM")) format = "TIFF";
  if (starts("RIFF") && data.size() >= 12 && std::memcmp(data.data() + 8, "WEBP", 4) == 0) {
    format = "WebP";
  }
  if (starts("P3") || starts("P6") || starts("P5") || starts("P2")) format = "PPM/PGM";
  if (format) {
    throw std::runtime_error(std::string("unsupported image format ") + format +
                             " (stoker decodes JPEG and PNG)");
  }
  throw std::runtime_error("not an image (no JPEG or PNG signature)");
}

// Decodes and transforms; errors carry the reason only (callers add the sample's name).
void decode_into(std::span<const std::byte> encoded, const ImageTransform& t, std::uint64_t seed,
                 std::span<std::byte> out, const CropBox* crop, std::uint64_t max_pixels) {
  if (out.size() != t.output_bytes()) {
    throw std::invalid_argument("output has " + std::to_string(out.size()) +
                                " bytes, the transform makes " + std::to_string(t.output_bytes()));
  }
  Scratch& s = scratch();
  const bool jpeg = image::is_jpeg(encoded);
  const bool png = !jpeg && image::is_png(encoded);
  if (!jpeg && !png) throw_unknown_format(encoded);

  int width = 0, height = 0;
  if (jpeg) {
    if (!s.jpeg) s.jpeg = std::make_unique<image::JpegDecoder>();
    const auto h = s.jpeg->read_header(encoded);
    width = h.width;
    height = h.height;
  } else {
    const auto h = image::png_size(encoded);
    width = h.width;
    height = h.height;
  }
  check_pixels(width, height, max_pixels);  // before anything image-sized is allocated

  // Buffers are reserved for the largest crop this image could get, not this one's: once
  // every image has been seen, no later crop makes them grow (steady state allocates nothing).
  const int max_taps = image::bilinear_taps(0, std::max(width, height), t.size);
  const std::size_t padding = static_cast<std::size_t>(max_taps) * 3 + 16;  // >= row_padding()
  const std::size_t stride = static_cast<std::size_t>(t.size) * 4;          // RGBx rows
  const auto window = static_cast<std::size_t>(t.size);
  s.rows.reserve(static_cast<std::size_t>(height) * stride);
  s.x_weights.reserve(window * static_cast<std::size_t>(max_taps));
  s.y_weights.reserve(window * static_cast<std::size_t>(max_taps));
  s.rgb.reserve(static_cast<std::size_t>(width) * 3 + padding);

  const image::Geometry g = image::plan_geometry(t, width, height, seed, crop);
  const int denom = jpeg ? image::dct_denominator(g, t.exact) : 1;
  int scaled_w = width, scaled_h = height;
  if (denom > 1) {
    const auto h = s.jpeg->scaled_size(denom);
    scaled_w = h.width;
    scaled_h = h.height;
  }
  const ScaledSpan sx = scale_span(g.region.x, g.region.width, width, scaled_w);
  const ScaledSpan sy = scale_span(g.region.y, g.region.height, height, scaled_h);
  const AxisCoeffs cx = axis(s.x_start, s.x_count, s.x_weights, sx.size, sx.box0, sx.box1,
                             g.out_width, g.window_x, t.size);
  const AxisCoeffs cy = axis(s.y_start, s.y_count, s.y_weights, sy.size, sy.box0, sy.box1,
                             g.out_height, g.window_y, t.size);

  const auto rows_needed = static_cast<std::size_t>(cy.last - cy.first);
  RowTarget target{&cx, sized(s.rows, rows_needed * stride).data(), stride};
  const int x0 = sx.begin + cx.first, x1 = sx.begin + cx.last;
  const int y0 = sy.begin + cy.first, y1 = sy.begin + cy.last;
  if (jpeg) {
    s.jpeg->decode(denom, x0, x1, y0, y1, padding, {&resample_into_rows, &target});
  } else {
    image::decode_png(encoded, max_pixels, s.rgba);
    auto rgb = sized(s.rgb, static_cast<std::size_t>(x1 - x0) * 3 + padding);
    for (int y = y0; y < y1; ++y) {
      const std::uint8_t* src =
          s.rgba.data() + (static_cast<std::size_t>(y) * width + static_cast<std::size_t>(x0)) * 4;
      for (int x = 0; x < x1 - x0; ++x)
        std::memcpy(&rgb[static_cast<std::size_t>(x) * 3], src + x * 4, 3);
      resample_into_rows(&target, rgb.data(), y - y0);
    }
  }

  image::OutputArgs args;
  args.out = out;
  args.dtype = t.dtype;
  args.layout = t.layout;
  args.flip = g.flip;
  args.width = args.height = t.size;
  if (t.dtype == DType::f32) image::normalize_args(t.mean, t.std, args);
  image::resample_columns(target.rows, stride, cy, args, sized(s.acc, stride),
                          sized(s.line, stride));
}

}  // namespace

ImageTransform ImageTransform::train(int size) {
  ImageTransform t;
  t.crop = Crop::random_resized;
  t.size = size;
  t.random_flip = true;
  return t;
}

ImageTransform ImageTransform::val(int resize, int size) {
  ImageTransform t;
  t.crop = Crop::resize_center;
  t.resize = resize;
  t.size = size;
  t.random_flip = false;
  return t;
}

std::vector<std::int64_t> ImageTransform::shape() const {
  if (layout == ImageLayout::chw) return {3, size, size};
  return {size, size, 3};
}

std::size_t ImageTransform::output_bytes() const {
  return static_cast<std::size_t>(size) * static_cast<std::size_t>(size) * 3 * dtype_size(dtype);
}

void ImageTransform::validate() const {
  auto bad = [](const std::string& what) {
    throw std::invalid_argument("stoker::ImageTransform: " + what);
  };
  if (size < 1 || size > 16384) bad("size must be in [1, 16384], is " + std::to_string(size));
  if (crop == Crop::resize_center && (resize < size || resize > 65535)) {
    bad("resize (" + std::to_string(resize) + ") must be at least size (" + std::to_string(size) +
        ")");
  }
  if (!(scale[0] > 0 && scale[0] <= scale[1] && scale[1] <= 1.0)) {
    bad("scale must satisfy 0 < scale[0] <= scale[1] <= 1");
  }
  // Finite bounds keep every crop side computed from them a representable int.
  if (!(ratio[0] > 0 && ratio[0] <= ratio[1] && ratio[1] < 1e9 && ratio[0] > 1e-9)) {
    bad("ratio must satisfy 1e-9 < ratio[0] <= ratio[1] < 1e9");
  }
  if (dtype != DType::u8 && dtype != DType::f32) bad("dtype must be uint8 or float32");
  for (float v : std) {
    if (!(v != 0.0f) || !std::isfinite(v)) bad("std must be finite and non-zero");
  }
  for (float v : mean) {
    if (!std::isfinite(v)) bad("mean must be finite");
  }
}

void decode_image(std::span<const std::byte> encoded, std::string_view name,
                  const ImageTransform& transform, std::uint64_t seed, std::span<std::byte> out,
                  const CropBox* crop, std::uint64_t max_pixels) {
  try {
    decode_into(encoded, transform, seed, out, crop, max_pixels);
  } catch (const std::exception& e) {
    throw std::runtime_error(std::string(name) + ": " + e.what());
  }
}

std::array<int, 2> image_size(std::span<const std::byte> encoded, std::string_view name) {
  try {
    if (image::is_jpeg(encoded)) {
      Scratch& s = scratch();
      if (!s.jpeg) s.jpeg = std::make_unique<image::JpegDecoder>();
      const auto h = s.jpeg->read_header(encoded);
      return {h.width, h.height};
    }
    if (image::is_png(encoded)) {
      const auto h = image::png_size(encoded);
      return {h.width, h.height};
    }
    throw_unknown_format(encoded);
  } catch (const std::exception& e) {
    throw std::runtime_error(std::string(name) + ": " + e.what());
  }
}

ImageDataset::ImageDataset(ImageDatasetOptions options) : options_(std::move(options)) {
  if (!options_.source) throw std::invalid_argument("stoker::ImageDataset: no source");
  options_.transform.validate();
}

std::size_t ImageDataset::size() const { return options_.source->size(); }

std::vector<FieldSpec> ImageDataset::fields() const {
  return {{"image", options_.transform.dtype, options_.transform.shape()},
          {"label", DType::i64, {}}};
}

std::string ImageDataset::sample_name(std::size_t index) const {
  return options_.source->name(index);
}

std::vector<std::string> image_cheaper_reads(bool small_files) {
  std::vector<std::string> out;
  if (small_files) out.emplace_back("record shards (stoker pack), if it reads many small files");
  out.insert(out.end(), {"a RAM cache of the encoded bytes", "uint8 output, normalised on the GPU",
                         "a smaller decode (DCT scaling: exact=False)"});
  return out;
}

std::vector<std::string> ImageDataset::cheaper_reads() const {
  return image_cheaper_reads(options_.source->file_per_sample());
}

bool ImageDataset::will_read(std::span<const std::size_t> rows) const noexcept {
  return options_.source->will_read(rows);
}

std::size_t ImageDataset::resident_bytes() const {
  return static_cast<std::size_t>(options_.source->counters().cached_bytes +
                                  options_.source->ahead_bytes());
}

ObjectStorageCounters ImageDataset::object_storage_counters() const {
  return options_.source->object_storage();
}

void ImageDataset::read(std::size_t index, const SampleOut& out) const {
  if (index >= size()) {
    throw std::out_of_range("stoker::ImageDataset: index " + std::to_string(index) +
                            " out of range for " + std::to_string(size()) + " samples");
  }
  EncodedBytes& encoded = scratch().encoded;
  options_.source->read(index, encoded);  // names the file itself on failure
  try {
    decode_into(encoded.bytes, options_.transform, out.seed(), out.bytes(0), nullptr,
                options_.max_pixels);
  } catch (const std::exception& e) {
    throw std::runtime_error(options_.source->name(index) + ": " + e.what());
  }
  out.as<std::int64_t>(1)[0] = options_.source->label(index);
}

}  // namespace stoker
