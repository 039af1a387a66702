#include "io/remote.h"

#include <fcntl.h>
#include <pthread.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <optional>
#include <sstream>
#include <stdexcept>
#include <thread>
#include <tuple>
#include <unordered_map>

#include "io/disk_cache.h"
#include "io/object_store.h"
#include "source/file_util.h"
#include "stoker/frontend/environment.h"
#include "stoker/frontend/host_share.h"
#include "stoker/frontend/log.h"
#include "stoker/frontend/object_files.h"

namespace stoker::detail {
namespace {

namespace fs = std::filesystem;
using io::ObjectStoreError;

// Objects named one by one under a parent prefix are looked up by a HEAD each when there are
// at most this many of them (a listing might return far more keys than asked for), else by one
// listing of the parent.
constexpr std::size_t kHeadAtMost = 4;
constexpr std::size_t kResolveThreads = 16;

std::uint64_t elapsed_ns(std::chrono::steady_clock::time_point since) {
  return static_cast<std::uint64_t>(
      std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - since)
          .count());
}

std::uint64_t fnv1a(std::string_view s) {
  std::uint64_t h = 1469598103934665603ull;
  for (unsigned char c : s) {
    h ^= c;
    h *= 1099511628211ull;
  }
  return h;
}

// A listing shared by the processes of a job on a node: DIR/<hash>.lst, holding a header line,
// the prefix, the job and the endpoint (a file whose header differs is not used), then
// "SIZE ETAG_BYTES KEY_BYTES\nETAGKEY\n" per object (keys may hold any byte).
constexpr std::string_view kListingMagic = "stoker-listing 1";

std::string listing_file(const std::string& dir, const std::string& prefix, const std::string& job,
                         const std::string& endpoint) {
  char name[32];
  std::snprintf(name, sizeof name, "%016llx.lst",
                static_cast<unsigned long long>(fnv1a(prefix + '\n' + job + '\n' + endpoint)));
  return (fs::path(dir) / name).string();
}

std::string listing_header(const std::string& prefix, const std::string& job,
                           const std::string& endpoint) {
  return std::string(kListingMagic) + '\n' + prefix + '\n' + job + '\n' + endpoint + '\n';
}

std::optional<std::vector<io::ObjectInfo>> load_listing(const std::string& file,
                                                        const std::string& header,
                                                        const std::string& bucket) {
  std::ifstream in(file, std::ios::binary);
  if (!in) return std::nullopt;
  std::string got(header.size(), '\0');
  if (!in.read(got.data(), static_cast<std::streamsize>(got.size())) || got != header) {
    return std::nullopt;
  }
  std::vector<io::ObjectInfo> out;
  std::uint64_t size = 0;
  std::size_t etag_bytes = 0, key_bytes = 0;
  while (in >> size >> etag_bytes >> key_bytes) {
    if (in.get() != '\n' || etag_bytes > 4096 || key_bytes > 65536) return std::nullopt;
    io::ObjectInfo o;
    o.size = size;
    o.etag.resize(etag_bytes);
    o.key.resize(key_bytes);
    if (!in.read(o.etag.data(), static_cast<std::streamsize>(etag_bytes)) ||
        !in.read(o.key.data(), static_cast<std::streamsize>(key_bytes)) || in.get() != '\n') {
      return std::nullopt;  // cut short: listed again
    }
    o.url = "s3://" + bucket + "/" + o.key;
    out.push_back(std::move(o));
  }
  if (!in.eof()) return std::nullopt;
  return out;
}

// A failure leaves no file (the next process lists).
void save_listing(const std::string& file, const std::string& header,
                  const std::vector<io::ObjectInfo>& objects) {
  std::ostringstream out;
  out << header;
  for (const auto& o : objects) {
    out << o.size << ' ' << o.etag.size() << ' ' << o.key.size() << '\n' << o.etag << o.key << '\n';
  }
  detail::replace_file(file, out.str());
}

// Whether this process shares its object caches with others reading the same blocks
// (share_object_caches(); every forked process).
std::atomic<bool>& caches_shared() {
  static std::atomic<bool> shared{false};
  return shared;
}
[[maybe_unused]] const bool kForkedShares = [] {
  pthread_atfork(nullptr, nullptr, [] { caches_shared().store(true); });
  return true;
}();

}  // namespace

void share_object_caches() { caches_shared().store(true); }

bool is_url(std::string_view path) {
  return path.starts_with("s3://") || path.starts_with("http://") || path.starts_with("https://");
}

