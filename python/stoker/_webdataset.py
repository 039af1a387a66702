"""WebDataset tar shards read natively (docs/formats.md, "WebDataset shards")."""

from __future__ import annotations

import os
import re
from typing import Iterable, Sequence, Union

from . import _stoker
from ._datasets import NativeDataset

_RANGE = re.compile(r"^(-?\d+)\.\.(-?\d+)(?:\.\.-?(\d+))?$")
_LETTERS = re.compile(r"^([A-Za-z])\.\.([A-Za-z])(?:\.\.-?(\d+))?$")


def _closing(s: str, start: int) -> int:
    """The index of the '}' matching the '{' at `start`, or -1."""
    depth, i = 0, start
    while i < len(s):
        c = s[i]
        if c == "\\":
            i += 2
            continue
        if c == "{":
            depth += 1
        elif c == "}":
            depth -= 1
            if depth == 0:
                return i
        i += 1
    return -1


def _split_top(s: str) -> list[str]:
    """`s` split at its commas outside braces."""
    parts, depth, i, last = [], 0, 0, 0
    while i < len(s):
        c = s[i]
        if c == "\\":
            i += 2
            continue
        if c == "{":
            depth += 1
        elif c == "}":
            depth -= 1
        elif c == "," and depth == 0:
            parts.append(s[last:i])
            last = i + 1
        i += 1
    parts.append(s[last:])
    return parts


def _range(inner: str):
    m = _RANGE.match(inner)
    if m:
        a, b, step = m.group(1), m.group(2), int(m.group(3) or 1) or 1
        lo, hi = int(a), int(b)
        width = max(len(a), len(b)) if any(
            x.lstrip("-").startswith("0") and len(x.lstrip("-")) > 1 for x in (a, b)) else 0
        values = range(lo, hi + 1, step) if lo <= hi else range(lo, hi - 1, -step)
        return [str(v).zfill(width) if v >= 0 else "-" + str(-v).zfill(width - 1)
                for v in values]
    m = _LETTERS.match(inner)
    if m:
        lo, hi, step = ord(m.group(1)), ord(m.group(2)), int(m.group(3) or 1) or 1
        values = range(lo, hi + 1, step) if lo <= hi else range(lo, hi - 1, -step)
        return [chr(v) for v in values]
    return None


def _expand(s: str) -> list[str]:
    i = 0
    while i < len(s):
        c = s[i]
        if c == "\\":
            i += 2
            continue
        if c == "{":
            j = _closing(s, i)
            if j < 0:
                break
            inner = s[i + 1:j]
            parts = _split_top(inner)
            if len(parts) > 1:
                alternatives = [x for p in parts for x in _expand(p)]
            else:
                alternatives = _range(inner)
                if alternatives is None:  # "{x}": kept as it is, its inside expanded
                    alternatives = ["{" + x + "}" for x in _expand(inner)]
            rests = _expand(s[j + 1:])
            return [s[:i] + a + r for a in alternatives for r in rests]
        i += 1
    return [s]


def braceexpand(pattern: str) -> list[str]:
    """Brace expansion as the ``braceexpand`` package (and so ``webdataset``) does it:
    ``{a,b}`` alternatives, ``{000..146}`` ranges (zero-padded when a bound is), ``{a..e}``,
    ``{1..9..2}`` steps, nesting, ``\\{`` for a literal brace."""
    return [re.sub(r"\\(.)", r"\1", s) for s in _expand(pattern)]


def expand_shards(shards: Union[str, os.PathLike, Iterable]) -> list[str]:
    """The shard paths `shards` names, as ``webdataset.WebDataset`` takes them: a path, a brace
    pattern, several of them joined by ``::``, or a list of those. A directory stays as it is
    (the data set reads every ``*.tar`` in it, in name order)."""
    if isinstance(shards, (str, os.PathLike)):
        items = [os.fspath(shards)]
    else:
        items = [os.fspath(s) for s in shards]
    out = []
    for item in items:
        for part in item.split("::"):
            out.extend(braceexpand(part))
    if not out:
        raise ValueError("stoker.WebDataset: no shards")
    return out


_IMAGE_EXTENSIONS = ("jpg", "jpeg", "png")


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

    Each shard is indexed once from its tar headers and the index is cached on disk (in
    ``index_cache``, a directory; default ``$STOKER_CACHE_DIR``, ``$XDG_CACHE_HOME/stoker`` or
    ``~/.cache/stoker``; ``False`` for none), keyed by the shard's path, size and mtime. The
    data set has a length and random access: the shuffle, DistributedSampler, ``state_dict()``
    resume and ``cache_bytes`` (the RAM cache) work as for ImageFolder. A sample with a missing
    field, a bad label or an image that does not decode raises naming shard and key (or is
    skipped with the DataLoader's ``on_error='skip'``). Compressed shards (``.tar.gz``) are
    refused: they cannot be read at random offsets.
    """

    def __init__(
        self,
        shards,
        fields: Sequence[str] = ("jpg;jpeg;png", "cls"),
        transform=None,
        cache_bytes: int = 0,
        max_pixels: int = 89_478_485,
        index_cache=None,
    ) -> None:
        from .transforms import Compose

        self._made_with = ((shards,), dict(fields=fields, transform=transform,
                                           cache_bytes=cache_bytes, max_pixels=max_pixels,
                                           index_cache=index_cache))
        if isinstance(fields, str):
            fields = (fields,)
        fields = tuple(str(f) for f in fields)
        if not fields:
            raise ValueError("stoker.WebDataset: no fields")
        images = any(alt.strip().lower().rsplit(".", 1)[-1] in _IMAGE_EXTENSIONS
                     for f in fields for alt in f.split(";"))
        if transform is not None and not isinstance(transform, Compose):
            raise TypeError("transform must be a stoker.transforms.Compose (torchvision's "
                            "ImageNet pipelines, run in C++)")
        if images and transform is None:
            raise TypeError("stoker.WebDataset: the image fields need a transform "
                            "(e.g. stoker.transforms.train(224))")
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
                                          use_cache)

    def key(self, index: int) -> str:
        """The key of sample `index` (``__key__`` in webdataset)."""
        return self.sample_name(index).rsplit(" key '", 1)[1][:-1]

    def sample_name(self, index: int) -> str:
        """Shard and key of sample `index`, as errors name it: ``<shard> key '<key>'``."""
        return self._handle.sample_name(index)

    def counters(self) -> dict:
        """Reads so far, and how many went to the shard files (0 new ones once a RAM cache is
        warm)."""
        return self._handle.counters()
