// stoker::ParquetDataset over files written here with Arrow's own Parquet writer: the column
// kinds, errors at construction, corrupt pages through the loader's skip policy, and the row
// group cache (epoch 2 reads no file).
#include "stoker/parquet.h"

#include <arrow/api.h>
#include <arrow/io/file.h>
#include <gtest/gtest.h>
#include <parquet/arrow/writer.h>
#include <parquet/file_reader.h>
#include <parquet/metadata.h>
#include <parquet/properties.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "image_fixtures.h"
#include "stoker/loader.h"
#include "support/read_sample.h"

namespace stoker {
namespace {

namespace fs = std::filesystem;
using testing::TempDir;

template <class T>
T ok(arrow::Result<T> r) {
  if (!r.ok()) throw std::runtime_error(r.status().ToString());
  return std::move(*r);
}
void ok(const arrow::Status& s) {
  if (!s.ok()) throw std::runtime_error(s.ToString());
}

// Writes `table` as a Parquet file of row groups of `row_group_rows` rows, uncompressed, with
// its Arrow schema (as pyarrow writes it: fixed-size lists read back as such).
void write_parquet(const fs::path& path, const std::shared_ptr<arrow::Table>& table,
                   std::int64_t row_group_rows) {
  auto out = ok(arrow::io::FileOutputStream::Open(path.string()));
  auto props = parquet::WriterProperties::Builder()
                   .compression(parquet::Compression::UNCOMPRESSED)
                   ->disable_dictionary()
                   ->build();
  auto arrow_props = parquet::ArrowWriterProperties::Builder().store_schema()->build();
  ok(parquet::arrow::WriteTable(*table, arrow::default_memory_pool(), out, row_group_rows, props,
                                arrow_props));
  ok(out->Close());
}

std::string as_string(const std::vector<std::byte>& b) {
  return {reinterpret_cast<const char*>(b.data()), b.size()};
}

// Rows 0..n-1: label = 10 * i, ok = i odd, feat = [i, i + 0.5, -i], image (JPEG, a null in
// row `null_image` if given), hf = {bytes: JPEG, path: "i.jpg"}, caption "row i" (null in
// row 1).
std::shared_ptr<arrow::Table> sample_table(int n, int null_image = -1) {
  arrow::Int64Builder label;
  arrow::BooleanBuilder flag;
  auto feat_values = std::make_shared<arrow::FloatBuilder>();
  arrow::FixedSizeListBuilder feat(arrow::default_memory_pool(), feat_values, 3);
  arrow::BinaryBuilder image;
  auto hf_type =
      arrow::struct_({arrow::field("bytes", arrow::binary()), arrow::field("path", arrow::utf8())});
  std::unique_ptr<arrow::ArrayBuilder> hf_builder;
  ok(arrow::MakeBuilder(arrow::default_memory_pool(), hf_type, &hf_builder));
  auto& hf = static_cast<arrow::StructBuilder&>(*hf_builder);
  auto& hf_bytes = static_cast<arrow::BinaryBuilder&>(*hf.field_builder(0));
  auto& hf_path = static_cast<arrow::StringBuilder&>(*hf.field_builder(1));
  arrow::StringBuilder caption;
  for (int i = 0; i < n; ++i) {
    const auto jpeg = as_string(testing::make_jpeg(40 + i, 30, 3, static_cast<std::uint32_t>(i)));
    ok(label.Append(10 * i));
    ok(flag.Append(i % 2 == 1));
    ok(feat.Append());
    ok(feat_values->AppendValues(
        {static_cast<float>(i), static_cast<float>(i) + 0.5f, -static_cast<float>(i)}));
    ok(i == null_image ? image.AppendNull() : image.Append(jpeg));
    ok(hf.Append());
    ok(hf_bytes.Append(jpeg));
    ok(hf_path.Append(std::to_string(i) + ".jpg"));
    ok(i == 1 ? caption.AppendNull() : caption.Append("row " + std::to_string(i)));
  }
  auto schema =
      arrow::schema({arrow::field("label", arrow::int64()), arrow::field("ok", arrow::boolean()),
                     arrow::field("feat", arrow::fixed_size_list(arrow::float32(), 3)),
                     arrow::field("image", arrow::binary()), arrow::field("hf", hf_type),
                     arrow::field("caption", arrow::utf8())});
  return arrow::Table::Make(schema, {ok(label.Finish()), ok(flag.Finish()), ok(feat.Finish()),
                                     ok(image.Finish()), ok(hf.Finish()), ok(caption.Finish())});
}

using testing::read_sample;

template <class T>
T value(const std::vector<std::byte>& b, std::size_t k = 0) {
  T v;
  std::memcpy(&v, b.data() + k * sizeof(T), sizeof(T));
  return v;
}

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const std::exception& e) {
    return e.what();
  }
  return "";
}

