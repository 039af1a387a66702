"""stoker.ParquetDataset: the rows of Parquet files as a map-style data set.

pyarrow reads the files (row groups are the unit of I/O); stoker's C++ half
(python/src/parquet_dataset.cc) keeps the row groups it read in a cache bounded in bytes,
writes numeric columns into the batch and decodes encoded images with its own pipeline, in its
worker threads, without the GIL. docs/formats.md, "Parquet files", says what is read and how.
"""

from __future__ import annotations

import os
import threading
from collections import OrderedDict
from typing import Sequence

from .. import _stoker
from ..elements import to_array
from .native import NativeDataset, object_storage_args
from .parquet_objects import ParquetObject, Source, open_objects, open_parquet
from .shards import local_files

_OPEN_FILES = 32  # ParquetFiles kept open, over all threads
_URLS = ("s3://", "http://", "https://")


def _pyarrow():
    try:
        import pyarrow
        import pyarrow.parquet
    except ImportError as e:
        raise ImportError("stoker.ParquetDataset reads Parquet files with pyarrow, which is not "
                          "installed: pip install pyarrow") from e
    return pyarrow, pyarrow.parquet


def expand_files(files, storage: tuple = ("", True, "", 10 << 30),
                 known: tuple = ()) -> list[Source]:
    """The Parquet files `files` names: a path, a glob, a directory (its *.parquet files, in
    name order), a URL (docs/storage.md: ``s3://`` objects or prefixes, ``http(s)://`` objects,
    read by ranges through the object cache: parquet_objects.py) or a list of those, in the
    order given. Local files as their paths, objects as ParquetObjects (their footers read).
    `storage` and `known`: parquet_objects.open_objects'."""
    if isinstance(files, (str, os.PathLike)):
        files = [files]
    out: list[Source] = []
    items = [os.fspath(f) for f in files]
    for i, path in enumerate(items):
        if path.startswith(_URLS):
            if i == 0 or not items[i - 1].startswith(_URLS):
                urls = []  # consecutive URLs: resolved together (one listing per prefix)
                for u in items[i:]:
                    if not u.startswith(_URLS):
                        break
                    urls.append(u)
                out += open_objects(urls, _pyarrow()[1], storage, known)
            continue
        out += local_files(path, ".parquet", "stoker.ParquetDataset")
    if not out:
        raise ValueError("stoker.ParquetDataset: no files")
    return out


_NUMBERS = {
    "bool": "bool", "int8": "int8", "int16": "int16", "int32": "int32", "int64": "int64",
    "uint8": "uint8", "uint16": "uint16", "uint32": "uint32", "uint64": "uint64",
    "halffloat": "float16", "float": "float32", "double": "float64",
}


def _selected_bytes(footers, columns: dict) -> list[list[int]]:
    """Per file, each row group's bytes in the row-group cache: `columns` maps each column read
    in C++ to the bytes of a row's value (numbers: known exactly) or None (encoded images: their
    leaves' uncompressed size in the footer, the bytes as stored). The storage blocks of a
    shuffle over more row groups than the cache holds (storage_layout())."""
    images = {name for name, row in columns.items() if row is None}
    out = []
    for footer in footers:
        sizes = []
        for g in range(footer.num_row_groups):
            group = footer.row_group(g)
            size = sum(group.num_rows * row for row in columns.values() if row is not None)
            size += sum(group.column(c).total_uncompressed_size
                        for c in range(group.num_columns)
                        if group.column(c).path_in_schema.split(".")[0] in images)
            sizes.append(size)
        out.append(sizes)
    return out


