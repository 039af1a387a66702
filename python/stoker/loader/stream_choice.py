"""A stream's worker_type='auto' (stream_pipeline.py): the choice measured on epochs read
in-line (Choice: in-line, worker threads or worker processes, from the pure rules of
src/tune/worker_kind.h; processes started mid-epoch in the background while it is first
measured), and the check after a switch (Check)."""

from __future__ import annotations

import time
from typing import Optional

from .. import _stoker
from .plan import cpu_share
from .worker_choice import Delivered, handover

# How often, in in-line batches once measured, a stream on auto asks whether its processes
# start mid-epoch (Choice.early): the model's three calls every batch would be its read's
# share on a cheap stream.
_EARLY_EVERY = 8


class Choice:
    """A stream on num_workers='auto' and worker_type='auto', read in-line: its batches after
    each epoch's first, timed in the training loop (the read: the time in next(); the step:
    the time between batches), one batch handed over on the worker's code, and whether the
    stream asked get_worker_info() as it began (it shards itself), then choose_stream_workers
    (src/tune/worker_kind.h) at the next epoch's start (decide), and, until that first
    decision, every _EARLY_EVERY batches whether processes start mid-epoch (early)."""

    def __init__(self, make) -> None:
        self.make = make  # the worker processes' ProcessWorkers, given the base seed, count
        # In-line's first epochs, from its second on (to Window.longest; warm with warm), for
        # the check after a switch.
        self.delivered = Delivered(bounded=True, warm=True)
        self._batches = 0
        self._read = self._step = self._read_cpu = 0.0
        # The loop's thread's time runnable but off a CPU (ns) as the measured batches began:
        # a preempted read is not a read that waits.
        self._delay0: Optional[int] = None
        self._handover: Optional[tuple[float, float]] = None
        self._got: Optional[float] = None  # when the last batch of this epoch was handed out
        self._shards = False  # the stream asked get_worker_info() as an epoch began
        self._unpicklable = ""  # why its batches could not go to a worker process
        self.costs: Optional[tuple] = None  # per batch: read, step, pack, unpack (decide)
        self._decided = False  # decide() gave a choice once (early() asks no more)
        self.trial = False  # decide() gave a thread's trial (stream_thread_trial)
        self.threads_tried = False  # that trial was left: the choice goes on without it

    def batch(self, asked: float, got: float, batch, cpu: float) -> None:
        """A batch read in-line: asked for at `asked`, got at `got`, `cpu` seconds of the
        loop's thread's CPU time in between (the rest of the read waited: I/O, sleeps)."""
        self.delivered.batch(asked, got)
        if self._delay0 is None:
            self._delay0 = _run_delay_ns()
        if self._got is not None:  # not the epoch's first: its time includes the start
            self._batches += 1
            self._read += got - asked
            self._read_cpu += cpu
            self._step += asked - self._got
            if self._handover is None:
                self._handover, self._unpicklable = handover(batch)
                got = time.perf_counter()  # the timing is not the loop's step
                self.delivered.last = got
        self._got = got

    def unmeasured(self) -> None:
        """What the loop's thread did since the last batch (a fork) is not the loop's step."""
        now = time.perf_counter()
        if self._got is not None:
            self._got = now
        self.delivered.last = now

    def epoch_end(self, asked_worker_info: bool) -> None:
        self._got = None
        self._shards = self._shards or asked_worker_info
        self.delivered.epoch_end()

    def early(self, shards_now: bool) -> Optional[tuple[int, str]]:
        """Mid-epoch, every _EARLY_EVERY batches once measured, until the first decision at an
        epoch's end: (workers, the reason) where the model picks processes (not threads, not
        in-line) and the batches read in-line so far lost, by it, what their forks cost
        (BACKGROUND_START_SECONDS), else None. Only then: later, the model's saving an epoch
        is known, and a start is weighed at the epoch's end (decide)."""
        if (self._decided or self._batches < _stoker.STREAM_MIN_BATCHES
                or self._batches % _EARLY_EVERY):
            return None
        model = self._model(self._shards or shards_now)
        if model is None or model[0] != "process":
            return None
        _, workers, reason = model
        # The batches so far as one epoch: the saving a batch times the batches measured.
        start, _ = _stoker.stream_worth_starting(
            *self.costs, workers, cpu_share(), self._batches, 1,
            _stoker.BACKGROUND_START_SECONDS)
        if not start:
            return None
        return workers, (
            f"{reason}; the {self._batches} batches read in-line so far lost, by the model, "
            f"more than their forks cost (about "
            f"{1e3 * _stoker.BACKGROUND_START_SECONDS:.0f} ms), so they start in the "
            f"background during the {_ordinal(self.delivered.epochs + 1)} epoch read in-line "
            f"and read from the first epoch after it at which they are up")

    def wait_for(self, workers: int) -> float:
        """At an epoch's start, processes started in the background and not yet up: how long
        the loop waits for them (the whole start's cost, PROCESS_START_SECONDS, where the
        epoch read in-line would lose more by the model; else 0, and it is read in-line)."""
        d = self.delivered
        wait, _ = _stoker.stream_worth_starting(
            *self.costs, workers, cpu_share(), d.batches / max(d.epochs, 1), 1,
            _stoker.PROCESS_START_SECONDS)
        return _stoker.PROCESS_START_SECONDS if wait else 0.0

    def decide(self) -> Optional[tuple[str, int, str, bool]]:
        """None while measuring, else ('inline' | 'thread' | 'process', workers, the reason,
        whether to switch now)."""
        model = self._model(self._shards)
        if model is None:
            return None
        self._decided = True
        kind, workers, reason = model
        if kind == "process":
            d = self.delivered
            start, why = _stoker.stream_worth_starting(
                *self.costs, workers, cpu_share(), d.batches / max(d.epochs, 1), d.epochs,
                _stoker.PROCESS_START_SECONDS)
            if start:
                return "process", workers, f"{reason}; {why}", True
            reason = f"auto: in-line for now ({why}); the model: {reason}"
        # In-line, for good or for now: one thread that reads while the step runs, tried.
        trial = self._thread_trial(kind, workers)
        if trial is not None:
            self.trial = True
            return "thread", 1, f"{trial}; else {reason}", True
        if kind == "process":
            return "inline", 0, reason, False
        return kind, workers, reason, True

    def _thread_trial(self, kind: str, workers: int) -> Optional[str]:
        """Instead of in-line (for good, or for now: processes not yet worth their start), one
        thread that reads while the step runs, once (stream_thread_trial): its reason, else
        None."""
        if kind == "thread" or self.threads_tried:
            return None
        trial, why = _stoker.stream_thread_trial(*self.costs, cpu_share(), workers)
        return why if trial else None

    def _model(self, shards: bool) -> Optional[tuple[str, int, str]]:
        """None while measuring, else what the times so far pick before any start's cost:
        ('inline' | 'thread' | 'process', workers, the reason); sets `costs`."""
        if self._batches < _stoker.STREAM_MIN_BATCHES or self._handover is None:
            return None
        n = self._batches
        costs = self.costs = (self._read / n, self._step / n, *self._handover)
        cores = cpu_share()
        # The reads' time off the CPU, less all the time the loop's thread was runnable and
        # not running meanwhile (a busy machine's preemption; none known: no waits).
        now = _run_delay_ns()
        waits = 0.0
        if now is not None and self._delay0 is not None:
            waits = max(0.0, self._read - self._read_cpu - (now - self._delay0) / 1e9)
        # Threads need no pickling: a stream whose batches cannot go to a process may use them.
        threads, why_threads = _stoker.choose_stream_threads(*costs, waits / n, cores, shards)
        if threads:
            return "thread", threads, why_threads
        if self._unpicklable:
            return "inline", 0, f"auto: in-line ({self._unpicklable}; {why_threads})"
        workers, reason = _stoker.choose_stream_workers(*costs, cores, shards)
        if not workers:
            return "inline", 0, f"{reason}; {why_threads}"
        return "process", workers, reason


