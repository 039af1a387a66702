#include "stoker/frontend/log.h"

#include <pthread.h>

#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <string>
#include <string_view>
#include <utility>

#include "stoker/frontend/environment.h"

namespace stoker {
namespace {

// Held across fork(): a child starts with it free, never locked for good by a thread that
// does not exist there (a worker process forked while an engine thread logged hung at its
// first line). Never destroyed: a thread may log during exit.
std::mutex& log_mutex() {
  static std::mutex* mu = [] {
    auto* made = new std::mutex;
    pthread_atfork([] { log_mutex().lock(); }, [] { log_mutex().unlock(); },
                   [] { log_mutex().unlock(); });
    return made;
  }();
  return *mu;
}

std::function<void(LogLevel, std::string_view)>& log_handler() {
  static std::function<void(LogLevel, std::string_view)> handler;
  return handler;
}

LogLevel& min_level() {
  static LogLevel level = [] {
    return detail::env_var("STOKER_LOG") == "debug" ? LogLevel::debug : LogLevel::info;
  }();
  return level;
}

// Read once as the library loads (a Python import holds the GIL; a program starts with one
// thread), not at the first log line, which may come on any thread while another waits.
[[maybe_unused]] const LogLevel initial_level = min_level();

}  // namespace

void set_log_level(LogLevel level) {
  std::lock_guard lock(log_mutex());
  min_level() = level;
}

LogLevel log_level() {
  std::lock_guard lock(log_mutex());
  return min_level();
}

void set_log_handler(std::function<void(LogLevel, std::string_view)> handler) {
  std::lock_guard lock(log_mutex());
  log_handler() = std::move(handler);
}

namespace detail {

void log(LogLevel level, std::string_view message) {
  std::lock_guard lock(log_mutex());
  if (level < min_level()) return;
  if (log_handler()) {
    log_handler()(level, message);
  } else {
    std::fprintf(stderr, "stoker: %.*s\n", static_cast<int>(message.size()), message.data());
  }
}

}  // namespace detail
}  // namespace stoker
