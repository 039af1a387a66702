// stoker.ParquetDataset's native half: a map-style data set over the rows of Parquet files,
// whose row groups are read by pyarrow (python/stoker/datasets/parquet.py) and whose samples are
// written, and their encoded images decoded, in C++ without the GIL.
//
// Row groups are the unit of I/O. A worker thread that reads a row not in memory calls the
// Python loader once for the row's whole row group (the GIL is held for the call only; pyarrow
// releases it while it reads and decompresses), copies the columns it returns into C++ memory
// and keeps them in a cache shared by the worker threads, bounded in bytes, least recently
// used out first: random access reads a row group once for as long as it stays cached.
#pragma once

#include <pybind11/pybind11.h>

#include <cstdint>
#include <string>
#include <vector>

#include "native_datasets.h"

namespace stoker::python {

namespace py = pybind11;

// A ParquetDataset handle.
//   load:         load(file_index, row_group) -> one entry per column, in column order: for
//                 an array column (data, nulls), data a C-contiguous array of rows x the
//                 column's shape, of its element type; for an image column (offsets, data,
//                 nulls), offsets int64 of rows + 1, data uint8 (the encoded images, end to
//                 end). nulls: None or a bool array, true where the row's value is null.
//   files:        the files' paths, for naming rows in errors.
//   row_groups:   per file, the rows of each of its row groups (from the file's metadata).
//   row_group_bytes: per file, each row group's selected columns' uncompressed size (from
//                 the metadata): the storage blocks of a windowed shuffle (storage_layout()).
//   columns:      (name, kind "array" | "image", element type, shape) per column; an image
//                 column's element type and shape come from `transform`.
//   transform:    an ImageTransform spec, for the image columns ("" if there is none).
//   cache_bytes:  the row group cache's budget (at least the last row group read is kept).
NativeDataset make_parquet_dataset(const py::object& load, const std::vector<std::string>& files,
                                   const std::vector<std::vector<std::int64_t>>& row_groups,
                                   const std::vector<std::vector<std::uint64_t>>& row_group_bytes,
                                   const py::list& columns, const std::string& transform,
                                   std::size_t cache_bytes, std::uint64_t max_pixels);

// Registers parquet_dataset() and parquet_counters() on the module.
void bind_parquet(py::module_& m);

}  // namespace stoker::python
