// JPEG encoding for generated benchmark and test images (`stoker bench -w jpeg`, the tests'
// fixtures). Unstable: part of the front ends' seam (include/stoker/frontend/README.md).
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace stoker::detail {

// Encodes `pixels` (width x height x components: 1 gray, 3 RGB, 4 CMYK) as a baseline JPEG;
// `subsample` gives 4:2:0 chroma (as Pillow's and most cameras'), else 4:4:4; `progressive`
// writes a progressive JPEG; a nonzero `orientation` adds an EXIF block (APP1) whose
// orientation tag says it.
std::vector<std::byte> encode_jpeg(const std::vector<std::uint8_t>& pixels, int width, int height,
                                   int components, int quality = 90, bool subsample = true,
                                   bool progressive = false, int orientation = 0);

}  // namespace stoker::detail
