"""A stream's share of the one memory cap (memory_limit): what its batches, its worker
processes and the shuffle buffers read in the training process hold, looked at every 50 ms as
batches are handed out; each worker's queue is made shallower to fit. The rule is C++
(StreamMemoryCap, include/stoker/frontend/memory_cap.h); this measures and applies it."""

from __future__ import annotations

import logging
import sys

import numpy as np

from .. import _stoker
from ..workers import arena as _arena

_log = logging.getLogger("stoker")


def nbytes(batch) -> int:
    """The bytes of a batch's arrays (tensors, numpy arrays, bytes) in its nested containers."""
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(batch, torch.Tensor):
        return batch.nelement() * batch.element_size()
    if isinstance(batch, np.ndarray):
        return batch.nbytes
    if isinstance(batch, (bytes, bytearray)):
        return len(batch)
    if isinstance(batch, dict):
        return sum(nbytes(v) for v in batch.values())
    if isinstance(batch, (list, tuple)):
        return sum(nbytes(v) for v in batch)
    return 0


class StreamMemory:
    """The cap over one stream's Streams (stream_epochs.py): the largest batch seen at a look,
    the worker processes' arenas and Pss_Anon, the buffers of the copies read here."""

    def __init__(self, limit: int, depth: int, streams, workers: int, processes: bool) -> None:
        self._cap = _stoker.StreamMemoryCap(limit, depth)
        self._streams = streams
        self.set_workers(workers, processes)
        self._batch = 0  # the largest batch's bytes seen at a look
        # One batch per worker until the first look knows a batch's size: a worker process
        # keeps the arenas it made (what a deeper start would make them grow to).
        self._depth = 1
        streams.set_depth(1)
        self._said = False  # a lowered depth is said once

    def want(self, depth: int) -> None:
        """Each worker's queue asked to hold `depth` batches from now on (a bursty stream's,
        deeper_stream_depth); the cap may hold it lower. Applied at once."""
        self._cap.want(depth)
        look = self._look()
        if look["depth"] != self._depth:
            self._depth = look["depth"]
            self._streams.set_depth(self._depth)

    def set_workers(self, workers: int, processes: bool) -> None:
        self._cap.set_workers(workers, processes)
        self._processes = processes

    def batch(self, batch) -> None:
        """A batch was handed out: when a look is due, its bytes count and the cap is applied.
        ValueError when not even one batch per worker fits the cap beside nothing else."""
        if not self._cap.due():
            return
        self._batch = max(self._batch, nbytes(batch))
        look = self._look()
        if look["too_small"]:
            raise ValueError(f"stoker: {look['message']}")
        if look["warn"]:  # the rest outgrew it; a run of hours is not ended for it
            _log.warning("stoker: %s; going on with one batch in flight per worker",
                         look["message"])
        if look["depth"] != self._depth:
            if look["depth"] < self._depth and not self._said:
                self._said = True
                _log.info("stoker: memory_limit: each stream worker's queue holds %d batch(es) "
                          "to fit (%s)", look["depth"], look["line"])
            self._depth = look["depth"]
            self._streams.set_depth(self._depth)

    def _look(self) -> dict:
        streams = self._streams
        batches = streams.in_flight() + _stoker.HELD_BATCHES
        if self._processes:  # the arenas they grew, which each keeps while it lives
            batches = max(batches, _arena.mapped_arenas(streams.pids()))
        return self._cap.look(self._batch, batches * self._batch, streams.resident_bytes(),
                              streams.buffered_bytes())

    def look(self) -> tuple[dict, str]:
        """A look now (the queues' depth is not changed by it): stats()'s memory_* numbers and
        each worker's queue `depth`, and report()'s memory line."""
        look = self._look()
        keys = ("memory_limit", "memory_used", "memory_peak", "memory_batches",
                "memory_workers", "memory_buffers")
        return {key: look[key] for key in keys} | {"depth": self._depth}, look["line"]