std::string default_object_cache_dir() { return default_cache_dir("objects"); }

RemoteFiles::RemoteFiles(const std::string& cache_dir, std::uint64_t cache_bytes)
    : cache_dir_(cache_bytes > 0 ? cache_dir : std::string()),
      store_(std::make_unique<io::ObjectStore>()),
      cache_bytes_(cache_bytes) {
  if (cache_bytes > 0) {
    const std::size_t ranks = host_share().local_ranks;
    ahead_limit_ = std::min<std::uint64_t>(kAheadBytes, cache_bytes / 2 / ranks);
    if (ranks == 1 && cache_bytes <= kHeldBytes) held_ = std::make_unique<HeldBlocks>(cache_bytes);
  }
  if (!cache_dir_.empty()) {
    try {
      cache_ = std::make_unique<io::DiskCache>(cache_dir_, cache_bytes);
    } catch (const std::exception&) {
      cache_dir_.clear();  // a cache that cannot be made is no cache: reads fetch their ranges
      held_.reset();
    }
  }
}

RemoteFiles::~RemoteFiles() {
  // Closing the store fails the GETs still running (each fetch ahead's on_done has run when it
  // returns); the finisher stores the chunks held that were fetched, forgets the rest, and ends.
  store_.reset();
  std::thread finisher;
  {
    MutexLock lock(mu_);
    stopping_ = true;
    finisher = std::move(finisher_);
  }
  ahead_cv_.notify_all();
  if (finisher.joinable()) finisher.join();
}

std::vector<std::vector<RemoteObject>> RemoteFiles::resolve(const std::vector<std::string>& urls,
                                                            std::string_view suffix,
                                                            const std::vector<RemoteObject>& known,
                                                            const SharedListings& shared) {
  struct Item {
    io::ObjectUrl url;
    bool prefix = false;
    std::string parent;                   // s3: the listing that holds it ("s3://b/dir/")
    const RemoteObject* known = nullptr;  // resolved already
  };
  std::vector<Item> items;
  std::map<std::string, std::vector<std::size_t>> by_parent;  // objects named one by one
  for (const auto& u : urls) {
    Item it;
    it.url = io::parse_object_url(u);  // std::invalid_argument for a malformed URL
    for (const auto& k : known) {
      if (k.url == u) it.known = &k;
    }
    if (it.known != nullptr) {
      items.push_back(std::move(it));
      continue;
    }
    if (it.url.scheme == io::ObjectUrl::Scheme::kS3) {
      const std::size_t slash = it.url.key.rfind('/');
      const std::string name =
          slash == std::string::npos ? it.url.key : it.url.key.substr(slash + 1);
      it.prefix = name.size() <= suffix.size() || !name.ends_with(suffix);
      if (it.prefix) {
        it.parent = "s3://" + it.url.bucket + "/" + it.url.key;
        if (!it.url.key.empty() && !it.url.key.ends_with('/')) it.parent += '/';
      } else {
        it.parent = "s3://" + it.url.bucket + "/" +
                    (slash == std::string::npos ? "" : it.url.key.substr(0, slash + 1));
        by_parent[it.parent].push_back(items.size());
      }
    }
    items.push_back(std::move(it));
  }
  // The listings to make: every prefix, and the parents of more than kHeadAtMost named objects.
  std::vector<std::string> listings;
  for (const auto& it : items) {
    const bool list =
        it.known == nullptr && (it.prefix || (it.url.scheme == io::ObjectUrl::Scheme::kS3 &&
                                              by_parent[it.parent].size() > kHeadAtMost));
    if (list && std::find(listings.begin(), listings.end(), it.parent) == listings.end()) {
      listings.push_back(it.parent);
    }
  }
  std::vector<std::vector<io::ObjectInfo>> listed(listings.size());
  parallel_for(listings.size(), kResolveThreads,
               [&](std::size_t i) { listed[i] = listing(listings[i], shared); });
  std::vector<std::vector<RemoteObject>> out(items.size());
  parallel_for(items.size(), kResolveThreads, [&](std::size_t i) {
    const Item& it = items[i];
    if (it.known != nullptr) {
      out[i].push_back(*it.known);
      return;
    }
    const auto l = std::find(listings.begin(), listings.end(), it.parent);
    if (l == listings.end()) {  // http(s), or one of a few s3 objects: a HEAD
      io::ObjectInfo info = store_->head(it.url.url);
      out[i].push_back({it.url.url, info.size, info.etag});
      return;
    }
    const auto& objects = listed[static_cast<std::size_t>(l - listings.begin())];
    const std::string key_prefix = it.parent.substr(5 + it.url.bucket.size() + 1);
    if (!it.prefix) {
      for (const auto& o : objects) {
        if (o.key == it.url.key) {
          out[i].push_back({it.url.url, o.size, o.etag});
          return;
        }
      }
      throw ObjectStoreError(
          ObjectStoreError::Kind::kNotFound, it.url.url, 404, "NoSuchKey",
          it.url.url + ": no such object (not in the listing of " + it.parent + ")");
    }
    for (const auto& o : objects) {
      const std::string_view rest = std::string_view(o.key).substr(key_prefix.size());
      if (rest.find('/') == std::string_view::npos && rest.size() > suffix.size() &&
          rest.ends_with(suffix)) {
        out[i].push_back({o.url, o.size, o.etag});
      }
    }
    if (out[i].empty()) {
      throw ObjectStoreError(ObjectStoreError::Kind::kNotFound, it.url.url, 404, "",
                             it.parent + ": no objects named *" + std::string(suffix) +
                                 " directly under this prefix (" + std::to_string(objects.size()) +
                                 " objects under it in all)");
    }
  });
  return out;
}

