// stoker::ParquetDataset (include/stoker/parquet.h): Parquet read by Apache Arrow's C++ Parquet
// reader, a row group's selected columns at a time, kept in a byte-bounded LRU cache shared by
// the worker threads; rows are then copied (numbers) or decoded (images) from the Arrow arrays
// straight into their batch slots.
#include "stoker/parquet.h"

#include <arrow/api.h>
#include <arrow/io/file.h>
#include <arrow/util/byte_size.h>
#include <parquet/arrow/reader.h>
#include <parquet/arrow/schema.h>
#include <parquet/exception.h>
#include <parquet/file_reader.h>
#include <parquet/metadata.h>
#include <parquet/properties.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstring>
#include <filesystem>
#include <optional>
#include <set>
#include <span>
#include <stdexcept>
#include <string_view>
#include <unordered_map>
#include <utility>

#include "io/file.h"
#include "source/resolve.h"
#include "stoker/frontend/mutex.h"

namespace stoker {
namespace {

namespace fs = std::filesystem;

enum class Kind : std::uint8_t { number, image, text };

struct Column {
  std::string name;
  Kind kind = Kind::number;
  std::shared_ptr<arrow::DataType> type;  // the first file's; every file must have the same
  std::size_t field = 0;                  // number, image: its index in fields()
  FieldSpec spec;                         // number, image
  std::size_t elements = 1;               // number: values per row
  bool boolean = false;                   // number: bit-packed bools, written as uint8
  bool hf_image = false;                  // image: Hugging Face's struct {bytes, path}
};

struct File {
  std::string path;
  io::FilePtr io;  // a local file, or an object read through the object cache
  std::shared_ptr<parquet::FileMetaData> metadata;
  std::vector<int> leaves;              // the Parquet leaf columns read, for all the columns
  std::vector<std::size_t> leaves_end;  // column k's leaves end at leaves[leaves_end[k]]
};

// A row group of one file, and where its rows are in the data set.
struct Part {
  std::size_t file = 0;
  int row_group = 0;               // within the file
  std::int64_t first_in_file = 0;  // the file's row number of its first row
  std::int64_t rows = 0;
  std::uint64_t offset = 0;  // its bytes in the file: from its first column chunk
  std::uint64_t length = 0;  // to the end of its last
};

// A stoker io::File as Arrow's input (leveldb's and Arrow's random-access file are the
// anchors): Arrow's Parquet reader reads the footer and the column chunks asked for by range,
// and never knows whether they come from a local file or through the object cache. `once`:
// what is read is kept elsewhere (the footer, in the file's FileMetaData): read by exact
// ranges, not through the cache's chunks (File::read_uncached).
class ArrowFile final : public arrow::io::RandomAccessFile {
 public:
  ArrowFile(io::FilePtr file, bool once) : file_(std::move(file)), once_(once) {}

