#include "progress.h"

#include <fmt/core.h>
#include <sys/ioctl.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <iterator>
#include <utility>

namespace stoker::tools {
namespace {

std::size_t terminal_width() {
  winsize w{};
  if (::ioctl(STDERR_FILENO, TIOCGWINSZ, &w) == 0 && w.ws_col > 0) return w.ws_col;
  return 80;
}

}  // namespace

ProgressBar::ProgressBar(std::string label, std::size_t total, bool quiet)
    : shown_(!quiet && ::isatty(STDERR_FILENO) == 1), label_(std::move(label)), total_(total) {}

ProgressBar::~ProgressBar() {
  if (drawn_) {
    fmt::print(stderr, "\r\033[K");  // carriage return, erase to the end of the line
    std::fflush(stderr);
  }
}

void ProgressBar::update(std::size_t done, std::string_view note) {
  if (!shown_) return;
  const auto now = Clock::now();
  if (drawn_ && now - last_ < std::chrono::milliseconds(100)) return;
  last_ = now;
  drawn_ = true;
  // Fitted to the terminal (resized or not), so the line never wraps and \r redraws it.
  const std::size_t width = terminal_width();
  std::string text = label_;
  if (total_ > 0) {
    const std::string count = fmt::format(" {}/{}", std::min(done, total_), total_);
    const std::size_t room = width > text.size() + count.size() + note.size() + 6
                                 ? width - text.size() - count.size() - note.size() - 6
                                 : 0;
    const std::size_t bar = std::min<std::size_t>(room, 40);
    if (bar >= 10) {
      const std::size_t filled = bar * std::min(done, total_) / total_;
      text += fmt::format(" [{}{}]", std::string(filled, '#'), std::string(bar - filled, '.'));
    }
    text += count;
  }
  if (!note.empty()) fmt::format_to(std::back_inserter(text), " {}", note);
  if (text.size() >= width) text.resize(width - 1);
  fmt::print(stderr, "\r{}\033[K", text);
  std::fflush(stderr);
}

}  // namespace stoker::tools
