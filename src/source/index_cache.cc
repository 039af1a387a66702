#include "source/index_cache.h"

#include <xxhash.h>

#include <cstdio>
#include <exception>
#include <filesystem>
#include <vector>

#include "source/file_util.h"

namespace stoker::detail {

std::int64_t etag_stamp(std::string_view etag) {
  return static_cast<std::int64_t>(XXH3_64bits(etag.data(), etag.size()));
}

std::string index_cache_file(const std::string& dir, std::string_view name, std::string_view ext) {
  char hex[24];
  std::snprintf(hex, sizeof hex, "%016llx",
                static_cast<unsigned long long>(XXH3_64bits(name.data(), name.size())));
  return (std::filesystem::path(dir) / (std::string(hex) + "." + std::string(ext))).string();
}

namespace {

// The whole file, read into a string (the entry's body is then cut out of it in place: the
// entries of a large index are not copied twice); nullopt when it cannot be read.
std::optional<std::string> read_entry(const std::string& file) {
  std::FILE* f = std::fopen(file.c_str(), "rb");
  if (f == nullptr) return std::nullopt;
  std::string bytes;
  bool ok = std::fseek(f, 0, SEEK_END) == 0;
  const long size = ok ? std::ftell(f) : -1;
  ok = ok && size >= 0 && std::fseek(f, 0, SEEK_SET) == 0;
  if (ok) {
    bytes.resize(static_cast<std::size_t>(size));
    ok = std::fread(bytes.data(), 1, bytes.size(), f) == bytes.size();
  }
  std::fclose(f);
  if (!ok) return std::nullopt;
  return bytes;
}

}  // namespace

std::optional<std::string> load_index_entry(const std::string& file, std::string_view magic,
                                            const IndexKey& key) {
  auto read = read_entry(file);
  if (!read) return std::nullopt;
  std::string& bytes = *read;
  if (bytes.size() < 8 + 8) return std::nullopt;
  const std::size_t body = bytes.size() - 8;
  std::uint64_t sum = 0;
  std::memcpy(&sum, bytes.data() + body, 8);
  if (XXH3_64bits(bytes.data(), body) != sum) return std::nullopt;
  IndexReader r(std::string_view(bytes.data(), body));
  char kind[8];
  std::uint64_t size = 0, name_length = 0;
  std::int64_t stamp = 0;
  std::string name;
  if (!r.get(kind) || std::string_view(kind, 8) != magic || !r.get(size) || !r.get(stamp) ||
      !r.get(name_length) || !r.get_string(name, name_length) || name != key.name ||
      size != key.size || stamp != key.stamp) {
    return std::nullopt;
  }
  const std::size_t header = body - r.left();
  bytes.resize(body);
  bytes.erase(0, header);
  return read;
}

void save_index_entry(const std::string& file, std::string_view magic, const IndexKey& key,
                      std::string_view body) {
  IndexWriter w;
  w.data.reserve(8 + 8 + 8 + 8 + key.name.size() + body.size() + 8);
  w.put_bytes(magic.data(), 8);
  w.put(key.size);
  w.put(key.stamp);
  w.put(static_cast<std::uint64_t>(key.name.size()));
  w.put_bytes(key.name.data(), key.name.size());
  w.put_bytes(body.data(), body.size());
  w.put(static_cast<std::uint64_t>(XXH3_64bits(w.data.data(), w.data.size())));
  (void)replace_file(file, w.data);  // a cache: a failure leaves the next process to index
}

}  // namespace stoker::detail