std::vector<io::ObjectInfo> RemoteFiles::listing(const std::string& prefix,
                                                 const SharedListings& shared) {
  if (shared.dir.empty() || shared.job.empty()) return store_->list(prefix);
  const std::string& endpoint = store_->settings().endpoint;
  const std::string file = listing_file(shared.dir, prefix, shared.job, endpoint);
  const std::string header = listing_header(prefix, shared.job, endpoint);
  const std::string bucket = io::parse_object_url(prefix).bucket;
  if (auto cached = load_listing(file, header, bucket)) return std::move(*cached);
  std::vector<io::ObjectInfo> listed = store_->list(prefix);
  save_listing(file, header, listed);
  return listed;
}

std::vector<RemoteObject> RemoteFiles::list_all(const std::string& prefix,
                                                const SharedListings& shared) {
  const io::ObjectUrl u = io::parse_object_url(prefix);  // std::invalid_argument if malformed
  if (u.scheme != io::ObjectUrl::Scheme::kS3) {
    throw std::invalid_argument(prefix +
                                ": an http(s) URL has no listing; an image folder in object "
                                "storage is an s3:// prefix");
  }
  std::string parent = "s3://" + u.bucket + "/" + u.key;
  if (!u.key.empty() && !u.key.ends_with('/')) parent += '/';
  std::vector<RemoteObject> out;
  for (auto& o : listing(parent, shared)) {
    out.push_back({std::move(o.url), o.size, std::move(o.etag)});
  }
  return out;
}

namespace {

// Throws std::runtime_error for bytes [offset, offset + n) past the object's end.
void check_range(const RemoteObject& object, std::uint64_t offset, std::size_t n) {
  if (offset > object.size || n > object.size - offset) {
    throw std::runtime_error(object.url + ": bytes [" + std::to_string(offset) + ", " +
                             std::to_string(offset + n) + ") lie past the object's end (" +
                             std::to_string(object.size) + " bytes when it was listed)");
  }
}

// The cache chunk of `object` that byte `offset` (< its size) lies in: its start and length.
std::pair<std::uint64_t, std::size_t> chunk_at(const RemoteObject& object, std::uint64_t offset) {
  if (object.chunk_starts != nullptr && !object.chunk_starts->empty()) {
    const auto& starts = *object.chunk_starts;
    const auto next = std::upper_bound(starts.begin(), starts.end(), offset);
    const std::uint64_t begin = next == starts.begin() ? 0 : *(next - 1);
    const std::uint64_t end = next == starts.end() ? object.size : *next;
    return {begin, static_cast<std::size_t>(end - begin)};
  }
  const std::uint64_t begin = offset / kRemoteChunkBytes * kRemoteChunkBytes;
  return {begin, static_cast<std::size_t>(
                     std::min<std::uint64_t>(kRemoteChunkBytes, object.size - begin))};
}

}  // namespace

