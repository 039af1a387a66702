// What a data set reading object storage (s3://, http(s)://) fetched: the counters behind
// Dataset::object_storage_counters(), the loader's Stats::storage_* and report()'s verdict
// "network-bound" (docs/storage.md).
#pragma once

#include <chrono>
#include <cstdint>

namespace stoker {

// Object-storage traffic of a data set reading s3:// or http(s):// URLs (WebDataset's URL
// shards) in this process (every data set reading through the same object cache directory
// shares it): requests by kind (every attempt counts), body bytes, retries, and chunk reads
// served by the disk cache (docs/storage.md).
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
  // Range GETs made for reads (a chunk each, or without the disk cache the read's own range;
  // retries included) and the time they took; and the time reads waited for the store,
  // summed over the reading threads (a read waiting for another thread's fetch of its chunk
  // counts its wait).
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
