"""Worker processes warmed before a switch of worker kind: each makes batches until one is as
quick as on the threads and makes ready the arenas its batches in flight will need, then the
loader's reads go to them (worker_type='auto' moving a loader from threads to processes
mid-run, python/stoker/loader/engine_pipeline.py). The training loop waits for it, up to a
bound; past the bound the engine's threads read until the warm-up ends."""

from __future__ import annotations

import logging
import math
import pickle
import threading
from typing import Optional

from . import arena as _arena
from .processes import decode_reply

_log = logging.getLogger("stoker")

# A fresh worker process's first batches cost several steady ones: its first collates and its
# heap growing after the fork, and each new arena (a memfd made and its pages faulted in, in
# the worker as it writes and here as the training loop reads). Measured with a padding collate
# (4 MB batches, `bench/auto_matrix.py --workload padding`): a forked worker's first 6 batches
# took 4-6 ms (collate 2-4 ms, writing into a new arena 2.7 ms) against 0.4 ms after, and the
# training loop's first read of each arena 0.5 ms against 0.13. Each process makes batches
# until one takes no longer than a batch job took on the threads and faults in no new memory,
# at most this many.
_MOST_WARM_BATCHES = 8


class Warming:
    """Each worker process makes `batches` (all at once, the GIL released while they do) until
    one takes at most `steady` seconds and no new memory, and makes `hold` arenas ready, which
    this process maps and faults in; then the loader sends its reads to them."""

    def __init__(self, loader, pool, batches: list, steady: float, hold: int) -> None:
        self._pool = pool
        self._stopped = threading.Event()
        self._handed = False
        self.cpu: dict[int, float] = {}  # worker: its least CPU seconds a batch (jobs.call)
        args = pickle.dumps((batches[:_MOST_WARM_BATCHES], steady, hold),
                            protocol=pickle.HIGHEST_PROTOCOL)
        self._calls = [threading.Thread(target=self._warm, args=(w, args), daemon=True,
                                        name=f"stoker warm-up {w}") for w in range(pool.size)]
        self._thread = threading.Thread(target=self._run, args=(loader,), daemon=True,
                                        name="stoker warm-up")
        self._thread.start()

    def _warm(self, w: int, args: bytes) -> None:
        cpu = warm(self._pool, w, args, self._stopped)
        if cpu is not None:
            self.cpu[w] = cpu

    def _run(self, loader) -> None:
        for c in self._calls:
            c.start()
        for c in self._calls:
            c.join()
        if not self._stopped.is_set():
            loader.use_processes(self._pool)
            self._handed = True

    @property
    def handed(self) -> bool:
        """The loader reads on the processes now."""
        return self._handed

    def wait(self, timeout: float) -> bool:
        """Waits up to `timeout` seconds for the hand-over; whether it happened (Ctrl-C
        interrupts the wait)."""
        self._thread.join(timeout)
        return self._handed

    def stop(self) -> None:
        self._stopped.set()
        if self._thread.is_alive():
            self._pool.stop()  # a warm-up call returns at once
            self._thread.join()
        if not self._handed:
            self._pool.finish()


def arenas_in_flight(depth: int, workers: int) -> int:
    """The arenas a worker process needs ready, for its batches in flight: its share of the
    queue's (`depth`) and of the two the training loop holds, the one it writes, and one for an
    uneven share (2 processes at depth 4 came to 5-6 arenas each)."""
    return -(-(depth + 2) // workers) + 2


def warm(pool, w: int, args: bytes, stopped: Optional[threading.Event] = None):
    """Worker `w`'s warm-up call (BatchJobs.call, with `args`): the arenas it made ready
    mapped and faulted in here, unless `stopped` is set; returns its least CPU seconds a batch,
    or None (it made none, failed or died: its reads go on all the same)."""
    try:
        reply = pool.call(w, 0, args)
        if not reply[0]:  # (False, why): it died, and is restarted by its next job
            return None
        _, failed, blob, pid = reply
        if failed or (stopped is not None and stopped.is_set()):
            return None
        objects, _ = decode_reply(blob, w, pid, [], "batch")
        reserved, cpu = objects[0]
        _arena.fault_in(pid, reserved)
        return cpu
    except Exception:  # noqa: BLE001 - the warm-up only saves time; the reads go on
        _log.debug("stoker: warming worker process %d failed", w, exc_info=True)
        return None


def top_up(pool, batches: list, hold: int) -> None:
    """After some of the warmed processes were let go, each of the others (`pool`'s) makes
    `hold` arenas ready (one batch made first, for its size): each now has more batches in
    flight."""
    args = pickle.dumps((batches[:1], math.inf, hold), protocol=pickle.HIGHEST_PROTOCOL)
    for w in range(pool.size):
        warm(pool, w, args)