void RemoteFiles::read(const RemoteObject& object, std::uint64_t offset, std::byte* dst,
                       std::size_t n) {
  if (n == 0) return;
  check_range(object, offset, n);
  if (!cache_) {  // the range fetched ahead, or the read's own range: one GET
    if (!take_range(object, offset, dst, n)) read_uncached(object, offset, dst, n);
    return;
  }
  const std::uint64_t end = offset + n;
  for (std::uint64_t at = offset; at < end;) {
    const auto [c, length] = chunk_at(object, at);
    at = c + length;
    const std::uint64_t lo = std::max(offset, c), hi = std::min(end, c + length);
    std::byte* to = dst + (lo - offset);
    const auto part = static_cast<std::size_t>(hi - lo);
    const std::string key = io::DiskCache::key(object.url, c, length, object.etag);
    if (const Chunk held = held_ ? held_->find(key) : nullptr) {
      std::memcpy(to, held.get() + (lo - c), part);
      ++hits_;
      hit_bytes_ += part;
      forget_unread(key);
      continue;
    }
    if (cache_->get_range(key, length, lo - c, to, part)) {
      ++hits_;
      hit_bytes_ += part;
      forget_unread(key);
      continue;
    }
    ++misses_;
    const auto waiting = std::chrono::steady_clock::now();
    const Chunk chunk = fetch_chunk(object, c, length, key);
    wait_ns_ += elapsed_ns(waiting);
    std::memcpy(to, chunk.get() + (lo - c), part);
  }
}

void RemoteFiles::done_with(const RemoteObject& object, std::uint64_t offset) {
  if (!cache_ || offset >= object.size) return;
  const auto [c, length] = chunk_at(object, offset);
  const std::string key = io::DiskCache::key(object.url, c, length, object.etag);
  let_go(key);
  cache_->demote(key);
}

void RemoteFiles::let_go(const RemoteObject& object) {
  if (!held_ || object.chunk_starts == nullptr) return;
  for (const std::uint64_t start : *object.chunk_starts) {
    if (start >= object.size) break;
    const auto [c, length] = chunk_at(object, start);
    let_go(io::DiskCache::key(object.url, c, length, object.etag));
  }
}

void RemoteFiles::let_go(const std::string& key) {
  {
    MutexLock lock(mu_);  // read to its end before the finisher kept it: not to be kept
    if (auto it = ahead_.find(key); it != ahead_.end()) it->second.finished = true;
  }
  forget_unread(key);
  if (held_) held_->release(key);
}

bool RemoteFiles::holds(const RemoteObject& object) const {
  return held_ && object.done_with_each && !caches_shared().load(std::memory_order_relaxed);
}

void RemoteFiles::keep(const std::string& key, const std::shared_ptr<std::byte[]>& data,
                       std::size_t length, bool hold) {
  const auto spill = [this](const std::string& k, const std::byte* d, std::size_t n) {
    cache_->put(k, d, n);
  };
  if (!hold || !held_->hold(key, data, length, spill)) cache_->put(key, data.get(), length);
}

void RemoteFiles::forget_unread(const std::string& key) {
  MutexLock lock(mu_);
  if (auto it = unread_.find(key); it != unread_.end()) {
    unread_bytes_ -= it->second;
    unread_.erase(it);
  }
}

bool RemoteFiles::room_ahead(std::uint64_t bytes) {
  if (ahead_bytes_ + unread_bytes_ + bytes > ahead_limit_) {
    for (auto it = unread_.begin(); it != unread_.end();) {
      if (cache_->contains(it->first) || (held_ && held_->find(it->first))) {
        ++it;
      } else {  // let go unread (pushed out, or another process's turn): no longer held
        unread_bytes_ -= it->second;
        it = unread_.erase(it);
      }
    }
  }
  return ahead_bytes_ + unread_bytes_ + bytes <= ahead_limit_;
}

void RemoteFiles::read_uncached(const RemoteObject& object, std::uint64_t offset, std::byte* dst,
                                std::size_t n) {
  if (n == 0) return;
  check_range(object, offset, n);
  const auto started = std::chrono::steady_clock::now();
  store_->read(object.url, offset, n, dst);
  const std::uint64_t ns = elapsed_ns(started);
  wait_ns_ += ns;
  fetch_ns_ += ns;
  ++chunk_fetches_;
}

