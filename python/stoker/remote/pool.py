"""Remote workers on Ray: extra worker slots of the engine, served by Ray actors.

The engine does not know about them. An engine worker thread that takes a chunk of a batch
asks ``RemoteWorkers.run`` (from ``PyDataset::read_rows``, python/src/py_dataset.cc) to have it
read remotely: if an actor is free, the chunk goes to it as the worker processes' kJob
(python/src/py_workers.h: the rows' sample indices and seeds, field offsets into the actor's
own buffer), the actor (``RemoteWorker``, actor.py) reads and writes the rows exactly as a
worker process does (``_run_job`` of workers/main.py over ``SampleWriter``), and returns them
as one numpy array through Ray's object store, with the pickled object values and errors; the
thread copies the rows into its slab (the one copy on this node) and the engine goes on as for
any chunk. So the order,
exactly-once delivery, cancellation, error policy, ``state_dict()`` and backpressure (batches
in flight bounded by the free slabs) are the engine's. A chunk whose actor dies, whose node
goes, or whose reply is later than ``reissue_after`` is issued again by the same thread to
another free actor, or read locally when none is free or left; it has one owner, the thread,
and only the reply it waits for is used, so nothing is delivered twice.

Under torchrun (or with ``pool=``) the ranks of a job share one pool of actors: named actors
in Ray's "stoker" namespace, made by the first rank that asks (``get_if_exists``), each rank
sending its own partition's units, at most SLOTS per actor at a time (so no rank starves).
An actor is owned by the rank that made it (not detached: it goes with that process, so a
crash leaves nothing behind) and killed by the last rank that lets it go. A lost actor is
replaced, with a bounded backoff, while the cluster has room.

Ray is imported only when ``remote=`` is used (``pip install stoker[ray]``).
"""

from __future__ import annotations

import dataclasses
import itertools
import logging
import os
import pickle
import socket
import threading
import time
import uuid
from typing import Any, NamedTuple, Optional

from ..workers import main as _worker
from ..workers.jobs import BatchJobs
from ..workers.processes import rebuild_error
from .actor import RayWorkers, RemoteWorker, _import_ray, fingerprint, job_pool

_log = logging.getLogger("stoker")


class RemoteReply(NamedTuple):
    """A chunk's reply from a remote worker, as RemoteExecutor (python/src/py_executors.cc)
    reads it, by name: docs/worker_protocol.md, *The remote reply*."""

    status: bytes  # a byte per row: 0 read, else failed
    rows: Any  # the rows' bytes (a uint8 array over the actor's buffer), field after field
    objects: Optional[list]  # each row's object values, or None without object slots
    failures: dict  # {row: exception}
    wait_s: float  # seconds this thread waited for the reply
    read_s: float  # seconds the actor read
    idle_s: float  # seconds the actor idled before the job

# Ray's exceptions that mean the unit's worker is gone or late (the unit is issued again);
# any other exception from ray.get is an error of the unit itself.
_LOST = ("RayActorError", "ActorDiedError", "ActorUnavailableError", "ObjectLostError",
         "OwnerDiedError", "ObjectReconstructionFailedError", "NodeDiedError",
         "WorkerCrashedError", "RaySystemError", "GetTimeoutError", "LocalRayletDiedError",
         "TaskUnschedulableError", "ActorUnschedulableError")


# Units in flight per actor: while it reads one, the next waits at the actor (Ray runs an
# actor's calls one at a time, in order), so the actor does not idle through each round trip.
SLOTS = 2

# A lost actor is replaced (and one first asked for by num_workers='auto' is started) in up to
# REPLACE_ATTEMPTS tries, the n-th after a wait of REPLACE_BACKOFF * 2**n seconds (at most
# REPLACE_BACKOFF_MAX; none before a first start's first), each only if the cluster has room
# for it; a new actor that does not answer within READY_S is given up.
REPLACE_ATTEMPTS = 6
REPLACE_BACKOFF = 0.5
REPLACE_BACKOFF_MAX = 15.0
READY_S = 60.0

