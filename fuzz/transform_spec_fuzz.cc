// Fuzzes ImageTransform::parse, the parser of transform settings from Python and the command
// line: any text either fails with std::invalid_argument or gives a valid transform whose
// spec() parses back to the same transform, and that transform decodes a small image without
// anything but a std::exception going wrong (the crop rules with fuzzed sizes, scales and
// ratios).
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <exception>
#include <stdexcept>
#include <string_view>
#include <vector>

#include "stoker/image.h"

namespace {

// A 40x24 grayscale PNG (a gradient), made by fuzz/make_corpus.py.
constexpr unsigned char kPng[] = {
#include "transform_spec_image.inc"
};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  stoker::ImageTransform t;
  try {
    t = stoker::ImageTransform::parse(text);
  } catch (const std::invalid_argument&) {
    return 0;
  }
  const stoker::ImageTransform again = stoker::ImageTransform::parse(t.spec());
  if (!(again == t)) std::abort();  // spec() must round-trip
  if (t.size > 64) return 0;        // the output is size^2 pixels: keep each input fast
  std::vector<std::byte> out(t.output_bytes());
  try {
    stoker::decode_image({reinterpret_cast<const std::byte*>(kPng), sizeof kPng}, "fuzz", t, size,
                         out);
  } catch (const std::exception&) {
  }
  return 0;
}
