// The message a call throws (std::exception's what()), or "(no error)": for tests that check
// how bad input is named.
#pragma once

#include <exception>
#include <functional>
#include <string>

namespace stoker {

inline std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const std::exception& e) {
    return e.what();
  }
  return "(no error)";
}

}  // namespace stoker
