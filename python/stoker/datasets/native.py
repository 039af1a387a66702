"""Data sets that run entirely in C++, without the GIL."""

from __future__ import annotations

import os
from typing import Sequence

from .. import _stoker
from ..elements import element_dtype, to_array
from ..progress import Bar
from .shards import is_url


def object_storage_args(index_cache, object_cache, object_cache_bytes) -> tuple:
    """The data sets' object-storage arguments (docs/storage.md) as the C++ constructors take
    them: (index cache directory, whether to use one, object cache directory, its bytes).
    `index_cache`: None or True the default place, False none, else a directory; `object_cache`:
    None the default place, else a directory."""
    if index_cache is False:
        index_dir, use_index = "", False
    else:
        index_dir, use_index = "" if index_cache in (None, True) else os.fspath(index_cache), True
    return (index_dir, use_index, "" if object_cache is None else os.fspath(object_cache),
            int(object_cache_bytes))


class NativeDataset:
    """Base of the data sets stoker reads in C++. Indexing one returns a sample: for
    inspection, and for a wrapper such as torch's Subset, ConcatDataset or random_split read by
    a DataLoader, where it takes the sample's seed (``stoker.sample_seed()``) so that random
    augmentations differ per sample and epoch as they do natively."""

    _handle: "_stoker.NativeDataset"
    _names: tuple[str, ...]
    _as_dict: bool
    _made_with: tuple  # (args, kwargs) of the constructor: pickled instead of the handle

    def __reduce__(self):
        # Made again where it is unpickled (a remote worker): the handle is a C++ object.
        args, kwargs = self._made_with
        return (_make, (type(self), args, kwargs, os.getpid()))

    def __len__(self) -> int:
        return len(self._handle)

    def __getitem__(self, index: int):
        if not -len(self) <= index < len(self):
            raise IndexError(f"index {index} is out of range for {len(self)} samples")
        seed = _stoker.sample_seed() or 0  # None outside a DataLoader's read
        values = [to_array(a, t) for a, t in zip(self._handle.read(index % len(self), seed),
                                                 self._handle.element_types)]
        return dict(zip(self._names, values)) if self._as_dict else tuple(values)

    def storage_layout(self):
        """Where the samples' bytes are (docs/storage.md, "Data larger than the cache"), or
        None when the data set cannot tell: ``block_ends`` (the samples of block ``b`` end at
        ``block_ends[b]``), ``block_bytes``, ``shard_ends`` (the same for its files or shards)
        and ``cache_bytes`` (the cache a block is read into whole). A shuffled DataLoader
        chooses its order from these (``stats()["shuffle"]``)."""
        return self._handle.storage_layout()

    def _structure(self):
        """The batch layout, as PyDataset.structure() describes it."""
        leaves = [("array", f, t) for f, t in enumerate(self._handle.element_types)]
        if self._as_dict:
            return ("map", dict, list(self._names), leaves)
        return ("seq", tuple, leaves)


def _make(cls, args, kwargs, pickled_in=None):
    if pickled_in is not None and pickled_in != os.getpid():
        # A worker of another process's loader: the blocks it reads once go to the object
        # cache on disk, where that loader's other workers find them (docs/storage.md).
        _stoker.share_object_caches()
    return cls(*args, **kwargs)


class ArrayDataset(NativeDataset):
    """Samples held in memory: one array (numpy array or CPU tensor, C-contiguous) per field,
    with the samples along the first dimension, used without a copy.

    ``ArrayDataset(images, labels)`` yields ``(image, label)`` tuples, like
    torch.utils.data.TensorDataset; ``ArrayDataset(image=images, label=labels)`` yields dicts.
    """

    def __init__(self, *arrays, **named_arrays) -> None:
        self._made_with = (arrays, named_arrays)
        if arrays and named_arrays:
            raise TypeError("ArrayDataset takes arrays either by position or by name, not both")
        if named_arrays:
            self._names, values = tuple(named_arrays), list(named_arrays.values())
        else:
            self._names, values = tuple(f"{i}" for i in range(len(arrays))), list(arrays)
        self._as_dict = bool(named_arrays)
        self._handle = _stoker.array_dataset(list(self._names), values)


class SyntheticDataset(NativeDataset):
    """Generated samples with a set shape and an optional per-sample latency (slept, like I/O)
    and CPU work (spun, like decoding): for benchmarks and tests. Each field is
    ``(name, dtype, shape)``; values are a documented function of (sample, element)
    (include/stoker/sources.h)."""

    def __init__(
        self,
        samples: int,
        fields: Sequence[tuple] = (("image", "float32", (3, 224, 224)), ("label", "int64", ())),
        latency: float = 0.0,
        cpu_work: float = 0.0,
        classes: int = 10,
    ) -> None:
        self._made_with = ((samples, fields, latency, cpu_work, classes), {})
        spec = [(str(n), element_dtype(t), tuple(int(d) for d in s)) for n, t, s in fields]
        self._names = tuple(n for n, _, _ in spec)
        self._as_dict = False
        self._handle = _stoker.synthetic_dataset(int(samples), spec, float(latency),
                                                 float(cpu_work), int(classes))


