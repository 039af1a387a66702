#include "source/resolve.h"

#include <algorithm>
#include <filesystem>
#include <stdexcept>
#include <system_error>
#include <utility>

namespace stoker::detail {
namespace fs = std::filesystem;

PathKind path_kind(const std::string& path, std::string_view suffix) {
  if (is_url(path)) {
    if (!path.starts_with("s3://")) return PathKind::object;
    const std::string name = path.substr(path.find_last_of('/') + 1);
    return name.size() > suffix.size() && name.ends_with(suffix) ? PathKind::object
                                                                 : PathKind::prefix;
  }
  std::error_code ec;
  return fs::is_directory(path, ec) ? PathKind::directory : PathKind::file;
}

std::vector<std::string> storage_urls(const std::vector<std::string>& paths,
                                      std::string_view suffix, std::vector<char>& in_storage) {
  std::vector<std::string> urls;
  in_storage.assign(paths.size(), 0);
  for (std::size_t k = 0; k < paths.size(); ++k) {
    const PathKind kind = path_kind(paths[k], suffix);
    in_storage[k] = kind == PathKind::object || kind == PathKind::prefix;
    if (in_storage[k]) urls.push_back(paths[k]);
  }
  return urls;
}

std::vector<std::string> files_in(const std::string& dir, std::string_view suffix) {
  std::vector<std::string> out;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    const std::string name = e.path().filename().string();
    if (name.ends_with(suffix) && !e.is_directory(ec)) out.push_back(e.path().string());
  }
  if (ec) throw std::runtime_error(dir + ": cannot list: " + ec.message());
  std::sort(out.begin(), out.end());
  return out;
}

std::string index_cache_dir(const ObjectStorageOptions& o, const std::string& kind) {
  if (!o.index_cache) return {};
  return o.index_cache_dir.empty() ? default_cache_dir(kind) : o.index_cache_dir;
}

Resolver::Resolver(const ObjectStorageOptions& o, std::string kind)
    : options_(o), kind_(std::move(kind)), index_dir_(index_cache_dir(o)) {}

void Resolver::take_turn(const std::vector<std::string>& urls) {
  if (!remote_) remote_ = RemoteHandle(options_.object_cache_dir, options_.object_cache_bytes);
  if (turn_) return;
  std::string key = kind_;
  for (const auto& u : urls) key += '\n' + u;
  turn_.emplace(index_dir_, key);
}

std::vector<std::vector<io::FilePtr>> Resolver::objects(const std::vector<std::string>& urls,
                                                        std::string_view suffix) {
  take_turn(urls);
  std::vector<RemoteObject> known;
  for (const auto& k : options_.known_objects) known.push_back({k.url, k.size, k.etag});
  std::vector<std::vector<io::FilePtr>> out;
  for (const auto& per_url : remote_->resolve(urls, suffix, known, turn_->shared)) {
    auto& files = out.emplace_back();
    for (const auto& o : per_url) files.push_back(open(o));
  }
  return out;
}

std::vector<io::FilePtr> Resolver::objects_of(const std::string& url, std::string_view suffix) {
  if (options_.known_objects.empty()) return objects({url}, suffix).at(0);
  take_turn({url});
  std::vector<io::FilePtr> out;
  for (const auto& k : options_.known_objects)
    out.push_back(open(RemoteObject{k.url, k.size, k.etag}));
  return out;
}

std::vector<RemoteObject> Resolver::list_all(const std::string& prefix) {
  take_turn({prefix});
  if (!options_.known_objects.empty()) {
    std::vector<RemoteObject> out;
    for (const auto& k : options_.known_objects) out.push_back({k.url, k.size, k.etag});
    return out;
  }
  return remote_->list_all(prefix, turn_->shared);
}

io::FilePtr Resolver::open(const std::string& path, bool keep_open) {
  return io::open_local(path, keep_open);
}

io::FilePtr Resolver::open(const RemoteObject& object) const {
  return io::open_object(object, remote_);
}

void Resolver::index(std::size_t n, std::size_t threads,
                     const std::function<void(std::size_t)>& index) {
  parallel_for(n, threads, index);
  if (remote_) remote_->flush_stores();  // the chunks read for the indexes, for the next in turn
}

}  // namespace stoker::detail
