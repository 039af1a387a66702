#include "parquet_dataset.h"

#include <pybind11/numpy.h>
#include <pybind11/stl.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstring>
#include <memory>
#include <span>
#include <stdexcept>
#include <unordered_map>
#include <utility>

#include "gil.h"
#include "host_array.h"
#include "native_datasets.h"
#include "stoker/frontend/mutex.h"
#include "stoker/image.h"

namespace stoker::python {
namespace {

enum class Kind : std::uint8_t { array, image };

struct Column {
  std::string name;
  Kind kind = Kind::array;
  FieldSpec field;        // its place in the batch
  std::size_t row_bytes;  // array: bytes of one row's value
};

// One column of a row group, in C++ memory.
struct ColumnData {
  std::vector<std::byte> data;        // array: rows x row_bytes; image: the encoded images
  std::vector<std::int64_t> offsets;  // image: rows + 1 offsets into data
  std::vector<std::uint8_t> nulls;    // empty when the column has no null in this row group
};

struct RowGroup {
  std::vector<ColumnData> columns;
  std::string error;  // why it could not be read (then every row of it fails with this)
  std::size_t bytes = 0;
};

// A row group of one file, and where its rows are in the data set.
struct Part {
  std::size_t file = 0;
  std::size_t row_group = 0;       // within the file
  std::int64_t first_in_file = 0;  // the file's row number of its first row
  std::int64_t rows = 0;
  std::uint64_t bytes = 0;  // its selected columns' uncompressed size (the footer's)
};

class ParquetRows final : public Dataset {
 public:
  ParquetRows(py::object load, std::vector<std::string> files, std::vector<Part> parts,
              std::vector<Column> columns, ImageTransform transform, std::size_t cache_bytes,
              std::uint64_t max_pixels)
      : load_(hold(std::move(load))),
        files_(std::move(files)),
        parts_(std::move(parts)),
        columns_(std::move(columns)),
        transform_(std::move(transform)),
        cache_bytes_(cache_bytes),
        max_pixels_(max_pixels) {
    starts_.reserve(parts_.size() + 1);
    auto blocks = std::make_shared<StorageBlocks>();
    std::size_t start = 0;
    for (std::size_t g = 0; g < parts_.size(); ++g) {
      const Part& p = parts_[g];
      starts_.push_back(start);
      start += static_cast<std::size_t>(p.rows);
      blocks->ends.push_back(start);
      blocks->bytes.push_back(p.bytes);
      if (g + 1 == parts_.size() || parts_[g + 1].file != p.file) {
        blocks->object_ends.push_back(start);
      }
    }
    starts_.push_back(start);
    size_ = start;
    blocks_ = std::move(blocks);
  }

  // The row groups are the blocks, each decoded whole into the row-group cache.
  StorageLayout storage_layout() const override {
    StorageLayout layout;
    layout.blocks = blocks_;
    layout.cache_bytes = cache_bytes_;
    layout.read_whole = true;
    layout.cache_per_process = true;
    layout.cache = "row-group cache";
    layout.cache_option = "cache_bytes";
    return layout;
  }

  std::size_t size() const override { return size_; }

  std::vector<FieldSpec> fields() const override {
    std::vector<FieldSpec> out;
    for (const auto& c : columns_) out.push_back(c.field);
    return out;
  }

  std::vector<std::string> cheaper_reads() const override {
    const bool images = std::any_of(columns_.begin(), columns_.end(),
                                    [](const Column& c) { return c.kind == Kind::image; });
    return images ? image_cheaper_reads(false) : std::vector<std::string>{};
  }

  std::string sample_name(std::size_t index) const override {
    if (index >= size_) return {};
    const auto [g, r] = locate(index);
    return row_name(g, r);
  }

