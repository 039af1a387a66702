// JPEG encoding for generated test and benchmark images.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace stoker::testing {

// Encodes `pixels` (width x height x components: 1 gray, 3 RGB, 4 CMYK) as a baseline JPEG;
// `subsample` gives 4:2:0 chroma (as Pillow's and most cameras'), else 4:4:4.
std::vector<std::byte> encode_jpeg(const std::vector<std::uint8_t>& pixels, int width, int height,
                                   int components, int quality = 90, bool subsample = true);

}  // namespace stoker::testing