# The Ray namespace of shared pools' named actors (a namespace of their own: each rank is a
# Ray job of its own, with an anonymous namespace by default).
NAMESPACE = "stoker"

# Loaders of this process on an automatic shared pool, in the order made: the ranks of a job
# make their loaders in the same order, so the n-th loader of each rank shares the n-th pool.
_pool_ordinal = itertools.count()

# Handles of shared actors this process let go while other ranks still used them: an actor
# lives as long as the process that made it holds a handle to it.
_kept: list = []


@dataclasses.dataclass(eq=False)
class _Actor:
    """One actor of a loader's slot k, as long as it is the one there."""

    handle: Any
    attached: Any  # the reference of its attach() call, which answers once it is up
    pid: Optional[int] = None
    has_layout: bool = False
    alive: bool = True


class RemoteWorkers:
    """The actors of one loader and which of them are free; ``run`` is called by the engine's
    worker threads (with the GIL, which ``ray.get`` releases while it waits)."""

    def __init__(self, spec: RayWorkers, dataset, first_id: int, num_workers: int,
                 base_seed: int, worker_init_fn, active: Optional[int] = None) -> None:
        ray = self._ray = _import_ray()
        if not ray.is_initialized():
            ray.init(address=spec.address)
        self._spec = spec
        self._pool = (None if spec.pool is False else spec.pool if spec.pool is not None
                      else job_pool(os.environ))
        if spec.pool is None and self._pool is not None:
            self._pool = f"{self._pool}/{next(_pool_ordinal)}"
        self._client = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex}"
        self._fingerprint = fingerprint(dataset)
        # A batch job's rows are batches (a collate_fn's or a batch sampler's).
        self._item = "batch" if isinstance(dataset, BatchJobs) else "sample"
        self._options = dict(spec.actor_options or {}, num_cpus=spec.num_cpus,
                             resources=spec.resources)
        self._options.setdefault("max_restarts", 0)
        if self._pool is not None:
            self._options.update(namespace=NAMESPACE, get_if_exists=True)
        self._class = ray.remote(RemoteWorker)
        self._args = (dataset, first_id, num_workers, base_seed, worker_init_fn,
                      hasattr(dataset, "__getitems__"))
        # Only the actors in use are started (num_workers='auto' starts with none): one not
        # asked for yet takes none of the cluster's CPUs. None: not started yet.
        active = spec.count if active is None else max(0, min(int(active), spec.count))
        self._workers: list[Optional[_Actor]] = [
            self._start(k) if k < active else None for k in range(spec.count)]
        self._lock = threading.Lock()
        # One entry per slot of a live actor that no unit holds.
        self._free = [k for k in range(active) for _ in range(SLOTS)][::-1]  # _lock
        self._active = active  # actors 0.._active-1 take units; guarded by _lock
        self._alive = active  # guarded by _lock
        self._warned = False  # "no remote worker left" was logged; guarded by _lock
        self._layout: Optional[bytes] = None
        self._stopped = False  # guarded by _lock
        self._stopping = threading.Event()  # set with _stopped, for the replacing threads
        # Threads starting or replacing actors, and the actors being started; guarded by _lock.
        self._replacing: list[threading.Thread] = []
        self._starting: set[int] = set()
        self._counts = dict(jobs=0, rows_bytes=0, wait_s=0.0, reissued=0, lost_workers=0,
                            replaced=0, local_jobs=0)  # guarded by _lock
        self._started = time.monotonic()

    def _start(self, k: int) -> _Actor:
        """Actor k, started (or, in a shared pool, the one of that name if it is up), and
        attached to; does not wait for it."""
        dataset, first_id, num_workers, base_seed, worker_init_fn, use_getitems = self._args
        name = {"name": f"{self._pool}/{k}"} if self._pool is not None else {}
        handle = self._class.options(**self._options, **name).remote(
            dataset, first_id + k, num_workers, base_seed, worker_init_fn, use_getitems,
            self._fingerprint)
        return _Actor(handle, handle.attach.remote(self._client, self._fingerprint))

    @property
    def actors(self) -> list:
        """The Ray actors of the slots (a lost one's until it is replaced; None for one not
        started yet)."""
        return [w.handle if w is not None else None for w in self._workers]

    @property
    def pool(self) -> Optional[str]:
        """The shared pool's name, None if the actors are this loader's own."""
        return self._pool

    @property
    def size(self) -> int:
        return len(self._workers)

    @property
    def active(self) -> int:
        return self._active

    @property
    def threads(self) -> int:
        """The engine threads that serve the actors in use: one per slot."""
        return SLOTS * self._active

    def set_active(self, active: int) -> None:
        """Units go to the first `active` actors only. One not started yet is started by a
        thread of its own and takes units once it is up (until then its units are read
        locally, as when no actor is free). The loader's own actors past `active` are
        stopped once their units are back, which frees their CPUs; a shared pool's stay up,
        idle (other ranks may use them)."""
        with self._lock:
            self._active = max(0, min(int(active), len(self._workers)))
            if self._stopped:
                return
            missing = [k for k in range(self._active)
                       if self._workers[k] is None and k not in self._starting]
            self._starting.update(missing)
            threads = [threading.Thread(target=self._bring_up, args=(k, True), daemon=True,
                                        name=f"stoker-start-{k}") for k in missing]
            self._replacing.extend(threads)
            given_back = self._take_given_back()
        for thread in threads:
            thread.start()
        self._stop_given_back(given_back)

    def _take_given_back(self) -> list:
        """(_lock held) The loader's own actors past the active ones with no unit in flight
        (every slot free), out of the slots: the caller stops them outside the lock. None can
        get a unit meanwhile: run() takes only the active ones' slots."""
        if self._pool is not None or self._stopped:
            return []
        taken = []
        for k in range(self._active, len(self._workers)):
            worker = self._workers[k]
            if worker is not None and worker.alive and self._free.count(k) == SLOTS:
                self._free = [j for j in self._free if j != k]
                self._workers[k] = None  # started afresh if asked for again
                self._alive -= 1
                taken.append((k, worker))
        return taken

    def _stop_given_back(self, taken: list) -> None:
        for k, worker in taken:
            self._kill(worker.handle)
            _log.info("stoker: remote worker %d given back and stopped (its CPUs are free)", k)

    def set_layout(self, message: bytes) -> None:
        self._layout = message

    def run(self, job: bytes) -> Optional[RemoteReply]:
        """A chunk read by a free actor (a RemoteReply); None if no actor is free or left (the
        chunk is then read locally)."""
        while True:
            with self._lock:
                usable = [k for k in self._free if k < self._active]
                if self._stopped or not usable:
                    self._counts["local_jobs"] += 1
                    return None
                k = usable[-1]
                self._free.remove(k)
                worker = self._workers[k]
                layout = None if worker.has_layout else self._layout
            try:
                if worker.pid is None:  # the actor is up (its start is not the network's);
                    # one that never answers (never scheduled, its attach lost) is given up
                    worker.pid = self._ray.get(worker.attached, timeout=READY_S)
                started = time.monotonic()
                status, rows, blob, where, read_s, idle_s = self._ray.get(
                    worker.handle.run.remote(job, layout), timeout=self._spec.reissue_after)
            except Exception as e:
                if not _is_lost(e):
                    with self._lock:
                        if worker.alive:
                            self._free.append(k)
                    raise
                self._lose(k, worker, e, job)
                continue
            waited = time.monotonic() - started
            with self._lock:
                if worker.alive:
                    self._free.append(k)
                worker.has_layout = True
                self._counts["jobs"] += 1
                self._counts["rows_bytes"] += rows.nbytes
                self._counts["wait_s"] += waited
                given_back = self._take_given_back() if k >= self._active else []
            self._stop_given_back(given_back)
            objects, failures = None, {}
            if blob:
                objects, errors = pickle.loads(blob)
                failures = {row: rebuild_error(info, f"stoker: raised in remote worker {k} "
                                                     f"({where}) while reading {self._item} "
                                                     f"{self._index(job, row)}")
                            for row, info in errors}
            return RemoteReply(status, rows, objects, failures, waited, read_s, idle_s)

    def _lose(self, k: int, worker: _Actor, error: BaseException, job: bytes) -> None:
        """`worker` (actor k) is gone (or late, and given up): its unit is issued again by the
        caller, and a replacement started."""
        with self._lock:
            self._counts["reissued"] += 1
            if not worker.alive:  # its other unit, lost with it
                return
            worker.alive = False
            self._free = [j for j in self._free if j != k]
            self._alive -= 1
            self._counts["lost_workers"] += 1
            stopped = self._stopped
            last = self._alive == 0 and not self._warned
            self._warned |= last
            replacing = None
            if not stopped and self._spec.replace:
                replacing = threading.Thread(target=self._bring_up, args=(k, False),
                                             daemon=True, name=f"stoker-replace-{k}")
                self._replacing.append(replacing)
        # Killed before a replacement looks for actor k by its name: a late one would
        # otherwise go on with its unit, and could be found again.
        self._kill(worker.handle)
        if replacing is not None:
            replacing.start()  # returns at once if the loader stopped meanwhile
        if stopped:
            return
        nrows = _worker._JOB.unpack_from(job)[3]
        _log.info("stoker: remote worker %d lost (%s: %s); its %d %ss are issued again",
                  k, type(error).__name__, str(error).splitlines()[0] if str(error) else "",
                  nrows, self._item)
        if last:
            _log.warning("stoker: no remote worker left (the last one: %s); reading on local "
                         "workers%s", type(error).__name__,
                         " until one is replaced" if self._spec.replace else "")

    def _bring_up(self, k: int, first: bool) -> None:
        """Starts actor k for the first time, or a new one for the lost actor k (a thread of
        its own): up to REPLACE_ATTEMPTS tries with a growing wait before each (but a first
        start's first), each only while the cluster has room for it."""
        what = "started" if first else "replaced"
        try:
            for attempt in range(REPLACE_ATTEMPTS):
                wait = 0.0 if first and attempt == 0 else min(REPLACE_BACKOFF * 2 ** attempt,
                                                              REPLACE_BACKOFF_MAX)
                if self._stopping.wait(wait):
                    return
                try:
                    # A first start is asked of Ray at once (it places the actor when the
                    # cluster has room); a replacement only when there is room now.
                    worker = self._start(k) if first and attempt == 0 else self._restart(k)
                    if worker is None:
                        continue
                    if not self._ready(worker):
                        stopping = self._stopping.is_set()
                        if not stopping or self._pool is None:
                            # Not placed, or not up in time; or the loader stops and it is
                            # its own (a shared pool's actor may serve other ranks).
                            self._kill(worker.handle)
                        if stopping:
                            return
                        continue
                except Exception as e:
                    if _is_lost(e):
                        continue
                    _log.warning("stoker: remote worker %d not %s: %s", k, what, e)
                    return
                with self._lock:
                    installed = not self._stopped
                    if installed:
                        self._workers[k] = worker
                        self._free.extend([k] * SLOTS)
                        self._alive += 1
                        if not first:
                            self._counts["replaced"] += 1
                    given_back = self._take_given_back()  # it, if given back meanwhile
                if not installed:
                    self._release(worker)
                    return
                _log.info("stoker: remote worker %d %s (pid %d)", k, what, worker.pid)
                self._stop_given_back(given_back)
                return
            _log.info("stoker: remote worker %d not %s after %d tries (no room in the "
                      "cluster, or the new actors did not start)", k, what, REPLACE_ATTEMPTS)
        finally:
            with self._lock:
                self._starting.discard(k)

    def _restart(self, k: int) -> Optional[_Actor]:
        """A new actor k, or that of the shared pool if another rank started or replaced it
        already; None if the cluster has no room for one now."""
        if self._pool is not None:
            try:
                handle = self._ray.get_actor(f"{self._pool}/{k}", namespace=NAMESPACE)
                return _Actor(handle, handle.attach.remote(self._client, self._fingerprint))
            except ValueError:  # none of that name (any more)
                pass
        available = self._ray.available_resources()
        needs = dict(self._spec.resources or {}, CPU=self._spec.num_cpus)
        if any(available.get(name, 0) < amount for name, amount in needs.items()):
            return None
        return self._start(k)

    def _ready(self, worker: _Actor) -> bool:
        """Waits for a new actor's attach() (in short steps, to see the loader stop): True
        once it answered, False if the loader stops or READY_S pass first."""
        deadline = time.monotonic() + READY_S
        while not self._stopping.is_set() and time.monotonic() < deadline:
            done, _ = self._ray.wait([worker.attached], timeout=0.5)
            if done:
                worker.pid = self._ray.get(worker.attached)
                return True
        return False

    def _kill(self, handle) -> None:
        try:
            self._ray.kill(handle)
        except Exception:  # gone already, or Ray is shut down
            pass

    def _release(self, worker: _Actor) -> None:
        """This loader lets `worker` go: its own actor is killed; a shared one only by the
        last rank using it (the others keep its handle, which keeps it alive if this process
        made it)."""
        if self._pool is None:
            self._kill(worker.handle)
            return
        try:
            left = self._ray.get(worker.handle.detach.remote(self._client), timeout=READY_S)
        except Exception:  # gone, or busy past READY_S: it goes with its owner at the latest
            left = 1
        if left == 0:
            self._kill(worker.handle)
        else:
            _kept.append(worker.handle)

    @staticmethod
    def _index(job: bytes, row: int) -> int:
        nfields = _worker._JOB.unpack_from(job)[2]
        at = _worker._JOB.size + nfields * _worker._FIELD.size + row * _worker._ROW.size
        return _worker._ROW.unpack_from(job, at)[0]

    def stats(self) -> dict[str, Any]:
        """The network stage: rows received (bytes, bytes/s over the loader's life), the time
        the engine's threads waited for replies, units read remotely and locally, re-issued;
        the actors: how many there are, alive, in use, replaced, their pids."""
        with self._lock:
            counts = dict(self._counts)
            alive = self._alive
            pids = [w.pid if w is not None and w.alive else None for w in self._workers]
        elapsed = max(time.monotonic() - self._started, 1e-9)
        counts["bytes_per_s"] = counts["rows_bytes"] / elapsed
        counts["workers"] = len(self._workers)
        counts["alive"] = alive
        counts["active"] = self._active
        counts["pids"] = pids
        counts["pool"] = self._pool
        return counts

    def stop(self) -> None:
        """Lets the actors go (see _release; a thread waiting for a killed one returns at once
        and reads nothing) and stops the replacing threads."""
        with self._lock:
            if self._stopped:
                return
            self._stopped = True
            self._stopping.set()
            replacing = list(self._replacing)
            workers = [w for w in self._workers if w is not None and w.alive]
        for thread in replacing:
            # One not started yet returns at once when it is; on one of them, the loader was
            # collected by that thread.
            if thread.is_alive() and thread is not threading.current_thread():
                thread.join()
        if not self._ray.is_initialized():
            return
        for worker in workers:
            self._release(worker)


def _is_lost(error: BaseException) -> bool:
    """Whether a Ray call failed because its actor is gone or late (the unit is issued again),
    rather than with an error of the unit itself."""
    return any(c.__name__ in _LOST for c in type(error).__mro__)
