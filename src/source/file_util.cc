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
  // O_NONBLOCK: opening a named pipe (a FIFO named like an image) waits for a writer without
  // it; with it, the open returns and the check below refuses the file. It changes nothing
  // for a regular file.
  Fd f{::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK)};
  if (f.fd < 0) throw_errno(path, "cannot open");
  struct stat st {};
  if (::fstat(f.fd, &st) != 0) throw_errno(path, "cannot stat");
  if (!S_ISREG(st.st_mode)) throw std::runtime_error(path + ": not a regular file");
  const auto size = static_cast<std::size_t>(st.st_size);
  out.resize(size);
  std::size_t done = 0;
  while (done < size) {
    const ssize_t n = ::pread(f.fd, out.data() + done, size - done, static_cast<off_t>(done));
    if (n < 0) {
      if (errno == EINTR) continue;
      throw_errno(path, "cannot read");
    }
    if (n == 0) break;  // the file shrank while we read it
    done += static_cast<std::size_t>(n);
  }
  out.resize(done);
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
