// WebDataset tar shards read in place (docs/formats.md): each shard is indexed once from its
// tar headers (the index cached on disk), so the data set is map-style (a length, random
// access, the global shuffle, exact resume, the RAM cache) like an image folder.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "stoker/dataset.h"
#include "stoker/encoded.h"
#include "stoker/image.h"
#include "stoker/object_storage.h"

namespace stoker {

struct WebDatasetOptions {
  // Tar files, or directories (every *.tar in them, in name order), or URLs of objects
  // (docs/storage.md): s3://BUCKET/KEY.tar and http(s)://... shards, or an s3:// prefix (every
  // *.tar object directly under it, in key order). Brace patterns are expanded by the caller
  // (the Python package does it).
  std::vector<std::string> shards;
  // The sample's fields, in order: a field is a member's name after its key (lower-case),
  // alternatives separated by ';' (the first present one is taken). Kinds, by the field's last
  // extension: jpg/jpeg/png images (decoded with `transform`), cls/cls2/class/count/index/inx/
  // id/txt integers (int64), npy arrays (dtype and shape fixed by the first sample that has
  // it). Anything else (json, raw bytes) is refused: a batch holds fixed-shape arrays only.
  std::vector<std::string> fields{"jpg;jpeg;png", "cls"};
  ImageTransform transform;
  std::uint64_t max_pixels = kDefaultMaxPixels;
  // Keeps up to this many bytes of the samples' encoded bytes in RAM (cache_in_ram).
  std::size_t cache_bytes = 0;
  // Where shard indexes are cached (storage.index_cache_dir: "" is $STOKER_CACHE_DIR, else
  // $XDG_CACHE_HOME/stoker, else ~/.cache/stoker, each in a "webdataset" subfolder; a cache
  // that cannot be written is ignored; storage.index_cache false: none); for URL shards, the
  // object cache (storage.object_cache_dir, object_cache_bytes) and the shards already resolved
  // (storage.known_objects: another process's WebDataset::objects(), taken as they are, with no
  // request: worker processes made from a pickled data set do not list the bucket again).
  ObjectStorageOptions storage;
};

// The data set. Samples are the runs of consecutive members of a shard with the same key (the
// member's path up to the first dot of its base name), as the `webdataset` package groups
// them; members with no key (no dot in the base name) and `__meta__` files are left out, as
// that package leaves them out. read() preads the sample's selected members (one read when
// they are adjacent) and decodes them into the batch; a missing field, a duplicate member, a
// bad integer or npy, an image that does not decode, or a shard truncated since it was
// indexed throws std::runtime_error naming shard and key.
//
// Thread safety: immutable after construction; read() may be called from any thread.
class WebDataset final : public Dataset {
 public:
  // Throws std::runtime_error naming the shard for a missing, unreadable, compressed or
  // corrupt shard, std::invalid_argument for an unknown or unsupported field.
  explicit WebDataset(WebDatasetOptions options);
  ~WebDataset() override;

  std::size_t size() const override;
  std::vector<FieldSpec> fields() const override;
  void read(std::size_t index, const SampleOut& out) const override;
  // Over URLs with an object cache: starts the range GETs of the samples' chunks that the cache
  // does not hold, all at once (RemoteFiles::prefetch), so a batch over many shards waits for
  // one round trip rather than one per sample per worker thread.
  bool will_read(std::span<const std::size_t> rows) const noexcept override;
  std::string sample_name(std::size_t index) const override;
  std::vector<std::string> cheaper_reads() const override { return image_cheaper_reads(false); }
  // Each shard's samples in blocks of about 1/1024 of the object cache (32 KiB to 8 MiB), cut
  // between samples; over URLs, when the shards do not fit the cache, these are the chunks
  // each read fetches (docs/storage.md, "Data larger than the cache").
  StorageLayout storage_layout() const override;

  // The samples' encoded bytes (behind the RAM cache when cache_bytes > 0): its counters()
  // count reads of the shard files.
  const std::shared_ptr<EncodedSource>& source() const;
  std::vector<std::string> shard_paths() const;
  std::string key(std::size_t index) const;
  // Shards whose index came from the on-disk cache at construction (the rest were indexed).
  std::size_t indexes_from_cache() const;
  // The URL shards, as resolved at construction (in shard order).
  std::vector<ObjectVersion> objects() const;
  // The object-storage counters (all zero when no shard is a URL).
  ObjectStorageCounters object_storage_counters() const override;
  // The RAM cache's bytes (cache_bytes) and, for URL shards, the chunks being fetched ahead.
  std::size_t resident_bytes() const override;

  struct Impl;

 private:
  std::shared_ptr<Impl> impl_;
  std::shared_ptr<EncodedSource> source_;  // impl_, or a RAM cache in front of it
  WebDatasetOptions options_;
};

// A tar member's sample key and field as webdataset groups them (its base_plus_ext, the field
// lower-cased), or nullopt for a member webdataset leaves out: a meta file ("__x__" first in
// the path) or a name with no key (no '.' in the base name). The stream reader
// (python/stoker/datasets/webdataset_stream.py) groups by it as WebDataset does.
std::optional<std::pair<std::string, std::string>> webdataset_member(std::string_view name);

// The shard files `paths` names: files as they are, directories as every *.tar in them in name
// order. Throws std::runtime_error for a directory with no *.tar (naming it).
std::vector<std::string> webdataset_shards(const std::vector<std::string>& paths);

}  // namespace stoker