ParquetOptions options(const fs::path& path, std::vector<std::string> columns) {
  ParquetOptions o;
  o.files = {path.string()};
  o.columns = std::move(columns);
  o.transform = ImageTransform::val(32, 32);
  return o;
}

TEST(Parquet, ReadsNumbersListsImagesHuggingFaceImagesAndStrings) {
  TempDir dir;
  write_parquet(dir / "a.parquet", sample_table(5, /*null_image=*/4), 2);
  write_parquet(dir / "b.parquet", sample_table(3), 3);
  ParquetDataset d(options(dir.path(), {"hf", "label", "caption", "ok", "feat", "image"}));
  ASSERT_EQ(d.size(), 8u);
  const auto fields = d.fields();  // the string column is not a field
  ASSERT_EQ(fields.size(), 5u);
  EXPECT_EQ(fields[0].name, "hf");
  EXPECT_EQ(fields[0].shape, (std::vector<std::int64_t>{3, 32, 32}));
  EXPECT_EQ(fields[1].dtype, DType::i64);
  EXPECT_EQ(fields[2].dtype, DType::u8);
  EXPECT_EQ(fields[3].dtype, DType::f32);
  EXPECT_EQ(fields[3].shape, (std::vector<std::int64_t>{3}));
  for (std::size_t i : {0u, 3u, 6u}) {  // row groups 0 and 1 of a, the one of b
    const std::size_t row = i < 5 ? i : i - 5;
    const auto r = read_sample(d, i);
    EXPECT_EQ(value<std::int64_t>(r.fields[1]), static_cast<std::int64_t>(10 * row));
    EXPECT_EQ(value<std::uint8_t>(r.fields[2]), row % 2);
    EXPECT_EQ(value<float>(r.fields[3], 1), static_cast<float>(row) + 0.5f);
    EXPECT_EQ(value<float>(r.fields[3], 2), -static_cast<float>(row));
    // The binary column and the Hugging Face struct hold the same JPEG: the same pixels.
    EXPECT_EQ(r.fields[0], r.fields[4]);
  }
  EXPECT_EQ(d.text(0, "caption"), "row 0");
  EXPECT_EQ(d.text(1, "caption"), std::nullopt);
  EXPECT_EQ(d.text(7, "caption"), "row 2");
  EXPECT_NE(error_of([&] { (void)d.text(0, "label"); }).find("not a string column"),
            std::string::npos);
  EXPECT_EQ(d.sample_name(6), (dir / "b.parquet").string() + " row 1");
  // A null image fails its row, named by file, row and column.
  const std::string e = error_of([&] { read_sample(d, 4); });
  EXPECT_EQ(e, (dir / "a.parquet").string() + " row 4, column 'image': null");
  // Each row group read once while it stays cached: a's 0, 1 and 2 (row 4), b's 0.
  EXPECT_EQ(d.counters().row_group_reads, 4u);
}

TEST(Parquet, BadFilesAndColumnsAreNamedAtConstruction) {
  TempDir dir;
  write_parquet(dir / "a.parquet", sample_table(3), 3);
  const std::string a = (dir / "a.parquet").string();
  std::string e = error_of([&] { ParquetDataset d(options(dir / "none.parquet", {"label"})); });
  EXPECT_NE(e.find("none.parquet: not a readable Parquet file (no such file)"), std::string::npos)
      << e;
  e = error_of([&] { ParquetDataset d(options(a, {"label", "nope"})); });
  EXPECT_NE(e.find(a + ": no column 'nope' (its columns: label, ok, feat, image, hf, caption)"),
            std::string::npos)
      << e;
  e = error_of([&] { ParquetDataset d(options(a, {"label", "label"})); });
  EXPECT_NE(e.find("'label' asked for twice"), std::string::npos) << e;
  // Truncated (a partial download), and not Parquet at all.
  const auto whole = testing::read_file(a);
  testing::write_file(dir / "cut.parquet",
                      std::vector<std::byte>(whole.begin(), whole.begin() + whole.size() / 2));
  e = error_of([&] { ParquetDataset d(options(dir / "cut.parquet", {"label"})); });
  EXPECT_NE(e.find("cut.parquet: not a readable Parquet file ("), std::string::npos) << e;
  testing::write_file(dir / "x.parquet", std::vector<std::byte>(100, std::byte{7}));
  e = error_of([&] { ParquetDataset d(options(dir / "x.parquet", {"label"})); });
  EXPECT_NE(e.find("x.parquet: not a readable Parquet file ("), std::string::npos) << e;
  // A type stoker does not read: named with the file and column.
  arrow::ListBuilder list(arrow::default_memory_pool(), std::make_shared<arrow::Int32Builder>());
  ok(list.Append());
  auto lists = arrow::Table::Make(arrow::schema({arrow::field("v", arrow::list(arrow::int32()))}),
                                  {ok(list.Finish())});
  write_parquet(dir / "lists.pq", lists, 1);
  e = error_of([&] { ParquetDataset d(options(dir / "lists.pq", {"v"})); });
  EXPECT_NE(e.find("lists.pq: column 'v' has type list<element: int32>"), std::string::npos) << e;
  // A directory with no *.parquet.
  fs::create_directories(dir / "empty");
  e = error_of([&] { ParquetDataset d(options(dir / "empty", {"v"})); });
  EXPECT_NE(e.find("no Parquet files"), std::string::npos) << e;
}

