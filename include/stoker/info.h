// What this build of stoker is and which GPU support it found on this machine.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace stoker {

// The library's version ("0.1.0"): CMake's project version, which the Python package and the
// `stoker` command line report too.
std::string_view version();

// What the search for the CUDA runtime found. stoker needs no CUDA toolkit to build: the
// runtime (libcudart) is loaded with dlopen the first time a CUDA device is asked for, from
// (in order) the file or directory in $STOKER_CUDA_RUNTIME alone if set; else directories
// the Python package passes (the runtime the installed PyTorch wheel ships); the system's
// library path (libcudart.so.13, .so.12, .so.11.0); $CUDA_HOME/lib64, $CUDA_PATH/lib64 and
// /usr/local/cuda/lib64; the first runtime that sees a device is used. docs/install.md has the
// details.
struct CudaInfo {
  std::string library;                // the libcudart loaded; empty if none was found
  int runtime_version = 0;            // cudaRuntimeGetVersion: 12040 is CUDA 12.4
  int driver_version = 0;             // cudaDriverGetVersion; 0 without a driver
  int devices = 0;                    // devices that answer
  std::string why;                    // why no device answers; empty when one does
  std::vector<std::string> searched;  // where the runtime was looked for, in order

  bool available() const { return devices > 0; }
};

// Loads the runtime on the first call (the same search the loader's device = "cuda" does) and
// reports what it found; later calls return the same answer. Thread safety: any thread.
CudaInfo cuda_info();

// The table of CudaInfo's fields (as for_each_stat is Stats'): visit(name, value) for each, in
// declaration order; src/field_tables.cc checks at compile time that it names every member.
template <class Visit>
void for_each_field(const CudaInfo& info, Visit&& visit) {
  visit("library", info.library);
  visit("runtime_version", info.runtime_version);
  visit("driver_version", info.driver_version);
  visit("devices", info.devices);
  visit("why", info.why);
  visit("searched", info.searched);
}

}  // namespace stoker