RemoteFiles::Chunk RemoteFiles::fetch_chunk(const RemoteObject& object, std::uint64_t offset,
                                            std::size_t length, const std::string& key) {
  std::promise<Chunk> promise;
  {
    MutexLock lock(mu_);
    if (auto it = ahead_.find(key); it != ahead_.end()) {
      it->second.read = true;
      const Ahead ahead = it->second;
      MutexUnlock unlocked(mu_);
      ahead.done.get();  // fetched ahead: wait for that GET (its error is this read's)
      return ahead.data;
    }
    if (auto it = in_flight_.find(key); it != in_flight_.end()) {
      std::shared_future<Chunk> theirs = it->second;
      MutexUnlock unlocked(mu_);
      return theirs.get();  // another thread is fetching it: one GET between us
    }
    in_flight_.emplace(key, promise.get_future().share());
  }
  std::shared_future<Chunk> result;
  try {
    std::shared_ptr<std::byte[]> buf = std::make_shared_for_overwrite<std::byte[]>(length);
    // Another thread may have fetched and stored it between our miss and now.
    if (const Chunk held = held_ ? held_->find(key) : nullptr) {
      std::memcpy(buf.get(), held.get(), length);
    } else if (!cache_->get(key, buf.get(), length)) {
      const auto started = std::chrono::steady_clock::now();
      store_->read(object.url, offset, length, buf.get());
      fetch_ns_ += elapsed_ns(started);
      ++chunk_fetches_;
      // Not stored here: a cache write costs 0.1-1 ms of file system work, and 1,000 shards
      // indexed at once waited for theirs (a cold first batch 1.6-2.5 s with the cache on ext4,
      // 0.9 s on tmpfs).
      store_later(key, buf, length, holds(object));
    }
    promise.set_value(std::move(buf));
  } catch (...) {
    promise.set_exception(std::current_exception());
  }
  {
    MutexLock lock(mu_);
    auto it = in_flight_.find(key);
    result = it->second;
    in_flight_.erase(it);
  }
  return result.get();
}

bool RemoteFiles::prefetch(const RemoteObject& object, std::uint64_t offset, std::size_t n) {
  const Range range{offset, n};
  return prefetch(object, std::span<const Range>(&range, 1));
}

bool RemoteFiles::prefetch(const RemoteObject& object, std::span<const Range> ranges) {
  if (!cache_) {
    // Runs of ranges at most kCoalesceGap apart, each fetched by one GET.
    std::vector<Range> sorted;
    for (const auto& [offset, n] : ranges) {
      if (n > 0 && offset < object.size && n <= object.size - offset) sorted.push_back({offset, n});
    }
    std::sort(sorted.begin(), sorted.end());
    sorted.erase(std::unique(sorted.begin(), sorted.end()), sorted.end());
    const std::uint64_t run_cap = std::min<std::uint64_t>(kRemoteChunkBytes, kAheadBytes / 4);
    for (std::size_t i = 0; i < sorted.size();) {
      std::uint64_t end = sorted[i].first + sorted[i].second;
      std::size_t j = i + 1;
      for (; j < sorted.size() && sorted[j].first <= end + kCoalesceGap &&
             std::max(end, sorted[j].first + sorted[j].second) - sorted[i].first <= run_cap;
           ++j) {
        end = std::max(end, sorted[j].first + sorted[j].second);
      }
      const auto run = std::span(sorted).subspan(i, j - i);
      const bool taken = run.size() == 1
                             ? prefetch_range(object, run[0].first, run[0].second)
                             : prefetch_run(object, {run[0].first, end - run[0].first}, run);
      if (!taken) return false;
      i = j;
    }
    return true;
  }
  // The chunks the ranges lie in, in the object's order, each once.
  std::vector<Range> chunks;
  for (const auto& [offset, n] : ranges) {
    if (n == 0 || offset >= object.size) continue;
    const std::uint64_t end = std::min<std::uint64_t>(offset + n, object.size);
    for (std::uint64_t at = offset; at < end;) {
      chunks.push_back(chunk_at(object, at));
      at = chunks.back().first + chunks.back().second;
    }
  }
  std::sort(chunks.begin(), chunks.end());
  chunks.erase(std::unique(chunks.begin(), chunks.end()), chunks.end());
  // A GET is at most a quarter of what may be fetched ahead, so that several are in flight.
  const std::uint64_t run_cap = std::min<std::uint64_t>(kRemoteChunkBytes, ahead_limit_ / 4);
  MutexLock lock(mu_);
  std::size_t i = 0;
  while (i < chunks.size()) {
    if (stopping_) return true;
    std::vector<std::string> keys;  // a run: adjacent chunks none of which is held
    std::uint64_t run_bytes = 0;
    std::size_t j = i;
    for (; j < chunks.size(); ++j) {
      const auto [c, length] = chunks[j];
      if (j > i &&
          (c != chunks[j - 1].first + chunks[j - 1].second || run_bytes + length > run_cap)) {
        break;
      }
      std::string key = io::DiskCache::key(object.url, c, length, object.etag);
      // Under mu_: the finisher stores a chunk in the cache before it forgets it here.
      if (ahead_.contains(key) || in_flight_.contains(key) || cache_->contains(key) ||
          (held_ && held_->find(key))) {
        if (j == i) continue;  // not part of a run: the next chunk may start one
        break;
      }
      keys.push_back(std::move(key));
      run_bytes += length;
    }
    if (keys.empty()) {
      i = j;
      continue;
    }
    const std::size_t first = j - keys.size();
    if (ahead_.size() + keys.size() > kAheadChunks || !room_ahead(run_bytes)) return false;
    const auto data = std::make_shared_for_overwrite<std::byte[]>(run_bytes);
    std::shared_future<void> done;
    const bool hold = holds(object);
    try {
      // Its on_done waits for mu_, held until the chunks are in ahead_.
      done = store_
                 ->submit_read(object.url, chunks[first].first, run_bytes, data.get(),
                               io::ObjectStore::Priority::kAhead,
                               [this, keys] {
                                 for (const auto& key : keys) ahead_ended(key);
                               })
                 .share();
    } catch (const std::exception&) {
      return true;  // the store is closing: a hint, dropped
    }
    start_finisher();
    const auto started = std::chrono::steady_clock::now();
    std::uint64_t at = 0;
    for (std::size_t k = 0; k < keys.size(); ++k) {
      Ahead ahead;
      ahead.data = std::shared_ptr<std::byte[]>(data, data.get() + at);  // a part of the GET's
      ahead.length = chunks[first + k].second;
      ahead.done = done;
      ahead.started = started;
      ahead.timed = k == 0;
      ahead.hold = hold;
      at += ahead.length;
      ahead_bytes_ += ahead.length;
      ahead_.emplace(std::move(keys[k]), std::move(ahead));
    }
    ++prefetched_;
    ++chunk_fetches_;
    i = j;
  }
  return true;
}

