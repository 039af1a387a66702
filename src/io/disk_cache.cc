#include "io/disk_cache.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <vector>

namespace stoker::io {

namespace {

namespace fs = std::filesystem;

constexpr char kMagic[4] = {'S', 'T', 'K', 'C'};

std::string hash_name(const std::string& key) {
  std::uint64_t h = 1469598103934665603ull;  // FNV-1a, 64 bits: stable across builds
  for (unsigned char c : key) {
    h ^= c;
    h *= 1099511628211ull;
  }
  char out[24];
  std::snprintf(out, sizeof out, "%016llx.bin", static_cast<unsigned long long>(h));
  return out;
}

std::string header(const std::string& key) {
  std::string h(kMagic, sizeof kMagic);
  auto n = static_cast<std::uint32_t>(key.size());
  h.append(reinterpret_cast<const char*>(&n), sizeof n);
  h += key;
  return h;
}

bool write_all(int fd, const void* data, std::size_t n) {
  const char* p = static_cast<const char*>(data);
  while (n > 0) {
    ssize_t w = ::write(fd, p, n);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return false;
    p += w;
    n -= static_cast<std::size_t>(w);
  }
  return true;
}

bool read_all(int fd, void* data, std::size_t n) {
  char* p = static_cast<char*>(data);
  while (n > 0) {
    ssize_t r = ::read(fd, p, n);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) return false;
    p += r;
    n -= static_cast<std::size_t>(r);
  }
  return true;
}

bool pread_all(int fd, void* data, std::size_t n, std::uint64_t offset) {
  char* p = static_cast<char*>(data);
  while (n > 0) {
    ssize_t r = ::pread(fd, p, n, static_cast<off_t>(offset));
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) return false;
    p += r;
    n -= static_cast<std::size_t>(r);
    offset += static_cast<std::uint64_t>(r);
  }
  return true;
}

}  // namespace

DiskCache::DiskCache(std::string dir, std::uint64_t max_bytes)
    : dir_(std::move(dir)), max_bytes_(max_bytes) {
  fs::create_directories(dir_);
  struct Found {
    std::string name;
    std::uint64_t size;
    fs::file_time_type time;
  };
  std::vector<Found> found;
  for (const auto& e : fs::directory_iterator(dir_)) {
    std::string name = e.path().filename().string();
    std::error_code ec;
    if (name.find(".tmp.") != std::string::npos) {
      fs::remove(e.path(), ec);  // a write that did not finish
      continue;
    }
    if (name.size() != 20 || !name.ends_with(".bin") || !e.is_regular_file(ec)) continue;
    found.push_back({name, e.file_size(ec), e.last_write_time(ec)});
  }
  std::sort(found.begin(), found.end(),
            [](const Found& a, const Found& b) { return a.time > b.time; });
  detail::MutexLock lock(mu_);
  for (const auto& f : found) {
    lru_.push_back({f.name, f.size});
    index_[f.name] = std::prev(lru_.end());
    bytes_ += f.size;
  }
  evict_locked();
}

std::string DiskCache::key(const std::string& url, std::uint64_t offset, std::size_t length,
                           const std::string& etag) {
  return url + "#" + std::to_string(offset) + "+" + std::to_string(length) + "@" + etag;
}

bool DiskCache::get(const std::string& key, std::byte* dst, std::size_t length) {
  return get_range(key, length, 0, dst, length);
}

bool DiskCache::get_range(const std::string& key, std::size_t length, std::uint64_t offset,
                          std::byte* dst, std::size_t n) {
  if (offset > length || n > length - offset) return false;
  std::string name = hash_name(key);
  bool touch = false;
  {
    detail::MutexLock lock(mu_);
    auto it = index_.find(name);
    if (it == index_.end()) {
      ++counters_.misses;
      return false;
    }
    touch = !it->second->touched;
    it->second->touched = true;
  }
  std::string path = dir_ + "/" + name;
  std::string want = header(key);
  bool ok = false;
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd >= 0) {
    struct stat st {};
    std::string got(want.size(), '\0');
    ok = ::fstat(fd, &st) == 0 && static_cast<std::uint64_t>(st.st_size) == want.size() + length &&
         read_all(fd, got.data(), got.size()) && got == want &&
         pread_all(fd, dst, n, want.size() + offset);
    if (ok && touch) ::futimens(fd, nullptr);  // recently used, for the next process's order
    ::close(fd);
  }
  detail::MutexLock lock(mu_);
  if (!ok) {
    ++counters_.misses;
    return false;
  }
  ++counters_.hits;
  counters_.hit_bytes += n;
  if (auto it = index_.find(name); it != index_.end()) {
    lru_.splice(lru_.begin(), lru_, it->second);
  }
  return true;
}

bool DiskCache::contains(const std::string& key) const {
  const std::string name = hash_name(key);
  detail::MutexLock lock(mu_);
  return index_.find(name) != index_.end();
}

void DiskCache::demote(const std::string& key) {
  const std::string name = hash_name(key);
  detail::MutexLock lock(mu_);
  if (auto it = index_.find(name); it != index_.end()) lru_.splice(lru_.end(), lru_, it->second);
}

void DiskCache::put(const std::string& key, const std::byte* data, std::size_t length) {
  std::string name = hash_name(key);
  std::string head = header(key);
  std::uint64_t size = head.size() + length;
  if (size > max_bytes_) return;
  std::string tmp;
  {
    detail::MutexLock lock(mu_);
    tmp = dir_ + "/" + name + ".tmp." + std::to_string(::getpid()) + "." +
          std::to_string(tmp_counter_++);
  }
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0 && errno == ENOENT) {  // the directory was removed under us: make it again
    std::error_code ec;
    fs::create_directories(dir_, ec);
    fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  }
  if (fd < 0) return;
  bool ok = write_all(fd, head.data(), head.size()) && write_all(fd, data, length);
  ok = ::close(fd) == 0 && ok;
  if (!ok || ::rename(tmp.c_str(), (dir_ + "/" + name).c_str()) != 0) {
    ::unlink(tmp.c_str());
    return;
  }
  detail::MutexLock lock(mu_);
  if (auto it = index_.find(name); it != index_.end()) {
    bytes_ -= it->second->size;
    lru_.erase(it->second);
    index_.erase(it);
  }
  lru_.push_front({name, size});
  index_[name] = lru_.begin();
  bytes_ += size;
  counters_.stored_bytes += length;
  evict_locked();
}

void DiskCache::drop_locked(const std::string& name) {
  auto it = index_.find(name);
  if (it == index_.end()) return;
  bytes_ -= it->second->size;
  lru_.erase(it->second);
  index_.erase(it);
}

void DiskCache::evict_locked() {
  while (bytes_ > max_bytes_ && !lru_.empty()) {
    std::string name = lru_.back().name;
    ::unlink((dir_ + "/" + name).c_str());
    drop_locked(name);
    ++counters_.evictions;
  }
}

DiskCache::Counters DiskCache::counters() const {
  detail::MutexLock lock(mu_);
  return counters_;
}

std::uint64_t DiskCache::bytes() const {
  detail::MutexLock lock(mu_);
  return bytes_;
}

std::size_t DiskCache::entries() const {
  detail::MutexLock lock(mu_);
  return lru_.size();
}

}  // namespace stoker::io
