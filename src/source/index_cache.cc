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

std::optional<std::string> load_index_entry(const std::string& file, std::string_view magic,
                                            const IndexKey& key) {
  std::vector<std::byte> bytes;
  try {
    read_whole_file(file, bytes);
  } catch (const std::exception&) {
    return std::nullopt;
  }
  if (bytes.size() < 8 + 8) return std::nullopt;
  const std::size_t body = bytes.size() - 8;
  std::uint64_t sum = 0;
  std::memcpy(&sum, bytes.data() + body, 8);
  if (XXH3_64bits(bytes.data(), body) != sum) return std::nullopt;
  IndexReader r(std::string_view(reinterpret_cast<const char*>(bytes.data()), body));
  char kind[8];
  std::uint64_t size = 0, name_length = 0;
  std::int64_t stamp = 0;
  std::string name;
  if (!r.get(kind) || std::string_view(kind, 8) != magic || !r.get(size) || !r.get(stamp) ||
      !r.get(name_length) || !r.get_string(name, name_length) || name != key.name ||
      size != key.size || stamp != key.stamp) {
    return std::nullopt;
  }
  return std::string(reinterpret_cast<const char*>(bytes.data()) + (body - r.left()), r.left());
}

void save_index_entry(const std::string& file, std::string_view magic, const IndexKey& key,
                      std::string_view body) {
  IndexWriter w;
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
