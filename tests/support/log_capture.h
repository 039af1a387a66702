// The log lines the engine writes while a test runs (set_log_handler), at `level` and above;
// the default handler and level are back when it goes.
#pragma once

#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include "stoker/log.h"

namespace stoker::testing {

class LogCapture {
 public:
  explicit LogCapture(LogLevel level = LogLevel::info) {
    set_log_level(level);
    set_log_handler([this](LogLevel, std::string_view line) {
      std::lock_guard lock(mu_);
      lines_.emplace_back(line);
    });
  }
  ~LogCapture() {
    set_log_handler({});
    set_log_level(LogLevel::info);
  }
  LogCapture(const LogCapture&) = delete;
  LogCapture& operator=(const LogCapture&) = delete;

  std::vector<std::string> lines() {
    std::lock_guard lock(mu_);
    return lines_;
  }

 private:
  std::mutex mu_;
  std::vector<std::string> lines_;
};

}  // namespace stoker::testing