  void read(std::size_t index, const SampleOut& out) const override {
    if (index >= size_) {
      throw std::out_of_range("stoker.ParquetDataset: index " + std::to_string(index) +
                              " out of range for " + std::to_string(size_) + " rows");
    }
    reads_.fetch_add(1, std::memory_order_relaxed);
    const auto [g, r] = locate(index);
    const std::shared_ptr<const RowGroup> group = row_group(g);
    if (!group->error.empty()) {
      throw std::runtime_error(row_name(g, r) + ": its row group (" +
                               std::to_string(parts_[g].row_group) +
                               ") could not be read: " + group->error);
    }
    for (std::size_t c = 0; c < columns_.size(); ++c) {
      const Column& column = columns_[c];
      const ColumnData& d = group->columns[c];
      if (!d.nulls.empty() && d.nulls[r] != 0) {
        throw std::runtime_error(row_name(g, r) + ", column '" + column.name + "': null");
      }
      if (column.kind == Kind::array) {
        out.copy_from(c, std::span(d.data).subspan(r * column.row_bytes, column.row_bytes));
        continue;
      }
      const auto begin = static_cast<std::size_t>(d.offsets[r]);
      const auto end = static_cast<std::size_t>(d.offsets[r + 1]);
      try {
        // The row's name is made on failure only: a steady-state read allocates nothing.
        decode_image(std::span(d.data).subspan(begin, end - begin), "", transform_, out.seed(),
                     out.bytes(c), nullptr, max_pixels_);
      } catch (const std::exception& e) {
        throw std::runtime_error(row_name(g, r) + ", column '" + column.name + "'" + e.what());
      }
    }
  }

  py::dict counters() const {
    py::dict d;
    d["reads"] = reads_.load(std::memory_order_relaxed);
    d["row_group_reads"] = row_group_reads_.load(std::memory_order_relaxed);
    d["row_group_bytes"] = row_group_bytes_.load(std::memory_order_relaxed);
    detail::MutexLock lock(mu_);
    d["cached_row_groups"] = cache_.size();
    d["cached_bytes"] = cached_bytes_;
    return d;
  }

 private:
  struct Slot {
    std::shared_ptr<const RowGroup> group;  // null while a thread reads it
    std::uint64_t last_use = 0;
  };

  // The row group index and the row within it of data set row `index`.
  std::pair<std::size_t, std::size_t> locate(std::size_t index) const {
    const auto it = std::upper_bound(starts_.begin(), starts_.end(), index);
    const auto g = static_cast<std::size_t>(it - starts_.begin()) - 1;
    return {g, index - starts_[g]};
  }

  std::string row_name(std::size_t g, std::size_t r) const {
    const Part& p = parts_[g];
    return files_[p.file] + " row " +
           std::to_string(p.first_in_file + static_cast<std::int64_t>(r));
  }

  // Row group g from the cache, or read (by this thread, or by another already reading it).
  std::shared_ptr<const RowGroup> row_group(std::size_t g) const {
    {
      detail::MutexLock lock(mu_);
      for (;;) {
        auto it = cache_.find(g);
        if (it == cache_.end()) break;
        it->second.last_use = ++tick_;
        if (it->second.group) return it->second.group;
        lock.wait(loaded_);  // another thread reads it
      }
      cache_[g] = Slot{nullptr, ++tick_};
    }
    std::shared_ptr<const RowGroup> group = load(g);
    detail::MutexLock lock(mu_);
    Slot& slot = cache_[g];
    slot.group = group;
    cached_bytes_ += group->bytes;
    // Least recently used out first, down to the budget; the row group just read stays (a
    // reader in another thread holds its own reference to one that goes).
    while (cached_bytes_ > cache_bytes_ && cache_.size() > 1) {
      auto oldest = cache_.end();
      for (auto it = cache_.begin(); it != cache_.end(); ++it) {
        if (it->first == g || !it->second.group) continue;
        if (oldest == cache_.end() || it->second.last_use < oldest->second.last_use) oldest = it;
      }
      if (oldest == cache_.end()) break;
      cached_bytes_ -= oldest->second.group->bytes;
      cache_.erase(oldest);
    }
    loaded_.notify_all();
    return group;
  }

