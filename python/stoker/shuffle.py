"""What a user trades between shuffles (docs/storage.md, "Data larger than the cache"):
``stoker.shuffle_report(dataset)`` prints the shuffle a DataLoader gives a data set and its
quality beside a full shuffle, a stream's shard shuffle with a buffer, and reading in order.
The orders are computed, not read (stoker/frontend/shuffle_choice.h); ``stoker
shuffle-report --webdataset ...`` prints the same from the command line."""

from __future__ import annotations

from typing import Optional, Sequence

from . import _stoker
from .datasets.native import NativeDataset
from .loader.plan import SHUFFLE_MODES


def shuffle_report(dataset, batch_size: int = 64, *, labels: Optional[Sequence[int]] = None,
                   shuffle="auto", seed: int = 0, epoch: int = 0,
                   buffers: Sequence[int] = (1000, 5000),
                   cache_bytes: Optional[int] = None, show: bool = True) -> dict:
    """The shuffle ``stoker.DataLoader(dataset, shuffle=...)`` gives `dataset` (``"auto"``,
    ``"global"`` or ``"window"``) and why, and each order's quality: the entropy of the steps
    between neighbours in sample and shard ids (Mosaic Streaming's measure; also as a share of
    a full shuffle's) and, with `labels` (one per sample, e.g. of a data set sorted by label),
    the distinct labels in a batch of `batch_size` beside i.i.d. draws. `cache_bytes`: judge
    against another object cache than the data set's own. Prints the table unless `show` is
    False; returns it (``"text"``) with every figure."""
    if shuffle is True:
        shuffle = "auto"
    if shuffle != "auto" and shuffle not in SHUFFLE_MODES:
        raise ValueError(f"shuffle must be 'auto', 'global' or 'window', not {shuffle!r}")
    handle = dataset._handle if isinstance(dataset, NativeDataset) else None
    report = _stoker.shuffle_report(
        handle, len(dataset), getattr(_stoker.ShuffleMode, shuffle), int(seed), int(epoch),
        int(batch_size), [int(x) for x in labels] if labels is not None else [],
        [int(b) for b in buffers], cache_bytes)
    if show:
        print(report["text"], end="")
    return report


def shuffle_quality(order: Sequence[int], shard_ends: Sequence[int] = (), *,
                    labels: Optional[Sequence[int]] = None, batch_size: int = 0) -> dict:
    """The quality of any order of sample ids (a loader's epoch as delivered, a stream's):
    the entropy (bits) of the steps between neighbours in sample ids and in shard ids (the
    samples of shard k end at ``shard_ends[k]``), and with `labels` (one per sample) and
    `batch_size`, the mean distinct labels of a batch and of an i.i.d. draw of one."""
    return _stoker.shuffle_quality([int(i) for i in order], [int(e) for e in shard_ends],
                                   [int(x) for x in labels] if labels is not None else [],
                                   int(batch_size))
