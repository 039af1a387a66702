// Small POSIX file helpers shared by the encoded sources.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace stoker::detail {

// Reads the whole file at `path` into `out` (resized to the file's size; its capacity reused).
// Throws std::runtime_error "<path>: <reason>".
void read_whole_file(const std::string& path, std::vector<std::byte>& out);

[[noreturn]] void throw_errno(const std::string& path, const std::string& what);

}  // namespace stoker::detail
