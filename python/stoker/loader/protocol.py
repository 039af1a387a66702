"""The protocol a DataLoader delegates to: one pipeline per loader, built from its Plan
(pipelines.build: the engine's, engine_pipeline.py, for map-style data sets; the stream's,
stream_pipeline.py, for iterable ones).

    start(epoch, batch)    the epoch to read from that batch on (restored or fresh)
    next(timeout)          the next batch, or EPOCH_END
    len()                  batches per epoch
    state_dict(resume, next_epoch) / load_state_dict(state)   the position, and back
    stats(), report()      what ran, and a verdict on it
    trace(path, max)       a timeline of the loading (None: write it)
    skipped(), set_workers(n), set_depth(d), pids(), processes(), deaths()
    close()                stops the workers now (idempotent); release(): the same from __del__

A method a pipeline cannot carry out raises ValueError saying why.
"""

from __future__ import annotations

import logging
from typing import Optional

from .plan import Plan
from .stream_producers import EPOCH_END

__all__ = ["EPOCH_END", "Pipeline"]

_log = logging.getLogger("stoker")


class Pipeline:
    """What both pipelines share: the plan, and the kind and count of workers as they run
    (worker_type='auto' may move reads to processes)."""

    # A stream's len(dataset) as of the last len(loader): its iterator warns past it.
    reported_len: Optional[int] = None
    # Whether len() is the batches an epoch gives (not a stream's, which says what its data
    # set reports).
    exact_len = True

    def __init__(self, plan: Plan) -> None:
        self.plan = plan
        self.worker_type = plan.worker_type
        self.worker_type_reason = plan.worker_type_reason
        self.num_workers = plan.num_workers
        # Settings worker_type='auto' switched to, measured slower than the one before and left
        # (stats()["worker_type_left"]).
        self.left: list = []

    def log_worker_type(self) -> None:
        _log.info("stoker: %s workers (%s)", self.worker_type, self.worker_type_reason)

    def stats(self) -> dict:
        """The pipeline's numbers, with which pipeline runs and which kind of worker reads,
        and why."""
        stats = self._stats()
        stats["pipeline"] = self.plan.pipeline
        stats["worker_type"] = self.worker_type
        stats["worker_type_reason"] = self.worker_type_reason
        stats["worker_type_left"] = list(self.left)
        stats["worker_pids"] = self.pids()
        # Worker processes that died reading and were replaced (their samples read again).
        stats["worker_deaths"] = self.deaths()
        return stats

    def report(self) -> dict:
        """The pipeline's verdict, ending with which workers read now and why (auto decides
        while it runs: ``readers``, ``readers_reason``)."""
        report = self._report()
        readers = (f"{self.num_workers} {self.worker_type} worker(s)" if self.num_workers
                   else "read in-line")
        report.update(readers=readers, readers_reason=self.worker_type_reason,
                      reproducibility=self.plan.reproducibility,
                      reproducibility_reason=self.plan.reproducibility_reason)
        report["text"] += (f"; {readers}: {self.worker_type_reason}; reproducible: "
                           f"{self.plan.reproducibility} ({self.plan.reproducibility_reason})")
        return report

    # --- each pipeline's own --------------------------------------------------------------

    def start(self, epoch: int, batch: int) -> None:
        raise NotImplementedError

    def next(self, timeout: float):
        raise NotImplementedError

    def __len__(self) -> int:
        raise NotImplementedError

    def state_dict(self, resume: Optional[tuple], next_epoch: Optional[int]) -> dict:
        raise NotImplementedError

    def load_state_dict(self, state: dict) -> tuple[int, int]:
        raise NotImplementedError

    def _stats(self) -> dict:
        raise NotImplementedError

    def _report(self) -> dict:
        raise NotImplementedError

    def trace(self, path: Optional[str], max_events: int) -> None:
        raise NotImplementedError

    def skipped(self) -> list:
        raise NotImplementedError

    def set_workers(self, workers: int) -> None:
        raise NotImplementedError

    def set_depth(self, depth: int) -> None:
        raise NotImplementedError

    def pids(self) -> list:
        raise NotImplementedError

    def processes(self) -> list:
        raise NotImplementedError

    def deaths(self) -> int:
        """Worker processes that died reading and were replaced; a stream's are raised."""
        return 0

    def close(self) -> None:
        raise NotImplementedError

    def release(self) -> None:
        raise NotImplementedError
