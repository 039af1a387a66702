#include "util/node_lock.h"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <stdexcept>
#include <system_error>

#include "stoker/frontend/environment.h"

namespace stoker::detail {

std::string torchrun_job() {
  const std::optional<std::string> run = env_nonempty("TORCHELASTIC_RUN_ID");
  if (!run) return {};
  return *run + "/" + std::to_string(::getppid());
}

NodeLock::NodeLock(const std::string& path) {
  std::error_code ec;
  std::filesystem::create_directories(std::filesystem::path(path).parent_path(), ec);
  fd_ = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (fd_ < 0) {
    throw std::runtime_error(path + ": cannot make the lock file: " + std::strerror(errno));
  }
  while (::flock(fd_, LOCK_EX) != 0) {
    if (errno == EINTR) continue;
    const int err = errno;
    ::close(fd_);
    throw std::runtime_error(path + ": cannot lock: " + std::strerror(err));
  }
}

NodeLock::~NodeLock() {
  if (fd_ >= 0) ::close(fd_);  // closing the file releases its lock
}

}  // namespace stoker::detail
