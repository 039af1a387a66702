"""Remote workers on Ray: extra worker slots of the engine, served by Ray actors.

The engine does not know about them. An engine worker thread that takes a chunk of a batch
asks ``RemoteWorkers.run`` (from ``PyDataset::read_rows``, python/src/py_dataset.cc) to have it
read remotely: if an actor is free, the chunk goes to it as the worker processes' kJob
(python/src/py_workers.h: the rows' sample indices and seeds, field offsets into the actor's
own buffer), the actor reads and writes the rows exactly as a worker process does
(``_worker._run_job`` over ``SampleWriter``), and returns them as one numpy array through Ray's
object store, with the pickled object values and errors; the thread copies the rows into its
slab (the one copy on this node) and the engine goes on as for any chunk. So the order,
exactly-once delivery, cancellation, error policy, ``state_dict()`` and backpressure (batches
in flight bounded by the free slabs) are the engine's. A chunk whose actor dies, whose node
goes, or whose reply is later than ``reissue_after`` is issued again by the same thread to
another free actor, or read locally when none is free or left; it has one owner, the thread,
and only the reply it waits for is used, so nothing is delivered twice.

Ray is imported only when ``remote=`` is used (``pip install stoker[ray]``).
"""

from __future__ import annotations

import dataclasses
import logging
import mmap
import os
import pickle
import socket
import sys
import threading
import time
from typing import Any, Optional

from . import _stoker, _worker
from ._workers import rebuild_error

_log = logging.getLogger("stoker")

# Ray's exceptions that mean the unit's worker is gone or late (the unit is issued again);
# any other exception from ray.get is an error of the unit itself.
_LOST = ("RayActorError", "ActorDiedError", "ActorUnavailableError", "ObjectLostError",
         "OwnerDiedError", "ObjectReconstructionFailedError", "NodeDiedError",
         "WorkerCrashedError", "RaySystemError", "GetTimeoutError", "LocalRayletDiedError",
         "TaskUnschedulableError", "ActorUnschedulableError")


# Units in flight per actor: while it reads one, the next waits at the actor (Ray runs an
# actor's calls one at a time, in order), so the actor does not idle through each round trip.
SLOTS = 2

# num_workers='auto' with remote=: remote workers are asked for one at a time while the
# training loop waits more than _GROW_WAIT of its time and the local workers are CPU-saturated
# (their CPU time over wall time, per core of their share, at least _SATURATED), and given
# back one at a time while it waits less than _SHRINK_WAIT. Decided every TUNE_BATCHES
# batches, from the engine's stats over that stretch.
TUNE_BATCHES = 8
_GROW_WAIT = 0.10
_SHRINK_WAIT = 0.02
_SATURATED = 0.8


def next_active(active: int, count: int, wait_fraction: float, local_load: float) -> int:
    """How many of `count` remote workers to use next, `active` being used now: local first
    (Pecan's rule), remote workers only for the excess."""
    if wait_fraction > _GROW_WAIT and local_load >= _SATURATED and active < count:
        return active + 1
    if wait_fraction < _SHRINK_WAIT and active > 0:
        return active - 1
    return active


@dataclasses.dataclass(frozen=True)
class RayWorkers:
    """What ``DataLoader(remote=...)`` starts: ``ray_workers(n, ...)`` says how."""

    count: int
    num_cpus: float = 1
    resources: Optional[dict] = None
    address: Optional[str] = None
    reissue_after: Optional[float] = None
    actor_options: Optional[dict] = None


def ray_workers(count: int, *, num_cpus: float = 1, resources: Optional[dict] = None,
                address: Optional[str] = None, reissue_after: Optional[float] = None,
                **actor_options) -> RayWorkers:
    """Remote workers for ``stoker.DataLoader(..., remote=stoker.ray_workers(4))``: `count`
    Ray actors, each with `num_cpus` CPUs (and `resources`, and any other option of Ray's
    ``.options()``, such as ``scheduling_strategy``), placed by Ray anywhere in the cluster.
    They read the excess: a chunk goes to a free actor, else to a local worker.

    `address`: the cluster to connect to if Ray is not initialized yet (``ray.init(address)``;
    None: Ray's default, ``RAY_ADDRESS`` or a local cluster). `reissue_after` (seconds): a
    chunk whose reply is later than that is issued again (locally if no actor is free) and its
    actor given up; None waits for as long as the actor lives."""
    if int(count) < 1:
        raise ValueError(f"ray_workers needs at least one worker, not {count}")
    if reissue_after is not None and reissue_after <= 0:
        raise ValueError(f"reissue_after must be positive, not {reissue_after}")
    return RayWorkers(int(count), num_cpus, resources, address, reissue_after,
                      actor_options or None)