  // Reads row group g through the Python loader. Never throws: a failure is kept in the row
  // group (every one of its rows then fails with it, without reading it again).
  std::shared_ptr<const RowGroup> load(std::size_t g) const {
    auto group = std::make_shared<RowGroup>();
    const Part& p = parts_[g];
    const auto rows = static_cast<std::size_t>(p.rows);
    try {
      ForkGate::Pass pass;  // before the GIL (gil.h, rule 5)
      if (interpreter_finalizing()) throw std::runtime_error("the interpreter is exiting");
      EngineThreadGil gil;
      try {
        const py::object result = (*load_)(p.file, p.row_group);
        const auto entries = py::reinterpret_borrow<py::sequence>(result);
        if (entries.size() != columns_.size()) {
          throw std::runtime_error("the loader returned " + std::to_string(entries.size()) +
                                   " columns, not " + std::to_string(columns_.size()));
        }
        // The arrays stay referenced here while their bytes are copied without the GIL.
        std::vector<py::array> held;
        std::vector<std::pair<std::span<const std::byte>, std::vector<std::byte>*>> copies;
        auto bytes_of = [&](const py::handle& obj, const std::string& what) {
          py::array a = py::array::ensure(obj, py::array::c_style);
          if (!a) throw std::runtime_error(what + " is not an array");
          held.push_back(a);
          return std::span(static_cast<const std::byte*>(a.data()),
                           static_cast<std::size_t>(a.nbytes()));
        };
        group->columns.resize(columns_.size());
        for (std::size_t c = 0; c < columns_.size(); ++c) {
          const Column& column = columns_[c];
          const auto entry = py::reinterpret_borrow<py::sequence>(entries[c]);
          ColumnData& d = group->columns[c];
          const std::string what = "column '" + column.name + "'";
          const py::object nulls = entry[entry.size() - 1];
          if (!nulls.is_none()) {
            const auto n = bytes_of(nulls, what + "'s nulls");
            if (n.size() != rows) throw std::runtime_error(what + ": nulls of the wrong length");
            d.nulls.resize(rows);
            std::memcpy(d.nulls.data(), n.data(), rows);
          }
          if (column.kind == Kind::array) {
            const auto data = bytes_of(entry[0], what);
            if (data.size() != rows * column.row_bytes) {
              throw std::runtime_error(what + " has " + std::to_string(data.size()) +
                                       " bytes for " + std::to_string(rows) + " rows, not " +
                                       std::to_string(rows * column.row_bytes));
            }
            copies.emplace_back(data, &d.data);
            continue;
          }
          const auto offsets = bytes_of(entry[0], what + "'s offsets");
          const auto data = bytes_of(entry[1], what);
          if (offsets.size() != (rows + 1) * sizeof(std::int64_t)) {
            throw std::runtime_error(what + ": offsets of the wrong length");
          }
          d.offsets.resize(rows + 1);
          std::memcpy(d.offsets.data(), offsets.data(), offsets.size());
          for (std::size_t r = 0; r < rows; ++r) {
            if (d.offsets[r] < 0 || d.offsets[r] > d.offsets[r + 1] ||
                static_cast<std::uint64_t>(d.offsets[r + 1]) > data.size()) {
              throw std::runtime_error(what + ": offsets outside its data");
            }
          }
          copies.emplace_back(data, &d.data);
        }
        {
          py::gil_scoped_release nogil;
          for (auto& [src, dest] : copies) dest->assign(src.begin(), src.end());
        }
      } catch (py::error_already_set& e) {
        // With the GIL, which the exception needs; its type and message, no traceback.
        group->error = py::str(e.type().attr("__name__")).cast<std::string>() + ": " +
                       py::str(e.value()).cast<std::string>();
        group->columns.clear();
      }
    } catch (const std::exception& e) {
      group->error = e.what();
      group->columns.clear();
    }
    for (const auto& d : group->columns) {
      group->bytes += d.data.size() + d.offsets.size() * sizeof(std::int64_t) + d.nulls.size();
    }
    row_group_reads_.fetch_add(1, std::memory_order_relaxed);
    row_group_bytes_.fetch_add(group->bytes, std::memory_order_relaxed);
    return group;
  }

  std::shared_ptr<py::object> load_;
  std::vector<std::string> files_;
  std::vector<Part> parts_;
  std::vector<std::size_t> starts_;  // data set row of each part's first row, and the size
  std::size_t size_ = 0;
  std::shared_ptr<const StorageBlocks> blocks_;  // the non-empty row groups
  std::vector<Column> columns_;
  ImageTransform transform_;
  std::size_t cache_bytes_;
  std::uint64_t max_pixels_;

