// Constants and layout of stoker's record shards, mirroring docs/record_format.md (the spec).
// All integers are little-endian.
#pragma once

#include <cstddef>
#include <cstdint>

namespace stoker::records {

inline constexpr char kMagic[8] = {'S', 'T', 'O', 'K', 'R', 'E', 'C', '\n'};
inline constexpr std::uint32_t kVersion = 1;
inline constexpr std::size_t kHeaderBytes = 64;
inline constexpr std::size_t kEntryBytes = 40;
inline constexpr const char* kShardSuffix = ".stkr";

// The shard header, at offset 0.
struct Header {
  char magic[8];
  std::uint32_t version;
  std::uint32_t header_bytes;
  std::uint64_t records;
  std::uint64_t index_offset;
  std::uint64_t index_bytes;
  std::uint64_t index_checksum;   // XXH3-64 of the index bytes
  std::uint64_t header_checksum;  // XXH3-64 of the 48 bytes before this field
  // This shard's number and the pack's shard count, so that a reader of the directory knows
  // when shards are missing (a pack copied in part). 0 and 0 in packs written before: unknown.
  std::uint32_t shard;
  std::uint32_t shards;
};
static_assert(sizeof(Header) == kHeaderBytes);

// One index entry per record.
struct Entry {
  std::uint64_t offset;  // of the payload, from the start of the file
  std::uint64_t length;  // payload bytes
  std::int64_t label;
  std::uint64_t checksum;     // XXH3-64 of the payload
  std::uint32_t name_offset;  // into the index's name block
  std::uint32_t name_length;
};
static_assert(sizeof(Entry) == kEntryBytes);

}  // namespace stoker::records
