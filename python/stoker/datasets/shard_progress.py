"""Where an epoch over a shard stream stands, in a form that survives a change of topology.

A shard stream (``stoker.WebDatasetStream``) deals the epoch's shards to the ranks and their
workers, and each worker reads its shards front to back through a shuffle buffer. Its position
is kept per shard, by the samples' ordinals (their order in the shard):

    entry = [read, end, pending]

``read``: the ordinals before it were read (or skipped, as consumed before); ``end``: the
shard was read to its end; ``pending``: the ordinals before ``read`` that were not handed out
(in a shuffle buffer when the state was taken). A sample was consumed if its ordinal is below
``read`` and not pending. A map of such entries (shard index -> entry; the index is the shard's
place in the data set's shard list, so the state does not depend on where the files are) is
small: a few numbers per shard touched, plus the buffers' contents.

Maps merge by union: the shards of an epoch are each read by one worker, and an entry carried
by several workers (the progress at the start of a resumed epoch) merges with itself. The
rest of an epoch is the shards with samples left, dealt over the ranks and workers of
whatever topology resumes it, as a fresh epoch deals all of them.
"""

from __future__ import annotations

import functools
import random
from typing import Iterable, Optional, Sequence

KIND = "stoker.shard_stream"
VERSION = 1


def consumed(entry: Optional[Sequence], ordinal: int) -> bool:
    """Whether the sample `ordinal` of the shard was handed out according to `entry`."""
    if entry is None:
        return False
    return ordinal < entry[0] and ordinal not in _pending_set(entry)


def _pending_set(entry: Sequence) -> frozenset:
    pending = entry[2]
    return pending if isinstance(pending, frozenset) else frozenset(pending)


def union(a: Optional[Sequence], b: Optional[Sequence]) -> Optional[list]:
    """The entry of the samples consumed in `a` or in `b`."""
    if a is None or b is None:
        return None if a is None and b is None else list(a if b is None else b)
    read = max(a[0], b[0])
    # Not consumed in a: pending in a, or at or after a's read; the same for b.
    left_a = _pending_set(a) | frozenset(range(a[0], read))
    left_b = _pending_set(b) | frozenset(range(b[0], read))
    return [read, bool(a[1] or b[1]), sorted(left_a & left_b)]


def merge(maps: Iterable[Optional[dict]]) -> dict:
    """The union of shard maps (keys made ints: a state that went through JSON has strings)."""
    out: dict[int, list] = {}
    for m in maps:
        for shard, entry in (m or {}).items():
            shard = int(shard)
            out[shard] = union(out.get(shard), entry)
    return out


def has_left(entry: Optional[Sequence]) -> bool:
    """Whether the shard has samples not yet consumed."""
    return entry is None or not entry[1] or bool(entry[2])


def deal(order: Sequence[int], start: dict, rank: int, world_size: int, worker: int,
         workers: int) -> list[int]:
    """The shards (of the epoch's `order`) one worker of one rank reads: those with samples
    left at the start (`start`: the map the epoch resumes from, {} for a fresh one), dealt
    over the ranks, then over each rank's workers, as webdataset deals a fresh epoch."""
    left = [s for s in order if has_left(start.get(s))]
    return left[rank::world_size][worker::workers]


class PassEpochs:
    """The epoch a shard stream's pass reads when it is not resumed: the one set_epoch()
    named, else the DataLoader's (given before each pass), else one more than the last pass
    (iterated bare). Its users keep _epoch, _loader_epoch and _next_epoch."""

    _epoch: Optional[int]
    _loader_epoch: Optional[int]
    _next_epoch: int

    def _pass_epoch(self) -> int:
        if self._epoch is not None:
            return self._epoch
        if self._loader_epoch is not None:
            return self._loader_epoch
        epoch = self._next_epoch
        self._next_epoch += 1
        return epoch


def deal_here(count: int, shuffle: bool, seed: int, epoch: int,
              start: dict) -> tuple[list[int], list[int], bool]:
    """This rank's and this DataLoader worker's shards of `count` in the epoch's order
    (shuffled by seed + epoch when `shuffle`), dealt as deal() deals: (the shards, the
    topology [rank, world_size, worker, workers], whether this runs in a worker)."""
    from ..distributed import world

    order = list(range(count))
    if shuffle:
        random.Random(seed + epoch).shuffle(order)
    rank, world_size = world()
    try:
        from torch.utils.data import get_worker_info
        info = get_worker_info()
    except ImportError:  # pragma: no cover
        info = None
    worker, workers = (info.id, info.num_workers) if info is not None else (0, 1)
    mine = deal(order, start, rank, world_size, worker, workers)
    return mine, [rank, world_size, worker, workers], info is not None


def iterable_class(name: str, impl: type, module: str):
    """`impl` as a torch IterableDataset named `name` (so that torch's own DataLoader takes
    it too), made when first asked for: stoker imports without importing torch. Returns the
    module's ``stream_class()`` (the class, made on its first call) and its ``__getattr__``
    (PEP 562: ``module.<name>`` is that class)."""

    @functools.cache
    def stream_class() -> type:
        try:
            from torch.utils.data import IterableDataset as base
        except ImportError:  # pragma: no cover
            base = object
        return type(name, (impl, base), {"__module__": module, "__doc__": impl.__doc__})

    def module_getattr(attribute: str):
        if attribute != name:
            raise AttributeError(f"module {module!r} has no attribute {attribute!r}")
        return stream_class()

    return stream_class, module_getattr


def check(state: dict, **expected) -> None:
    """Raises ValueError if `state` is not a shard stream's of this data set."""
    if not isinstance(state, dict) or state.get("kind") != KIND:
        raise ValueError("stoker: the state is not a shard stream's (stoker.WebDatasetStream, "
                         "stoker.TextTokens)")
    if state.get("version") != VERSION:
        raise ValueError(f"stoker: a shard stream state of version {state.get('version')}; "
                         f"this stoker reads version {VERSION}")
    for key, value in expected.items():
        if state.get(key) != value:
            raise ValueError(f"stoker: the state does not match this data set: {key} is "
                             f"{state.get(key)!r} in the state and {value!r} here")


def merge_states(states: Sequence[dict]) -> dict:
    """Every worker's state of every rank (None for a worker that handed out nothing) as one
    merged state, which any ranks and workers resume; when the epoch is over, the next one's
    start (a fresh epoch)."""
    states = [s for s in states if s is not None]
    if not states:
        raise ValueError("stoker: no shard stream state to merge")
    first = states[0]
    keys = ("epoch", "seed", "shards", "shuffle", "shardshuffle")
    for state in states:
        check(state, **{k: first[k] for k in keys})
    progress = merge(m for s in states for m in (s.get("start"), s.get("progress")))
    epoch = first["epoch"]
    if len(progress) == first["shards"] and not any(map(has_left, progress.values())):
        epoch, progress = epoch + 1, {}
    return {**{k: first[k] for k in ("kind", "version", *keys)}, "epoch": epoch,
            "merged": True, "start": progress, "progress": {}}
