#include "stoker/frontend/object_files.h"

#include "io/remote.h"

namespace stoker::detail {

std::vector<std::string> local_object_files(const std::vector<std::string>& urls,
                                            const std::string& suffix) {
  auto files = remote_files("", kDefaultObjectCacheBytes);
  std::vector<const RemoteObject*> objects;
  const auto resolved = files->resolve(urls, suffix);
  for (const auto& per_url : resolved) {
    for (const auto& o : per_url) objects.push_back(&o);
  }
  std::vector<std::string> out(objects.size());
  constexpr std::size_t kDownloads = 8;  // objects fetched at once (each a stream of ranges)
  parallel_for(objects.size(), kDownloads,
               [&](std::size_t i) { out[i] = files->local_file(*objects[i]); });
  return out;
}

}  // namespace stoker::detail
