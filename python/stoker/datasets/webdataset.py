"""WebDataset tar shards read natively (docs/formats.md, "WebDataset shards")."""

from __future__ import annotations

import io
import os
import random
import re
import tarfile
import zlib
from typing import Iterable, Optional, Sequence, Union

import numpy as np
from braceexpand import braceexpand

from .. import _stoker
from . import shard_progress
from .native import NativeDataset


def expand_shards(shards: Union[str, os.PathLike, Iterable]) -> list[str]:
    """The shard paths `shards` names, as ``webdataset.WebDataset`` takes them: a path or URL, a
    brace pattern, several of them joined by ``::``, or a list of those. A directory (or an
    ``s3://`` prefix) stays as it is (the data set reads every ``*.tar`` in it, in name
    order)."""
    if isinstance(shards, (str, os.PathLike)):
        items = [os.fspath(shards)]
    else:
        items = [os.fspath(s) for s in shards]
    out = []
    for item in items:
        for part in item.split("::"):
            out.extend(braceexpand(part))  # the package webdataset expands patterns with
    if not out:
        raise ValueError("stoker.WebDataset: no shards")
    return out


_URL_SCHEMES = ("s3://", "http://", "https://")


def is_url(path: str) -> bool:
    """Whether `path` is an object-storage URL (``s3://``, ``http://``, ``https://``)."""
    return isinstance(path, str) and path.startswith(_URL_SCHEMES)


_IMAGE_EXTENSIONS = ("jpg", "jpeg", "png")
_INTEGER_EXTENSIONS = ("cls", "cls2", "class", "count", "index", "inx", "id", "txt")
_COMPRESSED = (".tar.gz", ".tgz")


def _kind(field: str) -> str:
    ext = field.rsplit(".", 1)[-1]
    if ext in _IMAGE_EXTENSIONS:
        return "image"
    if ext in _INTEGER_EXTENSIONS:
        return "integer"
    if ext == "npy":
        return "npy"
    raise ValueError(f"stoker.WebDataset: field '{field}' is not supported: a batch holds "
                     "fixed-shape arrays, so the fields read are images (jpg, jpeg, png), "
                     "integers (cls, cls2, class, count, index, inx, id, txt holding an "
                     "integer) and npy arrays; json, text and other raw bytes are not "
                     "(docs/formats.md)")


def _parse_fields(fields) -> tuple[tuple[str, tuple[str, ...], str], ...]:
    """(name, lower-case alternatives, kind) per field, checked as the C++ side checks them."""
    out = []
    for f in fields:
        alternatives = tuple(a.lower() for a in f.split(";"))
        if any(not a for a in alternatives):
            raise ValueError(f"stoker.WebDataset: field '{f}' has an empty name")
        kinds = {_kind(a) for a in alternatives}
        if len(kinds) > 1:
            raise ValueError(f"stoker.WebDataset: field '{f}' mixes kinds (images, integers, "
                             "arrays)")
        if any(f == name for name, _, _ in out):
            raise ValueError(f"stoker.WebDataset: field '{f}' is asked for twice (a batch's "
                             "fields have distinct names)")
        out.append((f, alternatives, kinds.pop()))
    return tuple(out)


# webdataset's base_plus_ext and tar_file_iterator's skip_meta.
_KEY = re.compile(r"^((?:.*/|)[^.]+)[.]([^/]*)$")
_META = re.compile(r"__[^/]*__($|/)")