  arrow::Status Close() override {
    closed_ = true;
    return arrow::Status::OK();
  }
  bool closed() const override { return closed_; }
  arrow::Result<std::int64_t> Tell() const override { return position_; }
  arrow::Status Seek(std::int64_t position) override {
    if (position < 0) return arrow::Status::Invalid(file_->name(), ": a negative offset");
    position_ = position;
    return arrow::Status::OK();
  }
  arrow::Result<std::int64_t> GetSize() override {
    return static_cast<std::int64_t>(file_->size());
  }
  arrow::Result<std::int64_t> Read(std::int64_t n, void* out) override {
    ARROW_ASSIGN_OR_RAISE(const std::int64_t got, ReadAt(position_, n, out));
    position_ += got;
    return got;
  }
  arrow::Result<std::shared_ptr<arrow::Buffer>> Read(std::int64_t n) override {
    ARROW_ASSIGN_OR_RAISE(auto buffer, ReadAt(position_, n));
    position_ += buffer->size();
    return buffer;
  }
  // Thread safety: from any thread (io::File::read_at is).
  arrow::Result<std::int64_t> ReadAt(std::int64_t position, std::int64_t n, void* out) override {
    if (position < 0 || n < 0) return arrow::Status::Invalid(file_->name(), ": a negative range");
    const auto at = static_cast<std::uint64_t>(position);
    auto* dst = static_cast<std::byte*>(out);
    try {
      if (!once_)
        return static_cast<std::int64_t>(file_->read_at(at, dst, static_cast<std::size_t>(n)));
      const std::uint64_t left = at < file_->size() ? file_->size() - at : 0;
      const auto count =
          static_cast<std::size_t>(std::min<std::uint64_t>(left, static_cast<std::uint64_t>(n)));
      file_->read_uncached(at, dst, count);
      return static_cast<std::int64_t>(count);
    } catch (const std::exception& e) {  // names the file (a URL: the HTTP status too)
      return arrow::Status::IOError(e.what());
    }
  }
  arrow::Result<std::shared_ptr<arrow::Buffer>> ReadAt(std::int64_t position,
                                                       std::int64_t n) override {
    ARROW_ASSIGN_OR_RAISE(auto buffer, arrow::AllocateResizableBuffer(n));
    ARROW_ASSIGN_OR_RAISE(const std::int64_t got, ReadAt(position, n, buffer->mutable_data()));
    if (got < n) ARROW_RETURN_NOT_OK(buffer->Resize(got));
    return std::shared_ptr<arrow::Buffer>(std::move(buffer));
  }
  arrow::Status WillNeed(const std::vector<arrow::io::ReadRange>& ranges) override {
    for (const auto& r : ranges) {
      file_->will_read(static_cast<std::uint64_t>(r.offset), static_cast<std::size_t>(r.length));
    }
    return arrow::Status::OK();
  }

