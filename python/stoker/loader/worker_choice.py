"""The engine pipeline's two decisions taken while it runs, from what the first batches show:
worker_type='auto' (threads, or processes for GIL-bound reads) and, with num_workers='auto'
and remote=, how many remote workers to use. Each is a small state machine fed the engine's
stats; the pipeline (engine_pipeline.py) carries out what it decides."""

from __future__ import annotations

import time
from typing import Optional

from .. import _stoker
from .plan import cores

# The decisions themselves, their thresholds and the reasons they give are the engine's
# (src/tune/worker_kind.h); this module measures and keeps the state between batches.
gil_bound = _stoker.gil_bound


class WorkerTypeChoice:
    """worker_type='auto': measures the first batches read on threads, then decides once."""

    def __init__(self, whole_batches: bool) -> None:
        self._whole_batches = whole_batches
        self._batches = 0
        self._start: Optional[tuple] = None

    def measure(self, gil_stats, stats: dict, threads: int) -> Optional[tuple[bool, str]]:
        """Called after each batch handed out with the data set's gil_stats() and the
        engine's stats(): None while measuring, then (move to processes, the reason)."""
        reads, _, _, cpu_s = gil_stats
        now = time.perf_counter()
        if self._start is None:
            self._start = (reads, cpu_s, now, stats)
            return None
        self._batches += 1
        reads -= self._start[0]
        if self._batches < _stoker.KIND_MIN_BATCHES or reads < _stoker.KIND_MIN_READS:
            return None
        first = self._start[3]
        busy = (cpu_s - self._start[1]) / max(now - self._start[2], 1e-9)
        return _stoker.choose_worker_kind(
            busy, stats["worker_cpu_s"] - first["worker_cpu_s"],
            stats["worker_run_delay_s"] - first["worker_run_delay_s"], self._whole_batches,
            threads, cores())


class RemoteTuning:
    """num_workers='auto' with remote=: every few batches, one more remote worker or one
    fewer (next_remote_workers, src/tune/worker_kind.h), from the stretch since the last
    decision."""

    def __init__(self) -> None:
        self._batches = 0
        self._last: Optional[dict] = None

    def due(self) -> bool:
        """Counts a batch handed out; whether a decision is due."""
        self._batches += 1
        return self._batches % _stoker.REMOTE_TUNE_BATCHES == 0

    def decide(self, stats: dict, local_workers: int, active: int,
               size: int) -> Optional[tuple[int, float, float]]:
        """(remote workers to use, the share of time the training loop waited, the local
        workers' load), or None before the second decision point."""
        last, self._last = self._last, stats
        elapsed = stats["elapsed_s"] - last["elapsed_s"] if last is not None else 0.0
        if elapsed <= 0:
            return None
        wait = (stats["consumer_wait_s"] - last["consumer_wait_s"]) / elapsed
        # worker_cpu_s also counts the threads waiting on remote workers, which use little.
        load = ((stats["worker_cpu_s"] - last["worker_cpu_s"]) / elapsed
                / max(1.0, min(local_workers, stats["cpu_cores"])))
        read = stats["network_read_s"] - last["network_read_s"]
        idle = stats["network_idle_s"] - last["network_idle_s"]
        remote_busy = read / (read + idle) if read + idle > 0 else None
        return _stoker.next_remote_workers(active, size, wait, load, remote_busy), wait, load