def _ordinal(n: int) -> str:
    return f"{n}{'th' if 10 <= n % 100 < 20 else {1: 'st', 2: 'nd', 3: 'rd'}.get(n % 10, 'th')}"


def _run_delay_ns() -> Optional[int]:
    """The calling thread's time runnable but waiting for a CPU, ns (Linux's schedstat), or
    None where there is no such file."""
    try:
        with open("/proc/thread-self/schedstat") as f:
            return int(f.read().split()[1])
    except (OSError, IndexError, ValueError):
        return None


class Check:
    """After auto switched a stream from `left` to `now`: `before`, the window measured on
    `left`; `delivered`, the new setting's, until check_switch keeps it or goes back."""

    def __init__(self, before, left: str, now: str, costs: Optional[tuple] = None,
                 workers: int = 0, resume: Optional[Choice] = None,
                 mid_epoch: bool = False) -> None:
        self.before, self.left, self.now = before, left, now
        self.costs, self.workers = costs, workers  # what the model predicted `now` from
        self.delivered = Delivered()
        # A thread's trial: the choice it was tried before, which goes on if it is left.
        self.resume = resume
        # Checked after batches too, not only between epochs: one worker thread, which can
        # hand the stream back to the loop's thread mid-epoch (Streams.inline_now).
        self.mid_epoch = mid_epoch

    def learned(self) -> str:
        """The reason's clause for a switch left: the hand-over a batch that would explain
        what `now` delivered (learn_handover, src/tune/worker_kind.h), against the one timed."""
        if self.costs is None:
            return ""
        pack, unpack = _stoker.learn_handover(*self.costs, self.workers, cpu_share(),
                                              self.delivered.window.mean())
        return (f"; so a hand-over cost about {1e3 * (pack + unpack):.3f} ms a batch, not the "
                f"{1e3 * (self.costs[2] + self.costs[3]):.3f} ms timed")
