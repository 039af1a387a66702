// The dataset interface: a map-style source that writes sample i straight into its slot of a
// batch slab. There is no per-sample allocation and no collate copy: the loader hands the
// dataset one writable span per field, already at the sample's final place in the batch.
#pragma once

#include <cstddef>
#include <cstdint>
#include <exception>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "stoker/object_storage.h"
#include "stoker/sampler.h"

namespace stoker {

enum class DType : std::uint8_t { u8, i8, i16, i32, i64, f16, bf16, f32, f64 };

// The one table of element types: size, name (numpy's and torch's) and kind of number, in
// DType order. Everything that maps a DType (sizes, names, DLPack codes) reads it.
struct DTypeInfo {
  enum class Kind : std::uint8_t { unsigned_int, signed_int, floating, bfloat };
  DType dtype;
  std::size_t size;
  std::string_view name;
  Kind kind;
};
inline constexpr DTypeInfo kDTypes[] = {
    {DType::u8, 1, "uint8", DTypeInfo::Kind::unsigned_int},
    {DType::i8, 1, "int8", DTypeInfo::Kind::signed_int},
    {DType::i16, 2, "int16", DTypeInfo::Kind::signed_int},
    {DType::i32, 4, "int32", DTypeInfo::Kind::signed_int},
    {DType::i64, 8, "int64", DTypeInfo::Kind::signed_int},
    {DType::f16, 2, "float16", DTypeInfo::Kind::floating},
    {DType::bf16, 2, "bfloat16", DTypeInfo::Kind::bfloat},
    {DType::f32, 4, "float32", DTypeInfo::Kind::floating},
    {DType::f64, 8, "float64", DTypeInfo::Kind::floating},
};

const DTypeInfo& dtype_info(DType dtype);  // throws std::invalid_argument for an unknown value
inline std::size_t dtype_size(DType dtype) { return dtype_info(dtype).size; }
inline std::string_view dtype_name(DType dtype) { return dtype_info(dtype).name; }

// One field of a sample: a fixed-shape array. Scalars have an empty shape.
struct FieldSpec {
  std::string name;
  DType dtype = DType::u8;
  std::vector<std::int64_t> shape;
  // Stays in host memory when batches go to a device (metadata such as ids or sizes).
  bool host_only = false;

  std::size_t elements() const;  // product of shape (1 for a scalar)
  std::size_t bytes() const;     // elements() * dtype_size(dtype)
};

// Where one sample is to be written: field f of this sample is bytes(f), exactly
// fields()[f].bytes() long, inside the batch slab. Cheap to copy; valid only during read().
class SampleOut {
 public:
  // Built by the loader: field f of row `row` starts at field_bases[f] + row * field_bytes[f].
  SampleOut(std::span<const std::size_t> field_bytes, std::byte* const* field_bases,
            std::size_t row, std::uint64_t seed, std::uint64_t epoch = 0) noexcept
      : field_bytes_(field_bytes), bases_(field_bases), row_(row), seed_(seed), epoch_(epoch) {}

  std::size_t num_fields() const noexcept { return field_bytes_.size(); }

  // Throws std::out_of_range for a field the dataset did not declare.
  std::span<std::byte> bytes(std::size_t field) const {
    if (field >= field_bytes_.size()) throw_bad_field(field);
    return {bases_[field] + row_ * field_bytes_[field], field_bytes_[field]};
  }

  // The field viewed as elements of T. Throws std::invalid_argument if the field's size is not
  // a multiple of sizeof(T).
  template <class T>
  std::span<T> as(std::size_t field) const {
    auto b = bytes(field);
    if (b.size() % sizeof(T) != 0) throw_bad_element_size(field, sizeof(T));
    return {reinterpret_cast<T*>(b.data()), b.size() / sizeof(T)};
  }

  // Copies `src` into field `field`; throws std::invalid_argument if the sizes differ. Large
  // copies bypass the cache (the row is read later by another thread or the device).
  void copy_from(std::size_t field, std::span<const std::byte> src) const;

  // Seed for this sample's random choices (augmentation), a pure function of the loader's
  // seed, the epoch and the sample index: results do not depend on workers or timing.
  std::uint64_t seed() const noexcept { return seed_; }
  std::size_t row() const noexcept { return row_; }  // position in the batch
  // The epoch the sample is read for: a loader reads the next epoch's first batches before the
  // current one ends, so a read may be for a later epoch than the one being delivered.
  std::uint64_t epoch() const noexcept { return epoch_; }

 private:
  [[noreturn]] void throw_bad_element_size(std::size_t field, std::size_t size) const;
  [[noreturn]] void throw_bad_field(std::size_t field) const;

  std::span<const std::size_t> field_bytes_;
  std::byte* const* bases_;
  std::size_t row_;
  std::uint64_t seed_;
  std::uint64_t epoch_;
};

// A map-style data set.
//
// Thread safety: read() is called concurrently from several worker threads (each call with
// its own SampleOut) and must be safe for that; size() must be constant for the dataset's
// lifetime, and so must fields(), except that a data set whose layout is learned from its
// samples (fields_known() false) returns none until its first successful probe().
class Dataset {
 public:
  virtual ~Dataset() = default;

  virtual std::size_t size() const = 0;
  virtual std::vector<FieldSpec> fields() const = 0;

  // Writes sample `index` (< size()) into `out`. Throws on failure; the loader reports the
  // exception, with its type kept, together with the sample index (see SampleError).
  virtual void read(std::size_t index, const SampleOut& out) const = 0;

