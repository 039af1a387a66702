// Where the encoded bytes of a sample live (an image folder, packed record shards, a RAM
// cache in front of either), seen by the decoding datasets. Sources hand out bytes; they do
// not decode.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "stoker/object_storage.h"

namespace stoker {

// The encoded bytes of one sample: either a view into memory the source keeps (the RAM
// cache), or bytes read into `storage` (files, record shards), which the caller reuses from one
// read to the next so that steady-state reads allocate nothing.
struct EncodedBytes {
  std::span<const std::byte> bytes;
  std::vector<std::byte> storage;
};

// Thread safety: read() is called concurrently from worker threads; everything else must be
// constant after construction.
class EncodedSource {
 public:
  virtual ~EncodedSource() = default;

  virtual std::size_t size() const = 0;
  virtual std::int64_t label(std::size_t index) const = 0;
  // A name for error messages: the file's path, or shard and record for records.
  virtual std::string name(std::size_t index) const = 0;
  // The class names, in label order (torchvision's ImageFolder.classes).
  virtual std::vector<std::string> classes() const = 0;

  // Sets out.bytes to sample `index`'s encoded bytes. Throws std::runtime_error naming the
  // sample (name(index)) and the reason: unreadable file, truncated or corrupt record.
  virtual void read(std::size_t index, EncodedBytes& out) const = 0;

  // Read statistics, for showing e.g. that a RAM cache serves every read after the first epoch.
  struct Counters {
    std::uint64_t reads = 0;          // read() calls
    std::uint64_t storage_reads = 0;  // of those, served from files (disk or the page cache)
    std::uint64_t storage_bytes = 0;
    std::uint64_t cached = 0;  // samples held in a RAM cache (cache_in_ram only)
    std::uint64_t cached_bytes = 0;
  };
  virtual Counters counters() const = 0;

  // Sources over URLs (docs/storage.md): a hint that these samples will be read soon (the
  // loader's Dataset::will_read, passed on), so the chunks holding them that the object cache
  // lacks are fetched now, in parallel; quick, never waits for I/O, never throws; false when
  // rows were left out for want of room (Dataset::will_read). The objects
  // as resolved, and this process's traffic through the source's object cache (nothing, and
  // all zero, for local files).
  virtual bool will_read(std::span<const std::size_t> /*rows*/) const noexcept { return true; }
  virtual std::vector<ObjectVersion> objects() const { return {}; }
  virtual ObjectStorageCounters object_storage() const { return {}; }
  // Bytes fetched ahead of their reads and held in memory until stored or read (the memory
  // cap counts them: Dataset::resident_bytes).
  virtual std::uint64_t ahead_bytes() const { return 0; }
  // Each sample is a file (or object) of its own: an image folder (record shards would help a
  // run that reads many small files).
  virtual bool file_per_sample() const { return false; }
};

// torchvision.datasets.ImageFolder's layout: root/<class>/<file>, classes sorted by name,
// files sorted by path within each class, only files with an image extension (.jpg .jpeg .png
// .ppm .bmp .pgm .tif .tiff .webp, any case). Throws std::runtime_error if `root` has no class
// folder or no image.
//
// `root` may be an s3:// prefix (docs/storage.md): one recursive listing (shared by the ranks
// of a torchrun job on the node), class folders the first level of keys below it, the same
// order and labels; each image is then read whole through the object cache described by
// `remote`. An http(s):// URL has no listing: refused. An empty listing, a missing bucket or
// refused credentials throw (io::ObjectStoreError, a std::runtime_error) naming the URL and
// the HTTP status.
std::shared_ptr<EncodedSource> open_image_folder(const std::string& root,
                                                 const ObjectStorageOptions& remote = {});

// Packed record shards written by `stoker pack` (format: docs/record_format.md), read with
// pread (not mapped). `path` is one shard file or a directory of them (every *.stkr file, in
// name order). Throws std::runtime_error naming the file and the reason for a missing,
// truncated or corrupt shard (bad magic, version, header or index checksum, records outside
// the file). Each record's checksum is verified on every read(): a corrupt record, or one that
// a shard truncated or rewritten while open no longer holds, throws, naming shard and record.
//
// `path` may be a URL (docs/storage.md): an s3:// prefix (every *.stkr object directly under
// it, checked for completeness as a directory is), or one shard's s3:// or http(s):// URL. Each
// shard's header and index are read once per node (kept in `remote.index_cache_dir`, keyed by
// URL, size and ETag); records are read through the chunked object cache.
std::shared_ptr<EncodedSource> open_records(const std::string& path,
                                            const ObjectStorageOptions& remote = {});

struct PackOptions {
  std::uint64_t shard_bytes = std::uint64_t{1} << 30;  // a new shard starts past this size
  bool overwrite = false;  // replace an existing `dest` (else that is an error)
  // Called after each record with (records done, records in all, bytes written).
  std::function<void(std::size_t, std::size_t, std::uint64_t)> progress;
};

struct PackResult {
  std::size_t records = 0;
  std::size_t shards = 0;
  std::uint64_t bytes = 0;  // payload bytes
  std::size_t classes = 0;
};

// Writes every sample of `source` (bytes, label, name, and the class list) into record shards
// in the directory `dest`, in source order. Atomic: the shards are written into a temporary
// directory beside `dest`, synced, and renamed to `dest` only when complete, so a reader never
// sees a partial pack. Throws std::runtime_error naming the file and the reason.
PackResult pack_records(const EncodedSource& source, const std::string& dest,
                        const PackOptions& options = {});

// pack_records over open_image_folder(src) (what `stoker pack` does). Refuses a `dest` that is
// `src` or contains it: replacing it would delete the images being packed.
PackResult pack_image_folder(const std::string& src, const std::string& dest,
                             const PackOptions& options = {});

// The tables of PackResult's and EncodedSource::Counters' fields (as for_each_stat is
// Stats'): visit(name, value) for each, in declaration order; src/field_tables.cc checks at compile
// time that they name every member.
template <class Visit>
void for_each_field(const PackResult& r, Visit&& visit) {
  visit("records", r.records);
  visit("shards", r.shards);
  visit("bytes", r.bytes);
  visit("classes", r.classes);
}
template <class Visit>
void for_each_field(const EncodedSource::Counters& c, Visit&& visit) {
  visit("reads", c.reads);
  visit("storage_reads", c.storage_reads);
  visit("storage_bytes", c.storage_bytes);
  visit("cached", c.cached);
  visit("cached_bytes", c.cached_bytes);
}

// Keeps the encoded bytes of `source` in RAM, up to `budget_bytes` (first come, first kept),
// so that later epochs never touch the disk: the RAM-disk trick without root or tmpfs. The
// budget is reserved as address space only; memory is used as samples are kept.
std::shared_ptr<EncodedSource> cache_in_ram(std::shared_ptr<EncodedSource> source,
                                            std::size_t budget_bytes);

}  // namespace stoker