  mutable detail::Mutex mu_;
  mutable std::condition_variable loaded_;
  mutable std::unordered_map<std::size_t, Slot> cache_ STOKER_GUARDED_BY(mu_);
  mutable std::uint64_t tick_ STOKER_GUARDED_BY(mu_) = 0;
  mutable std::size_t cached_bytes_ STOKER_GUARDED_BY(mu_) = 0;

  mutable std::atomic<std::uint64_t> reads_{0};
  mutable std::atomic<std::uint64_t> row_group_reads_{0};
  mutable std::atomic<std::uint64_t> row_group_bytes_{0};
};

}  // namespace

NativeDataset make_parquet_dataset(const py::object& load, const std::vector<std::string>& files,
                                   const std::vector<std::vector<std::int64_t>>& row_groups,
                                   const std::vector<std::vector<std::uint64_t>>& row_group_bytes,
                                   const py::list& columns, const std::string& transform,
                                   std::size_t cache_bytes, std::uint64_t max_pixels) {
  if (files.size() != row_groups.size() || files.size() != row_group_bytes.size()) {
    throw py::value_error("stoker.ParquetDataset: one list of row groups per file");
  }
  ImageTransform t;
  const bool images = !transform.empty();
  if (images) {
    t = ImageTransform::parse(transform);  // std::invalid_argument: ValueError
    t.validate();
  }
  NativeDataset out;
  std::vector<Column> cols;
  for (auto item : columns) {
    const auto spec = item.cast<py::tuple>();
    Column c;
    c.name = spec[0].cast<std::string>();
    const auto kind = spec[1].cast<std::string>();
    if (kind == "image") {
      if (!images) {
        throw py::value_error("stoker.ParquetDataset: column '" + c.name +
                              "' holds encoded images: it needs transform=");
      }
      c.kind = Kind::image;
      c.field = {c.name, t.dtype, t.shape()};
      out.element_types.emplace_back(dtype_name(t.dtype));
    } else if (kind == "array") {
      const auto type = element_type(spec[2].cast<std::string>());
      c.field = {c.name, type.storage, spec[3].cast<std::vector<std::int64_t>>()};
      out.element_types.push_back(type.name);
    } else {
      throw py::value_error("stoker.ParquetDataset: unknown column kind '" + kind + "'");
    }
    c.row_bytes = c.field.bytes();
    cols.push_back(std::move(c));
  }
  if (cols.empty()) throw py::value_error("stoker.ParquetDataset: no columns");
  std::vector<Part> parts;
  for (std::size_t f = 0; f < files.size(); ++f) {
    std::int64_t first = 0;
    if (row_group_bytes[f].size() != row_groups[f].size()) {
      throw py::value_error("stoker.ParquetDataset: one size per row group");
    }
    for (std::size_t g = 0; g < row_groups[f].size(); ++g) {
      const std::int64_t rows = row_groups[f][g];
      if (rows < 0) throw py::value_error("stoker.ParquetDataset: a negative row count");
      if (rows > 0) parts.push_back({f, g, first, rows, row_group_bytes[f][g]});
      first += rows;
    }
  }
  out.dataset = std::make_shared<ParquetRows>(load, files, std::move(parts), std::move(cols),
                                              std::move(t), cache_bytes, max_pixels);
  return out;
}

void bind_parquet(py::module_& m) {
  m.def("parquet_dataset", &make_parquet_dataset, py::arg("load"), py::arg("files"),
        py::arg("row_groups"), py::arg("row_group_bytes"), py::arg("columns"), py::arg("transform"),
        py::arg("cache_bytes"), py::arg("max_pixels"));
  m.def(
      "parquet_counters",
      [](const NativeDataset& d) {
        const auto* rows = dynamic_cast<const ParquetRows*>(d.dataset.get());
        if (rows == nullptr) throw py::type_error("stoker: not a ParquetDataset");
        return rows->counters();
      },
      py::arg("dataset"));
}

}  // namespace stoker::python