def _column_kind(pa, type_, name: str, path: str):
    """(kind, element type, shape, how to read it) of a column of type `type_`; kind is
    "array", "image" or "string"."""
    t = pa.types
    if isinstance(type_, pa.BaseExtensionType):
        shape = getattr(type_, "shape", None)
        permutation = getattr(type_, "permutation", None)
        if shape is None or (permutation is not None
                             and list(permutation) != list(range(len(shape)))):
            raise TypeError(f"stoker.ParquetDataset: {path}: column '{name}' has the extension "
                            f"type {type_}, which is not read (fixed-shape tensors in row-major "
                            f"order are)")
        kind, element, inner, _ = _column_kind(pa, type_.storage_type, name, path)
        if kind != "array" or inner != (int(_prod(shape)),):
            raise TypeError(f"stoker.ParquetDataset: {path}: column '{name}' ({type_}) is not "
                            f"a tensor of numbers")
        return "array", element, tuple(int(d) for d in shape), "tensor"
    if str(type_) in _NUMBERS and (t.is_integer(type_) or t.is_floating(type_)
                                   or t.is_boolean(type_)):
        return "array", _NUMBERS[str(type_)], (), "scalar"
    if t.is_fixed_size_list(type_):
        kind, element, inner, _ = _column_kind(pa, type_.value_type, name, path)
        if kind == "array":
            return "array", element, (type_.list_size, *inner), "list"
    if t.is_binary(type_) or t.is_large_binary(type_) or str(type_) == "binary_view":
        return "image", "", (), "binary"
    if t.is_struct(type_):
        names = [type_.field(i).name for i in range(type_.num_fields)]
        if "bytes" in names:
            inner = type_.field(names.index("bytes")).type
            if t.is_binary(inner) or t.is_large_binary(inner):
                return "image", "", (), "struct"
    if t.is_string(type_) or t.is_large_string(type_) or str(type_) == "string_view":
        return "string", "", (), "string"
    raise TypeError(f"stoker.ParquetDataset: {path}: column '{name}' has the type {type_}, "
                    f"which is not read: numbers and bools (and fixed-size lists and "
                    f"fixed-shape tensors of them) become arrays, binary columns and "
                    f"structs {{bytes, path}} encoded images, strings lists of str")


def _row_bytes(kind) -> int | None:
    """The bytes of a row's value of a column of `kind` (_column_kind) in the row-group cache;
    None for encoded images (as long as they are)."""
    import numpy as np

    return None if kind[0] == "image" else np.dtype(kind[1]).itemsize * _prod(kind[2])


def _prod(values) -> int:
    n = 1
    for v in values:
        n *= int(v)
    return n


def _open(pq, source: Source):
    """A ParquetFile that checks the CRC of each page that has one (pyarrow >= 14)."""
    try:
        return open_parquet(pq, source, page_checksum_verification=True)
    except TypeError:
        return open_parquet(pq, source)


