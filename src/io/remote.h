// Objects in object storage (s3:// and http(s):// URLs) as the readers see them: resolved once
// (a listing per prefix, not a HEAD per object), then read at any offset through fixed-size
// chunks that are fetched with one range GET each and kept in the local disk cache
// (docs/storage.md). Reads of neighbouring samples of one shard fall in one chunk, so they
// cost one GET between them; a chunk that several threads miss at once is fetched once.
#pragma once

#include <sys/types.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <future>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "io/held_blocks.h"
#include "stoker/frontend/mutex.h"
#include "stoker/object_storage.h"
#include "util/node_lock.h"
#include "util/parallel.h"

namespace stoker::io {
class ObjectStore;
class DiskCache;
struct ObjectInfo;
}  // namespace stoker::io

namespace stoker::detail {

// "s3://...", "http://...", "https://...".
bool is_url(std::string_view path);

struct RemoteObject {
  std::string url;
  std::uint64_t size = 0;
  std::string etag;  // "" when the server sent none
  // Where the object's cache chunks start (sorted, the first 0), when a reader made them fit
  // its samples (the storage blocks of a windowed shuffle: no sample straddles two, each is
  // fetched whole by one GET); null: aligned chunks of kRemoteChunkBytes.
  std::shared_ptr<const std::vector<std::uint64_t>> chunk_starts = nullptr;
  // The reader calls RemoteFiles::done_with() after each chunk's last read (a windowed
  // shuffle's blocks, each read once an epoch): a process that is the only reader of its cache
  // holds the chunks in memory from their GET to then, not in the disk cache (kHeldBytes).
  bool done_with_each = false;
};

// The default directory of the object cache: $STOKER_CACHE_DIR/objects, else
// $XDG_CACHE_HOME/stoker/objects, else ~/.cache/stoker/objects ("" when none of them is set).
std::string default_object_cache_dir();
inline constexpr std::uint64_t kDefaultObjectCacheBytes = 10ull << 30;
inline constexpr std::size_t kRemoteChunkBytes = 8u << 20;

// Chunks fetched ahead of their readers (RemoteFiles::prefetch) at most at once, and at most
// this many bytes (32 full chunks) held for them, and never more than half of the object cache
// divided among the node's ranks (LOCAL_WORLD_SIZE), counting the chunks fetched ahead that
// reached the cache and were not read yet (more would push out chunks not yet read, the
// node's other ranks' included; a windowed shuffle's window fits the other half with the
// samples read ahead, shuffle_choice.h). More than
// the store runs at once (io::ObjectStoreOptions::max_in_flight): the rest wait in its queue of
// fetches ahead, in the order asked, so that the hints of every batch the engine has opened are
// taken (a batch of small shards asks for as many chunks as it has samples) and the store never
// runs dry.
inline constexpr std::size_t kAheadChunks = 1024;
inline constexpr std::uint64_t kAheadBytes = 256ull << 20;

// The largest object cache whose blocks (RemoteObject::done_with_each) a process holds in
// memory between their GET and their last read instead of the disk cache, at most the cache's
// bytes (what the window and the blocks fetched ahead of it fill; past that, the blocks held
// longest go to the disk cache). A larger cache cuts blocks of 256 KiB and more, whose files
// cost little beside their bytes. Not in a process that shares its cache with others that read
// the same blocks (the node's ranks, LOCAL_WORLD_SIZE > 1; a worker process, forked or given
// its data set by pickle): they find each other's blocks in the disk cache.
inline constexpr std::uint64_t kHeldBytes = 256ull << 20;

// One per process and cache directory (remote_files()): an ObjectStore (its settings from the
// environment and ~/.aws) and the disk cache. Thread safety: every member from any thread.
class RemoteFiles {
 public:
  RemoteFiles(const std::string& cache_dir, std::uint64_t cache_bytes);
  ~RemoteFiles();  // fails what is still being fetched ahead, and waits for it
  RemoteFiles(const RemoteFiles&) = delete;
  RemoteFiles& operator=(const RemoteFiles&) = delete;