def _import_ray():
    try:
        import ray
    except ImportError as e:
        raise ImportError("stoker: remote workers need Ray: pip install 'stoker[ray]' "
                          "(or pip install ray)") from e
    return ray


class RemoteWorker:
    """One remote worker (the body of a Ray actor): holds the data set (shipped once, by Ray's
    serialisation) and a buffer the rows of a chunk are written into."""

    def __init__(self, dataset, worker_id: int, num_workers: int, base_seed: int,
                 worker_init_fn, use_getitems: bool) -> None:
        torch = sys.modules.get("torch")
        if torch is not None:
            torch.set_num_threads(1)
        seed = _worker.seed_worker(base_seed, worker_id)
        _worker.set_torch_worker_info(worker_id, num_workers, seed, dataset)
        self._dataset = dataset
        self._use_getitems = use_getitems
        self._writer = _stoker.SampleWriter()
        self._buffer: Optional[mmap.mmap] = None
        self._init_error = None
        self._where = f"{socket.gethostname()}, pid {os.getpid()}"
        if worker_init_fn is not None:
            try:
                worker_init_fn(worker_id)
            except Exception as e:  # reported with every job, as the reason its rows fail
                self._init_error = _worker._error_info(e)

    def pid(self) -> int:
        """This worker's process id on its node."""
        return os.getpid()

    def run(self, job: bytes, layout: Optional[bytes]):
        """Reads a kJob's rows into the buffer; returns (status bytes, the rows as a numpy
        array over the buffer, the reply's blob, where this worker runs). Ray copies the array
        into its object store when this returns, before the next job reuses the buffer."""
        import numpy as np

        if layout is not None:
            self._writer.set_layout(*pickle.loads(layout))
        _, _, nfields, nrows, _ = _worker._JOB.unpack_from(job)
        total = 0
        for f in range(nfields):
            offset, row_bytes = _worker._FIELD.unpack_from(job, _worker._JOB.size
                                                           + f * _worker._FIELD.size)
            total = max(total, offset + nrows * row_bytes)
        self._reserve(total)
        reply = _worker._run_job(job, self._dataset, self._writer, self._init_error,
                                 self._use_getitems, None)
        _, nstatus, nblob = _worker._RESULT.unpack_from(reply, _worker._HEADER.size)
        at = _worker._HEADER.size + _worker._RESULT.size
        return (reply[at:at + nstatus], np.frombuffer(self._buffer, np.uint8, total),
                reply[len(reply) - nblob:] if nblob else b"", self._where)

    def _reserve(self, size: int) -> None:
        # Region 1 of the jobs: a memfd mapped here and by the writer, grown as needed.
        if self._buffer is not None and len(self._buffer) >= size:
            return
        size = max(size, 2 * len(self._buffer) if self._buffer is not None else 1 << 20)
        if self._buffer is not None:
            self._writer.drop(1)
            self._buffer.close()
        fd = os.memfd_create("stoker-remote")
        os.ftruncate(fd, size)
        self._buffer = mmap.mmap(fd, size)
        self._writer.map(1, fd, size)  # takes the fd


