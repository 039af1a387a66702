// printf-style formatting into a std::string, for messages built by the core library (which
// does not depend on fmt; the tools do).
#pragma once

#include <cstdio>
#include <string>

namespace stoker::detail {

template <class... Args>
std::string format(const char* pattern, Args... args) {
  const int n = std::snprintf(nullptr, 0, pattern, args...);
  if (n <= 0) return {};
  std::string out(static_cast<std::size_t>(n), '\0');
  std::snprintf(out.data(), out.size() + 1, pattern, args...);
  return out;
}

}  // namespace stoker::detail