  // The objects each URL names, in order. A URL whose last path component ends in `suffix`
  // (".tar") is one object; any other s3:// URL is a prefix: every object directly under
  // PREFIX/ whose name ends in `suffix`, in key order (an error if there is none). s3:// objects
  // are resolved by one listing of each distinct parent prefix (not a HEAD each); http(s)://
  // objects by a HEAD each (in parallel). Throws io::ObjectStoreError naming the URL.
  // A URL found in `known` is taken from there, with no request.
  //
  // With `shared.job` (the job's key on this node, torchrun_job()) and `shared.dir`, each listing
  // is kept in `shared.dir` for the processes of that job on this node: the first lists, the
  // others read its file. Callers serialise the processes (NodeLock) so that one lists first.
  struct SharedListings {
    std::string dir;
    std::string job;
  };
  std::vector<std::vector<RemoteObject>> resolve(const std::vector<std::string>& urls,
                                                 std::string_view suffix,
                                                 const std::vector<RemoteObject>& known = {},
                                                 const SharedListings& shared = {});

  // Every object under the s3:// prefix `prefix` ("s3://b/dir/"; a trailing '/' is added), at
  // any depth, in key order: one listing (every page), shared within the job as resolve()'s
  // are. Throws io::ObjectStoreError naming the URL (std::invalid_argument for an http(s) URL,
  // which has no listing).
  std::vector<RemoteObject> list_all(const std::string& prefix, const SharedListings& shared = {});

  // Reads bytes [offset, offset + n) of the object into dst: from the chunks held in memory or
  // the disk cache where they are, else with one range GET per chunk (kRemoteChunkBytes, aligned),
  // each stored in the cache. Without a cache (cache_bytes 0) exactly the range is fetched. Throws
  // io::ObjectStoreError (the URL and the HTTP status in its message) or std::runtime_error for
  // a range past the object's end.
  void read(const RemoteObject& object, std::uint64_t offset, std::byte* dst, std::size_t n);

  // Bytes [offset, offset + n) with one range GET of exactly them, neither looked up in nor
  // kept in the chunk cache: for what is read once and kept elsewhere (a large record shard's
  // header and index, in the index cache), so that 64 bytes do not cost an 8 MiB chunk. Throws
  // as read().
  void read_uncached(const RemoteObject& object, std::uint64_t offset, std::byte* dst,
                     std::size_t n);

  // A hint that bytes [offset, offset + n) of the object will be read soon: each chunk holding
  // them that is neither in the disk cache nor being fetched is fetched now, in the background
  // (range GETs in parallel through the store's multi handle), and stored in the cache; a
  // read() of a chunk being fetched waits for that GET instead of making its own. At most
  // kAheadChunks chunks and kAheadBytes are fetched ahead at once, and what was fetched ahead
  // and is not read yet stays within the limit above: past that the rest of the hint is
  // dropped and prefetch() returns false (the caller may hint it again once reads made room;
  // else the read fetches its chunk itself). Never waits for I/O. Without a cache, exactly the
  // range is fetched and held in memory until a read() of exactly that range takes it (the
  // oldest dropped once kAheadBytes are held).
  bool prefetch(const RemoteObject& object, std::uint64_t offset, std::size_t n);
  // The same for several ranges of one object (a batch's samples in one shard), with the
  // chunks that lie next to each other in the object fetched together, by one range GET of up
  // to kRemoteChunkBytes and a quarter of what may be fetched ahead (samples read in order, each
  // its own block, cost one GET per run of them, not one each). Without a cache, likewise the
  // ranges themselves: ranges at most kCoalesceGap apart (a tar header between two samples) are
  // fetched by one GET of up to kRemoteChunkBytes and a quarter of kAheadBytes, each still
  // taken by a read of exactly it. Ranges are (offset, length).
  using Range = std::pair<std::uint64_t, std::size_t>;
  static constexpr std::uint64_t kCoalesceGap = 4096;
  bool prefetch(const RemoteObject& object, std::span<const Range> ranges);

  // A hint that the chunk holding byte `offset` of the object will not be read again soon (a
  // windowed shuffle read every sample of its block this epoch): held in memory, it is let go;
  // in the disk cache, it is the first out.
  void done_with(const RemoteObject& object, std::uint64_t offset);

  // The object's reader is gone (its data set destroyed), and with it the done_with() calls
  // to come: its chunks held in memory are let go, read to their end or not.
  void let_go(const RemoteObject& object);

  // Waits until every chunk a read fetched so far is in the cache (they are stored in the
  // background): before another process of the node takes its turn (NodeTurn) and looks there.
  void flush_stores();

