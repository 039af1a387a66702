// A progress line for long command-line work (pack, bench, tune): drawn on stderr only when it
// is a terminal, so pipes, logs and --json output stay clean. Debian 12 packages no C++
// progress-bar library (indicators is not there), so this is a small one on fmt.
#pragma once

#include <chrono>
#include <cstddef>
#include <string>
#include <string_view>

namespace stoker::tools {

// Thread safety: one thread.
class ProgressBar {
 public:
  // `total` steps (0: unknown, shown without a bar); `quiet` (--json) draws nothing either.
  ProgressBar(std::string label, std::size_t total, bool quiet = false);
  ~ProgressBar();  // erases the line (what follows is the result)
  ProgressBar(const ProgressBar&) = delete;
  ProgressBar& operator=(const ProgressBar&) = delete;

  bool shown() const { return shown_; }
  // `done` of `total` steps, with a short note after the bar ("12.3 MB/s"); redrawn at most
  // ten times a second.
  void update(std::size_t done, std::string_view note = {});

 private:
  using Clock = std::chrono::steady_clock;
  const bool shown_;
  const std::string label_;
  const std::size_t total_;
  Clock::time_point last_{};
  bool drawn_ = false;
};

}  // namespace stoker::tools