// Overwrites the page header of row group `g`'s column `c` with garbage.
void corrupt_page(const fs::path& path, int g, int c) {
  const auto reader = parquet::ParquetFileReader::OpenFile(path.string());
  const auto offset = reader->metadata()->RowGroup(g)->ColumnChunk(c)->data_page_offset();
  std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
  f.seekp(offset);
  const std::string junk(16, '\xfb');
  f.write(junk.data(), static_cast<std::streamsize>(junk.size()));
}

TEST(Parquet, ACorruptPageFailsItsRowGroupsRowsOnlyAndTheLoaderSkipsThem) {
  TempDir dir;
  const fs::path file = dir / "a.parquet";
  write_parquet(file, sample_table(9), 3);
  corrupt_page(file, 1, 3);  // row group 1 (rows 3..5), the image column
  ParquetOptions po = options(file, {"image", "label"});
  auto d = std::make_shared<ParquetDataset>(po);
  const std::string e = error_of([&] { read_sample(*d, 4); });
  EXPECT_NE(e.find(file.string() + " row 4: its row group (1) could not be read: "),
            std::string::npos)
      << e;
  for (std::size_t workers : {0u, 3u}) {
    LoaderOptions o;
    o.dataset = std::make_shared<ParquetDataset>(po);
    o.batch_size = 2;
    o.workers = workers;
    o.shuffle = true;
    o.on_error = ErrorPolicy::skip;
    Loader loader(o);
    std::size_t rows = 0;
    std::set<std::int64_t> labels;
    while (auto b = loader.next()) {
      rows += b->size();
      const auto l = b->as<std::int64_t>(1);
      labels.insert(l.begin(), l.end());
    }
    EXPECT_EQ(rows, 9u);  // the bad rows replaced by good ones
    EXPECT_EQ(labels, (std::set<std::int64_t>{0, 10, 20, 60, 70, 80}));
    std::set<std::size_t> skipped;
    for (const auto& s : loader.skipped_samples()) {
      skipped.insert(s.index);
      EXPECT_EQ(s.name, file.string() + " row " + std::to_string(s.index));
      EXPECT_NE(s.reason.find("its row group (1) could not be read"), std::string::npos)
          << s.reason;
    }
    EXPECT_EQ(skipped, (std::set<std::size_t>{3, 4, 5})) << "workers " << workers;
  }
}

TEST(Parquet, AFileTruncatedAfterOpeningFailsTheRowGroupsItLost) {
  TempDir dir;
  const fs::path file = dir / "a.parquet";
  write_parquet(file, sample_table(6), 2);
  ParquetDataset d(options(file, {"image", "label"}));
  const auto reader = parquet::ParquetFileReader::OpenFile(file.string());
  const auto cut = reader->metadata()->RowGroup(2)->ColumnChunk(0)->data_page_offset() + 10;
  fs::resize_file(file, static_cast<std::uintmax_t>(cut));  // row group 2 (rows 4, 5) cut
  EXPECT_EQ(value<std::int64_t>(read_sample(d, 1).fields[1]), 10);
  const std::string e = error_of([&] { read_sample(d, 5); });
  EXPECT_NE(e.find(file.string() + " row 5: its row group (2) could not be read: "),
            std::string::npos)
      << e;
  // Its failure is kept: the other row of that row group fails without another read.
  const auto reads = d.counters().row_group_reads;
  EXPECT_NE(error_of([&] { read_sample(d, 4); }).find("row 4: its row group (2)"),
            std::string::npos);
  EXPECT_EQ(d.counters().row_group_reads, reads);
}

