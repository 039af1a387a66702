// Parquet files read in place through Apache Arrow's C++ Parquet reader (docs/formats.md): a
// map-style data set over the files' rows, whose row groups are the unit of I/O. Built only
// where Arrow C++ is found (cmake/parquet.cmake: the target stoker::parquet).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "stoker/dataset.h"
#include "stoker/image.h"
#include "stoker/object_storage.h"

namespace stoker {

struct ParquetOptions {
  // Parquet files, or directories (every *.parquet in them, in name order, not recursive), or
  // URLs (docs/storage.md): s3:// and http(s):// objects, or an s3:// prefix (every *.parquet
  // object directly under it, in key order). The data set's rows are the files' rows, file
  // after file. An object's footer is read by exact range GETs, then only the column chunks
  // of the row groups read, each through the object cache as a chunk of its own.
  std::vector<std::string> files;
  // URL files: their object cache, the index cache of the node's turn and shared listings, and
  // the objects another process resolved them to.
  ObjectStorageOptions storage;
  // The columns a sample is made of, in order. Kinds, by the column's Arrow type:
  //   bool, int8..int64, uint8, float16/32/64: a scalar field of that type (bool as uint8);
  //   fixed_size_list of those (nested: [n][m]): a field of that shape;
  //   binary, large_binary, or Hugging Face's Image() struct {bytes, path} (its bytes): an
  //     encoded image (JPEG, PNG) decoded with `transform` into a field;
  //   string, large_string: no field (a batch holds fixed-shape arrays); read with
  //     ParquetDataset::text().
  // Anything else (uint16..uint64, variable-length lists, maps, ...) is refused.
  std::vector<std::string> columns;
  ImageTransform transform;
  std::uint64_t max_pixels = kDefaultMaxPixels;
  // Row groups read are kept in RAM up to this many bytes (their selected columns as stored:
  // encoded images, not pixels), least recently used out first; at least the last one read is
  // kept. With the whole data set's columns in budget, later epochs read no file.
  std::size_t cache_bytes = std::size_t{256} << 20;
};

// The data set. read() finds the row's row group in the cache, or reads it (its selected
// columns, once, by one thread, while other threads that need it wait), then copies the row's
// numbers into their batch slots and decodes its images straight into theirs.
//
// Errors name the file and the row (its row number in that file): a row group that cannot be
// read (a corrupt page, a failed decompression or page CRC, data that do not match the footer)
// fails each of its rows with the reader's reason, without being read again; a null, or an
// image that does not decode, fails its row. Other rows are not affected.
//
// Thread safety: read() and text() may be called from any thread.
class ParquetDataset final : public Dataset {
 public:
  // Throws std::runtime_error naming the file for a missing file, a directory with no
  // *.parquet, or a file whose footer cannot be read (truncated, not Parquet); naming the file
  // and column for a missing column or an unsupported type; std::invalid_argument for no
  // columns, a column asked for twice, or a bad transform.
  explicit ParquetDataset(ParquetOptions options);
  ~ParquetDataset() override;

  std::size_t size() const override;
  // The non-string columns, in the order given.
  std::vector<FieldSpec> fields() const override;
  void read(std::size_t index, const SampleOut& out) const override;
  std::string sample_name(std::size_t index) const override;  // "<file> row <n>"
  std::vector<std::string> cheaper_reads() const override;    // with image columns
  // The row groups, each decoded whole into the row-group cache (cache_bytes): a shuffled
  // loader over more than fit takes a window of them (docs/formats.md, "Memory").
  StorageLayout storage_layout() const override;
  // URL files: the traffic of their object cache (shared by the data sets over it).
  ObjectStorageCounters object_storage_counters() const override;

  // Row `index`'s value of string column `column` (std::nullopt for a null), through the row
  // group cache. Throws std::invalid_argument for a column that is not a string column of the
  // data set, std::runtime_error (naming file and row) if its row group cannot be read.
  std::optional<std::string> text(std::size_t index, const std::string& column) const;

  std::vector<std::string> files() const;

  struct Counters {
    std::uint64_t reads = 0;            // rows read
    std::uint64_t row_group_reads = 0;  // row groups read from the files
    std::uint64_t row_group_bytes = 0;  // their bytes, in memory
    std::uint64_t cached_row_groups = 0;
    std::uint64_t cached_bytes = 0;
  };
  Counters counters() const;
  // The row groups kept in RAM (cache_bytes).
  std::size_t resident_bytes() const override;

  struct Impl;

 private:
  std::shared_ptr<Impl> impl_;
};

// The Parquet files `paths` names: files as they are, directories as every *.parquet in them
// in name order. Throws std::runtime_error for a directory with none (naming it).
std::vector<std::string> parquet_files(const std::vector<std::string>& paths);

}  // namespace stoker
