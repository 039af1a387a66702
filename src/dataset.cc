#include "stoker/dataset.h"

#include <stdexcept>
#include <string>

#include "stoker/frontend/stream_copy.h"

namespace stoker {

namespace {
constexpr bool table_in_dtype_order() {
  for (std::size_t i = 0; i < std::size(kDTypes); ++i) {
    if (static_cast<std::size_t>(kDTypes[i].dtype) != i) return false;
  }
  return true;
}
static_assert(table_in_dtype_order(), "kDTypes must list every DType in declaration order");
}  // namespace

const DTypeInfo& dtype_info(DType dtype) {
  const auto i = static_cast<std::size_t>(dtype);
  if (i >= std::size(kDTypes)) throw std::invalid_argument("stoker: unknown dtype");
  return kDTypes[i];
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