def _tar_samples(path: str):
    """(key, {field: bytes}) for each sample of the tar (compressed or not) at `path`, read
    front to back and grouped as webdataset's group_by_keys groups them."""
    current = None
    try:
        with tarfile.open(path, "r|*") as tar:
            for info in tar:
                name = info.name
                if not info.isreg():
                    continue
                if ("/" not in name and name.startswith("__") and name.endswith("__")) or \
                        _META.match(name):
                    continue
                m = _KEY.match(name)
                if m is None:
                    continue
                key, field = m.group(1), m.group(2).lower()
                data = tar.extractfile(info).read()
                if current is None or current[0] != key:
                    if current is not None:
                        yield current
                    current = (key, {})
                if field in current[1]:
                    raise RuntimeError(f"{path} key '{key}': two members have the field "
                                       f"'{field}' (a duplicate file name in the tar)")
                current[1][field] = data
    except (tarfile.TarError, EOFError, OSError, zlib.error) as e:
        raise RuntimeError(f"{path}: {e} (a truncated or corrupt shard?)") from e
    if current is not None:
        yield current


class _Stream:
    """WebDataset shards read front to back as a stream (an IterableDataset): what
    ``stoker.WebDataset`` returns for compressed shards (``.tar.gz``, ``.tgz``), which cannot be
    indexed for random access, or with ``stream=True``. Same fields and transforms as the
    indexed data set; images are decoded by stoker's native pipeline. As ``webdataset`` does it:
    the shards are shuffled per epoch (``shardshuffle``, seeded with ``seed + epoch``), split
    over the ranks (``stoker.world()``) and then over the DataLoader's workers
    (``get_worker_info()``), and the samples go through a shuffle buffer of ``shuffle``
    samples (0: none). A rank or worker with no shard yields nothing, as in webdataset. Errors
    (a missing field, an image that does not decode, a truncated shard) are raised naming shard
    and key: a stream cannot skip them with ``on_error``. ``set_epoch(epoch)`` sets the epoch;
    otherwise each iteration counts one."""

    def __init__(self, shards, fields: Sequence[str] = ("jpg;jpeg;png", "cls"), transform=None,
                 max_pixels: int = 89_478_485, shuffle: int = 1000, shardshuffle: bool = True,
                 seed: int = 0) -> None:
        if isinstance(fields, str):
            fields = (fields,)
        self.fields = tuple(str(f) for f in fields)
        self._fields = _parse_fields(self.fields)
        _check_transform(self.fields, transform)
        self.shards = expand_shards(shards)
        self.transform = transform
        self._spec = transform.spec() if transform is not None else ""
        self.max_pixels = int(max_pixels)
        self.shuffle = int(shuffle)
        self.shardshuffle = bool(shardshuffle)
        self.seed = int(seed)
        self._epoch: Optional[int] = None  # set_epoch()'s
        self._loader_epoch: Optional[int] = None  # stoker's DataLoader's, before each pass
        self._next_epoch = 0  # iterated bare: each pass counts one
        self._resume: Optional[tuple] = None  # (epoch, start, progress) for the next pass
        self._pass: Optional[_Pass] = None  # the pass running (or ended): its position

    def set_epoch(self, epoch: int) -> None:
        self._epoch = int(epoch)

    def _stoker_epoch(self, epoch: int) -> None:
        """stoker's DataLoader tells each worker's copy the epoch it starts (unless
        set_epoch() set one), so worker threads and processes shuffle alike."""
        self._loader_epoch = int(epoch)

    def _shard_list(self) -> list[str]:
        """Every shard, in the data set's order: directories give their *.tar, *.tar.gz and
        *.tgz in name order."""
        shards = []
        for s in self.shards:
            if os.path.isdir(s):
                shards += sorted(os.path.join(s, n) for n in os.listdir(s)
                                 if n.endswith((".tar",) + _COMPRESSED))
            else:
                shards.append(s)
        return shards

    def _identity(self, shards: int) -> dict:
        return {"seed": self.seed, "shards": shards, "shuffle": self.shuffle,
                "shardshuffle": self.shardshuffle}

    def state_dict(self) -> dict:
        """Where the pass stands (torchdata's Stateful protocol): per shard, the samples read
        and those still in the shuffle buffer (stoker/datasets/shard_progress.py). Every
        worker's state of every rank merges into one that resumes on other ranks and workers
        (``stoker.merge_states``)."""
        if self._pass is not None:
            return self._pass.state()
        epoch = self._epoch if self._epoch is not None else self._next_epoch
        return {"kind": shard_progress.KIND, "version": shard_progress.VERSION,
                **self._identity(len(self._shard_list())), "epoch": epoch, "merged": False,
                "start": {}, "progress": {}}

    def load_state_dict(self, state: dict) -> None:
        """The next pass resumes `state`: one worker's own (the same ranks and workers read
        on) or a merged one (any ranks and workers: the shards with samples left are dealt
        over them, and each reads only the samples not yet consumed)."""
        shard_progress.check(state, **self._identity(len(self._shard_list())))
        self._resume = (int(state["epoch"]), shard_progress.merge([state.get("start")]),
                        shard_progress.merge([state.get("progress")]))

    def __iter__(self):
        from ..distributed import world

        shards = self._shard_list()
        if self._resume is not None:
            (epoch, start, progress), self._resume = self._resume, None
            self._next_epoch = epoch + 1
        else:
            start, progress = {}, {}
            if self._epoch is not None:
                epoch = self._epoch
            elif self._loader_epoch is not None:
                epoch = self._loader_epoch
            else:
                epoch = self._next_epoch
                self._next_epoch += 1
        order = list(range(len(shards)))
        if self.shardshuffle:
            random.Random(self.seed + epoch).shuffle(order)
        rank, world_size = world()
        try:
            from torch.utils.data import get_worker_info
            info = get_worker_info()
        except ImportError:  # pragma: no cover
            info = None
        worker, workers = (info.id, info.num_workers) if info is not None else (0, 1)
        mine = shard_progress.deal(order, start, rank, world_size, worker, workers)
        buffer: list = []  # (shard, ordinal, key, sample): read, not handed out
        this = self._pass = _Pass(self._identity(len(shards)), epoch, start, progress, buffer)
        rng = random.Random(f"{self.seed}-{epoch}-{'|'.join(shards[s] for s in mine)}")
        for s in mine:
            base = this.open(s)
            for ordinal, (key, sample) in enumerate(_tar_samples(shards[s])):
                if base.done(ordinal):
                    break
                this.processed[s] = ordinal + 1
                if base.consumed(ordinal):
                    continue
                item = (s, ordinal, key, sample)
                if len(buffer) < self.shuffle:
                    buffer.append(item)
                    continue
                if self.shuffle > 0:
                    i = rng.randrange(len(buffer))
                    buffer[i], item = item, buffer[i]
                yield self._convert(shards[item[0]], *item[2:], rng.getrandbits(64))
            this.ended.add(s)
        rng.shuffle(buffer)
        buffer.reverse()
        while buffer:  # taken off the buffer before it is handed out (state_dict)
            item = buffer.pop()
            yield self._convert(shards[item[0]], *item[2:], rng.getrandbits(64))

    def _convert(self, shard: str, key: str, sample: dict, seed: int) -> tuple:
        out = []
        for name, alternatives, kind in self._fields:
            data = next((sample[a] for a in alternatives if a in sample), None)
            where = f"{shard} key '{key}'"
            if data is None:
                raise RuntimeError(f"{where}: no field '{name}' (the sample has: "
                                   f"{', '.join(sample)})")
            if kind == "image":
                out.append(_stoker.decode_image(data, self._spec, seed, self.max_pixels,
                                                f"{where}: field '{name}'"))
            elif kind == "integer":
                try:
                    out.append(int(data.decode().strip()))
                except (ValueError, UnicodeDecodeError):
                    raise RuntimeError(f"{where}: field '{name}': not an integer") from None
            else:
                try:
                    out.append(np.load(io.BytesIO(data), allow_pickle=False))
                except ValueError as e:
                    raise RuntimeError(f"{where}: field '{name}': {e}") from None
        return tuple(out)