class _ImageDataset(NativeDataset):
    _kind = ""

    def __init__(self, path, transform, cache_bytes: int = 0,
                 max_pixels: int = 89_478_485, index_cache=None, object_cache=None,
                 object_cache_bytes: int = 10 << 30, _objects=()) -> None:
        from ..transforms import Compose

        self._made_with = ((path, transform, cache_bytes, max_pixels),
                           dict(index_cache=index_cache, object_cache=object_cache,
                                object_cache_bytes=object_cache_bytes))
        if not isinstance(transform, Compose):
            raise TypeError("transform must be a stoker.transforms.Compose (torchvision's "
                            "ImageNet pipelines, run in C++)")
        self.root = path if is_url(path) else str(path)
        self.transform = transform
        self._names = ("image", "label")
        self._as_dict = False
        self._handle = _stoker.image_dataset(
            self._kind, self.root, transform.spec(), int(cache_bytes), int(max_pixels),
            *object_storage_args(index_cache, object_cache, object_cache_bytes), list(_objects))
        self.classes = self._handle.classes()
        self.class_to_idx = {c: i for i, c in enumerate(self.classes)}

    def counters(self) -> dict:
        """Reads so far, and how many went to storage (0 new ones once a RAM cache is warm)."""
        return self._handle.counters()

    def sample_name(self, index: int) -> str:
        """Sample `index` as errors name it: its file (its URL), or shard and record."""
        return self._handle.sample_name(index)

    def object_storage(self) -> dict:
        """Over a URL (docs/storage.md): this process's object-storage traffic through the same
        object cache, as ``stoker.WebDataset.object_storage()`` counts it. Empty for local
        files."""
        return self._handle.object_storage() if is_url(self.root) else {}


class ImageFolder(_ImageDataset):
    """torchvision.datasets.ImageFolder's layout (root/<class>/<image>, classes sorted, same
    labels), decoded and transformed in C++: samples are (image, label). JPEG and PNG.

    ``cache_bytes`` keeps up to that many bytes of encoded images in RAM, so later epochs do
    not touch the disk. A file that fails to decode raises (or, with the DataLoader's
    ``on_error='skip'``, is replaced and reported) with its path and the reason.

    ``root`` may be an ``s3://bucket/train/`` prefix (docs/storage.md): one recursive listing
    per node, classes the first level of keys below it (same order and labels), each image read
    whole through ``object_cache`` (a directory; default ``$STOKER_CACHE_DIR/objects``) up to
    ``object_cache_bytes`` (0: no cache), the images of the batches the loader has opened
    fetched ahead in parallel. ``index_cache`` (default ``$STOKER_CACHE_DIR/indexes``; False:
    none) holds the lock files and, under torchrun, the listing the ranks of a node share.
    """

    _kind = "folder"


class RecordDataset(_ImageDataset):
    """Record shards written by ``stoker pack SRC DEST`` (docs/record_format.md), read with
    pread, each record's checksum checked; otherwise as ImageFolder.

    ``path`` may be a URL (docs/storage.md): an ``s3://bucket/pack/`` prefix (every ``*.stkr``
    directly under it) or one shard's ``s3://`` or ``http(s)://`` URL. Each shard's index is
    read once per node and kept in ``index_cache`` (default ``$STOKER_CACHE_DIR/indexes``;
    False: none), keyed by URL, size and ETag; records are read in 8 MiB chunks (a range GET
    each, shared by neighbouring records) kept in ``object_cache`` as for ImageFolder.
    """

    _kind = "records"

    def __init__(self, path, transform, cache_bytes: int = 0, max_pixels: int = 89_478_485,
                 index_cache=None, object_cache=None, object_cache_bytes: int = 10 << 30,
                 _objects=()) -> None:
        super().__init__(path, transform, cache_bytes, max_pixels, index_cache, object_cache,
                         object_cache_bytes, _objects)
        if is_url(self.root):
            # Unpickled in a worker process: the shards as resolved here, so that it makes no
            # request to find them again (no listing, no HEAD).
            self._made_with = (self._made_with[0],
                               dict(self._made_with[1], _objects=tuple(self._handle.objects())))


def pack(src, dest, shard_bytes: int = 1 << 30, overwrite: bool = False) -> dict:
    """Packs the image folder `src` into record shards in the directory `dest` (what
    ``stoker pack SRC DEST`` does), atomically: `dest` appears only when complete. Shows a
    tqdm bar on a terminal when tqdm is installed."""
    with Bar("pack", unit="file") as bar:
        return _stoker.pack(str(src), str(dest), int(shard_bytes), bool(overwrite),
                            bar.update_to)
