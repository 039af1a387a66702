// ImageTransform as text: the one parser of transform settings, shared by the Python package
// (transforms.Compose.spec()) and the command line (`stoker decode --transform`), and fuzzed
// (fuzz/transform_spec_fuzz.cc): it reads untrusted text, so every malformed input is an
// std::invalid_argument, never undefined behavior.
#include <array>
#include <charconv>
#include <cmath>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <string_view>
#include <system_error>

#include "stoker/image.h"

namespace stoker {
namespace {

// The message is appended piece by piece (GCC 12 warns, wrongly, on chains of + here).
template <class... Parts>
[[noreturn]] void bad(const Parts&... parts) {
  std::string message = "stoker::ImageTransform spec: ";
  (message.append(std::string_view(parts)), ...);
  throw std::invalid_argument(message);
}

bool is_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }

// Whole-string numbers only: "12x" or "" is an error, not 12 or 0.
template <class T>
T number(std::string_view key, std::string_view text) {
  T v{};
  const char* end = text.data() + text.size();
  const auto r = std::from_chars(text.data(), end, v);
  if (r.ec != std::errc{} || r.ptr != end || text.empty()) {
    bad(key, ": '", text, "' is not a number");
  }
  return v;
}

template <class T, std::size_t N>
std::array<T, N> numbers(std::string_view key, std::string_view text) {
  std::array<T, N> out{};
  for (std::size_t i = 0; i < N; ++i) {
    const auto comma = text.find(',');
    const bool last = i + 1 == N;
    if (last != (comma == std::string_view::npos)) {
      bad(key, " takes ", std::to_string(N), " comma-separated numbers");
    }
    out[i] = number<T>(key, text.substr(0, comma));
    if (!last) text.remove_prefix(comma + 1);
  }
  return out;
}

bool boolean(std::string_view key, std::string_view text) {
  if (text == "1" || text == "true") return true;
  if (text == "0" || text == "false") return false;
  bad(key, ": '", text, "' is not 0, 1, true or false");
}

// Shortest text that reads back to the same value.
template <class T>
std::string format(T v) {
  char buf[64];
  const auto r = std::to_chars(buf, buf + sizeof buf, v);
  return std::string(buf, r.ptr);
}

template <class T, std::size_t N>
std::string format(const std::array<T, N>& v) {
  std::string s;
  for (std::size_t i = 0; i < N; ++i) {
    if (i) s.push_back(',');
    s.append(format(v[i]));
  }
  return s;
}

}  // namespace

ImageTransform ImageTransform::parse(std::string_view spec) {
  ImageTransform t = train(224);
  constexpr std::array<std::string_view, 11> kKeys{"crop",  "size", "resize", "scale",
                                                   "ratio", "flip", "dtype",  "layout",
                                                   "mean",  "std",  "exact"};
  std::uint32_t seen = 0;
  while (!spec.empty()) {
    if (is_space(spec.front())) {
      spec.remove_prefix(1);
      continue;
    }
    std::size_t end = 0;
    while (end < spec.size() && !is_space(spec[end])) ++end;
    const std::string_view item = spec.substr(0, end);
    spec.remove_prefix(end);
    const auto eq = item.find('=');
    if (eq == std::string_view::npos) bad("'", item, "' is not key=value");
    const std::string_view key = item.substr(0, eq);
    const std::string_view value = item.substr(eq + 1);
    std::size_t k = 0;
    while (k < kKeys.size() && kKeys[k] != key) ++k;
    if (k == kKeys.size()) bad("unknown key '", key, "'");
    if (seen & (1u << k)) bad("'", key, "' given twice");
    seen |= 1u << k;
    if (key == "crop") {
      if (value == "random_resized") {
        t.crop = Crop::random_resized;
      } else if (value == "resize_center") {
        t.crop = Crop::resize_center;
      } else {
        bad("crop: '", value, "' is not random_resized or resize_center");
      }
    } else if (key == "size") {
      t.size = number<int>(key, value);
    } else if (key == "resize") {
      t.resize = number<int>(key, value);
    } else if (key == "scale") {
      t.scale = numbers<double, 2>(key, value);
    } else if (key == "ratio") {
      t.ratio = numbers<double, 2>(key, value);
    } else if (key == "flip") {
      t.random_flip = boolean(key, value);
    } else if (key == "dtype") {
      if (value == "uint8" || value == "u8") {
        t.dtype = DType::u8;
      } else if (value == "float32" || value == "f32") {
        t.dtype = DType::f32;
      } else {
        bad("dtype: '", value, "' is not uint8 or float32");
      }
    } else if (key == "layout") {
      if (value == "chw") {
        t.layout = ImageLayout::chw;
      } else if (value == "hwc") {
        t.layout = ImageLayout::hwc;
      } else {
        bad("layout: '", value, "' is not chw or hwc");
      }
    } else if (key == "mean") {
      t.mean = numbers<float, 3>(key, value);
    } else if (key == "std") {
      t.std = numbers<float, 3>(key, value);
    } else {
      t.exact = boolean(key, value);
    }
  }
  t.validate();
  return t;
}

std::string ImageTransform::spec() const {
  std::string s;
  auto add = [&s](std::string_view key, std::string_view value) {
    if (!s.empty()) s.push_back(' ');
    s.append(key).append("=").append(value);
  };
  add("crop", crop == Crop::random_resized ? "random_resized" : "resize_center");
  add("size", format(size));
  add("resize", format(resize));
  add("scale", format(scale));
  add("ratio", format(ratio));
  add("flip", random_flip ? "1" : "0");
  add("dtype", dtype == DType::u8 ? "uint8" : "float32");
  add("layout", layout == ImageLayout::chw ? "chw" : "hwc");
  add("mean", format(mean));
  add("std", format(std));
  add("exact", exact ? "1" : "0");
  return s;
}

}  // namespace stoker
