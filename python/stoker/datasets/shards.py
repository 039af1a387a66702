"""What the indexed and the streamed WebDataset share: shard names (paths, patterns, URLs) and
the fields of a sample."""

from __future__ import annotations

import os
from typing import Iterable, Union

from braceexpand import braceexpand


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


def _check_transform(fields, transform) -> None:
    from ..transforms import Compose

    images = any(_kind(a.lower()) == "image" for f in fields for a in f.split(";"))
    if transform is not None and not isinstance(transform, Compose):
        raise TypeError("transform must be a stoker.transforms.Compose (torchvision's "
                        "ImageNet pipelines, run in C++)")
    if images and transform is None:
        raise TypeError("stoker.WebDataset: the image fields need a transform "
                        "(e.g. stoker.transforms.train(224))")


def local_files(path: str, suffix: str, who: str) -> list[str]:
    """The local files one path names: a directory's *`suffix` files in name order, a glob's
    matches in name order, or the file itself; FileNotFoundError naming `who` and the path
    when there is none."""
    import glob

    if os.path.isdir(path):
        found = sorted(glob.glob(os.path.join(glob.escape(path), "*" + suffix)))
        if not found:
            raise FileNotFoundError(f"{who}: no *{suffix} file in {path}")
        return found
    if glob.has_magic(path) and not os.path.exists(path):
        found = sorted(glob.glob(path))
        if not found:
            raise FileNotFoundError(f"{who}: no file matches {path}")
        return found
    if os.path.isfile(path):
        return [path]
    raise FileNotFoundError(f"{who}: no such file: {path}")
