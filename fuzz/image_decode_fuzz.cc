// Fuzzes decode_image on JPEG (STOKER_FUZZ_JPEG) or PNG (STOKER_FUZZ_PNG) input: header
// parsing, the crop rules, region-of-interest decoding with DCT-domain scaling (the tiny
// outputs below make the crop many times the output, so 1/2 to 1/8 scaling is used), exact
// mode and the resampling kernels. Any outcome but success or std::exception is a bug.
#include <cstddef>
#include <cstdint>
#include <exception>
#include <span>
#include <vector>

#include "image/jpeg.h"
#include "image/png.h"
#include "stoker/image.h"

namespace {

// Small enough that a fuzzed header cannot make one input take seconds or gigabytes.
constexpr std::uint64_t kMaxPixels = std::uint64_t{1} << 22;

std::uint64_t fnv1a(std::span<const std::byte> data) {
  std::uint64_t h = 1469598103934665603ULL;
  for (std::byte b : data) h = (h ^ static_cast<std::uint8_t>(b)) * 1099511628211ULL;
  return h;
}

void decode(std::span<const std::byte> data, const stoker::ImageTransform& t, std::uint64_t seed,
            const stoker::CropBox* crop = nullptr) {
  std::vector<std::byte> out(t.output_bytes());
  try {
    stoker::decode_image(data, "fuzz", t, seed, out, crop, kMaxPixels);
  } catch (const std::exception&) {
    // A refused input: fine, as long as nothing else happened.
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* bytes, std::size_t size) {
  const std::span<const std::byte> data(reinterpret_cast<const std::byte*>(bytes), size);
#if defined(STOKER_FUZZ_JPEG)
  if (!stoker::image::is_jpeg(data)) return -1;  // not added to the corpus
#elif defined(STOKER_FUZZ_PNG)
  if (!stoker::image::is_png(data)) return -1;
#endif
  const std::uint64_t seed = fnv1a(data);
  stoker::ImageTransform train = stoker::ImageTransform::train(12);
  decode(data, train, seed);
  train.exact = true;
  train.layout = stoker::ImageLayout::hwc;
  train.dtype = stoker::DType::u8;
  decode(data, train, seed + 1);
  decode(data, stoker::ImageTransform::val(8, 8), seed);
  try {
    const auto [w, h] = stoker::image_size(data, "fuzz");
    if (w > 2 && h > 2) {  // a fixed crop inside the image, not at its origin
      const stoker::CropBox box{w / 3, h / 4, w - w / 3, h / 2};
      decode(data, stoker::ImageTransform::train(5), seed, &box);
    }
  } catch (const std::exception&) {
  }
  return 0;
}