class RemoteWorkers:
    """The actors of one loader and which of them are free; ``run`` is called by the engine's
    worker threads (with the GIL, which ``ray.get`` releases while it waits)."""

    def __init__(self, spec: RayWorkers, dataset, first_id: int, num_workers: int,
                 base_seed: int, worker_init_fn) -> None:
        ray = self._ray = _import_ray()
        if not ray.is_initialized():
            ray.init(address=spec.address)
        options = dict(spec.actor_options or {})
        options.setdefault("max_restarts", 0)
        actor = ray.remote(RemoteWorker).options(num_cpus=spec.num_cpus,
                                                 resources=spec.resources, **options)
        use_getitems = hasattr(dataset, "__getitems__")
        self.actors = [actor.remote(dataset, first_id + k, num_workers, base_seed,
                                    worker_init_fn, use_getitems)
                       for k in range(spec.count)]
        self._reissue_after = spec.reissue_after
        self._lock = threading.Lock()
        # One entry per slot of a live actor that no unit holds.
        self._free = [k for k in range(spec.count) for _ in range(SLOTS)][::-1]  # _lock
        self._dead: set[int] = set()  # guarded by _lock
        self._active = spec.count  # actors 0.._active-1 take units; guarded by _lock
        self._alive = spec.count  # guarded by _lock
        self._has_layout = [False] * spec.count  # guarded by _lock
        self._layout: Optional[bytes] = None
        self._stopped = False
        self._counts = dict(jobs=0, rows_bytes=0, wait_s=0.0, reissued=0, lost_workers=0,
                            local_jobs=0)  # guarded by _lock
        self._started = time.monotonic()

    @property
    def size(self) -> int:
        return len(self.actors)

    @property
    def active(self) -> int:
        return self._active

    @property
    def threads(self) -> int:
        """The engine threads that serve the actors in use: one per slot."""
        return SLOTS * self._active

    def set_active(self, active: int) -> None:
        """Units go to the first `active` actors only (the others stay up, idle)."""
        with self._lock:
            self._active = max(0, min(int(active), len(self.actors)))

    def set_layout(self, message: bytes) -> None:
        self._layout = message

    def run(self, job: bytes):
        """A chunk read by a free actor: (status, rows, object values or None, {row:
        exception}); None if no actor is free or left (the chunk is then read locally)."""
        while True:
            with self._lock:
                usable = [k for k in self._free if k < self._active]
                if self._stopped or not usable:
                    self._counts["local_jobs"] += 1
                    return None
                k = usable[-1]
                self._free.remove(k)
                layout = None if self._has_layout[k] else self._layout
            started = time.monotonic()
            try:
                status, rows, blob, where = self._ray.get(
                    self.actors[k].run.remote(job, layout), timeout=self._reissue_after)
            except Exception as e:
                if not any(c.__name__ in _LOST for c in type(e).__mro__):
                    with self._lock:
                        if k not in self._dead:
                            self._free.append(k)
                    raise
                self._lose(k, e, job)
                continue
            waited = time.monotonic() - started
            with self._lock:
                if k not in self._dead:
                    self._free.append(k)
                self._has_layout[k] = True
                self._counts["jobs"] += 1
                self._counts["rows_bytes"] += rows.nbytes
                self._counts["wait_s"] += waited
            objects, failures = None, {}
            if blob:
                objects, errors = pickle.loads(blob)
                failures = {row: rebuild_error(info, f"stoker: raised in remote worker {k} "
                                                     f"({where}) while reading sample "
                                                     f"{self._index(job, row)}")
                            for row, info in errors}
            return status, rows, objects, failures

    def _lose(self, k: int, error: BaseException, job: bytes) -> None:
        """Worker k is gone (or late, and given up): its unit is issued again by the caller."""
        with self._lock:
            self._counts["reissued"] += 1
            if k in self._dead:  # its other unit, lost with it
                return
            self._dead.add(k)
            self._free = [j for j in self._free if j != k]
            self._alive -= 1
            self._counts["lost_workers"] += 1
            alive, stopped = self._alive, self._stopped
        try:
            self._ray.kill(self.actors[k])  # a late one would otherwise go on with its unit
        except Exception:
            pass
        if stopped:
            return
        nrows = _worker._JOB.unpack_from(job)[3]
        _log.info("stoker: remote worker %d lost (%s: %s); its %d samples are issued again",
                  k, type(error).__name__, str(error).splitlines()[0] if str(error) else "",
                  nrows)
        if alive == 0:
            _log.warning("stoker: no remote worker left (the last one: %s); reading on local "
                         "workers", type(error).__name__)

    @staticmethod
    def _index(job: bytes, row: int) -> int:
        nfields = _worker._JOB.unpack_from(job)[2]
        at = _worker._JOB.size + nfields * _worker._FIELD.size + row * _worker._ROW.size
        return _worker._ROW.unpack_from(job, at)[0]

    def stats(self) -> dict[str, Any]:
        """The network stage: rows received (bytes, bytes/s over the loader's life), the time
        the engine's threads waited for replies, units read remotely and locally, re-issued."""
        with self._lock:
            counts = dict(self._counts)
            alive = self._alive
        elapsed = max(time.monotonic() - self._started, 1e-9)
        counts["bytes_per_s"] = counts["rows_bytes"] / elapsed
        counts["workers"] = len(self.actors)
        counts["alive"] = alive
        counts["active"] = self._active
        return counts

    def stop(self) -> None:
        """Kills the actors (a thread waiting for one returns at once and reads nothing)."""
        with self._lock:
            if self._stopped:
                return
            self._stopped = True
        if not self._ray.is_initialized():
            return
        for actor in self.actors:
            try:
                self._ray.kill(actor)
            except Exception:
                pass
