// The index of a tar file: where each regular member's data lies, read from the headers alone
// (the data is never read). Reads POSIX ustar, old (v7) and GNU tar: GNU long names
// (`././@LongLink`, type 'L'), pax extended headers ('x', and global 'g') with `path=` and
// `size=`, base-256 sizes. Directories, links, devices and other non-regular entries are left
// out. A damaged file is refused with the reason: a header whose checksum does not match, a
// member or header that runs past the end of the file, no end-of-archive marker (a partial
// download), a gzip-compressed tar (which cannot be read at random offsets).
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <vector>

namespace stoker::io {
class File;
}  // namespace stoker::io

namespace stoker::detail {

struct TarMember {
  std::string name;          // the full path inside the tar
  std::uint64_t offset = 0;  // of the data, from the start of the file
  std::uint64_t size = 0;    // bytes of data
  std::uint64_t header = 0;  // offset of the member's first header (pax/long name included)
  bool operator==(const TarMember&) const = default;
};

// Reads up to dst.size() bytes at `offset`, returns how many it read (fewer only at the end of
// the file). Throws std::runtime_error on an I/O error.
using ReadAt = std::function<std::size_t(std::uint64_t offset, std::span<std::byte> dst)>;

// Indexes a tar of `file_size` bytes read through `read`. `name` (the file's path) starts every
// error message. Throws std::runtime_error "<name>: <reason> at byte <offset>".
std::vector<TarMember> index_tar(const ReadAt& read, std::uint64_t file_size,
                                 const std::string& name);

// index_tar over a File (errors name file.name()).
std::vector<TarMember> index_tar(const io::File& file);

// index_tar over the local file at `path`.
std::vector<TarMember> index_tar_file(const std::string& path);

}  // namespace stoker::detail
