#include "stoker/frontend/environment.h"

#include <cstdlib>
#include <mutex>
#include <utility>

extern char** environ;

namespace stoker::detail {
namespace {

std::mutex& guard_mu() {
  static std::mutex mu;
  return mu;
}

EnvironmentGuard& guard() {
  static EnvironmentGuard g;
  return g;
}

void guarded(const std::function<void()>& read) {
  EnvironmentGuard g;
  {
    std::lock_guard lock(guard_mu());
    g = guard();
  }
  if (g) {
    g(read);
  } else {
    read();
  }
}

}  // namespace

void set_environment_guard(EnvironmentGuard g) {
  std::lock_guard lock(guard_mu());
  guard() = std::move(g);
}

std::optional<std::string> env_var(const char* name) {
  std::optional<std::string> out;
  guarded([&] {
    if (const char* v = std::getenv(name)) out = v;
  });
  return out;
}

std::optional<std::string> env_nonempty(const char* name) {
  std::optional<std::string> v = env_var(name);
  if (v && v->empty()) v.reset();
  return v;
}

std::map<std::string, std::string> env_vars(const std::function<bool(std::string_view)>& keep) {
  std::map<std::string, std::string> out;
  guarded([&] {
    for (char** e = environ; *e != nullptr; ++e) {
      std::string_view entry(*e);
      const std::size_t eq = entry.find('=');
      if (eq == std::string_view::npos || !keep(entry.substr(0, eq))) continue;
      out.emplace(std::string(entry.substr(0, eq)), std::string(entry.substr(eq + 1)));
    }
  });
  return out;
}

}  // namespace stoker::detail
