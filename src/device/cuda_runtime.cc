#include "device/cuda_runtime.h"

#include <dlfcn.h>
#include <link.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <utility>

#include "stoker/frontend/environment.h"
#include "stoker/frontend/mutex.h"

namespace stoker::detail {
namespace {

// Newest first, in each place.
constexpr const char* kSonames[] = {"libcudart.so.13", "libcudart.so.12", "libcudart.so.11.0",
                                    "libcudart.so"};

std::string loaded_path(void* handle, const std::string& fallback) {
  link_map* map = nullptr;
  if (dlinfo(handle, RTLD_DI_LINKMAP, &map) == 0 && map && map->l_name && *map->l_name) {
    return map->l_name;
  }
  return fallback;
}

// Resolves every entry point of `handle` into `rt`; false with the first missing one named.
bool resolve(void* handle, CudaRuntime& rt, std::string& why) {
#define STOKER_CUDA_RESOLVE(name, result, params)                     \
  rt.name = reinterpret_cast<result(*) params>(dlsym(handle, #name)); \
  if (!rt.name) {                                                     \
    why = "it has no " #name;                                         \
    return false;                                                     \
  }
  STOKER_CUDA_FUNCTIONS(STOKER_CUDA_RESOLVE)
#undef STOKER_CUDA_RESOLVE
  return true;
}

// Asks a loaded runtime what it sees. Without a driver or a device, cudaGetDeviceCount fails
// and its message is the reason; the runtime stays usable for the report.
void probe(CudaRuntime& rt) {
  CudaInfo& info = rt.info;
  rt.cudaRuntimeGetVersion(&info.runtime_version);
  if (rt.cudaDriverGetVersion(&info.driver_version) != kCudaSuccess) info.driver_version = 0;
  const CudaError status = rt.cudaGetDeviceCount(&info.devices);
  if (status != kCudaSuccess) {
    rt.cudaGetLastError();  // clear it, so the next call does not report it again
    info.devices = 0;
    info.why = rt.cudaGetErrorString(status);
  } else if (info.devices == 0) {
    info.why = "the CUDA runtime sees no device";
  }
}

struct Hints {
  Mutex mu;
  std::vector<std::string> dirs STOKER_GUARDED_BY(mu);
};

Hints& hints() {
  static auto* h = new Hints;  // never destroyed, as the runtime below
  return *h;
}

}  // namespace

std::shared_ptr<const CudaRuntime> load_cuda_runtime(const std::vector<std::string>& places) {
  std::vector<std::string> searched;
  std::string failures;                // libraries that exist but would not do, with why
  std::vector<void*> seen;             // one library may be found in two places
  std::shared_ptr<CudaRuntime> first;  // the first that loaded, if none sees a device
  for (const auto& place : places) {
    searched.push_back(place.empty() ? "the system library path" : place);
    std::vector<std::string> candidates;
    std::error_code ec;
    if (place.empty() || std::filesystem::is_directory(place, ec)) {
      for (const char* soname : kSonames) {
        candidates.push_back(place.empty() ? soname : place + "/" + soname);
      }
    } else {
      candidates.push_back(place);
    }
    for (const auto& candidate : candidates) {
      // A bare soname is also matched against the libraries already loaded (PyTorch's).
      const bool path = candidate.find('/') != std::string::npos;
      if (path && !std::filesystem::exists(candidate, ec)) continue;
      void* handle = dlopen(candidate.c_str(), RTLD_NOW | RTLD_LOCAL);
      if (!handle) {
        // A missing soname is the normal case on the system path; anything else is news.
        if (path) failures += "; " + std::string(dlerror());
        continue;
      }
      // Never unloaded, used or not: cudart's exit handlers must find it mapped.
      if (std::find(seen.begin(), seen.end(), handle) != seen.end()) continue;
      seen.push_back(handle);
      auto found = std::make_shared<CudaRuntime>();
      std::string why;
      if (!resolve(handle, *found, why)) {
        failures += "; " + loaded_path(handle, candidate) + ": " + why;
        continue;
      }
      found->info.library = loaded_path(handle, candidate);
      probe(*found);
      // A runtime newer than the driver sees no device where an older one may: go on.
      if (found->info.available()) {
        found->info.searched = std::move(searched);
        return found;
      }
      if (!first) first = std::move(found);
    }
  }
  if (first) {
    first->info.searched = std::move(searched);
    return first;
  }
  auto none = std::make_shared<CudaRuntime>();
  std::string where;
  for (const auto& s : searched) where += (where.empty() ? "" : ", ") + s;
  none->info.why = "no CUDA runtime (libcudart) found in " + where + failures;
  none->info.searched = std::move(searched);
  return none;
}

std::vector<std::string> default_cuda_runtime_places(const std::vector<std::string>& hint_dirs) {
  if (auto only = detail::env_nonempty("STOKER_CUDA_RUNTIME")) return {*only};
  std::vector<std::string> places = hint_dirs;
  places.emplace_back();  // the system library path
  for (const char* var : {"CUDA_HOME", "CUDA_PATH"}) {
    if (auto root = detail::env_nonempty(var)) places.push_back(*root + "/lib64");
  }
  places.emplace_back("/usr/local/cuda/lib64");
  return places;
}

void add_cuda_runtime_hints(const std::vector<std::string>& dirs) {
  Hints& h = hints();
  MutexLock lock(h.mu);
  h.dirs.insert(h.dirs.end(), dirs.begin(), dirs.end());
}

std::shared_ptr<const CudaRuntime> cuda_runtime() {
  // Never destroyed, like the library itself: loaders may ask during static destruction.
  static Mutex& mu = *new Mutex;
  static const std::shared_ptr<const CudaRuntime>* runtime STOKER_GUARDED_BY(mu) = nullptr;
  {
    MutexLock lock(mu);
    if (runtime != nullptr) return *runtime;
  }
  Hints& h = hints();
  std::vector<std::string> dirs;
  {
    MutexLock lock(h.mu);
    dirs = h.dirs;
  }
  // The places read the environment, which in Python may wait for the GIL (environment.h):
  // with no lock held that a thread holding the GIL could wait on.
  const std::vector<std::string> places = default_cuda_runtime_places(dirs);
  MutexLock lock(mu);
  if (runtime == nullptr) {
    runtime = new std::shared_ptr<const CudaRuntime>(load_cuda_runtime(places));
  }
  return *runtime;
}

}  // namespace stoker::detail

namespace stoker {

CudaInfo cuda_info() { return detail::cuda_runtime()->info; }

}  // namespace stoker
