#include "io/file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <stdexcept>
#include <utility>
#include <vector>

namespace stoker::io {
namespace {

[[noreturn]] void throw_errno(const std::string& path, const std::string& what) {
  throw std::runtime_error(path + ": " + what + ": " + std::strerror(errno));
}

// A descriptor closed when it goes out of scope.
struct Fd {
  int fd = -1;
  Fd() = default;
  explicit Fd(int f) : fd(f) {}
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  ~Fd() {
    if (fd >= 0) ::close(fd);
  }
};

// Opens `path` for reading, refusing what is not a regular file; its size into *size.
int open_regular(const std::string& path, std::uint64_t* size) {
  Fd f(::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK));
  if (f.fd < 0) throw_errno(path, "cannot open");
  struct stat st {};
  if (::fstat(f.fd, &st) != 0) throw_errno(path, "cannot stat");
  if (!S_ISREG(st.st_mode)) throw std::runtime_error(path + ": not a regular file");
  if (size != nullptr) *size = static_cast<std::uint64_t>(st.st_size);
  return std::exchange(f.fd, -1);
}

// Up to `n` bytes at `offset` of `fd` (the file `name`): the one pread loop. Returns how many
// (fewer at the file's end).
std::size_t pread_at(int fd, const std::string& name, std::uint64_t offset, std::byte* dst,
                     std::size_t n) {
  std::size_t done = 0;
  while (done < n) {
    const ssize_t got = ::pread(fd, dst + done, n - done, static_cast<off_t>(offset + done));
    if (got < 0) {
      if (errno == EINTR) continue;
      throw_errno(name, "cannot read");
    }
    if (got == 0) break;  // its end (truncated since it was opened, when before size())
    done += static_cast<std::size_t>(got);
  }
  return done;
}

class LocalFile final : public File {
 public:
  // `fd`: held for the File's life, or -1 to open the file for each read.
  LocalFile(const std::string& path, std::uint64_t size, int fd) : File(path, size), fd_(fd) {}

  std::size_t read_at(std::uint64_t offset, std::byte* dst, std::size_t n) const override {
    Fd own;
    const int fd = fd_.fd >= 0 ? fd_.fd : (own.fd = open_regular(name(), nullptr));
    return pread_at(fd, name(), offset, dst, n);
  }

 private:
  Fd fd_;
};

class ObjectFile final : public File {
 public:
  ObjectFile(detail::RemoteObject object, detail::RemoteHandle files)
      : File(object.url, object.size), object_(std::move(object)), files_(std::move(files)) {}
  ~ObjectFile() override {
    // Its reader is gone: no last reads to come. A forked worker holds no blocks (they go to
    // the disk cache there), and makes no RemoteFiles of its own to say so.
    if (detail::RemoteFiles* files = files_.made_here(); files && object_.done_with_each) {
      files->let_go(object_);
    }
  }
  ObjectFile(const ObjectFile&) = delete;
  ObjectFile& operator=(const ObjectFile&) = delete;

  std::size_t read_at(std::uint64_t offset, std::byte* dst, std::size_t n) const override {
    if (offset >= size()) return 0;
    n = static_cast<std::size_t>(std::min<std::uint64_t>(n, size() - offset));
    files_->read(object_, offset, dst, n);  // the URL and the HTTP status on failure
    return n;
  }
  void read_once(std::uint64_t offset, std::byte* dst, std::size_t n) const override {
    if (size() <= detail::kRemoteChunkBytes) {
      File::read_once(offset, dst, n);  // its one chunk, whose GET serves the rest too
      return;
    }
    files_->read_uncached(object_, offset, dst, n);
  }
  void read_uncached(std::uint64_t offset, std::byte* dst, std::size_t n) const override {
    files_->read_uncached(object_, offset, dst, n);
  }
  bool will_read(std::uint64_t offset, std::size_t n) const override {
    return files_->prefetch(object_, offset, n);
  }
  bool will_read(std::span<const Range> ranges) const override {
    return files_->prefetch(object_, ranges);
  }
  void done_with(std::uint64_t offset) const override { files_->done_with(object_, offset); }
  const detail::RemoteObject* object() const override { return &object_; }

 private:
  detail::RemoteObject object_;
  detail::RemoteHandle files_;
};

class Slice final : public File {
 public:
  Slice(FilePtr file, std::uint64_t offset, std::uint64_t length, std::string name)
      : File(std::move(name), length), file_(std::move(file)), offset_(offset) {}

  std::size_t read_at(std::uint64_t offset, std::byte* dst, std::size_t n) const override {
    if (offset >= size()) return 0;
    n = static_cast<std::size_t>(std::min<std::uint64_t>(n, size() - offset));
    return file_->read_at(offset_ + offset, dst, n);
  }
  bool will_read(std::uint64_t offset, std::size_t n) const override {
    if (offset >= size()) return true;
    n = static_cast<std::size_t>(std::min<std::uint64_t>(n, size() - offset));
    return file_->will_read(offset_ + offset, n);
  }
  void done_with(std::uint64_t offset) const override { file_->done_with(offset_ + offset); }

 private:
  FilePtr file_;
  std::uint64_t offset_ = 0;
};

}  // namespace

void File::read_once(std::uint64_t offset, std::byte* dst, std::size_t n) const {
  const std::size_t got = read_at(offset, dst, n);
  if (got < n) {
    throw std::runtime_error(name() + ": the file ends at " + std::to_string(offset + got) +
                             " bytes, " + std::to_string(n) + " bytes were to be read at " +
                             std::to_string(offset) + " (truncated while open)");
  }
}

void File::read_uncached(std::uint64_t offset, std::byte* dst, std::size_t n) const {
  File::read_once(offset, dst, n);
}

bool File::will_read(std::uint64_t, std::size_t) const { return true; }

bool File::will_read(std::span<const Range> ranges) const {
  bool all = true;
  for (const auto& [offset, n] : ranges) all = will_read(offset, n) && all;
  return all;
}

void File::done_with(std::uint64_t) const {}

FilePtr open_local(const std::string& path, bool keep_open) {
  std::uint64_t size = 0;
  Fd fd(open_regular(path, &size));
  if (!keep_open) return std::make_shared<LocalFile>(path, size, -1);
  auto file = std::make_shared<LocalFile>(path, size, fd.fd);
  fd.fd = -1;
  return file;
}

void read_local_file(const std::string& path, std::vector<std::byte>& out) {
  std::uint64_t size = 0;
  const Fd fd(open_regular(path, &size));
  out.resize(static_cast<std::size_t>(size));
  out.resize(pread_at(fd.fd, path, 0, out.data(), out.size()));  // shorter: it shrank meanwhile
}

FilePtr open_object(detail::RemoteObject object, detail::RemoteHandle files) {
  return std::make_shared<ObjectFile>(std::move(object), std::move(files));
}

FilePtr slice(FilePtr file, std::uint64_t offset, std::uint64_t length, std::string name) {
  if (offset > file->size() || length > file->size() - offset) {
    throw std::invalid_argument(name + ": bytes [" + std::to_string(offset) + ", " +
                                std::to_string(offset + length) + ") do not lie in " +
                                file->name() + " (" + std::to_string(file->size()) + " bytes)");
  }
  return std::make_shared<Slice>(std::move(file), offset, length, std::move(name));
}

}  // namespace stoker::io