 private:
  io::FilePtr file_;
  bool once_ = false;
  std::int64_t position_ = 0;
  bool closed_ = false;
};

struct RowGroup {
  std::vector<std::shared_ptr<arrow::ChunkedArray>> columns;  // in column order
  std::string error;  // why it could not be read (then every row of it fails with this)
  std::size_t bytes = 0;
};

[[noreturn]] void fail(const std::string& what) { throw std::runtime_error(what); }

// The dtype a number column's values are written as; nullopt for an unsupported type.
std::optional<DType> number_dtype(arrow::Type::type id) {
  switch (id) {
    case arrow::Type::BOOL:
    case arrow::Type::UINT8:
      return DType::u8;
    case arrow::Type::INT8:
      return DType::i8;
    case arrow::Type::INT16:
      return DType::i16;
    case arrow::Type::INT32:
      return DType::i32;
    case arrow::Type::INT64:
      return DType::i64;
    case arrow::Type::HALF_FLOAT:
      return DType::f16;
    case arrow::Type::FLOAT:
      return DType::f32;
    case arrow::Type::DOUBLE:
      return DType::f64;
    default:
      return std::nullopt;
  }
}

bool holds_bytes(const arrow::DataType& t) {
  return t.id() == arrow::Type::BINARY || t.id() == arrow::Type::LARGE_BINARY;
}

// Fills in `c`'s kind and spec from its Arrow type; false if the type is not supported.
bool classify(Column& c, const ImageTransform& transform) {
  const arrow::DataType& t = *c.type;
  if (t.id() == arrow::Type::STRING || t.id() == arrow::Type::LARGE_STRING) {
    c.kind = Kind::text;
    return true;
  }
  if (holds_bytes(t)) {
    c.kind = Kind::image;
  } else if (t.id() == arrow::Type::STRUCT) {
    const auto bytes = static_cast<const arrow::StructType&>(t).GetFieldByName("bytes");
    if (!bytes || !holds_bytes(*bytes->type())) return false;
    c.kind = Kind::image;
    c.hf_image = true;
  }
  if (c.kind == Kind::image) {
    c.spec = {c.name, transform.dtype, transform.shape()};
    return true;
  }
  std::vector<std::int64_t> shape;
  const arrow::DataType* leaf = &t;
  while (leaf->id() == arrow::Type::FIXED_SIZE_LIST) {
    const auto& list = static_cast<const arrow::FixedSizeListType&>(*leaf);
    shape.push_back(list.list_size());
    c.elements *= static_cast<std::size_t>(list.list_size());
    leaf = list.value_type().get();
  }
  const auto dtype = number_dtype(leaf->id());
  if (!dtype) return false;
  c.kind = Kind::number;
  c.boolean = leaf->id() == arrow::Type::BOOL;
  c.spec = {c.name, *dtype, std::move(shape)};
  return true;
}

// The Parquet leaf columns that hold field `f`: all its leaves, or only the `bytes` of a
// Hugging Face image struct (its paths are not read).
void collect_leaves(const parquet::arrow::SchemaField& f, bool hf_image, std::vector<int>& out) {
  if (f.is_leaf()) {
    out.push_back(f.column_index);
    return;
  }
  for (const auto& child : f.children) {
    if (hf_image && child.field->name() != "bytes") continue;
    collect_leaves(child, false, out);
  }
}

parquet::ReaderProperties reader_properties() {
  parquet::ReaderProperties p;
  p.set_page_checksum_verification(true);  // where the writer stored page CRCs
  return p;
}

// Where the column chunks of a file's row groups begin and end, 0 first: the chunks of the
// object cache for a Parquet object, so that a column chunk read is fetched by exactly its
// range (one GET; the columns not asked for never) and kept whole.
std::vector<std::uint64_t> column_chunk_bounds(const parquet::FileMetaData& m) {
  std::vector<std::uint64_t> out{0};
  for (int g = 0; g < m.num_row_groups(); ++g) {
    const auto group = m.RowGroup(g);
    for (int c = 0; c < group->num_columns(); ++c) {
      const auto chunk = group->ColumnChunk(c);
      const std::int64_t dictionary =
          chunk->has_dictionary_page() ? chunk->dictionary_page_offset() : 0;
      const std::int64_t start = dictionary > 0 ? std::min(dictionary, chunk->data_page_offset())
                                                : chunk->data_page_offset();
      if (start < 0 || chunk->total_compressed_size() < 0) continue;
      out.push_back(static_cast<std::uint64_t>(start));
      out.push_back(static_cast<std::uint64_t>(start + chunk->total_compressed_size()));
    }
  }
  std::sort(out.begin(), out.end());
  out.erase(std::unique(out.begin(), out.end()), out.end());
  return out;
}

// The byte ranges of row group g's leaf columns `leaves` (offset, length), for a read-ahead hint.
std::vector<io::File::Range> column_ranges(const parquet::FileMetaData& m, int g,
                                           const std::vector<int>& leaves) {
  std::vector<io::File::Range> out;
  const auto group = m.RowGroup(g);
  for (const int leaf : leaves) {
    const auto chunk = group->ColumnChunk(leaf);
    const std::int64_t dictionary =
        chunk->has_dictionary_page() ? chunk->dictionary_page_offset() : 0;
    const std::int64_t start = dictionary > 0 ? std::min(dictionary, chunk->data_page_offset())
                                              : chunk->data_page_offset();
    if (start < 0 || chunk->total_compressed_size() <= 0) continue;
    out.emplace_back(static_cast<std::uint64_t>(start),
                     static_cast<std::size_t>(chunk->total_compressed_size()));
  }
  std::sort(out.begin(), out.end());
  return out;
}

std::unique_ptr<parquet::arrow::FileReader> open_reader(
    const io::FilePtr& file, std::shared_ptr<parquet::FileMetaData> metadata) {
  parquet::ArrowReaderProperties props;
  props.set_use_threads(false);  // the engine's worker threads are the parallelism
  props.set_pre_buffer(false);   // and they do the reads themselves, not Arrow's I/O pool
  auto reader = parquet::arrow::FileReader::Make(
      arrow::default_memory_pool(),
      parquet::ParquetFileReader::Open(std::make_shared<ArrowFile>(file, false),
                                       reader_properties(), std::move(metadata)),
      props);
  if (!reader.ok()) fail(reader.status().message());
  return std::move(*reader);
}

// The chunk of `column` that holds row `r`, and the row within it.
std::pair<const arrow::Array*, std::int64_t> chunk_of(const arrow::ChunkedArray& column,
                                                      std::int64_t r) {
  for (const auto& chunk : column.chunks()) {
    if (r < chunk->length()) return {chunk.get(), r};
    r -= chunk->length();
  }
  return {nullptr, 0};
}

}  // namespace

struct ParquetDataset::Impl {
  std::vector<File> files;
  std::vector<Column> columns;
  std::vector<Part> parts;
  std::vector<std::size_t> starts;  // data set row of each part's first row, and the size
  std::shared_ptr<const StorageBlocks> blocks;  // the row groups (storage_layout())
  ImageTransform transform;
  std::uint64_t max_pixels = kDefaultMaxPixels;
  std::size_t cache_bytes = 0;
  detail::RemoteHandle remote;  // URL files: their object cache