bool RemoteFiles::prefetch_range(const RemoteObject& object, std::uint64_t offset, std::size_t n) {
  if (n > object.size - offset) return true;  // the read reports it
  std::string key = io::DiskCache::key(object.url, offset, n, object.etag);
  MutexLock lock(mu_);
  if (stopping_ || ranges_.contains(key)) return true;
  if (!room_for_range(n)) return false;
  Ahead range;
  range.data = std::make_shared_for_overwrite<std::byte[]>(n);
  range.length = n;
  range.started = std::chrono::steady_clock::now();
  range.number = ++ranges_made_;
  try {
    range.done = store_
                     ->submit_read(object.url, offset, n, range.data.get(),
                                   io::ObjectStore::Priority::kAhead,
                                   [this, started = range.started] {
                                     fetch_ns_ += elapsed_ns(started);  // its GET, queue included
                                   })
                     .share();
  } catch (const std::exception&) {
    return true;  // the store is closing: a hint, dropped
  }
  ahead_bytes_ += n;
  ranges_order_.emplace_back(key, range.number);
  ranges_.emplace(std::move(key), std::move(range));
  ++prefetched_;
  ++chunk_fetches_;
  return true;
}

bool RemoteFiles::room_for_range(std::uint64_t n) {
  // Past the cap, the oldest ranges nobody took are dropped, once their GETs have ended (the
  // transfer writes into the buffer until then).
  while (ahead_bytes_ + n > kAheadBytes && !ranges_order_.empty()) {
    const auto& [oldest, number] = ranges_order_.front();
    if (auto it = ranges_.find(oldest); it != ranges_.end() && it->second.number == number) {
      if (it->second.done.wait_for(std::chrono::seconds(0)) != std::future_status::ready) {
        return false;
      }
      ahead_bytes_ -= it->second.length;
      ranges_.erase(it);
    }
    ranges_order_.pop_front();
  }
  return ahead_bytes_ + n <= kAheadBytes;
}

