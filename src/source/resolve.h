// The one place that turns a user's paths and URLs into io::Files (docs/storage.md): a source
// asks the resolver what a name is and gets files back, never asking whether they are local
// or in object storage. Local paths and directories are looked at on the file system; s3:// and
// http(s):// URLs go to the process's object cache (io/remote.h), the URLs of one data set
// resolved together (one listing per parent prefix, not a HEAD per object) while the processes
// of the node take turns (NodeTurn: the first lists and indexes, the others find its results in
// the caches), and their files indexed in parallel.
#pragma once

#include <cstddef>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "io/file.h"
#include "io/remote.h"
#include "stoker/object_storage.h"

namespace stoker::detail {

// What a name given by the user is: a local file (or nothing there yet), a local directory, an
// object (an http(s):// URL, or an s3:// URL whose last component ends in `suffix`), or an
// s3:// prefix (any other s3:// URL: the objects under it).
enum class PathKind { file, directory, object, prefix };
PathKind path_kind(const std::string& path, std::string_view suffix);

// The names among `paths` that are in object storage (objects and s3:// prefixes), in order;
// `in_storage[k]` says whether paths[k] is one of them.
std::vector<std::string> storage_urls(const std::vector<std::string>& paths,
                                      std::string_view suffix, std::vector<char>& in_storage);

// The files directly in the local directory `dir` whose names end in `suffix`, sorted by name
// (directories left out). Throws std::runtime_error naming `dir` when it cannot be listed.
std::vector<std::string> files_in(const std::string& dir, std::string_view suffix);

// The index cache directory of `o`: "" when o.index_cache is off, else o.index_cache_dir or
// its default, default_cache_dir(`kind`) (a WebDataset's "webdataset", VideoClips' "video").
std::string index_cache_dir(const ObjectStorageOptions& o, const std::string& kind = "indexes");

// The files of one data set. Thread safety: one thread; index() runs its calls on several.
class Resolver {
 public:
  // `o`: the object cache and index cache of the data set's URLs (and the objects another
  // process resolved them to). `kind`: the data set's kind ("records"), in the key of the
  // node's turn.
  Resolver(const ObjectStorageOptions& o, std::string kind);

  // The objects each URL names, in order (RemoteFiles::resolve: an object, or every object
  // ending in `suffix` directly under an s3:// prefix), as Files; the options' known objects
  // taken as they are, with no request. The node's turn (over the kind and every URL) is taken
  // first and held until the Resolver goes, so that the indexing that follows happens in turn
  // too. Throws io::ObjectStoreError naming the URL.
  std::vector<std::vector<io::FilePtr>> objects(const std::vector<std::string>& urls,
                                                std::string_view suffix);
  // The options' known objects when there are any (another process resolved `url`), else the
  // objects `url` names (objects() of the one URL).
  std::vector<io::FilePtr> objects_of(const std::string& url, std::string_view suffix);
  // Every object under the s3:// prefix `prefix` ('/' added), at any depth, in key order (the
  // known objects when there are any), in turn as objects() is.
  std::vector<detail::RemoteObject> list_all(const std::string& prefix);

  // A file: a local path (kept open, or opened for each read) or an object.
  static io::FilePtr open(const std::string& path, bool keep_open = true);
  io::FilePtr open(const detail::RemoteObject& object) const;

  // Runs index(i) for i in [0, n) on up to `threads` threads (each waits on its GETs), then
  // waits until every chunk they fetched is in the object cache, for the next process in turn.
  // Rethrows the first error (parallel_for).
  void index(std::size_t n, std::size_t threads, const std::function<void(std::size_t)>& index);

  // The object cache (null until a URL was resolved) and the index cache directory ("" none).
  const RemoteHandle& remote() const { return remote_; }
  const std::string& index_dir() const { return index_dir_; }

 private:
  void take_turn(const std::vector<std::string>& urls);
  ObjectStorageOptions options_;
  std::string kind_;
  std::string index_dir_;
  RemoteHandle remote_;
  std::optional<NodeTurn> turn_;
};

}  // namespace stoker::detail