  mutable detail::Mutex mu;
  mutable std::condition_variable loaded;
  struct Slot {
    std::shared_ptr<const RowGroup> group;  // null while a thread reads it
    std::uint64_t last_use = 0;
  };
  mutable std::unordered_map<std::size_t, Slot> cache STOKER_GUARDED_BY(mu);
  mutable std::uint64_t tick STOKER_GUARDED_BY(mu) = 0;
  mutable std::size_t cached_bytes STOKER_GUARDED_BY(mu) = 0;

  mutable std::atomic<std::uint64_t> reads{0};
  mutable std::atomic<std::uint64_t> row_group_reads{0};
  mutable std::atomic<std::uint64_t> row_group_bytes{0};

  std::size_t size() const { return starts.back(); }

  std::pair<std::size_t, std::int64_t> locate(std::size_t index) const {
    if (index >= size()) {
      throw std::out_of_range("stoker::ParquetDataset: row " + std::to_string(index) +
                              " out of range for " + std::to_string(size()) + " rows");
    }
    const auto it = std::upper_bound(starts.begin(), starts.end(), index);
    const auto g = static_cast<std::size_t>(it - starts.begin()) - 1;
    return {g, static_cast<std::int64_t>(index - starts[g])};
  }

  std::string row_name(std::size_t g, std::int64_t r) const {
    const Part& p = parts[g];
    return files[p.file].path + " row " + std::to_string(p.first_in_file + r);
  }

  // Row group g, from the cache or read (by this thread, or by another already reading it);
  // throws naming the row if it could not be read.
  std::shared_ptr<const RowGroup> row_group(std::size_t g, std::int64_t r) const {
    std::shared_ptr<const RowGroup> group = cached_or_loaded(g);
    if (!group->error.empty()) {
      fail(row_name(g, r) + ": its row group (" + std::to_string(parts[g].row_group) +
           ") could not be read: " + group->error);
    }
    return group;
  }

  std::shared_ptr<const RowGroup> cached_or_loaded(std::size_t g) const {
    {
      detail::MutexLock lock(mu);
      for (;;) {
        auto it = cache.find(g);
        if (it == cache.end()) break;
        it->second.last_use = ++tick;
        if (it->second.group) return it->second.group;
        lock.wait(loaded);  // another thread reads it
      }
      cache[g] = Slot{nullptr, ++tick};
    }
    std::shared_ptr<const RowGroup> group = load(g);
    detail::MutexLock lock(mu);
    cache[g].group = group;
    cached_bytes += group->bytes;
    // Least recently used out first, down to the budget; the row group just read stays (a
    // reader in another thread holds its own reference to one that goes).
    while (cached_bytes > cache_bytes && cache.size() > 1) {
      auto oldest = cache.end();
      for (auto it = cache.begin(); it != cache.end(); ++it) {
        if (it->first == g || !it->second.group) continue;
        if (oldest == cache.end() || it->second.last_use < oldest->second.last_use) oldest = it;
      }
      if (oldest == cache.end()) break;
      cached_bytes -= oldest->second.group->bytes;
      cache.erase(oldest);
    }
    loaded.notify_all();
    return group;
  }

