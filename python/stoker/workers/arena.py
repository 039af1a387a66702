"""Batches made in a worker process, handed to the training process without pickling their
arrays: the tensors and numpy arrays of a reply are written into a shared-memory *arena* (a
memfd the worker owns) and only the tree around them (structure, dtypes, shapes, offsets and
small objects) is pickled. The training process maps the arena and its tensors view it.

An arena holds one reply at a time. Its first byte says who has it: the worker sets it to 1
when it writes a reply there, and the training process sets it back to 0 when the last array
viewing that reply is freed (a finalizer on the mapping's base array). The worker reuses an
arena whose byte is 0, so steady state makes no new memory: its pages stay faulted in, as a
recycled slab's do. An arena is never handed back to the system while the worker lives (the
training process may still be mapping a reply's fd when the worker picks its next job), and
goes with the worker: a memfd has no name, so nothing is left in /dev/shm.

The training process opens the worker's memfd through /proc/<pid>/fd/<fd> (same user; the
worker is its child) rather than having it passed over the socket, so the reply protocol of
python/src/py_workers.h stays bytes only. It maps each arena once and keeps the mapping while
the worker lives (forget() when it is gone): mapping every reply afresh cost an open, an mmap,
a page fault on every page the training loop reads and a munmap, with its TLB shootdown (12%
of the training process's time with batches of 4 MB).
"""

from __future__ import annotations

import errno
import io
import logging
import mmap
import os
import pickle
import sys
import time
import weakref
from typing import Any, Optional

import numpy as np

from .. import _stoker

_ALIGN = 64
_HEADER = _ALIGN  # byte 0: 1 while the training process holds the reply
_MIN_ARENA = 1 << 20
# numpy arrays smaller than this are pickled with the tree (that is cheap for them; a tensor's
# pickle goes through torch.save's machinery, which costs far more than a copy, so every
# tensor goes into the arena).
_MIN_SHARED = 4096
_TAG = b"SA"  # a reply with an arena starts with this; a plain pickle never does
# Making another arena failed for want of file descriptors or memory (every arena holds a
# batch the training loop keeps): the reply is pickled whole instead.
_OUT_OF_ARENAS = (errno.EMFILE, errno.ENFILE, errno.ENOMEM, errno.ENOSPC)
_log = logging.getLogger("stoker")


def _round_up(n: int, to: int) -> int:
    return (n + to - 1) // to * to


def _torch():
    return sys.modules.get("torch")


def _shareable(obj) -> Optional[tuple[str, Any, int]]:
    """('t' | 'n', dtype, bytes) for a leaf whose bytes go into the arena, else None."""
    torch = _torch()
    if torch is not None and type(obj) is torch.Tensor:
        if (obj.device.type == "cpu" and obj.layout == torch.strided and not obj.requires_grad
                and not obj.is_conj() and not obj.is_neg()):
            return "t", obj.dtype, obj.numel() * obj.element_size()
        return None
    if type(obj) is np.ndarray and not obj.dtype.hasobject and obj.nbytes >= _MIN_SHARED:
        return ("n", obj.dtype, obj.nbytes)
    return None


class _Pickler(pickle.Pickler):
    def __init__(self, file, leaves: list) -> None:
        super().__init__(file, protocol=pickle.HIGHEST_PROTOCOL)
        self._leaves = leaves

    def persistent_id(self, obj):
        kind = _shareable(obj)
        if kind is None:
            return None
        self._leaves.append(obj)
        return len(self._leaves) - 1