  // A data set whose fields are told by its samples (a Python data set learns them from the
  // first sample it reads) returns false until then. The loader then reads nothing at
  // construction; its first workers each call probe() on one sample of the first epoch, and
  // the first probe that returns fields gives the batch slabs their layout. A probe reads
  // sample `index` with `seed` as SampleOut::seed() would give it, returns the fields and
  // keeps the sample for the read of that (index, seed), so nothing is read twice. If the
  // sample fails, it keeps the failure for that read likewise (where it fails with its
  // batch), sets `failure` and returns no fields. An exception it throws is not the sample's
  // (the loader closing, Ctrl-C on the consumer's thread): the consumer gets it at once.
  // Probes may run concurrently, and after the fields are known (late ones still keep their
  // samples). Defaults: known; probe() returns fields().
  virtual bool fields_known() const { return true; }
  virtual std::vector<FieldSpec> probe(std::size_t /*index*/, std::uint64_t /*seed*/,
                                       std::exception_ptr& /*failure*/) const {
    return fields();
  }

  // What reports of failed samples call sample `index` besides its index: a file path, or a
  // shard and record. Default: nothing (the index says it all).
  virtual std::string sample_name(std::size_t /*index*/) const { return {}; }

  // What makes this data set's reads cheaper, for a report whose reads fill the cores
  // (diagnose(): an image data set's smaller decode, a video's shorter clips). Default: nothing
  // it knows of.
  virtual std::vector<std::string> cheaper_reads() const { return {}; }

  // Bytes this data set keeps in RAM between reads (a RAM cache of encoded bytes), counted
  // against the loader's memory_limit. Any thread. Default: none.
  virtual std::size_t resident_bytes() const { return 0; }

  // What this data set's reads fetched from object storage so far (s3://, http(s)://: the
  // counters of this process's store, shared by the data sets reading through it), from which
  // the loader counts its own traffic (Stats::storage_*) and tells a network-bound loop.
  // Any thread. Default: nothing (local data).
  virtual ObjectStorageCounters object_storage_counters() const { return {}; }

  // Where the samples' bytes are, for a shuffle that reads each block of storage once an epoch
  // (SampleOrder::blocks): the blocks and, when `read_whole`, the cache each is read into
  // whole (its byte cap; 0: none): the object cache a remote shard's block is fetched into by
  // one range GET, the row-group cache a Parquet row group is decoded into. A global shuffle
  // over more blocks than that cache holds reads blocks again and again, so the loader may
  // choose a window (shuffle_choice.h). Blocks a sample's read does not pull whole (local
  // shards) may be said too, for stoker.shuffle_report, with `read_whole` false. Null blocks:
  // in memory, or cannot tell. Any thread; the same for the data set's lifetime.
  struct StorageLayout {
    std::shared_ptr<const StorageBlocks> blocks;
    std::uint64_t cache_bytes = 0;
    bool read_whole = false;
    // What the data set fetches ahead of its reads (Dataset::will_read) is held to a share of
    // the cache of its own, counted until a read takes it (an object cache: half of it over
    // the node's ranks), so the samples read ahead take no room from the window's share.
    bool ahead_apart = false;
    // The data set fetches the blocks of the rows the loader hints (will_read) before their
    // reads. One that does not brings a block in only as a worker reads one of its samples
    // (Parquet's row groups): then only the batches being read hold blocks beside the window.
    bool fetches_ahead = false;
    // The cache is this process's own (Parquet's row-group cache, in memory), not the node's
    // (the object cache's directory): the node's other ranks read none of it, so a windowed
    // order gives each rank a run of blocks of its own (SampleOrder::nodes).
    bool cache_per_process = false;
    // The cache's name and the option that sizes it, for the choice's explanation.
    const char* cache = "object cache";
    const char* cache_option = "object_cache_bytes";
  };
  virtual StorageLayout storage_layout() const { return {}; }

  // A hint, called just before the previous sample is read: `index` is read next by this
  // thread. A dataset whose bytes are in memory can start bringing them into cache, which
  // overlaps that sample's memory latency with the current copy. Default: nothing.
  virtual void prefetch(std::size_t /*index*/) const {}

  // A hint, once per batch and epoch, as the loader opens a batch up to its prefetch depth of
  // batches before the loader opens that one: `rows` are the batch's samples, read soon by the
  // worker threads. A data set whose reads wait on a network starts fetching them all at once
  // here (WebDataset over URLs). Called with the loader's lock held: it must be quick, never
  // wait for I/O and never throw. Returns false when it left rows out for want of room (what
  // may be fetched ahead is full): the loader hints the batch again as it opens the next one.
  // Default: nothing, true.
  virtual bool will_read(std::span<const std::size_t> /*rows*/) const noexcept { return true; }

  // Chunk-level reads, for data sets that pay a fixed cost per call (a Python data set's GIL
  // round trip and __getitems__). When reads_chunks() is true the loader calls read_rows()
  // once per chunk of a batch instead of read() per row: sample indices[k] goes into outs[k];
  // a row that fails leaves its exception in errors[k] (which the loader hands in null) and
  // the others still count. Failed rows then go through the loader's usual failure path (skip
  // replaces them through read()). read_rows() returns only when no row is being written any
  // more. Default: read() per row.
  virtual bool reads_chunks() const { return false; }
  virtual void read_rows(std::span<const std::size_t> indices, std::span<const SampleOut> outs,
                         std::span<std::exception_ptr> errors) const;
};

}  // namespace stoker