  // Reads part g's selected columns. Never throws: a failure is kept in the row group (each of
  // its rows then fails with it, and it is not read again while cached).
  std::shared_ptr<const RowGroup> load(std::size_t g) const {
    auto group = std::make_shared<RowGroup>();
    const Part& p = parts[g];
    const File& f = files[p.file];
    try {
      // The selected column chunks, adjacent ones fetched together (an object; a local file:
      // nothing to do), then read by Arrow one column chunk at a time.
      const auto ranges = column_ranges(*f.metadata, p.row_group, f.leaves);
      f.io->will_read(ranges);
      const auto reader = open_reader(f.io, f.metadata);
      auto table = reader->ReadRowGroup(p.row_group, f.leaves);
      if (!table.ok()) fail(table.status().ToString());
      const arrow::Table& t = **table;
      if (t.num_rows() != p.rows) {
        fail("it has " + std::to_string(t.num_rows()) + " rows, its footer says " +
             std::to_string(p.rows));
      }
      for (const Column& c : columns) {
        auto column = t.GetColumnByName(c.name);
        if (!column) fail("no column '" + c.name + "' in what was read");
        // Corrupt pages can decode into arrays whose offsets point outside their data: checked
        // here once, so that reading a row never reads outside the row group.
        const auto valid = column->ValidateFull();
        if (!valid.ok()) fail("column '" + c.name + "': " + valid.ToString());
        group->bytes += static_cast<std::size_t>(arrow::util::TotalBufferSize(*column));
        group->columns.push_back(std::move(column));
      }
    } catch (const std::exception& e) {  // parquet::ParquetException among them
      group->error = e.what();
      group->columns.clear();
      group->bytes = 0;
    }
    row_group_reads.fetch_add(1, std::memory_order_relaxed);
    row_group_bytes.fetch_add(group->bytes, std::memory_order_relaxed);
    return group;
  }

  // Copies row r of number column c (an array of its chunk) into `dest`.
  void copy_number(const Column& c, const arrow::Array& top, std::int64_t r, std::byte* dest,
                   std::size_t g, std::int64_t row) const {
    const arrow::Array* a = &top;
    std::int64_t begin = r;
    std::int64_t count = 1;
    while (a->type_id() == arrow::Type::FIXED_SIZE_LIST) {
      const auto& list = static_cast<const arrow::FixedSizeListArray&>(*a);
      begin = list.value_offset(begin);
      count *= list.value_length();
      a = list.values().get();
    }
    if (a->null_count() > 0 && a != &top) {
      for (std::int64_t i = begin; i < begin + count; ++i) {
        if (a->IsNull(i)) fail(row_name(g, row) + ", column '" + c.name + "': a null value");
      }
    }
    if (c.boolean) {
      const auto& bools = static_cast<const arrow::BooleanArray&>(*a);
      for (std::int64_t i = 0; i < count; ++i) {
        dest[i] = static_cast<std::byte>(bools.Value(begin + i) ? 1 : 0);
      }
      return;
    }
    const auto& values = static_cast<const arrow::PrimitiveArray&>(*a);
    const std::size_t width = dtype_size(c.spec.dtype);
    const auto* src =
        values.values()->data() + static_cast<std::size_t>(values.offset() + begin) * width;
    std::memcpy(dest, src, static_cast<std::size_t>(count) * width);
  }

