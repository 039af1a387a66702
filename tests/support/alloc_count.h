// The switch and the counter behind support/counting_new.h's operator new.
#pragma once

#include <atomic>
#include <cstddef>

namespace stoker::alloc_count {
inline std::atomic<bool> counting{false};
inline std::atomic<std::size_t> allocations{0};
}  // namespace stoker::alloc_count
