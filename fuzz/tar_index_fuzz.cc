// Fuzzes the tar indexer and WebDataset over it: the input is one tar shard. A mutated header
// almost always fails its checksum, so each input is also tried with every ustar header's
// checksum recomputed, which lets the fuzzer reach the size, type, long-name and pax parsing
// behind it. Any outcome but success or std::exception is a bug; every member the index gives
// must lie inside the file.

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <string>
#include <string_view>
#include <vector>

#include "mem_file.h"
#include "source/tar_index.h"
#include "stoker/log.h"
#include "stoker/webdataset.h"
#include "support/read_sample.h"

namespace {

void index_and_read(const std::vector<std::uint8_t>& tar) {
  const stoker::detail::ReadAt read = [&](std::uint64_t offset, std::span<std::byte> dst) {
    if (offset >= tar.size()) return std::size_t{0};
    const std::size_t n = std::min<std::size_t>(dst.size(), tar.size() - offset);
    std::memcpy(dst.data(), tar.data() + offset, n);
    return n;
  };
  try {
    for (const auto& m : stoker::detail::index_tar(read, tar.size(), "fuzz.tar")) {
      if (m.offset > tar.size() || m.size > tar.size() - m.offset) std::abort();
    }
  } catch (const std::exception&) {
  }
  // The data set, reading every sample's fields.
  const MemFile file("shard.tar", tar.data(), tar.size());
  if (!file.ok()) return;
  try {
    stoker::WebDatasetOptions o;
    o.shards = {file.path()};
    o.fields = {"cls", "npy"};
    o.storage.index_cache = false;
    stoker::WebDataset d(o);
    for (const auto& f : d.fields()) {
      if (f.bytes() > (1u << 20)) throw std::runtime_error("too large for the fuzzer");
    }
    for (std::size_t i = 0; i < d.size() && i < 64; ++i) {
      (void)d.sample_name(i);
      try {
        (void)stoker::testing::read_sample(d, i);
      } catch (const std::exception&) {
      }
    }
  } catch (const std::exception&) {
  }
}

// Every 512-byte block that carries the ustar magic gets a matching checksum.
bool fix_checksums(std::vector<std::uint8_t>& tar) {
  bool changed = false;
  for (std::size_t at = 0; at + 512 <= tar.size(); at += 512) {
    std::uint8_t* h = tar.data() + at;
    if (std::memcmp(h + 257, "ustar", 5) != 0) continue;
    std::memset(h + 148, ' ', 8);
    unsigned sum = 0;
    for (std::size_t i = 0; i < 512; ++i) sum += h[i];
    char field[8];
    std::snprintf(field, sizeof field, "%06o", sum & 0777777);
    std::memcpy(h + 148, field, 7);
    changed = true;
  }
  return changed;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  static const bool quiet = [] {  // members with no key are logged: not per input here
    stoker::set_log_handler([](stoker::LogLevel, std::string_view) {});
    return true;
  }();
  (void)quiet;
  std::vector<std::uint8_t> tar(data, data + size);
  index_and_read(tar);
  if (fix_checksums(tar)) index_and_read(tar);
  return 0;
}