class _Pass:
    """One pass of a shard stream: what it resumed from and how far it read each of its
    shards; with the shuffle buffer, enough to say which samples were handed out."""

    def __init__(self, identity: dict, epoch: int, start: dict, progress: dict,
                 buffer: list) -> None:
        self._identity = identity
        self._epoch = epoch
        self._start = start  # never changed: shared by every state of the pass
        self._progress = progress  # a loaded worker state's own, for its shards
        self._buffer = buffer
        self._bases: dict[int, _Base] = {}
        self.processed: dict[int, int] = {}  # shard -> ordinals read (or skipped)
        self.ended: set[int] = set()

    def open(self, shard: int) -> "_Base":
        entry = shard_progress.union(self._start.get(shard), self._progress.get(shard))
        base = self._bases[shard] = _Base(entry)
        self.processed[shard] = 0
        return base

    def state(self) -> dict:
        pending: dict[int, set] = {s: set() for s in self.processed}
        for s, ordinal, _, _ in self._buffer:
            pending[s].add(ordinal)
        progress = dict(self._progress)
        for s, processed in self.processed.items():
            base = self._bases[s]
            pending[s].update(o for o in base.pending if o >= processed)
            progress[s] = [max(processed, base.read), s in self.ended or base.end,
                           sorted(pending[s])]
        return {"kind": shard_progress.KIND, "version": shard_progress.VERSION,
                **self._identity, "epoch": self._epoch, "merged": False,
                "start": self._start, "progress": progress}