bool RemoteFiles::prefetch_run(const RemoteObject& object, Range span, std::span<const Range> run) {
  MutexLock lock(mu_);
  if (stopping_) return true;
  std::vector<std::pair<std::string, Range>> wanted;  // the run's ranges not held already
  std::uint64_t bytes = 0;
  for (const auto& r : run) {
    std::string key = io::DiskCache::key(object.url, r.first, r.second, object.etag);
    if (ranges_.contains(key)) continue;
    bytes += r.second;
    wanted.emplace_back(std::move(key), r);
  }
  if (wanted.empty()) return true;
  // The bytes between the ranges (at most kCoalesceGap each) are fetched, not counted.
  if (!room_for_range(bytes)) return false;
  const auto data = std::make_shared_for_overwrite<std::byte[]>(span.second);
  const auto started = std::chrono::steady_clock::now();
  std::shared_future<void> done;
  try {
    done = store_
               ->submit_read(object.url, span.first, span.second, data.get(),
                             io::ObjectStore::Priority::kAhead,
                             [this, started] { fetch_ns_ += elapsed_ns(started); })
               .share();
  } catch (const std::exception&) {
    return true;  // the store is closing: a hint, dropped
  }
  for (auto& [key, r] : wanted) {
    Ahead range;
    range.data = data;
    range.at = static_cast<std::size_t>(r.first - span.first);
    range.length = r.second;
    range.started = started;
    range.done = done;
    range.number = ++ranges_made_;
    ahead_bytes_ += r.second;
    ranges_order_.emplace_back(key, range.number);
    ranges_.emplace(std::move(key), std::move(range));
  }
  ++prefetched_;
  ++chunk_fetches_;
  return true;
}

bool RemoteFiles::take_range(const RemoteObject& object, std::uint64_t offset, std::byte* dst,
                             std::size_t n) {
  Ahead range;
  {
    MutexLock lock(mu_);
    auto it = ranges_.find(io::DiskCache::key(object.url, offset, n, object.etag));
    if (it == ranges_.end()) return false;
    range = std::move(it->second);
    ranges_.erase(it);  // its name stays in ranges_order_ until it comes to the front
    ahead_bytes_ -= range.length;
  }
  const auto waiting = std::chrono::steady_clock::now();
  range.done.get();  // fetched ahead: its error (after the retries) is this read's
  wait_ns_ += elapsed_ns(waiting);
  std::memcpy(dst, range.data.get() + range.at, n);
  return true;
}

void RemoteFiles::start_finisher() {
  if (!finisher_.joinable()) finisher_ = std::thread([this] { finish_ahead(); });
}

void RemoteFiles::store_later(const std::string& key, const std::shared_ptr<std::byte[]>& data,
                              std::size_t length, bool hold) {
  bool held = false;
  {
    MutexLock lock(mu_);
    if (!stopping_ && ahead_bytes_ + length <= ahead_limit_ && !ahead_.contains(key)) {
      std::promise<void> fetched;
      fetched.set_value();
      Ahead chunk;
      chunk.data = data;
      chunk.length = length;
      chunk.done = fetched.get_future().share();
      chunk.fetched_ahead = false;
      chunk.hold = hold;
      start_finisher();
      ahead_bytes_ += length;
      ahead_.emplace(key, std::move(chunk));
      ahead_ended_.push_back(key);
      ++stores_held_;
      held = true;
    }
  }
  if (held) {
    ahead_cv_.notify_all();
  } else {
    keep(key, data, length, hold);
  }
}

void RemoteFiles::flush_stores() {
  MutexLock lock(mu_);
  while (stores_held_ > 0) lock.wait(stored_cv_);
}

void RemoteFiles::ahead_ended(const std::string& key) {
  {
    MutexLock lock(mu_);
    ahead_ended_.push_back(key);
  }
  ahead_cv_.notify_all();
}

void RemoteFiles::finish_ahead() {
  for (;;) {
    std::string key;
    Ahead ahead;
    {
      MutexLock lock(mu_);
      while (!stopping_ && ahead_ended_.empty()) lock.wait(ahead_cv_);
      if (ahead_ended_.empty()) return;  // stopping, and every fetch ahead has ended
      key = std::move(ahead_ended_.front());
      ahead_ended_.pop_front();
      ahead = ahead_.at(key);
    }
    bool ok = true;
    try {
      ahead.done.get();
    } catch (...) {
      ok = false;  // its readers get the error; a later read fetches it again
    }
    if (ok) {
      if (ahead.fetched_ahead && ahead.timed) fetch_ns_ += elapsed_ns(ahead.started);
      bool finished = false;
      {
        MutexLock lock(mu_);
        finished = ahead_.at(key).finished;
      }
      if (!(ahead.hold && finished)) keep(key, ahead.data, ahead.length, ahead.hold);
    }
    MutexLock lock(mu_);
    if (ahead.hold && ahead_.at(key).finished) held_->release(key);  // finished while kept
    if (ok && ahead.fetched_ahead && !ahead_.at(key).read &&
        unread_.try_emplace(key, ahead.length).second) {
      unread_bytes_ += ahead.length;  // counted until a read takes it
    }
    ahead_.erase(key);
    ahead_bytes_ -= ahead.length;
    if (!ahead.fetched_ahead) {
      --stores_held_;
      stored_cv_.notify_all();
    }
  }
}

