// Fuzzes stoker::ParquetDataset over one Parquet file (Arrow C++ reads it; built where Arrow is
// found): opening it, the column kinds, and reading every row of each of its top-level columns
// (row groups, nulls, images, strings). Any outcome but success or std::exception is a bug.
#include <arrow/buffer.h>
#include <arrow/io/memory.h>
#include <parquet/file_reader.h>
#include <parquet/metadata.h>
#include <parquet/schema.h>

#include <cstddef>
#include <cstdint>
#include <exception>
#include <string>
#include <vector>

#include "mem_file.h"
#include "stoker/parquet.h"
#include "support/read_sample.h"

namespace {

// As image_decode_fuzz's: small enough that a fuzzed image header cannot make one input take
// gigabytes. Under the default limit (89M pixels) a progressive JPEG decodes through a buffer of
// all its coefficients: a 45 KB file of one 9000x9000 image took 740 MB here, which beside the
// fuzzer's own memory passed libFuzzer's 2 GB in CI.
constexpr std::uint64_t kMaxPixels = std::uint64_t{1} << 22;

// Reads up to 64 rows of `columns` of the file at `path`; every failure is an exception.
void read_rows(const std::string& path, const std::vector<std::string>& columns) {
  try {
    stoker::ParquetOptions o;
    o.files = {path};
    o.columns = columns;
    o.transform = stoker::ImageTransform::val(16, 8);
    o.cache_bytes = 1 << 20;
    o.max_pixels = kMaxPixels;
    stoker::ParquetDataset d(o);
    const auto fields = d.fields();
    for (const auto& f : fields) {
      if (f.bytes() > (1u << 20)) return;  // too large for the fuzzer
    }
    for (std::size_t i = 0; i < d.size() && i < 64; ++i) {
      (void)d.sample_name(i);
      try {
        if (!fields.empty()) (void)stoker::testing::read_sample(d, i);
      } catch (const std::exception&) {
      }
      for (const auto& c : columns) {  // the string columns (the others refuse at once)
        try {
          (void)d.text(i, c);
        } catch (const std::exception&) {
        }
      }
    }
  } catch (const std::exception&) {
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  // The top-level columns, from the footer (if it reads): each alone, then all together.
  std::vector<std::string> columns;
  try {
    auto buffer = std::make_shared<arrow::io::BufferReader>(
        std::make_shared<arrow::Buffer>(data, static_cast<std::int64_t>(size)));
    const auto metadata = parquet::ReadMetaData(buffer);
    const auto* root = metadata->schema()->group_node();
    for (int i = 0; i < root->field_count() && i < 8; ++i) {
      columns.push_back(root->field(i)->name());
    }
  } catch (const std::exception&) {
  }
  if (columns.empty()) columns = {"image"};        // the open fails: its error path
  const MemFile file("fuzz.parquet", data, size);  // the data set reads files
  if (!file.ok()) return 0;
  for (const auto& c : columns) read_rows(file.path(), {c});
  if (columns.size() > 1) read_rows(file.path(), columns);
  return 0;
}