class Arenas:
    """A worker process's arenas (one thread uses it)."""

    def __init__(self) -> None:
        self._arenas: list[tuple[int, mmap.mmap, int]] = []  # (fd, mapping, inode), by size
        self._pickled_said = False

    def _take(self, nbytes: int) -> tuple[int, mmap.mmap, int]:
        for arena in self._arenas:  # the smallest free one that fits
            if len(arena[1]) >= nbytes and arena[1][0] == 0:
                return arena
        arena = self._make(nbytes)
        self._arenas.sort(key=lambda a: len(a[1]))
        return arena

    def _make(self, nbytes: int) -> tuple[int, mmap.mmap, int]:
        # A quarter more than asked, to a power of two (pages never written cost nothing): a
        # padding collate's batches, 3.9-4.2 MB, would otherwise need arenas of 4 and of 8
        # MiB, and each batch past the first 4 MiB ones made another, faulted in on its way.
        size = max(_MIN_ARENA, 1 << (nbytes + nbytes // 4 - 1).bit_length())
        fd = os.memfd_create("stoker-batch", os.MFD_CLOEXEC)
        os.ftruncate(fd, size)
        arena = (fd, mmap.mmap(fd, size), os.fstat(fd).st_ino)
        self._arenas.append(arena)
        return arena

    def dumps(self, obj) -> bytes:
        """`obj` pickled, its large arrays written into a free arena."""
        leaves: list = []
        tree = io.BytesIO()
        _Pickler(tree, leaves).dump(obj)
        if not leaves:
            return tree.getvalue()
        metas, offset = [], _HEADER
        for leaf in leaves:
            kind, dtype, nbytes = _shareable(leaf)
            name = str(dtype).removeprefix("torch.") if kind == "t" else dtype.str
            metas.append((kind, name, tuple(leaf.shape), offset, nbytes))
            offset = _round_up(offset + nbytes, _ALIGN)
        try:
            fd, mm, inode = self._take(offset)
        except OSError as e:
            if e.errno not in _OUT_OF_ARENAS:
                raise
            if not self._pickled_said:
                self._pickled_said = True
                _log.warning("stoker: worker process %d cannot make another shared-memory arena "
                             "(%s; the training loop holds a batch in each of its %d): batches "
                             "are pickled whole until one is freed (slower; raise ulimit -n, "
                             "or keep copies of fewer batches)", os.getpid(), e.strerror,
                             len(self._arenas))
            return pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
        torch = _torch()
        for leaf, (kind, _, _, start, nbytes) in zip(leaves, metas):
            if nbytes == 0:
                continue
            # A contiguous leaf is streamed past the cache: the arena is read by the training
            # process, later, and an ordinary copy into it (cold: the arenas take turns) cost
            # a padding worker twice a warm copy's time (docs/BENCHMARKS.md).
            if kind == "t":
                if leaf.is_contiguous():
                    _stoker.stream_copy(mm, start, leaf.data_ptr(), nbytes)
                else:
                    dest = torch.frombuffer(mm, dtype=torch.uint8, count=nbytes, offset=start)
                    dest.view(leaf.dtype).view(leaf.shape).copy_(leaf)
            elif leaf.flags.c_contiguous:
                _stoker.stream_copy(mm, start, leaf.ctypes.data, nbytes)
            else:
                dest = np.frombuffer(mm, dtype=np.uint8, count=nbytes, offset=start)
                np.copyto(dest.view(leaf.dtype).reshape(leaf.shape), leaf)
        mm[0] = 1
        head = pickle.dumps((fd, inode, len(mm), metas), protocol=pickle.HIGHEST_PROTOCOL)
        return _TAG + len(head).to_bytes(4, "little") + head + tree.getvalue()


    def discard(self, blob: bytes) -> None:
        """A reply made by dumps() that will not be sent: its arena is free again."""
        if blob.startswith(_TAG):
            fd = _head(blob)[0]
            for own, mm, _ in self._arenas:
                if own == fd:
                    mm[0] = 0

    @staticmethod
    def written(blob: bytes) -> int:
        """The bytes of its arena a reply made by dumps() uses (0: none, pickled whole)."""
        if not blob.startswith(_TAG):
            return 0
        metas = _head(blob)[3]
        return max((start + nbytes for _, _, _, start, nbytes in metas), default=_HEADER)

    def reserve(self, nbytes: int, count: int) -> list[tuple[int, int, int, int]]:
        """At least `count` free arenas of `nbytes`, made now if need be, their first `nbytes`
        faulted in (written), as a worker's batches in flight will need them; returns them as
        (fd, inode, size, nbytes) for the training process's fault_in()."""
        free = [a for a in self._arenas if len(a[1]) >= nbytes and a[1][0] == 0][:count]
        while len(free) < count:
            free.append(self._make(nbytes))
        self._arenas.sort(key=lambda a: len(a[1]))
        for _, mm, _ in free:  # free: nobody reads them
            _touch(mm, nbytes, write=True)
        return [(fd, inode, len(mm), nbytes) for fd, mm, inode in free]


def _head(blob: bytes) -> tuple:
    """A reply's arena part: (fd, inode, arena size, leaves' metas)."""
    return pickle.loads(blob[6:6 + int.from_bytes(blob[2:6], "little")])


def _touch(mm: mmap.mmap, nbytes: int, write: bool) -> None:
    """Faults in the pages of the first `nbytes` of `mm`: a byte of each read, or written (0,
    past the header: the owner byte stays as it is)."""
    view = np.frombuffer(mm, dtype=np.uint8, count=min(nbytes, len(mm)))
    try:
        if write:
            view[_HEADER::mmap.PAGESIZE] = 0
        else:
            int(view[::mmap.PAGESIZE].sum())
    finally:
        del view


class Packed:
    """One value made by Arenas.dumps, inside a reply pickled whole (a probe's sample):
    loads() it where the reply is decoded."""

    __slots__ = ("blob",)

    def __init__(self, blob: bytes) -> None:
        self.blob = blob

    def __reduce__(self):
        return Packed, (self.blob,)


def _release(mm: mmap.mmap) -> None:
    try:
        mm[0] = 0  # the worker may reuse the arena
    except (ValueError, TypeError):
        pass  # closed at interpreter exit


class _Unpickler(pickle.Unpickler):
    def __init__(self, file, leaves: list) -> None:
        super().__init__(file)
        self._leaves = leaves

    def persistent_load(self, pid):
        return self._leaves[pid]


# The training process's mappings of the workers' arenas: pid -> fd -> (inode, mapping). The
# inode, which the reply carries, tells a memfd from another that a later process with the
# same pid has at that fd (a stat of /proc/<pid>/fd/<fd> per reply would cost a path walk).
_mapped: dict[int, dict[int, tuple[int, mmap.mmap]]] = {}


def _mapping(pid: int, fd: int, inode: int, nbytes: int) -> mmap.mmap:
    arenas = _mapped.setdefault(pid, {})
    known = arenas.get(fd)
    if known is not None and known[0] == inode and len(known[1]) == nbytes:
        return known[1]
    gone = OSError(errno.ESRCH, f"stoker: worker process {pid} no longer holds the shared "
                                f"memory of its reply")
    try:
        local = os.open(f"/proc/{pid}/fd/{fd}", os.O_RDWR | os.O_CLOEXEC)
    except FileNotFoundError:  # the worker died after it replied (its descriptors went)
        raise gone from None
    if os.fstat(local).st_ino != inode:  # not the reply's arena: its worker is gone
        os.close(local)
        raise gone
    try:
        mm = mmap.mmap(local, nbytes)
    finally:
        os.close(local)
    arenas[fd] = (inode, mm)
    return mm


def handover_cost(obj, rounds: int = 3) -> tuple[float, float]:
    """What handing `obj` (a batch) from a worker process over costs, in seconds, timed here on
    the same code: (the worker's Arenas.dumps into a warm arena, the training process's
    loads of it), each the least of `rounds` (a round that lost its core to another process
    measures the machine's load, not the code). worker_type='auto' weighs a stream's worker
    on it (stream_pipeline.py)."""
    arenas = Arenas()
    pid = os.getpid()
    pack = unpack = float("inf")
    try:
        blob = arenas.dumps(obj)  # the arena made and faulted in, as a worker's are
        loads(blob, pid)  # and mapped, as at a worker's first reply
        for _ in range(rounds):
            arenas.discard(blob)
            start = time.perf_counter()
            blob = arenas.dumps(obj)
            packed = time.perf_counter()
            loads(blob, pid)
            pack = min(pack, packed - start)
            unpack = min(unpack, time.perf_counter() - packed)
        return pack, unpack
    finally:
        forget(pid)
        for fd, mm, _ in arenas._arenas:
            os.close(fd)
            try:
                mm.close()
            except BufferError:  # a view of it is still alive: it goes with the view
                pass


def fault_in(pid: int, arenas: list[tuple[int, int, int, int]]) -> None:
    """Maps worker `pid`'s arenas (Arenas.reserve) here ahead of its first replies in them, and
    faults in the pages they will use: a worker's first replies otherwise pay it in the
    training loop."""
    for fd, inode, size, nbytes in arenas:
        _touch(_mapping(pid, fd, inode, size), nbytes, write=False)


def mapped_arenas(pids) -> int:
    """How many arenas of workers `pids` are mapped here: the shared memory their batches came
    in, which each keeps while it lives (as many as it once had in flight). An arena is sized
    to a power of two, but only the pages a batch wrote are memory."""
    return sum(len(_mapped.get(pid, ())) for pid in pids)


def forget(pid: int) -> None:
    """Worker `pid` is gone: drop its mappings (each goes once no batch views it)."""
    _mapped.pop(pid, None)


_twins: dict[str, Optional[np.dtype]] = {}


def _numpy_twin(name: str) -> Optional[np.dtype]:
    """The numpy dtype torch.from_numpy turns into torch dtype `name` (float32, int64, ...),
    or None for those numpy lacks (bfloat16, float8_*, ...)."""
    try:
        return _twins[name]
    except KeyError:
        pass
    torch = _torch()
    try:
        twin = np.dtype(name)
        if torch.from_numpy(np.empty(0, twin)).dtype != getattr(torch, name):
            twin = None
    except (TypeError, AttributeError):
        twin = None
    _twins[name] = twin
    return twin


def loads(blob: bytes, pid: int):
    """What Arenas.dumps made in worker `pid`, its arrays viewing the worker's arena."""
    if not blob.startswith(_TAG):
        return pickle.loads(blob)
    head = 6 + int.from_bytes(blob[2:6], "little")
    fd, inode, nbytes, metas = pickle.loads(blob[6:head])
    mm = _mapping(pid, fd, inode, nbytes)
    base = np.frombuffer(mm, dtype=np.uint8)
    # Runs when the last array viewing `base` is gone (they all hold it).
    weakref.finalize(base, _release, mm)
    torch = _torch()
    leaves = []
    for kind, dtype, shape, start, size in metas:
        raw = base[start:start + size]
        if kind == "n":
            leaves.append(raw.view(np.dtype(dtype)).reshape(shape))
        elif (same := _numpy_twin(dtype)) is not None:
            # One torch call: each releases and retakes the GIL, which the training loop and
            # the other engine threads contend for.
            leaves.append(torch.from_numpy(raw.view(same).reshape(shape)))
        else:
            leaves.append(torch.from_numpy(raw).view(getattr(torch, dtype)).view(shape))
    del base
    return _Unpickler(io.BytesIO(blob[head:]), leaves).load()