  using Counters = ObjectStorageCounters;  // stoker/object_storage.h
  Counters counters() const;
  // Bytes of the chunks held in memory until they reach the cache (being fetched ahead, or
  // fetched by a read and not yet stored): at most kAheadBytes.
  std::uint64_t ahead_bytes() const;
  // Bytes of the blocks held in memory until their last read (kHeldBytes).
  std::uint64_t held_bytes() const;
  // What this holds in memory: ahead_bytes() + held_bytes(), for the memory cap.
  std::uint64_t memory_bytes() const { return ahead_bytes() + held_bytes(); }
  const std::string& cache_dir() const { return cache_dir_; }

 private:
  using Chunk = std::shared_ptr<const std::byte[]>;
  // One listing of `prefix`, from the job's shared file when `shared` names one that holds it.
  std::vector<io::ObjectInfo> listing(const std::string& prefix, const SharedListings& shared);
  Chunk fetch_chunk(const RemoteObject& object, std::uint64_t offset, std::size_t length,
                    const std::string& key);
  // Stores the chunks held in ahead_ in the cache as their GETs end (in that order, so that a
  // retried one does not hold back those behind it), then forgets them.
  void finish_ahead();
  void ahead_ended(const std::string& key);  // the store's on_done of a fetch ahead
  // A chunk a read fetched: into ahead_ for the finisher to store (the read goes on; later
  // reads take it from memory meanwhile), or stored here when kAheadBytes are held already.
  void store_later(const std::string& key, const std::shared_ptr<std::byte[]>& data,
                   std::size_t length, bool hold);
  // Whether the object's chunks are held in memory until their last read (kHeldBytes).
  bool holds(const RemoteObject& object) const;
  // A fetched chunk into memory (`hold`, while held_ has room) or the disk cache.
  void keep(const std::string& key, const std::shared_ptr<std::byte[]>& data, std::size_t length,
            bool hold);
  void start_finisher() STOKER_REQUIRES(mu_);
  // Whether `bytes` more may be fetched ahead: what is being fetched ahead or stored, and what
  // was fetched ahead into the cache and not read since, within ahead_limit_ (unread chunks
  // the cache let go first no longer count).
  bool room_ahead(std::uint64_t bytes) STOKER_REQUIRES(mu_);
  void forget_unread(const std::string& key);  // a read or done_with() took it
  void let_go(const std::string& key);         // done_with() without the disk cache's demotion
  // Without a cache: prefetch() and read() of exact ranges (ranges_). prefetch_run() fetches
  // the ranges `run` (sorted, not held, within `span` of the object) by one GET of `span`.
  bool prefetch_range(const RemoteObject& object, std::uint64_t offset, std::size_t n);
  bool prefetch_run(const RemoteObject& object, Range span, std::span<const Range> run);
  // Drops the oldest ranges nobody took (their GETs ended) until `n` more bytes fit kAheadBytes;
  // false when they do not.
  bool room_for_range(std::uint64_t n) STOKER_REQUIRES(mu_);
  bool take_range(const RemoteObject& object, std::uint64_t offset, std::byte* dst, std::size_t n);

  // A chunk held in memory until it is in the cache: being fetched ahead of its readers, or
  // fetched by a read and not yet stored.
  struct Ahead {
    std::shared_ptr<std::byte[]> data;
    std::size_t at = 0;  // where its bytes start in data (a range fetched in a run: its place)
    std::size_t length = 0;
    std::shared_future<void> done;
    std::chrono::steady_clock::time_point started;
    bool fetched_ahead = true;  // its fetch time is counted as it is stored
    bool timed = true;          // the first chunk of its GET: the GET's time counted once
    bool read = false;          // a read took it before it reached the cache
    bool hold = false;          // kept in held_, not the disk cache (holds())
    bool finished = false;      // done_with() came before it was kept: held no longer
    std::uint64_t number = 0;   // ranges_: which range fetched ahead (ranges_order_)
  };