class _RowGroupReader:
    """load(file_index, row_group) for the C++ half (parquet_dataset.h): called by stoker's
    worker threads, with the GIL. It holds no reference to its ParquetDataset, which holds the
    C++ half that holds it (a cycle through C++ is never collected)."""

    def __init__(self, files: list[Source], columns: list[str], kinds: list[tuple]) -> None:
        self.files, self.columns, self.kinds = files, columns, kinds
        # Each thread's open ParquetFiles, by (thread, file), the least recently used closed
        # first: at most _OPEN_FILES over all threads.
        self._open: OrderedDict = OrderedDict()

    def _file(self, index: int):
        key = (threading.get_ident(), index)
        f = self._open.get(key)
        try:  # each call below is atomic; another thread may close a file between them
            if f is None:
                _, pq = _pyarrow()
                f = self._open[key] = _open(pq, self.files[index])
                while len(self._open) > _OPEN_FILES:
                    self._open.popitem(last=False)
            else:
                self._open.move_to_end(key)
        except KeyError:
            pass
        return f

    def __call__(self, file_index: int, row_group: int) -> list:
        import numpy as np

        pa, _ = _pyarrow()
        source = self.files[file_index]
        if isinstance(source, ParquetObject):  # its column chunks fetched ahead, together
            source.will_read(row_group, self.columns)
        table = self._file(file_index).read_row_group(row_group, columns=self.columns,
                                                      use_threads=False)
        out = []
        for position, (_, element, shape, how) in enumerate(self.kinds):
            array = table.column(position).combine_chunks()
            if how == "struct":
                array = array.flatten()[[f.name for f in array.type].index("bytes")]
            nulls = array.is_null().to_numpy(zero_copy_only=False) if array.null_count else None
            if how in ("binary", "struct"):
                if not pa.types.is_large_binary(array.type):
                    array = array.cast(pa.large_binary())
                _, offsets, data = array.buffers()
                offsets = np.frombuffer(offsets, dtype=np.int64)[
                    array.offset:array.offset + len(array) + 1]
                data = (np.frombuffer(data, dtype=np.uint8) if data is not None
                        else np.zeros(0, np.uint8))
                out.append((offsets, data, nulls))
                continue
            if how == "tensor":
                array = array.storage
            rows = len(array)
            while how != "scalar" and pa.types.is_fixed_size_list(array.type):
                # A fixed-size list's values, this slice's only (.values ignores the offset).
                size = array.type.list_size
                array = array.values[array.offset * size:(array.offset + len(array)) * size]
                if array.null_count:
                    inner = array.is_null().to_numpy(zero_copy_only=False).reshape(rows, -1)
                    nulls = inner.any(axis=1) if nulls is None else nulls | inner.any(axis=1)
            if array.null_count:
                array = array.fill_null(False if element == "bool" else 0)
            values = array.to_numpy(zero_copy_only=False)
            out.append((np.ascontiguousarray(values).reshape((rows, *shape)), nulls))
        return out


