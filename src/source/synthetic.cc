#include <chrono>
#include <cstdint>
#include <stdexcept>
#include <thread>

#include "stoker/sources.h"

namespace stoker {
namespace {

// Element j of sample i is a function of base + 7 j with base = 131 i; stepping it by 7 with
// a wrap at `period` avoids a division per element.
template <class T>
void fill_float(std::span<T> out, std::size_t i) {
  std::uint64_t v = (i * 131) % 1000;
  for (auto& x : out) {
    x = static_cast<T>(v) / static_cast<T>(1000);
    v += 7;
    if (v >= 1000) v -= 1000;
  }
}

void fill_u8(std::span<std::uint8_t> out, std::size_t i) {
  std::uint64_t v = i * 131;
  for (auto& x : out) {
    x = static_cast<std::uint8_t>(v & 255);
    v += 7;
  }
}

template <class T>
void fill_int(std::span<T> out, std::size_t i, std::int64_t classes) {
  const auto c = static_cast<std::uint64_t>(classes);
  std::uint64_t v = i % c;
  for (auto& x : out) {
    x = static_cast<T>(v);
    if (++v == c) v = 0;
  }
}

void spin_for(std::chrono::microseconds work) {
  const auto until = std::chrono::steady_clock::now() + work;
  while (std::chrono::steady_clock::now() < until) {
  }
}

}  // namespace

SyntheticDataset::SyntheticDataset(Options options) : options_(std::move(options)) {
  if (options_.classes < 1) throw std::invalid_argument("stoker::SyntheticDataset: classes < 1");
  for (const auto& f : options_.fields) {
    if (f.dtype == DType::f16 || f.dtype == DType::bf16) {
      throw std::invalid_argument("stoker::SyntheticDataset: field '" + f.name + "' is " +
                                  std::string(dtype_name(f.dtype)) +
                                  "; synthetic data supports integer, float32 and float64");
    }
  }
}

void SyntheticDataset::read(std::size_t index, const SampleOut& out) const {
  if (index >= options_.samples) {
    throw std::out_of_range("stoker::SyntheticDataset: index " + std::to_string(index) +
                            " out of range for " + std::to_string(options_.samples) + " samples");
  }
  if (options_.latency.count() > 0) std::this_thread::sleep_for(options_.latency);
  if (options_.cpu_work.count() > 0) spin_for(options_.cpu_work);
  for (std::size_t f = 0; f < options_.fields.size(); ++f) {
    switch (options_.fields[f].dtype) {
      case DType::u8:
        fill_u8(out.as<std::uint8_t>(f), index);
        break;
      case DType::i8:
        fill_int(out.as<std::int8_t>(f), index, options_.classes);
        break;
      case DType::i16:
        fill_int(out.as<std::int16_t>(f), index, options_.classes);
        break;
      case DType::i32:
        fill_int(out.as<std::int32_t>(f), index, options_.classes);
        break;
      case DType::i64:
        fill_int(out.as<std::int64_t>(f), index, options_.classes);
        break;
      case DType::f32:
        fill_float(out.as<float>(f), index);
        break;
      case DType::f64:
        fill_float(out.as<double>(f), index);
        break;
      case DType::f16:
      case DType::bf16:
        break;  // refused by the constructor
    }
  }
}

}  // namespace stoker