std::uint64_t RemoteFiles::ahead_bytes() const {
  MutexLock lock(mu_);
  return ahead_bytes_;
}

std::uint64_t RemoteFiles::held_bytes() const { return held_ ? held_->bytes() : 0; }

RemoteFiles::Counters RemoteFiles::counters() const {
  const io::IoStats s = store_->stats();
  Counters c;
  c.list_requests = s.list_requests;
  c.head_requests = s.head_requests;
  c.get_requests = s.get_requests;
  c.requests = s.list_requests + s.head_requests + s.get_requests;
  c.bytes_fetched = s.bytes_fetched;
  c.retries = s.retries;
  c.failures = s.failures;
  c.cache_hits = hits_;
  c.cache_hit_bytes = hit_bytes_;
  c.cache_misses = misses_;
  c.chunk_fetches = chunk_fetches_;
  c.fetch_ns = fetch_ns_;
  c.wait_ns = wait_ns_;
  c.prefetched = prefetched_;
  return c;
}

RemoteHandle::RemoteHandle(std::string cache_dir, std::uint64_t cache_bytes)
    : cache_dir_(std::move(cache_dir)),
      cache_bytes_(cache_bytes),
      files_(remote_files(cache_dir_, cache_bytes_)),
      owner_(::getpid()) {}

RemoteFiles& RemoteHandle::operator*() const {
  if (::getpid() == owner_) return *files_;
  return *remote_files(cache_dir_, cache_bytes_);  // a forked worker: its own
}

std::string default_cache_dir(std::string_view sub) {
  if (auto d = env_nonempty("STOKER_CACHE_DIR")) return (fs::path(*d) / sub).string();
  if (auto d = env_nonempty("XDG_CACHE_HOME")) return (fs::path(*d) / "stoker" / sub).string();
  if (auto d = env_nonempty("HOME")) return (fs::path(*d) / ".cache" / "stoker" / sub).string();
  return {};
}

NodeTurn::NodeTurn(const std::string& index_dir, std::string_view what) {
  if (index_dir.empty()) return;
  shared = {(fs::path(index_dir) / "listings").string(), torchrun_job()};  // before the lock
  char name[40];
  std::snprintf(name, sizeof name, "%016llx.lock", static_cast<unsigned long long>(fnv1a(what)));
  try {
    lock.emplace((fs::path(index_dir) / "locks" / name).string());
  } catch (const std::exception& e) {  // e.g. a read-only cache: each process does it all
    log(LogLevel::warning, std::string(e.what()) + " (processes not serialised)");
  }
}

namespace {

// The stores made, by process: never destroyed (a process forked from this one must not join
// its parent's transfer thread, which does not exist in the child, and a store's thread lives
// as long as the process anyway). A forked child starts with a lock and a table of its own:
// another thread of the parent may have held the lock, or been changing the table, when it
// forked.
struct Stores {
  using Key = std::tuple<pid_t, std::string, std::uint64_t>;
  std::mutex* mu = new std::mutex;
  std::map<Key, std::shared_ptr<RemoteFiles>>* made =
      new std::map<Key, std::shared_ptr<RemoteFiles>>;
};

Stores& stores() {
  static Stores* s = [] {
    auto* made = new Stores;
    pthread_atfork(nullptr, nullptr, [] { stores() = Stores{}; });
    return made;
  }();
  return *s;
}

}  // namespace

std::shared_ptr<RemoteFiles> remote_files(const std::string& cache_dir, std::uint64_t cache_bytes) {
  const std::string dir = cache_dir.empty() ? default_object_cache_dir() : cache_dir;
  if (dir.empty()) cache_bytes = 0;
  Stores& s = stores();
  const Stores::Key key{::getpid(), dir, cache_bytes};
  {
    std::lock_guard lock(*s.mu);
    if (auto it = s.made->find(key); it != s.made->end()) return it->second;
  }
  // Made with no lock held: it reads the environment, which in Python may wait for the GIL
  // (environment.h), held perhaps by a thread waiting here. Made twice at once, one is kept.
  auto made = std::make_shared<RemoteFiles>(dir, cache_bytes);
  std::lock_guard lock(*s.mu);
  auto& slot = (*s.made)[key];
  if (!slot) slot = std::move(made);
  return slot;
}

}  // namespace stoker::detail
