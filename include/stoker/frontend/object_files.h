// Whole objects of object storage as local files (src/io/remote.h): what the Python
// package's Parquet data set reads s3:// and http(s):// URLs through. Installed for front
// ends, unstable (include/stoker/frontend/README.md).
#pragma once

#include <string>
#include <vector>

namespace stoker::detail {

// The objects named by `urls` (objects, prefixes or brace patterns; with a prefix, the objects
// under it whose names end in `suffix`), each downloaded whole into the process's disk cache
// (its default directory and size), 8 at a time: their local paths, in listing order.
// Throws std::runtime_error naming the URL and the reason. Blocks; any thread.
std::vector<std::string> local_object_files(const std::vector<std::string>& urls,
                                            const std::string& suffix);

}  // namespace stoker::detail
