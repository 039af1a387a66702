// Objects in object storage (s3:// and http(s):// URLs) as the readers see them: resolved once
// (a listing per prefix, not a HEAD per object), then read at any offset through fixed-size
// chunks that are fetched with one range GET each and kept in the local disk cache
// (docs/storage.md). Reads of neighbouring samples of one shard fall in one chunk, so they
// cost one GET between them; a chunk that several threads miss at once is fetched once.
#pragma once

#include <sys/types.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <future>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "stoker/frontend/mutex.h"
#include "stoker/webdataset.h"

namespace stoker::io {
class ObjectStore;
class DiskCache;
}  // namespace stoker::io

namespace stoker::detail {

// "s3://...", "http://...", "https://...".
bool is_url(std::string_view path);

struct RemoteObject {
  std::string url;
  std::uint64_t size = 0;
  std::string etag;  // "" when the server sent none
};

// The default directory of the object cache: $STOKER_CACHE_DIR/objects, else
// $XDG_CACHE_HOME/stoker/objects, else ~/.cache/stoker/objects ("" when none of them is set).
std::string default_object_cache_dir();
inline constexpr std::uint64_t kDefaultObjectCacheBytes = 10ull << 30;
inline constexpr std::size_t kRemoteChunkBytes = 8u << 20;

// Runs fn(0) ... fn(n - 1) on up to `threads` threads; rethrows the first exception (by index
// order among those that failed) after every call has returned.
void parallel_for(std::size_t n, std::size_t threads, const std::function<void(std::size_t)>& fn);

// One per process and cache directory (remote_files()): an ObjectStore (its settings from the
// environment and ~/.aws) and the disk cache. Thread safety: every member from any thread.
class RemoteFiles {
 public:
  RemoteFiles(const std::string& cache_dir, std::uint64_t cache_bytes);
  ~RemoteFiles();

  // The objects each URL names, in order. A URL whose last path component ends in `suffix`
  // (".tar") is one object; any other s3:// URL is a prefix: every object directly under
  // PREFIX/ whose name ends in `suffix`, in key order (an error if there is none). s3:// objects
  // are resolved by one listing of each distinct parent prefix (not a HEAD each); http(s)://
  // objects by a HEAD each (in parallel). Throws io::ObjectStoreError naming the URL.
  // A URL found in `known` is taken from there, with no request.
  std::vector<std::vector<RemoteObject>> resolve(const std::vector<std::string>& urls,
                                                 std::string_view suffix,
                                                 const std::vector<RemoteObject>& known = {});

  // Reads bytes [offset, offset + n) of the object into dst: from the disk cache where it holds
  // the chunks, else with one range GET per chunk (kRemoteChunkBytes, aligned), each stored in
  // the cache. Without a cache (cache_bytes 0) exactly the range is fetched. Throws
  // io::ObjectStoreError (the URL and the HTTP status in its message) or std::runtime_error for
  // a range past the object's end.
  void read(const RemoteObject& object, std::uint64_t offset, std::byte* dst, std::size_t n);

  // The object as a whole local file, for readers that need one (Parquet through pyarrow):
  // DIR/files/<hash of URL, size and ETag>-<its name>, where DIR is the cache directory,
  // downloaded by a stream of range GETs when it is not there yet (written to a temporary name,
  // then renamed). Files there that this process did not hand out are deleted, least recently
  // used first, to keep them within the cache's byte cap. Throws std::runtime_error without a
  // cache directory, io::ObjectStoreError naming the URL.
  std::string local_file(const RemoteObject& object);

  using Counters = ObjectStorageCounters;  // stoker/webdataset.h
  Counters counters() const;
  const std::string& cache_dir() const { return cache_dir_; }

 private:
  using Chunk = std::shared_ptr<const std::vector<std::byte>>;
  Chunk fetch_chunk(const RemoteObject& object, std::uint64_t offset, std::size_t length,
                    const std::string& key);

  std::string cache_dir_;
  std::unique_ptr<io::ObjectStore> store_;
  std::unique_ptr<io::DiskCache> cache_;  // null: no cache
  std::atomic<std::uint64_t> hits_{0}, hit_bytes_{0}, misses_{0};
  std::atomic<std::uint64_t> chunk_fetches_{0}, fetch_ns_{0}, wait_ns_{0};
  Mutex mu_;
  std::map<std::string, std::shared_future<Chunk>> in_flight_ STOKER_GUARDED_BY(mu_);
  std::uint64_t cache_bytes_ = 0;
  std::vector<std::string> handed_out_ STOKER_GUARDED_BY(mu_);  // local_file()s: never evicted
};

// The RemoteFiles of this process for a cache directory ("" for the default) and cap (0: no
// cache), made on first use and kept for the life of the process (its transfer thread
// included). A process forked after it was made gets its own on first use in the child, so
// worker processes never touch their parent's transfer thread.
std::shared_ptr<RemoteFiles> remote_files(const std::string& cache_dir, std::uint64_t cache_bytes);

}  // namespace stoker::detail
