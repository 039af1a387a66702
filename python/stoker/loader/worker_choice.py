"""The engine pipeline's two decisions taken while it runs, from what the first batches show:
worker_type='auto' (threads, or processes for GIL-bound reads) and, with num_workers='auto'
and remote=, how many remote workers to use. Each is a small state machine fed the engine's
stats; the pipeline (engine_pipeline.py) carries out what it decides."""

from __future__ import annotations

import time
from typing import Optional

from ..remote import pool as remote_pool
from .plan import cores

# worker_type='auto' measures reads from the first batch handed out (the start-up is left
# out) over at least this many more batches and samples: long enough for the threads to meet
# at the GIL, short next to an epoch.
_AUTO_MIN_BATCHES = 3
_AUTO_MIN_READS = 16
# The reads keep the GIL busy (CPU time of the worker threads while they hold it, over wall
# time) for at least this share of the time, and not much more than all of it: GIL-bound.
# Pure-Python __getitem__s on two threads keep it busy ~95% of the time (measured on a 2-core
# machine), cheap Python samples ~40-60% (the training loop's thread takes the rest); one that
# sleeps or waits for I/O ~1-3%; one whose work releases the GIL (numpy, PIL, torch ops) runs
# on several cores at once, so its threads' CPU time exceeds the wall time.
# Other processes competing for the cores take CPU time, not GIL time: a thread that holds the
# GIL while it waits for a core keeps the others out all the same. So the lower bound is
# checked on the CPU time scaled by the share of their runnable time the reading threads got a
# core (CPU time plus run-queue delay, Stats::worker_run_delay, over CPU time): unscaled, a
# pure-Python read on two threads measured ~50% at a load average of 3.5 on 2 cores and
# 12-17% with 10-14 other sessions spinning (load 4-13), below the threshold.
# The scale overstates (threads woken to take the GIL wait for a core too) and is at most
# _AUTO_LOAD_SCALE (the tuner's kRunDelayScale, src/tune/tuner.h): a sleeper's reads wait for
# a core after each wake-up, and the scale must not make their 1-5% look like a busy GIL; at
# 6 both stay on their side of the threshold down to and up to 6.7% unscaled. Load only ever
# lowers the unscaled share, so the upper bound (work in parallel) is checked on it.
# The batch path (collate_fn, batch_sampler, batch_size=None) has no upper bound: a batch job
# runs Python between its native calls (the fetch loop, the collate's walk of the samples)
# and a process adds only a streamed copy of the batch into its arena, so work that releases
# the GIL is no reason to stay on threads there. Processes against threads, side by side on
# 2 cores (bench/worker_kinds.py): a padding collate (its reads busy 0.8-1.4 of the wall
# time) 2.0x, per-sample randn stacked (1.06) 1.7x, a tensor indexed and stacked (0.25) 1.2x.
_AUTO_GIL_BUSY = 0.4
_AUTO_GIL_PARALLEL = 1.25
_AUTO_LOAD_SCALE = 6.0


def gil_bound(busy: float, on_cpu: float, delayed: float,
              whole_batches: bool = False) -> tuple[bool, float]:
    """Whether reads that kept the GIL busy `busy` of the wall time (its CPU time over wall
    time) are GIL-bound, given the worker threads' CPU time `on_cpu` and run-queue delay
    `delayed` over the same time; and the scale applied for that delay. `whole_batches`:
    the reads are batch jobs (no upper bound)."""
    scale = min(_AUTO_LOAD_SCALE, (on_cpu + delayed) / on_cpu) if on_cpu > 0 else 1.0
    parallel = busy > _AUTO_GIL_PARALLEL and not whole_batches
    return _AUTO_GIL_BUSY <= scale * busy and not parallel, scale


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
        if self._batches < _AUTO_MIN_BATCHES or reads < _AUTO_MIN_READS:
            return None
        first = self._start[3]
        busy = (cpu_s - self._start[1]) / max(now - self._start[2], 1e-9)
        bound, scale = gil_bound(busy, stats["worker_cpu_s"] - first["worker_cpu_s"],
                                 stats["worker_run_delay_s"] - first["worker_run_delay_s"],
                                 self._whole_batches)
        measured = (f"reads kept the GIL busy {busy:.0%} of the time on {threads} threads, "
                    f"{cores()} cores")
        if scale > 1.05:
            measured += f" ({scale * busy:.0%} counting their waits for a core)"
        if bound and cores() >= 2 and threads >= 2:
            why = "whole batches made in Python" if busy > _AUTO_GIL_PARALLEL else "GIL-bound"
            return True, f"auto: {measured}: {why}, so processes"
        why = ("fewer than 2 cores" if cores() < 2 else
               "fewer than 2 threads" if threads < 2 and bound else
               "work that releases the GIL" if busy > _AUTO_GIL_PARALLEL else
               "not GIL-bound")
        return False, f"auto: {measured}: {why}, so threads"


class RemoteTuning:
    """num_workers='auto' with remote=: every few batches, one more remote worker or one
    fewer (remote.pool.next_active), from the stretch since the last decision."""

    def __init__(self) -> None:
        self._batches = 0
        self._last: Optional[dict] = None

    def due(self) -> bool:
        """Counts a batch handed out; whether a decision is due."""
        self._batches += 1
        return self._batches % remote_pool.TUNE_BATCHES == 0

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
        return remote_pool.next_active(active, size, wait, load, remote_busy), wait, load
