#include <algorithm>
#include <stdexcept>
#include <string>

#include "stoker/frontend/host_allocator.h"
#include "stoker/sources.h"

namespace stoker {

ArrayDataset::ArrayDataset(std::vector<FieldSpec> fields,
                           std::vector<std::span<const std::byte>> data, std::size_t samples,
                           std::shared_ptr<const void> keep_alive)
    : fields_(std::move(fields)),
      data_(std::move(data)),
      samples_(samples),
      keep_alive_(std::move(keep_alive)) {
  for (const auto& f : fields_) field_bytes_.push_back(f.bytes());
  if (data_.size() != fields_.size()) {
    throw std::invalid_argument("stoker::ArrayDataset: " + std::to_string(fields_.size()) +
                                " fields but " + std::to_string(data_.size()) + " arrays");
  }
  for (std::size_t f = 0; f < fields_.size(); ++f) {
    const std::size_t expected = samples_ * fields_[f].bytes();
    if (data_[f].size() != expected) {
      throw std::invalid_argument("stoker::ArrayDataset: field '" + fields_[f].name + "' has " +
                                  std::to_string(data_[f].size()) + " bytes, expected " +
                                  std::to_string(expected));
    }
  }
}

namespace {

// Blocks from a HostAllocator, freed together.
class Blocks {
 public:
  explicit Blocks(std::shared_ptr<detail::HostAllocator> allocator)
      : allocator_(std::move(allocator)) {}
  ~Blocks() {
    for (auto b : blocks_) allocator_->deallocate(b.data(), b.size());
  }
  Blocks(const Blocks&) = delete;
  Blocks& operator=(const Blocks&) = delete;

  std::span<std::byte> add(std::size_t bytes) {
    blocks_.emplace_back(allocator_->allocate(bytes), bytes);
    return blocks_.back();
  }

 private:
  std::shared_ptr<detail::HostAllocator> allocator_;
  std::vector<std::span<std::byte>> blocks_;
};

}  // namespace

std::shared_ptr<ArrayDataset> ArrayDataset::materialize(const Dataset& source) {
  auto fields = source.fields();
  const std::size_t n = source.size();
  // Huge-page backed: shuffled reads touch rows all over the arrays.
  auto storage = std::make_shared<Blocks>(detail::pageable_allocator());
  std::vector<std::size_t> field_bytes;
  std::vector<std::byte*> bases;
  std::vector<std::span<const std::byte>> data;
  for (const auto& f : fields) {
    const auto block = storage->add(std::max<std::size_t>(n * f.bytes(), 1)).first(n * f.bytes());
    field_bytes.push_back(f.bytes());
    bases.push_back(block.data());
    data.emplace_back(block);
  }
  for (std::size_t i = 0; i < n; ++i) {
    source.read(i, SampleOut(field_bytes, bases.data(), i, 0));
  }
  return std::make_shared<ArrayDataset>(std::move(fields), std::move(data), n, storage);
}

void ArrayDataset::read(std::size_t index, const SampleOut& out) const {
  if (index >= samples_) {
    throw std::out_of_range("stoker::ArrayDataset: index " + std::to_string(index) +
                            " out of range for " + std::to_string(samples_) + " samples");
  }
  for (std::size_t f = 0; f < data_.size(); ++f) {
    const std::size_t n = field_bytes_[f];
    out.copy_from(f, data_[f].subspan(index * n, n));
  }
}

void ArrayDataset::prefetch(std::size_t index) const {
  // The first lines of each field: enough for the hardware prefetcher to take over the rest.
  constexpr std::size_t kLine = 64, kAhead = 4096;
  if (index >= samples_) return;
  for (std::size_t f = 0; f < data_.size(); ++f) {
    const std::byte* p = data_[f].data() + index * field_bytes_[f];
    const std::size_t n = std::min(field_bytes_[f], kAhead);
    for (std::size_t off = 0; off < n; off += kLine) __builtin_prefetch(p + off);
  }
}

}  // namespace stoker
