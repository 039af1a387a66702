"""Parquet files in object storage (s3:// and http(s):// URLs, docs/storage.md), read by pyarrow
by ranges through stoker's object cache, as the C++ reader reads them (src/source/parquet.cc):
the footer by its exact range, then only the column chunks of the row groups read, each a
chunk of the cache of its own (fetched whole by one GET, nothing around it, kept for later
epochs while the cache holds it)."""

from __future__ import annotations

import io
import os
from typing import Union

from .. import _stoker


class _Reader(io.RawIOBase):
    """An object as the binary file pyarrow reads: each read a range of it, through the object
    cache, or by exactly that range (`exact`: the footer, which pyarrow keeps)."""

    def __init__(self, handle, exact: bool = False) -> None:
        super().__init__()
        self._handle, self._exact, self._position = handle, exact, 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._position

    def seek(self, offset: int, whence: int = os.SEEK_SET) -> int:
        base = {os.SEEK_SET: 0, os.SEEK_CUR: self._position, os.SEEK_END: self._handle.size}
        self._position = max(0, base[whence] + offset)
        return self._position

    def read(self, n: int = -1) -> bytes:
        if n is None or n < 0:
            n = max(0, self._handle.size - self._position)
        data = self._handle.read(self._position, n, self._exact)
        self._position += len(data)
        return data

    def readinto(self, buffer) -> int:
        data = self.read(len(buffer))
        buffer[:len(data)] = data
        return len(data)


def _column_chunk(chunk) -> tuple[int, int]:
    """(offset, length) of a column chunk's pages, its dictionary page included."""
    start = chunk.data_page_offset
    if chunk.has_dictionary_page and chunk.dictionary_page_offset is not None:
        start = min(start, chunk.dictionary_page_offset)
    return start, chunk.total_compressed_size


class ParquetObject:
    """A Parquet file in object storage: its footer (read once, by its exact range) and a
    handle whose cache chunks are its column chunks."""

    def __init__(self, handle, pq) -> None:
        self.url = handle.url
        try:
            self.metadata = pq.ParquetFile(_Reader(handle, exact=True)).metadata
        except Exception as e:  # not Parquet, truncated; a failed request (which names it)
            raise ValueError(f"stoker.ParquetDataset: {self.url}: not a readable Parquet "
                             f"file (its footer could not be read: {e})") from e
        bounds = {0}
        for g in range(self.metadata.num_row_groups):
            group = self.metadata.row_group(g)
            for c in range(group.num_columns):
                start, length = _column_chunk(group.column(c))
                bounds |= {start, start + length}
        self._handle = handle.cut_at(sorted(bounds))

    def open(self, pq, **kwargs):
        """A pyarrow ParquetFile over it (the footer already read: no request); `kwargs` to
        ParquetFile."""
        return pq.ParquetFile(_Reader(self._handle), metadata=self.metadata, **kwargs)

    def will_read(self, row_group: int, columns) -> None:
        """Row group `row_group`'s column chunks of `columns` (top-level names) fetched ahead,
        neighbours by one GET."""
        group = self.metadata.row_group(row_group)
        ranges = [_column_chunk(group.column(c)) for c in range(group.num_columns)
                  if group.column(c).path_in_schema.split(".")[0] in columns]
        self._handle.will_read(sorted(r for r in ranges if r[1] > 0))

    def read(self, pq, columns: list[str]):
        """Every row group's `columns` as one pyarrow Table, their chunks fetched ahead."""
        for g in range(self.metadata.num_row_groups):
            self.will_read(g, columns)
        return self.open(pq).read(columns=columns, use_threads=False)

    def version(self) -> tuple:
        """(url, size, etag) as listed: what a worker process takes instead of listing again."""
        return (self.url, self._handle.size, self._handle.etag)

    def counters(self) -> dict:
        """The traffic of the object cache it reads through."""
        return self._handle.counters()

    def __str__(self) -> str:
        return self.url


Source = Union[str, ParquetObject]


def open_objects(urls: list[str], pq, storage: tuple = ("", True, "", 10 << 30),
                 known: tuple = ()) -> list[ParquetObject]:
    """The Parquet files `urls` name (objects; s3:// prefixes: their *.parquet objects), in
    order, their footers read. `storage`: the object cache and index cache to use
    (native.object_storage_args); `known`: (url, size, etag) of each as another process
    resolved them (no listing, no HEAD)."""
    handles = _stoker.open_object_files(urls, ".parquet", *storage, list(known))
    return [ParquetObject(h, pq) for h in handles]


def open_parquet(pq, source: Source, **kwargs):
    """A pyarrow ParquetFile over a local path (`kwargs` to ParquetFile) or an object."""
    if isinstance(source, ParquetObject):
        return source.open(pq, **kwargs)
    return pq.ParquetFile(source, **kwargs)
