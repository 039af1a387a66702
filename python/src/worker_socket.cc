#include "worker_socket.h"

#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <mutex>
#include <set>
#include <string>
#include <thread>

#include "py_workers.h"

namespace stoker::python {
namespace {

// How long a worker that closed its socket is given to become a zombie, so that its exit
// status can be read; an exit takes microseconds, a hung one is reported without a status.
constexpr std::chrono::milliseconds kStatusWait{2000};

std::mutex& fds_mu() {
  static auto* mu = new std::mutex();
  return *mu;
}
std::set<int>& fds() {
  static auto* s = new std::set<int>();  // never destroyed: used at exit
  return *s;
}
}  // namespace

void track_fd(int fd) {
  std::lock_guard lock(fds_mu());
  fds().insert(fd);
}
void close_fd(int fd) {
  if (fd < 0) return;
  {
    std::lock_guard lock(fds_mu());
    fds().erase(fd);
  }
  close(fd);
}

std::vector<std::uint8_t> message(std::uint32_t kind, const std::vector<std::uint8_t>& payload) {
  std::vector<std::uint8_t> m;
  m.reserve(wire::kHeaderBytes + payload.size());
  wire::put(m, kind);
  wire::put(m, static_cast<std::uint32_t>(payload.size()));
  m.insert(m.end(), payload.begin(), payload.end());
  return m;
}

bool send_all(int fd, const std::uint8_t* data, std::size_t size, int pass_fd) {
  while (size > 0) {
    iovec iov{const_cast<std::uint8_t*>(data), size};
    msghdr msg{};
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int))] = {};
    if (pass_fd >= 0) {
      msg.msg_control = control;
      msg.msg_controllen = sizeof control;
      cmsghdr* c = CMSG_FIRSTHDR(&msg);
      c->cmsg_level = SOL_SOCKET;
      c->cmsg_type = SCM_RIGHTS;
      c->cmsg_len = CMSG_LEN(sizeof(int));
      std::memcpy(CMSG_DATA(c), &pass_fd, sizeof(int));
    }
    const ssize_t n = sendmsg(fd, &msg, MSG_NOSIGNAL);  // a dead worker: EPIPE, not SIGPIPE
    if (n < 0) {
      if (errno == EINTR) continue;
      return false;
    }
    pass_fd = -1;  // sent with the first byte
    data += n;
    size -= static_cast<std::size_t>(n);
  }
  return true;
}

bool recv_all(int fd, std::uint8_t* data, std::size_t size) {
  while (size > 0) {
    const ssize_t n = recv(fd, data, size, 0);
    if (n == 0) return false;  // EOF: the worker is gone (or the socket was shut down)
    if (n < 0) {
      if (errno == EINTR) continue;
      return false;
    }
    data += n;
    size -= static_cast<std::size_t>(n);
  }
  return true;
}

std::optional<std::string> death_message(pid_t pid) {
  // WNOWAIT: read the status but leave the zombie to multiprocessing, which reaps its own.
  const auto deadline = std::chrono::steady_clock::now() + kStatusWait;
  for (;;) {
    siginfo_t info{};
    if (waitid(P_PID, static_cast<id_t>(pid), &info, WEXITED | WNOHANG | WNOWAIT) != 0) break;
    if (info.si_pid == pid) {
      const bool killed = info.si_code == CLD_KILLED || info.si_code == CLD_DUMPED;
      return death_message(pid, killed ? -info.si_status : info.si_status);
    }
    if (std::chrono::steady_clock::now() >= deadline) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return std::nullopt;
}

std::string death_message(pid_t pid, std::optional<int> exitcode) {
  const std::string worker = "DataLoader worker (pid " + std::to_string(pid) + ")";
  if (!exitcode) return worker + " exited unexpectedly";
  if (*exitcode < 0) {
    const char* name = strsignal(-*exitcode);
    return worker + " is killed by signal: " + (name ? name : std::to_string(-*exitcode));
  }
  return worker + " exited unexpectedly with exit code " + std::to_string(*exitcode);
}

std::vector<int> tracked_fds() {
  std::lock_guard lock(fds_mu());
  return {fds().begin(), fds().end()};
}

}  // namespace stoker::python
