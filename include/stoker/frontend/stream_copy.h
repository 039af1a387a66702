// Copying a sample into its slab row. Slab rows are written once and read later by another
// thread or by the device's copy engine, so large copies bypass the cache with streaming
// stores: that saves the read-for-ownership of every destination line (a third of the memory
// traffic of an ordinary copy) and keeps the cache for the source.
//
// Installed for front ends, unstable (include/stoker/frontend/README.md).
#pragma once

#include <cstddef>

namespace stoker::detail {

// Copies below this size use memcpy: the saving does not pay for the fence.
inline constexpr std::size_t kStreamCopyMin = 1024;

void stream_copy(std::byte* dst, const std::byte* src, std::size_t n) noexcept;

}  // namespace stoker::detail