  std::string cache_dir_;
  std::unique_ptr<io::ObjectStore> store_;
  std::unique_ptr<io::DiskCache> cache_;  // null: no cache
  std::unique_ptr<HeldBlocks> held_;      // null: no cache, over kHeldBytes, or the node's ranks
  std::atomic<std::uint64_t> hits_{0}, hit_bytes_{0}, misses_{0};
  std::atomic<std::uint64_t> chunk_fetches_{0}, fetch_ns_{0}, wait_ns_{0}, prefetched_{0};
  mutable Mutex mu_;
  std::map<std::string, std::shared_future<Chunk>> in_flight_ STOKER_GUARDED_BY(mu_);
  std::map<std::string, Ahead> ahead_ STOKER_GUARDED_BY(mu_);   // at most kAheadBytes
  std::deque<std::string> ahead_ended_ STOKER_GUARDED_BY(mu_);  // their GETs ended, oldest first
  std::uint64_t ahead_bytes_ STOKER_GUARDED_BY(mu_) = 0;
  // Chunks fetched ahead into the cache that no read has taken yet, by key: their bytes count
  // against ahead_limit_ until a read or done_with() takes them or the cache lets them go.
  std::map<std::string, std::uint64_t> unread_ STOKER_GUARDED_BY(mu_);
  std::uint64_t unread_bytes_ STOKER_GUARDED_BY(mu_) = 0;
  // Without a cache: exact ranges fetched ahead, by DiskCache::key, until a read takes each;
  // their bytes count in ahead_bytes_.
  std::map<std::string, Ahead> ranges_ STOKER_GUARDED_BY(mu_);
  // Oldest first, by key and number: a range taken stays here until it comes to the front, and
  // its key may be fetched ahead again meanwhile (a later number).
  std::deque<std::pair<std::string, std::uint64_t>> ranges_order_ STOKER_GUARDED_BY(mu_);
  std::uint64_t ranges_made_ STOKER_GUARDED_BY(mu_) = 0;
  std::size_t stores_held_ STOKER_GUARDED_BY(mu_) = 0;  // store_later()'s, not yet stored
  std::condition_variable stored_cv_;                   // stores_held_ went down
  bool stopping_ STOKER_GUARDED_BY(mu_) = false;
  std::condition_variable ahead_cv_;
  std::thread finisher_ STOKER_GUARDED_BY(mu_);  // started by the first chunk held
  std::uint64_t cache_bytes_ = 0;
  std::uint64_t ahead_limit_ = kAheadBytes;  // with a cache: at most half of it over the ranks
};

// The RemoteFiles of this process for a cache directory ("" for the default) and cap (0: no
// cache), made on first use and kept for the life of the process (its transfer thread
// included). A process forked after it was made gets its own on first use in the child, so
// worker processes never touch their parent's transfer thread.
std::shared_ptr<RemoteFiles> remote_files(const std::string& cache_dir, std::uint64_t cache_bytes);

// A data set's RemoteFiles, as it reaches them from any process: the one it was made with in
// the process that made it, else (a forked worker) that process's own for the same directory.
class RemoteHandle {
 public:
  RemoteHandle() = default;
  RemoteHandle(std::string cache_dir, std::uint64_t cache_bytes);
  explicit operator bool() const { return files_ != nullptr; }
  RemoteFiles& operator*() const;
  RemoteFiles* operator->() const { return &**this; }
  // Its RemoteFiles in the process that made it, null in another (a forked worker).
  RemoteFiles* made_here() const { return ::getpid() == owner_ ? files_.get() : nullptr; }

 private:
  std::string cache_dir_;
  std::uint64_t cache_bytes_ = 0;
  std::shared_ptr<RemoteFiles> files_;
  pid_t owner_ = 0;
};

// A cache directory's default place: $STOKER_CACHE_DIR/SUB, else $XDG_CACHE_HOME/stoker/SUB,
// else ~/.cache/stoker/SUB ("" when none of them is set).
std::string default_cache_dir(std::string_view sub);

// Taking turns on a node (docs/storage.md, "Ranks of a node"): with an index cache directory,
// an exclusive lock on INDEX_DIR/locks/<hash of `what`>.lock for as long as this lives (a
// cache that cannot be written: a warning, no lock), and the listings shared within the
// torchrun job in INDEX_DIR/listings. Without a directory: nothing shared.
struct NodeTurn {
  NodeTurn(const std::string& index_dir, std::string_view what);
  std::optional<NodeLock> lock;
  RemoteFiles::SharedListings shared;
};

}  // namespace stoker::detail
