// What a Batch's memory belongs to. A Batch holds exactly one owner: a host slab (given back to
// the slab pool) or a device slot (given back to the device slots, which return the slab it
// was copied from themselves). The batch path runs one way: engine -> stage -> user -> owner.
#pragma once

#include <cstddef>
#include <span>
#include <string_view>
#include <vector>

#include "stoker/dataset.h"

namespace stoker::detail {

// The layout every slab of a pool shares: one array per field, batch_size rows each.
struct SlabLayout {
  std::vector<FieldSpec> fields;
  std::vector<std::size_t> field_bytes;    // per sample
  std::vector<std::size_t> field_offsets;  // in the slab
  std::size_t batch_size = 0;
  std::size_t slab_bytes = 0;
};

// Thread safety: give_back() may be called from any thread, the rest by the batch's user.
class BatchOwner {
 public:
  virtual ~BatchOwner() = default;
  // The batch is done with the memory.
  virtual void give_back() noexcept = 0;
  virtual const SlabLayout& layout() const noexcept = 0;
  // The host slab: field f's rows start at host() + layout().field_offsets[f].
  virtual std::byte* host() const noexcept = 0;
  // Data set index per row.
  virtual std::span<const std::size_t> indices() const noexcept = 0;
  // The device copy, laid out like host(); null for a batch on the host.
  virtual std::byte* device_memory() const noexcept { return nullptr; }
  virtual std::string_view device() const noexcept { return "cpu"; }
  virtual void wait(void* /*stream*/) {}
  virtual void synchronize() {}
};

}  // namespace stoker::detail
