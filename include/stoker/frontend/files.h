// Reading a whole local file, as the encoded sources do (src/source/file_util.h); `stoker pack`
// uses it. Installed for front ends, unstable (include/stoker/frontend/README.md).
#pragma once

#include <cstddef>
#include <string>
#include <vector>

namespace stoker::detail {

// Reads the whole file at `path` into `out` (resized to the file's size; its capacity reused).
// Throws std::runtime_error "<path>: <reason>".
void read_whole_file(const std::string& path, std::vector<std::byte>& out);

}  // namespace stoker::detail
