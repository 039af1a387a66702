"""stoker.WebDatasetStream: WebDataset shards read front to back (compressed shards, or
``stream=True``), with a position per shard that resumes on any topology (shard_progress.py)."""

from __future__ import annotations

import io
import os
import random
import tarfile
import zlib
from typing import Optional, Sequence

import numpy as np

from .. import _stoker
from . import shard_progress
from .shards import _COMPRESSED, _check_transform, _parse_fields, expand_shards



def _tar_samples(path: str):
    """(key, {field: bytes}) for each sample of the tar (compressed or not) at `path`, read
    front to back and grouped as webdataset's group_by_keys groups them."""
    current = None
    try:
        with tarfile.open(path, "r|*") as tar:
            for info in tar:
                # Grouped by WebDataset's rule (src/source/webdataset.cc): webdataset's
                # base_plus_ext; meta files and keyless names left out.
                member = _stoker.webdataset_member(info.name) if info.isreg() else None
                if member is None:
                    continue
                key, field = member
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


class _Stream(shard_progress.PassEpochs):
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
        self._resume: Optional[tuple] = None  # (epoch, start, progress, replay): next pass
        self._pass: Optional[_Pass] = None  # the pass running (or ended): its position

    def set_epoch(self, epoch: int) -> None:
        self._epoch = int(epoch)

    def buffered_bytes(self) -> int:
        """The bytes of the samples in the shuffle buffer now (read, not handed out): what
        stoker's DataLoader counts against its memory_limit when this copy is read in the
        training process."""
        return self._pass.buffered if self._pass is not None else 0

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
        over them, and each reads only the samples not yet consumed). A worker's own state
        read by the same rank and worker of as many is replayed: the pass runs again from its
        start, its shuffle buffer and draws as they were, and hands out from the first sample
        it had not handed out, so that every later sample (and its augmentation) is the
        uninterrupted pass's; the samples before are read from their shards again, not
        decoded."""
        shard_progress.check(state, **self._identity(len(self._shard_list())))
        self._resume = (int(state["epoch"]), shard_progress.merge([state.get("start")]),
                        shard_progress.merge([state.get("progress")]),
                        None if state.get("merged") else state.get("replay"))

    def __iter__(self):
        shards = self._shard_list()
        replay = None
        if self._resume is not None:
            (epoch, start, progress, replay), self._resume = self._resume, None
            self._next_epoch = epoch + 1
        else:
            start, progress, epoch = {}, {}, self._pass_epoch()
        mine, topology, _ = shard_progress.deal_here(len(shards), self.shardshuffle, self.seed,
                                                     epoch, start)
        skip = 0
        if replay is not None and replay["topology"] == topology:
            progress, skip = {}, replay["handed"]  # the pass again, as it began
        buffer: list = []  # (shard, ordinal, key, sample): read, not handed out
        this = self._pass = _Pass(self._identity(len(shards)), epoch, start, progress, buffer)
        if not progress:  # a pass that began with no progress is replayed from its start
            this.topology = topology
        for shard, key, sample, seed in self._pass_samples(shards, mine, epoch, this, buffer):
            this.handed += 1
            if this.handed > skip:
                yield self._convert(shard, key, sample, seed)

    def _pass_samples(self, shards: list, mine: list, epoch: int, this: "_Pass",
                      buffer: list):
        """The pass's samples in the order handed out: (shard, key, sample, its seed)."""
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
                    this.buffered += _size(sample)
                    continue
                if self.shuffle > 0:
                    i = rng.randrange(len(buffer))
                    buffer[i], item = item, buffer[i]
                    this.buffered += _size(sample) - _size(item[3])
                yield shards[item[0]], *item[2:], rng.getrandbits(64)
            this.ended.add(s)
        rng.shuffle(buffer)
        buffer.reverse()
        while buffer:  # taken off the buffer before it is handed out (state_dict)
            item = buffer.pop()
            this.buffered -= _size(item[3])
            yield shards[item[0]], *item[2:], rng.getrandbits(64)

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


def _size(sample: dict) -> int:
    """The bytes of a sample as read from its shard (its members' data)."""
    return sum(len(data) for data in sample.values())


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
        self.buffered = 0  # the bytes of the samples in the buffer
        self.handed = 0  # samples handed out (or, replaying, passed over)
        self.topology: Optional[list] = None  # rank, world size, worker, workers

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
                "start": self._start, "progress": progress,
                "replay": ({"handed": self.handed, "topology": self.topology}
                           if self.topology is not None else None)}


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


# stoker.WebDatasetStream, a torch IterableDataset made on first use.
stream_class, __getattr__ = shard_progress.iterable_class("WebDatasetStream", _Stream, __name__)
