// Data read from object storage (s3:// and http(s):// URLs, docs/storage.md): the objects as
// resolved, the settings a data set over URLs takes, and the traffic it counts (behind
// Dataset::object_storage_counters(), the loader's Stats::storage_* and report()'s verdict
// "network-bound"). WebDataset, record packs and image folders share them.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

namespace stoker {

// An object as it was resolved (by a listing or a HEAD): a shard, a record shard, an image.
struct ObjectVersion {
  std::string url;
  std::uint64_t size = 0;
  std::string etag;
};

// Where a data set keeps what it read once and, over URLs, what it fetched: the options of
// every data set over object storage (WebDatasetOptions::storage, ParquetOptions::storage,
// VideoClipsOptions::storage; the record packs', image folders' and token corpora's
// `remote`/`storage` argument).
struct ObjectStorageOptions {
  // The chunks read from object storage, and the cache's byte cap (least recently used out; 0:
  // no cache, every read fetches its range). "" is $STOKER_CACHE_DIR/objects, else
  // $XDG_CACHE_HOME/stoker/objects, else ~/.cache/stoker/objects.
  std::string object_cache_dir;
  std::uint64_t object_cache_bytes = 10ull << 30;
  // Where what is read once per node is kept: a record shard's header and index (keyed by URL,
  // size and ETag), the listings shared by the ranks of a torchrun job, the lock files by which
  // the processes of a node take turns. "" is $STOKER_CACHE_DIR/indexes, else
  // $XDG_CACHE_HOME/stoker/indexes, else ~/.cache/stoker/indexes (a WebDataset's: .../webdataset,
  // VideoClips': .../video). `index_cache` false: none (each process lists and reads the
  // indexes itself).
  std::string index_cache_dir;
  bool index_cache = true;
  // What another process resolved the same URL to (its source's objects()), taken as it is,
  // with no request: the record shards of a prefix, an image folder's images.
  std::vector<ObjectVersion> known_objects;
};

// Object-storage traffic of the data sets over URLs of this process (every data set reading
// through the same object cache directory shares it): requests by kind (every attempt counts), body
// bytes, retries, and chunk reads served by the disk cache.
struct ObjectStorageCounters {
  std::uint64_t requests = 0;
  std::uint64_t list_requests = 0;
  std::uint64_t head_requests = 0;
  std::uint64_t get_requests = 0;
  std::uint64_t bytes_fetched = 0;
  std::uint64_t retries = 0;
  std::uint64_t failures = 0;
  std::uint64_t cache_hits = 0;
  std::uint64_t cache_hit_bytes = 0;
  std::uint64_t cache_misses = 0;
  // Range GETs made for reads (a chunk each, or without the disk cache the read's own range or
  // one for a run of neighbouring ranges hinted together; retries included) and the time they took;
  // and the time reads waited for the store, summed over the reading threads (a read waiting for
  // another thread's fetch of its chunk counts its wait).
  std::uint64_t chunk_fetches = 0;
  std::uint64_t fetch_ns = 0;
  std::uint64_t wait_ns = 0;
  // Of chunk_fetches, the chunks fetched ahead of their reads (the loader names the samples of
  // the batches it has opened before reading them: WebDataset::will_read).
  std::uint64_t prefetched = 0;
};

// The table of ObjectStorageCounters' fields (as for_each_stat is Stats'): visit(name, value)
// for each, in declaration order; src/field_tables.cc checks at compile time that it names every
// member.
template <class Visit>
void for_each_field(const ObjectStorageCounters& c, Visit&& visit) {
  visit("requests", c.requests);
  visit("list_requests", c.list_requests);
  visit("head_requests", c.head_requests);
  visit("get_requests", c.get_requests);
  visit("bytes_fetched", c.bytes_fetched);
  visit("retries", c.retries);
  visit("failures", c.failures);
  visit("cache_hits", c.cache_hits);
  visit("cache_hit_bytes", c.cache_hit_bytes);
  visit("cache_misses", c.cache_misses);
  visit("chunk_fetches", c.chunk_fetches);
  // Durations, as Stats' are (printed in seconds: "fetch_s", "wait_s").
  visit("fetch", std::chrono::nanoseconds(c.fetch_ns));
  visit("wait", std::chrono::nanoseconds(c.wait_ns));
  visit("prefetched", c.prefetched);
}

}  // namespace stoker
