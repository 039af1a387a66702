#include "source/file_util.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <random>
#include <stdexcept>
#include <utility>

#include "io/file.h"

namespace stoker::detail {

void throw_errno(const std::string& path, const std::string& what) {
  throw std::runtime_error(path + ": " + what + ": " + std::strerror(errno));
}

namespace {
struct Fd {
  int fd;
  ~Fd() {
    if (fd >= 0) ::close(fd);
  }
};
}  // namespace

void read_whole_file(const std::string& path, std::vector<std::byte>& out) {
  io::read_local_file(path, out);
}

bool replace_file(const std::string& path, std::string_view data) noexcept {
  try {
    std::error_code ec;
    std::filesystem::create_directories(std::filesystem::path(path).parent_path(), ec);
    std::random_device rd;
    const std::string tmp =
        path + ".tmp-" + std::to_string(::getpid()) + "-" + std::to_string(rd());
    Fd f{::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644)};
    if (f.fd < 0) return false;
    std::size_t done = 0;
    bool ok = true;
    while (ok && done < data.size()) {
      const ssize_t n = ::write(f.fd, data.data() + done, data.size() - done);
      if (n < 0 && errno == EINTR) continue;
      ok = n > 0;
      if (ok) done += static_cast<std::size_t>(n);
    }
    ok = ::close(std::exchange(f.fd, -1)) == 0 && ok;
    if (!ok || ::rename(tmp.c_str(), path.c_str()) != 0) {
      ::unlink(tmp.c_str());
      return false;
    }
    return true;
  } catch (...) {  // an allocation failed
    return false;
  }
}

}  // namespace stoker::detail
