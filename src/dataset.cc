#include "stoker/dataset.h"

#include <stdexcept>
#include <string>

#include "memory/stream_copy.h"

namespace stoker {

std::size_t dtype_size(DType dtype) {
  switch (dtype) {
    case DType::u8:
    case DType::i8:
      return 1;
    case DType::i16:
    case DType::f16:
    case DType::bf16:
      return 2;
    case DType::i32:
    case DType::f32:
      return 4;
    case DType::i64:
    case DType::f64:
      return 8;
  }
  throw std::invalid_argument("stoker: unknown dtype");
}

std::string_view dtype_name(DType dtype) {
  switch (dtype) {
    case DType::u8:
      return "uint8";
    case DType::i8:
      return "int8";
    case DType::i16:
      return "int16";
    case DType::i32:
      return "int32";
    case DType::i64:
      return "int64";
    case DType::f16:
      return "float16";
    case DType::bf16:
      return "bfloat16";
    case DType::f32:
      return "float32";
    case DType::f64:
      return "float64";
  }
  return "unknown";
}

std::size_t FieldSpec::elements() const {
  std::size_t n = 1;
  for (auto d : shape) n *= static_cast<std::size_t>(d);
  return n;
}

std::size_t FieldSpec::bytes() const { return elements() * dtype_size(dtype); }

void SampleOut::copy_from(std::size_t field, std::span<const std::byte> src) const {
  const auto dst = bytes(field);
  if (dst.size() != src.size()) {
    throw std::invalid_argument("stoker::SampleOut::copy_from: field " + std::to_string(field) +
                                " has " + std::to_string(dst.size()) + " bytes, the source " +
                                std::to_string(src.size()));
  }
  detail::stream_copy(dst.data(), src.data(), src.size());
}

void SampleOut::throw_bad_field(std::size_t field) const {
  throw std::out_of_range("stoker::SampleOut: field " + std::to_string(field) +
                          " does not exist (the dataset declares " +
                          std::to_string(field_bytes_.size()) + ")");
}

void SampleOut::throw_bad_element_size(std::size_t field, std::size_t size) const {
  throw std::invalid_argument("stoker::SampleOut: field " + std::to_string(field) + " has " +
                              std::to_string(field_bytes_[field]) +
                              " bytes, not a multiple of an element of " + std::to_string(size));
}

void Dataset::read_rows(std::span<const std::size_t> indices, std::span<const SampleOut> outs,
                        std::span<std::exception_ptr> errors) const {
  for (std::size_t k = 0; k < indices.size(); ++k) {
    try {
      read(indices[k], outs[k]);
    } catch (...) {
      errors[k] = std::current_exception();
    }
  }
}

}  // namespace stoker
