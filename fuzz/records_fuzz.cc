// Fuzzes the record-shard reader (open_records and read): the input is one shard file. A
// mutated shard almost always fails its header or index checksum, so each input is also tried
// with both checksums recomputed, which lets the fuzzer reach the index parser and the
// per-record checks behind them. Any outcome but success or std::exception is a bug.
#include <xxhash.h>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <exception>
#include <string>
#include <vector>

#include "mem_file.h"
#include "source/record_format.h"
#include "stoker/encoded.h"

namespace {

void open_and_read(const std::vector<std::uint8_t>& shard) {
  const MemFile file("shard", shard.data(), shard.size());  // the reader reads files
  if (!file.ok()) return;
  try {
    auto source = stoker::open_records(file.path());
    stoker::EncodedBytes bytes;
    for (std::size_t i = 0; i < source->size() && i < 64; ++i) {
      (void)source->name(i);
      (void)source->label(i);
      try {
        source->read(i, bytes);
        volatile std::byte sink{};
        for (std::byte b : bytes.bytes) sink = sink ^ b;  // every byte must be readable
      } catch (const std::exception&) {
      }
    }
    (void)source->classes();
  } catch (const std::exception&) {
  }
}

// The same shard with its index and header checksums made to match.
bool fix_checksums(std::vector<std::uint8_t>& shard) {
  using stoker::records::Header;
  if (shard.size() < sizeof(Header)) return false;
  Header h;
  std::memcpy(&h, shard.data(), sizeof h);
  if (h.index_offset <= shard.size() && h.index_bytes <= shard.size() - h.index_offset) {
    h.index_checksum = XXH3_64bits(shard.data() + h.index_offset, h.index_bytes);
  }
  h.header_checksum = XXH3_64bits(&h, offsetof(Header, header_checksum));
  std::memcpy(shard.data(), &h, sizeof h);
  return true;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  std::vector<std::uint8_t> shard(data, data + size);
  open_and_read(shard);
  if (fix_checksums(shard)) open_and_read(shard);
  return 0;
}
