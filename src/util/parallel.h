// Running a loop's calls on several threads (listing, indexing and downloading objects).
#pragma once

#include <cstddef>
#include <functional>

namespace stoker::detail {

// Runs fn(0) ... fn(n - 1) on up to `threads` threads; rethrows the first exception (by index
// order among those that failed) after every call has returned.
void parallel_for(std::size_t n, std::size_t threads, const std::function<void(std::size_t)>& fn);

}  // namespace stoker::detail