class _Base:
    """A shard's entry at the start of a pass: which ordinals to skip, and where to stop."""

    def __init__(self, entry) -> None:
        self.read, self.end = (entry[0], bool(entry[1])) if entry else (0, False)
        self.pending = frozenset(entry[2]) if entry else frozenset()
        # Read to its end before: nothing after the last pending sample is left.
        self._last = max(self.pending, default=-1) if self.end else None

    def consumed(self, ordinal: int) -> bool:
        return ordinal < self.read and ordinal not in self.pending

    def done(self, ordinal: int) -> bool:
        return self._last is not None and ordinal > self._last


def _compressed_dir(path: str) -> bool:
    """A directory of compressed shards only (no *.tar)."""
    if not os.path.isdir(path):
        return False
    names = os.listdir(path)
    return (any(n.endswith(_COMPRESSED) for n in names)
            and not any(n.endswith(".tar") for n in names))


def _check_transform(fields, transform) -> None:
    from ..transforms import Compose

    images = any(_kind(a.lower()) == "image" for f in fields for a in f.split(";"))
    if transform is not None and not isinstance(transform, Compose):
        raise TypeError("transform must be a stoker.transforms.Compose (torchvision's "
                        "ImageNet pipelines, run in C++)")
    if images and transform is None:
        raise TypeError("stoker.WebDataset: the image fields need a transform "
                        "(e.g. stoker.transforms.train(224))")


_stream_class = None


def __getattr__(name: str):
    """WebDatasetStream, made on first use: a torch IterableDataset (so that torch's own
    DataLoader takes it too) without importing torch when stoker is imported."""
    global _stream_class
    if name != "WebDatasetStream":
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    if _stream_class is None:
        try:
            from torch.utils.data import IterableDataset as base
        except ImportError:  # pragma: no cover
            base = object
        _stream_class = type("WebDatasetStream", (_Stream, base),
                             {"__module__": __name__, "__doc__": _Stream.__doc__})
    return _stream_class


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
            return __getattr__("WebDatasetStream")(shards, fields, transform, max_pixels,
                                                     **stream_options)
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
        if index_cache is False:
            cache_dir, use_cache = "", False
        else:
            cache_dir = "" if index_cache in (None, True) else os.fspath(index_cache)
            use_cache = True
        self._names = fields
        self._as_dict = False
        self._handle = _stoker.webdataset(self.shards, list(fields),
                                          transform.spec() if transform is not None else "",
                                          int(cache_bytes), int(max_pixels), cache_dir,
                                          use_cache,
                                          "" if object_cache is None else os.fspath(object_cache),
                                          int(object_cache_bytes), list(_objects))
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
