"""WebDataset tar shards read natively (docs/formats.md, "WebDataset shards")."""

from __future__ import annotations

import os
from typing import Sequence

from .. import _stoker
from .native import NativeDataset, object_storage_args
from .shards import _COMPRESSED, _check_transform, expand_shards, is_url


def _compressed_dir(path: str) -> bool:
    """A directory of compressed shards only (no *.tar)."""
    if not os.path.isdir(path):
        return False
    names = os.listdir(path)
    return (any(n.endswith(_COMPRESSED) for n in names)
            and not any(n.endswith(".tar") for n in names))


class WebDataset(NativeDataset):
    """WebDataset tar shards (``webdataset``'s format) read in C++, map-style.

    ``shards``: a list of paths, a brace pattern (``"train-{000000..000146}.tar"``) or a
    directory (every ``*.tar`` in it, in name order). Members are grouped into samples by key
    (the member's path up to the first dot of its base name) and a field is the rest of the
    name, lower-case; ``fields`` picks the fields and their order, as ``.to_tuple(...)`` does:
    ``WebDataset(shards, fields=("jpg", "cls"), transform=T.train(224))`` yields
    ``(image, label)``. ``"jpg;png"`` takes whichever the sample has. Images (jpg, jpeg, png)
    are decoded with ``transform`` (a ``stoker.transforms.Compose``, as for ImageFolder);
    ``cls``, ``txt`` (and cls2, class, count, index, inx, id) holding an integer become int64;
    ``npy`` arrays keep their dtype and shape (the same for every sample). Other fields (json,
    raw bytes) are refused: a batch holds fixed-shape arrays.

    Compressed shards (``.tar.gz``, ``.tgz``) cannot be indexed for random access: for them
    (or with ``stream=True``) this returns a ``WebDatasetStream``, an IterableDataset that
    reads the shards front to back with a shard shuffle and a shuffle buffer (its options:
    ``shuffle``, ``shardshuffle``, ``seed``), as ``webdataset`` does.

    Each shard is indexed once from its tar headers and the index is cached on disk (in
    ``index_cache``, a directory; default ``$STOKER_CACHE_DIR``, ``$XDG_CACHE_HOME/stoker`` or
    ``~/.cache/stoker``; ``False`` for none), keyed by the shard's path, size and mtime. The
    data set has a length and random access: the shuffle, DistributedSampler, ``state_dict()``
    resume and ``cache_bytes`` (the RAM cache) work as for ImageFolder. A sample with a missing
    field, a bad label or an image that does not decode raises naming shard and key (or is
    skipped with the DataLoader's ``on_error='skip'``).

    Shards may be URLs (docs/storage.md): ``s3://bucket/train-{000000..000146}.tar``, an
    ``s3://bucket/train/`` prefix (every ``*.tar`` object directly under it), or
    ``http(s)://`` URLs; settings (keys, region, endpoint) come from the usual ``AWS_*``
    variables and ``~/.aws`` files. Each shard is indexed once per node (the index cached as
    above, keyed by URL, size and ETag); samples are read in chunks of 8 MiB (one range GET
    each, so neighbouring samples share one) kept in ``object_cache`` (a directory; default
    ``$STOKER_CACHE_DIR/objects``, ``$XDG_CACHE_HOME/stoker/objects`` or
    ``~/.cache/stoker/objects``) up to ``object_cache_bytes`` (default 10 GiB, least recently
    used out; 0 for no cache), so later epochs read from local disk. ``object_storage()``
    counts requests, bytes fetched, retries and cache hits.
    """

    def __new__(cls, shards, fields=("jpg;jpeg;png", "cls"), transform=None, cache_bytes=0,
                max_pixels=89_478_485, index_cache=None, stream=None, object_cache=None,
                object_cache_bytes=10 << 30, _objects=(), **stream_options):
        paths = expand_shards(shards)
        compressed = any(p.endswith(_COMPRESSED) or _compressed_dir(p) for p in paths)
        urls = [p for p in paths if is_url(p)]
        if urls and (stream or compressed):
            raise ValueError(f"stoker.WebDataset: {urls[0]}: shards in object storage are read "
                             "at random offsets, so they must be uncompressed .tar shards "
                             "(no stream=True, no .tar.gz/.tgz)")
        if stream or (stream is None and compressed):
            if cache_bytes:
                raise ValueError("stoker.WebDataset: a stream (compressed shards, or "
                                 "stream=True) has no RAM cache (cache_bytes)")
            from .webdataset_stream import stream_class
            return stream_class()(shards, fields, transform, max_pixels, **stream_options)
        if stream_options:
            raise TypeError("stoker.WebDataset: " + ", ".join(stream_options) +
                            " apply to a stream only (compressed shards, or stream=True)")
        return super().__new__(cls)

    def __init__(
        self,
        shards,
        fields: Sequence[str] = ("jpg;jpeg;png", "cls"),
        transform=None,
        cache_bytes: int = 0,
        max_pixels: int = 89_478_485,
        index_cache=None,
        stream=None,
        object_cache=None,
        object_cache_bytes: int = 10 << 30,
        _objects=(),
    ) -> None:
        self._made_with = ((shards,), dict(fields=fields, transform=transform,
                                           cache_bytes=cache_bytes, max_pixels=max_pixels,
                                           index_cache=index_cache, object_cache=object_cache,
                                           object_cache_bytes=object_cache_bytes))
        if isinstance(fields, str):
            fields = (fields,)
        fields = tuple(str(f) for f in fields)
        if not fields:
            raise ValueError("stoker.WebDataset: no fields")
        _check_transform(fields, transform)
        self.shards = expand_shards(shards)
        self.fields = fields
        self.transform = transform
        self._names = fields
        self._as_dict = False
        self._handle = _stoker.webdataset(self.shards, list(fields),
                                          transform.spec() if transform is not None else "",
                                          int(cache_bytes), int(max_pixels),
                                          *object_storage_args(index_cache, object_cache,
                                                               object_cache_bytes),
                                          list(_objects))
        objects = self._handle.objects()
        if objects and all(is_url(p) for p in self.shards):
            # Unpickled in a worker process: the shards as resolved here, so that it makes no
            # request to find them again (no listing, no HEAD).
            self._made_with = (([o[0] for o in objects],),
                               dict(self._made_with[1], _objects=tuple(objects)))

    def key(self, index: int) -> str:
        """The key of sample `index` (``__key__`` in webdataset)."""
        return self.sample_name(index).rsplit(" key '", 1)[1][:-1]

    def sample_name(self, index: int) -> str:
        """Shard and key of sample `index`, as errors name it: ``<shard> key '<key>'``."""
        return self._handle.sample_name(index)

    def object_storage(self) -> dict:
        """Object-storage traffic of this process's URL shards read through the same object
        cache: ``requests`` (``list_requests``, ``head_requests``, ``get_requests``; every
        attempt counts), ``bytes_fetched``, ``retries``, ``failures``, and ``cache_hits`` /
        ``cache_hit_bytes`` / ``cache_misses`` (chunk reads served by, or missing from, the disk
        cache). Empty when no shard is a URL."""
        if not any(is_url(p) for p in self.shards):
            return {}
        return self._handle.object_storage()

    def counters(self) -> dict:
        """Reads so far, and how many went to the shard files (0 new ones once a RAM cache is
        warm)."""
        return self._handle.counters()
