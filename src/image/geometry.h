// Where an output image comes from: the torchvision crop rules (RandomResizedCrop's sampling,
// Resize of the shorter side, CenterCrop) turned into one resample of a region of the source
// image. Pure functions.
#pragma once

#include <cstdint>

#include "stoker/image.h"

namespace stoker::image {

struct Geometry {
  CropBox region;      // part of the source image that is resized
  int out_width = 0;   // the region is resized to out_width x out_height,
  int out_height = 0;  // of which the window [window_x, window_x + size) x
  int window_x = 0;    // [window_y, window_y + size) is the output
  int window_y = 0;
  bool flip = false;
};

// The geometry `transform` gives an image of width x height with random choices from `seed`;
// `crop`, if not null, is the random_resized crop to use instead of a random one (no flip).
Geometry plan_geometry(const ImageTransform& transform, int width, int height, std::uint64_t seed,
                       const CropBox* crop);

// The longest side an image may be resized to (a Resize of a very thin image).
inline constexpr int kMaxResized = 1 << 20;

// The largest DCT scaling denominator (1, 2, 4 or 8) that leaves the region at least
// ImageTransform::kDctGap times the resized image in both directions; 1 if `exact`.
int dct_denominator(const Geometry& g, bool exact);

}  // namespace stoker::image
