#include "util/parallel.h"

#include <algorithm>
#include <atomic>
#include <exception>
#include <thread>
#include <vector>

namespace stoker::detail {

void parallel_for(std::size_t n, std::size_t threads, const std::function<void(std::size_t)>& fn) {
  std::vector<std::exception_ptr> errors(n);
  std::atomic<std::size_t> next{0};
  auto work = [&] {
    for (std::size_t i = next++; i < n; i = next++) {
      try {
        fn(i);
      } catch (...) {
        errors[i] = std::current_exception();
        next = n;  // stop handing out more work: the first error is what the caller sees
      }
    }
  };
  const std::size_t k = std::min(threads, n);
  std::vector<std::thread> pool;
  pool.reserve(k > 0 ? k - 1 : 0);
  for (std::size_t t = 1; t < k; ++t) pool.emplace_back(work);
  work();
  for (auto& t : pool) t.join();
  for (auto& e : errors) {
    if (e) std::rethrow_exception(e);
  }
}

}  // namespace stoker::detail
