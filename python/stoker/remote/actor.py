"""The remote side of stoker's Ray workers: what ``remote=`` asks for (RayWorkers, made by
``ray_workers``) and the body of one actor (RemoteWorker), which reads a chunk's rows exactly
as a worker process does (``workers/main.py``'s ``_run_job`` over ``SampleWriter``) into a
buffer of its own. The loader's side, which sends the chunks and replaces lost actors, is
pool.py."""

from __future__ import annotations

import dataclasses
import mmap
import os
import pickle
import socket
import time
from typing import Mapping, Optional, Union

from .. import _stoker
from ..workers import main as _worker
from ..workers import startup
from ..workers.jobs import user_dataset


def job_pool(environ: Mapping[str, str]) -> Optional[str]:
    """The shared pool of the ranks of one torchrun job (its rendezvous id, when set, and
    master address and port), or None outside a job of several ranks."""
    if int(environ.get("WORLD_SIZE", "1")) < 2 or "MASTER_ADDR" not in environ:
        return None
    return (f"{environ.get('TORCHELASTIC_RUN_ID', '')}@{environ['MASTER_ADDR']}:"
            f"{environ.get('MASTER_PORT', '')}")


def fingerprint(dataset) -> str:
    """What the ranks sharing a pool check they read: the data set's type and length."""
    kind = type(dataset)
    return f"{kind.__module__}.{kind.__qualname__} of {len(dataset)} samples"


@dataclasses.dataclass(frozen=True)
class RayWorkers:
    """What ``DataLoader(remote=...)`` starts: ``ray_workers(n, ...)`` says how."""

    count: int
    num_cpus: float = 1
    resources: Optional[dict] = None
    address: Optional[str] = None
    reissue_after: Optional[float] = None
    actor_options: Optional[dict] = None
    pool: Union[str, bool, None] = None
    replace: bool = True


def ray_workers(count: int, *, num_cpus: float = 1, resources: Optional[dict] = None,
                address: Optional[str] = None, reissue_after: Optional[float] = None,
                pool: Union[str, bool, None] = None, replace: bool = True,
                **actor_options) -> RayWorkers:
    """Remote workers for ``stoker.DataLoader(..., remote=stoker.ray_workers(4))``: `count`
    Ray actors, each with `num_cpus` CPUs (and `resources`, and any other option of Ray's
    ``.options()``, such as ``scheduling_strategy``), placed by Ray anywhere in the cluster.
    They read the excess: a chunk goes to a free actor, else to a local worker.

    `address`: the cluster to connect to if Ray is not initialized yet (``ray.init(address)``;
    None: Ray's default, ``RAY_ADDRESS`` or a local cluster). `reissue_after` (seconds): a
    chunk whose reply is later than that is issued again (locally if no actor is free) and its
    actor given up; None waits for as long as the actor lives.

    `pool`: the ranks of a torchrun job share one pool of `count` actors by default (the
    n-th loader of each rank the n-th pool); a name shares the pool of that name among the
    loaders that give it (they must read the same data set); False keeps the actors to this
    loader. `replace`: a lost actor is replaced while the cluster has room (bounded retries)."""
    if int(count) < 1:
        raise ValueError(f"ray_workers needs at least one worker, not {count}")
    if reissue_after is not None and reissue_after <= 0:
        raise ValueError(f"reissue_after must be positive, not {reissue_after}")
    if pool is True or pool == "":
        raise ValueError(f"pool must be a name, None or False, not {pool!r}")
    return RayWorkers(int(count), num_cpus, resources, address, reissue_after,
                      actor_options or None, pool, bool(replace))


def _import_ray():
    try:
        import ray
    except ImportError as e:
        raise ImportError("stoker: remote workers need Ray: pip install 'stoker[ray]' "
                          "(or pip install ray)") from e
    return ray


class RemoteWorker:
    """One remote worker (the body of a Ray actor): holds the data set (shipped once, by Ray's
    serialisation) and a buffer the rows of a chunk are written into. Its callers (the
    loaders of the ranks sharing it) attach and detach; Ray runs its calls one at a time."""

    def __init__(self, dataset, worker_id: int, num_workers: int, base_seed: int,
                 worker_init_fn, use_getitems: bool, fingerprint: str) -> None:
        self._dataset = dataset
        self._use_getitems = use_getitems
        self._writer = _stoker.SampleWriter()
        self._buffer: Optional[mmap.mmap] = None
        self._where = f"{socket.gethostname()}, pid {os.getpid()}"
        self._fingerprint = fingerprint
        self._clients: set[str] = set()
        self._last_reply: Optional[float] = None  # when the previous run returned
        self._init_error = startup.start_worker(worker_id, num_workers, base_seed,
                                                user_dataset(dataset), worker_init_fn,
                                                own_process=True)

    def pid(self) -> int:
        """This worker's process id on its node."""
        return os.getpid()

    def attach(self, client: str, fingerprint: str) -> int:
        """A loader starts using this worker: returns its pid. Raises ValueError if the loader
        reads another data set than this worker's (two loaders on one pool name)."""
        if fingerprint != self._fingerprint:
            raise ValueError(f"stoker: remote worker pool serves {self._fingerprint}, not "
                             f"{fingerprint}: give each loader its own pool= name")
        self._clients.add(client)
        return os.getpid()

    def detach(self, client: str) -> int:
        """A loader lets this worker go: returns how many still use it."""
        self._clients.discard(client)
        return len(self._clients)

    def run(self, job: bytes, layout: Optional[bytes]):
        """Reads a kJob's rows into the buffer; returns (status bytes, the rows as a numpy
        array over the buffer, the reply's blob, where this worker runs, seconds it read,
        seconds it idled since its previous reply). Ray copies the array into its object store
        when this returns, before the next job reuses the buffer."""
        import numpy as np

        started = time.monotonic()
        idle = started - self._last_reply if self._last_reply is not None else 0.0
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
        self._last_reply = time.monotonic()
        return (reply[at:at + nstatus], np.frombuffer(self._buffer, np.uint8, total),
                reply[len(reply) - nblob:] if nblob else b"", self._where,
                self._last_reply - started, idle)

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