  // Row r's encoded image in column c's chunk `a`; nullopt for a null.
  static std::optional<std::string_view> image_bytes(const Column& c, const arrow::Array& a,
                                                     std::int64_t r) {
    if (a.IsNull(r)) return std::nullopt;
    const arrow::Array* bytes = &a;
    std::shared_ptr<arrow::Array> field;
    if (c.hf_image) {
      field = static_cast<const arrow::StructArray&>(a).GetFieldByName("bytes");
      bytes = field.get();
      if (bytes->IsNull(r)) return std::nullopt;
    }
    if (bytes->type_id() == arrow::Type::LARGE_BINARY) {
      return static_cast<const arrow::LargeBinaryArray&>(*bytes).GetView(r);
    }
    return static_cast<const arrow::BinaryArray&>(*bytes).GetView(r);
  }
};

std::vector<std::string> parquet_files(const std::vector<std::string>& paths) {
  std::vector<std::string> out;
  for (const auto& p : paths) {
    if (detail::path_kind(p, ".parquet") != detail::PathKind::directory) {
      out.push_back(p);  // a file, or a URL (resolved by the data set)
      continue;
    }
    const auto found = detail::files_in(p, ".parquet");
    if (found.empty()) fail(p + ": no Parquet files (*.parquet)");
    out.insert(out.end(), found.begin(), found.end());
  }
  return out;
}

ParquetDataset::ParquetDataset(ParquetOptions options) : impl_(std::make_shared<Impl>()) {
  Impl& d = *impl_;
  if (options.columns.empty()) throw std::invalid_argument("stoker::ParquetDataset: no columns");
  std::set<std::string> seen;
  for (const auto& name : options.columns) {
    if (!seen.insert(name).second) {
      throw std::invalid_argument("stoker::ParquetDataset: column '" + name + "' asked for twice");
    }
  }
  options.transform.validate();
  d.transform = options.transform;
  d.max_pixels = options.max_pixels;
  d.cache_bytes = options.cache_bytes;
  const auto named = parquet_files(options.files);
  if (named.empty()) throw std::invalid_argument("stoker::ParquetDataset: no files");
  // URL files: resolved together (one listing per prefix), their footers read by exact ranges,
  // then their column chunks through the object cache, each chunk a column chunk.
  std::vector<char> is_object;
  const std::vector<std::string> urls = detail::storage_urls(named, ".parquet", is_object);
  std::optional<detail::Resolver> resolver;
  std::vector<std::vector<io::FilePtr>> objects;
  if (!urls.empty()) {
    resolver.emplace(options.storage, "parquet");
    objects = resolver->objects(urls, ".parquet");
    d.remote = resolver->remote();
  }
  std::vector<std::pair<std::string, io::FilePtr>> paths;  // local files: opened below
  for (std::size_t k = 0, next = 0; k < named.size(); ++k) {
    if (!is_object[k]) {
      paths.emplace_back(named[k], nullptr);
      continue;
    }
    for (auto& file : objects[next++]) paths.emplace_back(file->name(), std::move(file));
  }

  for (const auto& [path, opened] : paths) {
    File f;
    f.path = path;
    f.io = opened;
    std::unique_ptr<parquet::arrow::FileReader> reader;
    std::shared_ptr<arrow::Schema> schema;
    try {
      if (!f.io) {
        std::error_code ec;
        if (!fs::exists(path, ec)) fail("no such file");
        f.io = detail::Resolver::open(path, false);  // opened for each read: any number of files
      }
      f.metadata = parquet::ReadMetaData(std::make_shared<ArrowFile>(f.io, true));
      if (const detail::RemoteObject* object = f.io->object()) {
        detail::RemoteObject cut = *object;
        cut.chunk_starts =
            std::make_shared<const std::vector<std::uint64_t>>(column_chunk_bounds(*f.metadata));
        f.io = resolver->open(cut);
      }
      reader = open_reader(f.io, f.metadata);
      const auto status = reader->GetSchema(&schema);
      if (!status.ok()) fail(status.message());
    } catch (const std::exception& e) {
      fail(path + ": not a readable Parquet file (" + e.what() + ")");
    }
    const auto& fields = reader->manifest().schema_fields;
    for (std::size_t k = 0; k < options.columns.size(); ++k) {
      const std::string& name = options.columns[k];
      const int i = schema->GetFieldIndex(name);
      if (i < 0) {
        std::string names;
        for (const auto& field : schema->fields()) {
          names += (names.empty() ? "" : ", ") + field->name();
        }
        fail(path + ": no column '" + name + "' (its columns: " + names + ")");
      }
      const auto& type = schema->field(i)->type();
      if (d.columns.size() == k) {  // the first file
        Column c;
        c.name = name;
        c.type = type;
        if (!classify(c, d.transform)) {
          fail(path + ": column '" + name + "' has type " + type->ToString() +
               ", which stoker does not read (numbers, fixed-size lists of numbers, binary "
               "images, Hugging Face image structs, strings)");
        }
        d.columns.push_back(std::move(c));
      }
      const Column& c = d.columns[k];
      if (!type->Equals(*c.type)) {
        fail(path + ": column '" + name + "' has type " + type->ToString() + ", not " +
             c.type->ToString() + " as in " + paths[0].first);
      }
      collect_leaves(fields[static_cast<std::size_t>(i)], c.hf_image, f.leaves);
      f.leaves_end.push_back(f.leaves.size());
    }
    const std::size_t file_index = d.files.size();
    std::int64_t first = 0;
    for (int g = 0; g < f.metadata->num_row_groups(); ++g) {
      const std::int64_t rows = f.metadata->RowGroup(g)->num_rows();
      if (rows < 0) fail(path + ": row group " + std::to_string(g) + " has a negative size");
      if (rows > 0) d.parts.push_back({file_index, g, first, rows});
      first += rows;
    }
    d.files.push_back(std::move(f));
  }
  std::size_t field = 0;
  for (auto& c : d.columns) {
    if (c.kind != Kind::text) c.field = field++;
  }
  d.starts.reserve(d.parts.size() + 1);
  auto blocks = std::make_shared<StorageBlocks>();
  std::size_t start = 0;
  for (std::size_t g = 0; g < d.parts.size(); ++g) {
    const Part& p = d.parts[g];
    d.starts.push_back(start);
    start += static_cast<std::size_t>(p.rows);
    // A row group is a storage block of what the cache holds of it: numbers' bytes exactly,
    // images and strings as long as the footer says they are uncompressed.
    const File& f = d.files[p.file];
    const auto group = f.metadata->RowGroup(p.row_group);
    std::uint64_t bytes = 0;
    for (std::size_t k = 0; k < d.columns.size(); ++k) {
      if (d.columns[k].kind == Kind::number) {
        bytes += static_cast<std::uint64_t>(p.rows) * d.columns[k].spec.bytes();
        continue;
      }
      for (std::size_t l = k == 0 ? 0 : f.leaves_end[k - 1]; l < f.leaves_end[k]; ++l) {
        bytes +=
            static_cast<std::uint64_t>(group->ColumnChunk(f.leaves[l])->total_uncompressed_size());
      }
    }
    blocks->ends.push_back(start);
    blocks->bytes.push_back(bytes);
    if (g + 1 == d.parts.size() || d.parts[g + 1].file != p.file) {
      blocks->object_ends.push_back(start);
    }
  }
  d.starts.push_back(start);
  d.blocks = std::move(blocks);
}

ObjectStorageCounters ParquetDataset::object_storage_counters() const {
  return impl_->remote ? impl_->remote->counters() : ObjectStorageCounters{};
}

Dataset::StorageLayout ParquetDataset::storage_layout() const {
  StorageLayout layout;
  layout.blocks = impl_->blocks;
  layout.cache_bytes = impl_->cache_bytes;
  layout.read_whole = true;
  layout.cache_per_process = true;
  layout.cache = "row-group cache";
  layout.cache_option = "cache_bytes";
  return layout;
}

ParquetDataset::~ParquetDataset() = default;

std::size_t ParquetDataset::size() const { return impl_->size(); }

std::vector<FieldSpec> ParquetDataset::fields() const {
  std::vector<FieldSpec> out;
  for (const auto& c : impl_->columns) {
    if (c.kind != Kind::text) out.push_back(c.spec);
  }
  return out;
}

std::vector<std::string> ParquetDataset::cheaper_reads() const {
  const auto& c = impl_->columns;
  const bool images =
      std::any_of(c.begin(), c.end(), [](const Column& k) { return k.kind == Kind::image; });
  return images ? image_cheaper_reads(false) : std::vector<std::string>{};
}

std::string ParquetDataset::sample_name(std::size_t index) const {
  if (index >= impl_->size()) return {};
  const auto [g, r] = impl_->locate(index);
  return impl_->row_name(g, r);
}

void ParquetDataset::read(std::size_t index, const SampleOut& out) const {
  const Impl& d = *impl_;
  const auto [g, r] = d.locate(index);
  d.reads.fetch_add(1, std::memory_order_relaxed);
  const auto group = d.row_group(g, r);
  for (std::size_t i = 0; i < d.columns.size(); ++i) {
    const Column& c = d.columns[i];
    if (c.kind == Kind::text) continue;
    const auto [chunk, k] = chunk_of(*group->columns[i], r);
    if (chunk == nullptr) fail(d.row_name(g, r) + ", column '" + c.name + "': not read");
    if (c.kind == Kind::number) {
      if (chunk->IsNull(k)) fail(d.row_name(g, r) + ", column '" + c.name + "': null");
      const auto dest = out.bytes(c.field);
      d.copy_number(c, *chunk, k, dest.data(), g, r);
      continue;
    }
    const auto bytes = Impl::image_bytes(c, *chunk, k);
    if (!bytes) fail(d.row_name(g, r) + ", column '" + c.name + "': null");
    try {
      // The row's name is made on failure only: a steady-state read allocates nothing.
      decode_image(std::as_bytes(std::span(bytes->data(), bytes->size())), "", d.transform,
                   out.seed(), out.bytes(c.field), nullptr, d.max_pixels);
    } catch (const std::exception& e) {
      fail(d.row_name(g, r) + ", column '" + c.name + "'" + e.what());
    }
  }
}

std::optional<std::string> ParquetDataset::text(std::size_t index,
                                                const std::string& column) const {
  const Impl& d = *impl_;
  const auto it = std::find_if(d.columns.begin(), d.columns.end(), [&](const Column& c) {
    return c.name == column && c.kind == Kind::text;
  });
  if (it == d.columns.end()) {
    throw std::invalid_argument("stoker::ParquetDataset: '" + column +
                                "' is not a string column of the data set");
  }
  const auto [g, r] = d.locate(index);
  const auto group = d.row_group(g, r);
  const auto [chunk, k] =
      chunk_of(*group->columns[static_cast<std::size_t>(it - d.columns.begin())], r);
  if (chunk == nullptr) fail(d.row_name(g, r) + ", column '" + column + "': not read");
  if (chunk->IsNull(k)) return std::nullopt;
  if (chunk->type_id() == arrow::Type::LARGE_STRING) {
    return std::string(static_cast<const arrow::LargeStringArray&>(*chunk).GetView(k));
  }
  return std::string(static_cast<const arrow::StringArray&>(*chunk).GetView(k));
}

std::vector<std::string> ParquetDataset::files() const {
  std::vector<std::string> out;
  for (const auto& f : impl_->files) out.push_back(f.path);
  return out;
}

ParquetDataset::Counters ParquetDataset::counters() const {
  const Impl& d = *impl_;
  Counters c;
  c.reads = d.reads.load(std::memory_order_relaxed);
  c.row_group_reads = d.row_group_reads.load(std::memory_order_relaxed);
  c.row_group_bytes = d.row_group_bytes.load(std::memory_order_relaxed);
  detail::MutexLock lock(d.mu);
  c.cached_row_groups = d.cache.size();
  c.cached_bytes = d.cached_bytes;
  return c;
}

std::size_t ParquetDataset::resident_bytes() const {
  const Impl& d = *impl_;
  detail::MutexLock lock(d.mu);
  return d.cached_bytes;
}

}  // namespace stoker
