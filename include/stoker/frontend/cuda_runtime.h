// Where the CUDA runtime is searched for (src/device/cuda_runtime.h): what a front end adds to
// the search. Installed for front ends, unstable (include/stoker/frontend/README.md).
#pragma once

#include <string>
#include <vector>

namespace stoker::detail {

// Directories to search before the system's (the Python package passes the PyTorch wheel's).
// Only a search not yet made sees them. Thread safety: any thread.
void add_cuda_runtime_hints(const std::vector<std::string>& dirs);

}  // namespace stoker::detail