class ParquetDataset(NativeDataset):
    """The rows of Parquet files, read by row group with pyarrow; samples are the values of
    `columns`, in that order (a tuple; a dict with ``as_dict=True``).

    - `files`: a path, a glob, a directory (its ``*.parquet`` files, in name order), an
      ``s3://`` or ``http(s)://`` URL (an ``s3://`` prefix: its ``*.parquet`` objects; read in
      place by column chunks through the object cache, docs/storage.md) or a list of those;
      their rows are the data set's, file after file.
    - Numeric columns (ints, floats, bools, fixed-size lists and fixed-shape tensors of them)
      become batch fields, one array each.
    - Binary columns holding encoded images (JPEG, PNG), and Hugging Face's image struct
      ``{bytes, path}``, are decoded and transformed in C++ by `transform` (a
      stoker.transforms.Compose, as for stoker.ImageFolder).
    - String columns become lists of str in the batch (a tuple of str per column inside a
      tuple sample, as torch's default_collate makes them).

    Row groups read are kept in a cache of up to ``cache_bytes`` (their selected columns, as
    stored: encoded images, not pixels), shared by the loader's worker threads; at least the
    last one read is kept. With the whole data set's columns under ``cache_bytes``, each row
    group is read once, and later epochs read nothing. When they do not fit, the DataLoader's
    ``shuffle=True`` shuffles over a window of row groups that fits half the cache (each row
    group read once an epoch, rows mixed across the window; docs/formats.md), where a global
    shuffle would read a row's group for nearly every row; ``shuffle='global'`` asks for that.

    Files at URLs are read through the object cache, as stoker.WebDataset's shards:
    ``object_cache`` (a directory; default ``$STOKER_CACHE_DIR/objects``, else
    ``~/.cache/stoker/objects``) up to ``object_cache_bytes`` (0: no cache, each column chunk
    fetched when read); a prefix's listing is shared by a node's processes through
    ``index_cache`` (a directory, or False for none).

    A file whose footer cannot be read (truncated, not Parquet) or that lacks a column is an
    error here, naming it. A row group that cannot be read (a corrupt page), a null value or
    an image that does not decode fails that row, naming file, row and column: with the
    DataLoader's ``on_error='skip'`` it is skipped and reported like an image that fails.
    """

    def __init__(self, files, columns: Sequence[str] = ("image", "label"), transform=None,
                 cache_bytes: int = 256 << 20, max_pixels: int = 89_478_485,
                 as_dict: bool = False, index_cache=None, object_cache=None,
                 object_cache_bytes: int = 10 << 30, _objects=()) -> None:
        self._made_with = ((files, tuple(columns), transform),
                           {"cache_bytes": cache_bytes, "max_pixels": max_pixels,
                            "as_dict": as_dict, "index_cache": index_cache,
                            "object_cache": object_cache,
                            "object_cache_bytes": object_cache_bytes})
        pa, pq = _pyarrow()
        if isinstance(columns, str):
            columns = (columns,)
        self.columns = tuple(str(c) for c in columns)
        if not self.columns:
            raise ValueError("stoker.ParquetDataset: no columns")
        if len(set(self.columns)) != len(self.columns):
            raise ValueError(f"stoker.ParquetDataset: a column is named twice: {self.columns}")
        sources = expand_files(files, object_storage_args(index_cache, object_cache,
                                                          object_cache_bytes), _objects)
        self.files = [str(f) for f in sources]  # paths and URLs
        objects = [s.version() for s in sources if isinstance(s, ParquetObject)]
        if objects and len(objects) == len(sources):
            # Unpickled in a worker process: the objects as resolved here, with no listing or
            # HEAD (each footer is read again, by one GET).
            self._made_with = ((self.files, *self._made_with[0][1:]),
                               dict(self._made_with[1], _objects=tuple(objects)))
        self.transform = transform
        spec = ""
        if transform is not None:
            from ..transforms import Compose

            if not isinstance(transform, Compose):
                raise TypeError("transform must be a stoker.transforms.Compose (torchvision's "
                                "ImageNet pipelines, run in C++)")
            spec = transform.spec()

        kinds = None
        row_groups, footers = [], []
        for path, source in zip(self.files, sources):
            try:
                opened = open_parquet(pq, source)  # an object's footer: read already
                meta, schema = opened.metadata, opened.schema_arrow
                footers.append(meta)
                row_groups.append([meta.row_group(g).num_rows
                                   for g in range(meta.num_row_groups)])
            except Exception as e:
                raise ValueError(f"stoker.ParquetDataset: {path}: not a readable Parquet "
                                 f"file (its footer could not be read: {e})") from e
            file_kinds = []
            for name in self.columns:
                index = schema.get_field_index(name)
                if index < 0:
                    raise KeyError(f"stoker.ParquetDataset: {path} has no column '{name}' "
                                   f"(it has {', '.join(schema.names)})")
                file_kinds.append(_column_kind(pa, schema.field(index).type, name, path))
            if kinds is None:
                kinds = file_kinds
            elif file_kinds != kinds:
                raise TypeError(f"stoker.ParquetDataset: {path}: the columns' types differ "
                                f"from {self.files[0]}'s ({file_kinds} against {kinds})")
        self._kinds = kinds
        self._strings = [i for i, k in enumerate(kinds) if k[0] == "string"]
        self._natives = [i for i, k in enumerate(kinds) if k[0] != "string"]
        if not self._natives:
            raise ValueError("stoker.ParquetDataset: only string columns; a sample needs a "
                             "number or an image column")
        if spec == "" and any(k[0] == "image" for k in kinds):
            name = self.columns[next(i for i, k in enumerate(kinds) if k[0] == "image")]
            raise ValueError(f"stoker.ParquetDataset: column '{name}' holds encoded images: "
                             f"give transform= (stoker.transforms)")
        self._names = self.columns
        self._as_dict = bool(as_dict)
        self._row_groups = row_groups
        self._sources = sources
        self._string_cache: OrderedDict = OrderedDict()
        self._string_lock = threading.Lock()
        self._handle = _stoker.parquet_dataset(
            _RowGroupReader(sources, [self.columns[i] for i in self._natives],
                            [kinds[i] for i in self._natives]),
            self.files, row_groups,
            _selected_bytes(footers, {self.columns[i]: _row_bytes(kinds[i]) for i in self._natives}),
            [(self.columns[i], kinds[i][0], kinds[i][1], kinds[i][2]) for i in self._natives],
            spec, int(cache_bytes), int(max_pixels))
        starts, first_in_file, total = [], [], 0
        for groups in row_groups:
            first = 0
            for rows in groups:
                starts.append(total)
                first_in_file.append(first)
                total += rows
                first += rows
        self._starts, self._first_in_file = starts, first_in_file

    def counters(self) -> dict:
        """Rows read, row groups read from the files (and their bytes), and what the row group
        cache holds now."""
        return _stoker.parquet_counters(self._handle)

    def object_storage(self) -> dict:
        """Over URLs (docs/storage.md): this process's object-storage traffic through the object
        cache, as ``stoker.WebDataset.object_storage()`` counts it. Empty for local files."""
        objects = [s for s in self._sources if isinstance(s, ParquetObject)]
        return objects[0].counters() if objects else {}

    # --- string columns: read on the consumer's side, by row group ------------------------

    def _strings_of(self, index: int) -> list:
        import bisect

        g = bisect.bisect_right(self._starts, index) - 1
        with self._string_lock:
            columns = self._string_cache.get(g)
            if columns is not None:
                self._string_cache.move_to_end(g)
        if columns is None:
            f, k = self._part(g)
            names = [self.columns[i] for i in self._strings]
            try:
                table = _open(_pyarrow()[1], self._sources[f]).read_row_group(k, columns=names)
            except Exception as e:
                raise ValueError(f"stoker.ParquetDataset: {self.files[f]} row "
                                 f"{index - self._starts[g] + self._first_in_file[g]}: its row "
                                 f"group ({k})'s string columns {names} could not be read: "
                                 f"{type(e).__name__}: {e}") from e
            columns = [table.column(j).to_pylist() for j in range(len(self._strings))]
            with self._string_lock:
                self._string_cache[g] = columns
                while len(self._string_cache) > 4:
                    self._string_cache.popitem(last=False)
        row = index - self._starts[g]
        return [columns[j][row] for j in range(len(self._strings))]  # a null is None

    def _part(self, g: int) -> tuple[int, int]:
        for f, groups in enumerate(self._row_groups):
            if g < len(groups):
                return f, g
            g -= len(groups)
        raise IndexError(g)

    def _batch_objects(self, indices) -> list:
        """The string columns of a batch's rows (data set indices), one list per column."""
        if not self._strings:
            return []
        rows = [self._strings_of(int(i)) for i in indices]
        return [[r[j] for r in rows] for j in range(len(self._strings))]

    def __getitem__(self, index: int):
        if not -len(self) <= index < len(self):
            raise IndexError(f"index {index} is out of range for {len(self)} samples")
        index %= len(self)
        seed = _stoker.sample_seed() or 0
        natives = [to_array(a, t) for a, t in zip(self._handle.read(index, seed),
                                                   self._handle.element_types)]
        strings = self._strings_of(index) if self._strings else []
        values = [None] * len(self.columns)
        for i, v in zip(self._natives, natives):
            values[i] = v
        for i, v in zip(self._strings, strings):
            values[i] = v
        return dict(zip(self._names, values)) if self._as_dict else tuple(values)

    def _structure(self):
        leaves, field, slot = [], 0, 0
        for kind in self._kinds:
            if kind[0] == "string":
                leaves.append(("object", slot))
                slot += 1
            else:
                leaves.append(("array", field, self._handle.element_types[field]))
                field += 1
        if self._as_dict:
            return ("map", dict, list(self._names), leaves)
        return ("seq", tuple, leaves)