TEST(Parquet, RowGroupsLargerThanTheCacheAreShuffledOverAWindowAndReadOnceAnEpoch) {
  TempDir dir;
  write_parquet(dir / "a.parquet", sample_table(120), 4);  // 30 row groups
  ParquetOptions po = options(dir.path(), {"image", "label"});
  const auto layout = ParquetDataset(po).storage_layout();
  ASSERT_NE(layout.blocks, nullptr);
  EXPECT_TRUE(layout.read_whole);
  ASSERT_EQ(layout.blocks->ends.size(), 30u);
  EXPECT_EQ(layout.blocks->ends[0], 4u);
  EXPECT_EQ(layout.blocks->object_ends, std::vector<std::size_t>{120});
  // The selected columns' uncompressed size: the JPEGs, mostly.
  EXPECT_GT(layout.blocks->bytes[0], 4u * 600);
  po.cache_bytes = layout.blocks->total_bytes() * 3 / 5;  // half of it: 9 row groups
  auto d = std::make_shared<ParquetDataset>(po);
  LoaderOptions o;
  o.dataset = d;
  o.batch_size = 2;
  o.workers = 2;
  o.shuffle = true;
  Loader loader(o);
  const Stats stats = loader.stats();
  EXPECT_EQ(stats.shuffle.rfind("window of ", 0), 0u) << stats.shuffle;
  EXPECT_NE(stats.shuffle.find("the row-group cache of"), std::string::npos) << stats.shuffle;
  EXPECT_GE(stats.shuffle_window, 2u);
  EXPECT_LT(stats.shuffle_window, 30u);
  for (std::uint64_t epoch = 0; epoch < 2; ++epoch) {
    loader.set_epoch(epoch);
    std::vector<std::int64_t> labels;
    while (auto batch = loader.next()) {
      const auto l = batch->as<std::int64_t>(1);
      labels.insert(labels.end(), l.begin(), l.end());
    }
    std::sort(labels.begin(), labels.end());
    ASSERT_EQ(labels.size(), 120u);
    for (std::size_t i = 0; i < labels.size(); ++i) {
      EXPECT_EQ(labels[i], 10 * static_cast<std::int64_t>(i));
    }
    // Each read once an epoch: a few the last epoch left in the cache are not read again, and
    // the next epoch's first window may be read ahead before this one's last batch is out.
    EXPECT_GT(d->counters().row_group_reads, 30u * epoch);
    EXPECT_LE(d->counters().row_group_reads, 30u * (epoch + 1) + stats.shuffle_window);
  }
}

TEST(Parquet, WithCacheBytesForTheDataSetEpochTwoReadsNoFile) {
  TempDir dir;
  write_parquet(dir / "a.parquet", sample_table(12), 3);
  for (const std::size_t cache_bytes : {std::size_t{64} << 20, std::size_t{1}}) {
    ParquetOptions po = options(dir.path(), {"image", "label"});
    po.cache_bytes = cache_bytes;
    auto d = std::make_shared<ParquetDataset>(po);
    LoaderOptions o;
    o.dataset = d;
    o.batch_size = 4;
    o.workers = 2;
    o.shuffle = true;
    o.shuffle_mode = ShuffleMode::global;  // the cache's own behaviour, not the window's
    Loader loader(o);
    std::vector<std::uint64_t> reads;
    for (std::uint64_t epoch = 0; epoch < 2; ++epoch) {
      loader.set_epoch(epoch);
      while (loader.next()) {
      }
      reads.push_back(d->counters().row_group_reads);
    }
    if (cache_bytes > 1) {
      EXPECT_EQ(reads[0], 4u);  // each row group once
      EXPECT_EQ(reads[1], reads[0]);
      EXPECT_EQ(d->counters().cached_row_groups, 4u);
      // What the cache holds counts against the loader's memory cap.
      EXPECT_GT(d->resident_bytes(), 0u);
      EXPECT_EQ(d->resident_bytes(), d->counters().cached_bytes);
      EXPECT_EQ(loader.stats().memory_cache, d->counters().cached_bytes);
    } else {
      // One row group kept (per reading thread): shuffled epochs read row groups again. (Not
      // reads[1] > reads[0]: the second epoch may be read ahead before the first one ends.)
      EXPECT_GT(reads[1], 4u);
    }
  }
}

}  // namespace
}  // namespace stoker
