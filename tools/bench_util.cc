#include "bench_util.h"

#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <filesystem>
#include <optional>

#include "interrupt.h"

extern char** environ;

namespace stoker::bench {

void spin_for(double ms) {
  const auto until = Clock::now() + std::chrono::duration<double, std::milli>(ms);
  while (Clock::now() < until) {
  }
}

double median(std::vector<double> v) {
  if (v.empty()) return 0.0;
  std::sort(v.begin(), v.end());
  const std::size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

std::string with_name(const std::string& path, const std::string& name) {
  const std::filesystem::path p(path);
  return (p.parent_path() / (p.stem().string() + "-" + name + p.extension().string())).string();
}

std::string source_file(const std::string& relative) {
  return std::string(STOKER_SOURCE_DIR) + "/" + relative;
}

std::string shell_quote(const std::string& s) {
  std::string out = "'";
  for (char c : s) out += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return out + "'";
}

int run_command(const std::string& command, std::string& out) {
  out.clear();
  // popen, with the child known, so that Ctrl-C reaches it (tools/interrupt.h).
  int fds[2];
  if (pipe(fds) != 0) return -1;
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, fds[1], STDOUT_FILENO);
  posix_spawn_file_actions_addclose(&actions, fds[0]);
  posix_spawn_file_actions_addclose(&actions, fds[1]);
  // A process group of its own: a signal passed on reaches the shell and what it started.
  posix_spawnattr_t attributes;
  posix_spawnattr_init(&attributes);
  posix_spawnattr_setflags(&attributes, POSIX_SPAWN_SETPGROUP);
  posix_spawnattr_setpgroup(&attributes, 0);
  const char* argv[] = {"sh", "-c", command.c_str(), nullptr};
  pid_t pid = 0;
  const int spawned =
      posix_spawn(&pid, "/bin/sh", &actions, &attributes, const_cast<char* const*>(argv), environ);
  posix_spawnattr_destroy(&attributes);
  posix_spawn_file_actions_destroy(&actions);
  close(fds[1]);
  if (spawned != 0) {
    close(fds[0]);
    return -1;
  }
  tools::set_interrupt_group(pid);
  // Reads until the command closes its output. Once Ctrl-C came (passed on to the command's
  // group by the handler, whichever thread it ran on), the command has kGrace to end; a
  // command that does not (a KeyboardInterrupt swallowed by some library's bare except) is
  // killed with its group, so that the tool never waits on it and leaves nothing running.
  constexpr auto kGrace = std::chrono::seconds(3);
  std::optional<Clock::time_point> stop_by;
  char buf[4096];
  for (;;) {
    if (!stop_by && tools::interrupted()) stop_by = Clock::now() + kGrace;
    if (stop_by && Clock::now() >= *stop_by) {
      kill(-pid, SIGKILL);
      break;
    }
    pollfd readable{fds[0], POLLIN, 0};
    if (poll(&readable, 1, 100) <= 0) continue;  // a timeout or EINTR: look at the flag again
    const ssize_t n = read(fds[0], buf, sizeof buf);
    if (n > 0) {
      out.append(buf, static_cast<std::size_t>(n));
    } else if (n == 0 || errno != EINTR) {
      break;
    }
  }
  close(fds[0]);
  // Interrupted, nothing of the group outlives us (the shell may end before what it started);
  // killed before the shell is reaped, while its pid still names the group.
  if (tools::interrupted()) kill(-pid, SIGKILL);
  int status = 0;
  while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  tools::set_interrupt_group(0);
  tools::throw_if_interrupted();
  return status;
}

}  // namespace stoker::bench
