#include "image/geometry.h"

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <string>

#include "stoker/frontend/random.h"

namespace stoker::image {
namespace {

// The per-sample generator, seeded by SampleOut::seed().
using Random = detail::SplitMix64;

// Python's round(): halves to even, as torchvision computes crop sizes.
int round_even(double v) { return static_cast<int>(std::nearbyint(v)); }

}  // namespace
}  // namespace stoker::image

namespace stoker {

RandomCropDraw draw_random_crop(const ImageTransform& t, int width, int height,
                                std::uint64_t seed) {
  image::Random rng(seed);
  RandomCropDraw d;
  // torchvision.transforms.RandomResizedCrop.get_params.
  const double area = static_cast<double>(width) * height;
  const double log_r0 = std::log(t.ratio[0]);
  const double log_r1 = std::log(t.ratio[1]);
  using image::round_even;
  bool found = false;
  for (int attempt = 0; attempt < 10 && !found; ++attempt) {
    const double target_area = area * rng.uniform(t.scale[0], t.scale[1]);
    const double aspect = std::exp(rng.uniform(log_r0, log_r1));
    // Compared as doubles first: a side far outside the image is no int.
    const double wd = std::nearbyint(std::sqrt(target_area * aspect));
    const double hd = std::nearbyint(std::sqrt(target_area / aspect));
    if (0 < wd && wd <= width && 0 < hd && hd <= height) {
      const int w = static_cast<int>(wd);
      const int h = static_cast<int>(hd);
      d.box = {rng.below(width - w + 1), rng.below(height - h + 1), w, h};
      found = true;
    }
  }
  if (!found) {  // the center crop, clamped to the ratio range
    const double in_ratio = static_cast<double>(width) / height;
    const double rmin = std::min(t.ratio[0], t.ratio[1]);
    const double rmax = std::max(t.ratio[0], t.ratio[1]);
    int w = width, h = height;
    if (in_ratio < rmin) {
      h = round_even(w / rmin);
    } else if (in_ratio > rmax) {
      w = round_even(h * rmax);
    }
    d.box = {(width - w) / 2, (height - h) / 2, w, h};
  }
  d.flip = t.random_flip && rng.uniform() < 0.5;
  return d;
}

}  // namespace stoker

namespace stoker::image {

Geometry plan_geometry(const ImageTransform& t, int width, int height, std::uint64_t seed,
                       const CropBox* crop) {
  Geometry g;
  if (t.crop == ImageTransform::Crop::random_resized) {
    if (crop) {
      if (crop->x < 0 || crop->y < 0 || crop->width <= 0 || crop->height <= 0 ||
          crop->x + crop->width > width || crop->y + crop->height > height) {
        throw std::invalid_argument("crop box outside the " + std::to_string(width) + "x" +
                                    std::to_string(height) + " image");
      }
      g.region = *crop;
    } else {
      const auto d = draw_random_crop(t, width, height, seed);
      g.region = d.box;
      g.flip = d.flip;
    }
    g.out_width = g.out_height = t.size;
    return g;
  }
  // Resize(resize): torchvision's _compute_resized_output_size for an int size.
  g.region = {0, 0, width, height};
  const bool wide = width > height;
  const int shorter = wide ? height : width;
  const int longer = wide ? width : height;
  const double new_long_exact = static_cast<double>(t.resize) * longer / shorter;
  // A very thin image would be resized to more columns than an int holds (or any resample
  // could use): refused, like an image over max_pixels.
  if (new_long_exact > kMaxResized) {
    throw std::runtime_error("a " + std::to_string(width) + "x" + std::to_string(height) +
                             " image resized to " + std::to_string(t.resize) +
                             " on its shorter side would be over " + std::to_string(kMaxResized) +
                             " pixels long");
  }
  const int new_long = static_cast<int>(new_long_exact);
  g.out_width = wide ? new_long : t.resize;
  g.out_height = wide ? t.resize : new_long;
  // CenterCrop(size): int(round((h - size) / 2.0)).
  g.window_x = round_even((g.out_width - t.size) / 2.0);
  g.window_y = round_even((g.out_height - t.size) / 2.0);
  g.flip = t.random_flip && Random(seed).uniform() < 0.5;
  return g;
}

int dct_denominator(const Geometry& g, bool exact) {
  if (exact) return 1;
  const double factor = std::min(static_cast<double>(g.region.width) / g.out_width,
                                 static_cast<double>(g.region.height) / g.out_height);
  // Pillow's Image.draft(size) picks the largest scale that keeps the decoded image at least
  // `size`; thumbnail() asks it for reducing_gap (2) times the output. The scaled IDCT is not
  // the triangle filter of Pillow's resize, and its error shrinks with the reduction that
  // follows it. Measured on real photos (tests/image/test_real_photos.py, docs/image.md), mean
  // absolute difference from torchvision's output over the photos (worst photo): a gap of 1
  // (decoded just above the output) 1.09 (5.1) levels in the val pipeline; 2: 0.36 (1.42);
  // 3: 0.12 (0.34). 3 keeps every photo well under 1 level.
  int denom = 1;
  while (denom < 8 && factor >= ImageTransform::kDctGap * 2.0 * denom) denom *= 2;
  return denom;
}

}  // namespace stoker::image
