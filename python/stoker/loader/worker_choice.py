"""worker_type='auto' on the engine pipeline: the first batches are read on threads and
measured (WorkerKindChooser, src/tune/worker_kind.cc: the GIL's busy share, the reads' CPU
time and the training loop's own per batch, a batch job's hand-over); then reads stay on
threads or move to worker processes, and how many; batch jobs' processes, once warm, measure
their own reads, and those their count did not need are let go (processes_to_keep). The
move is checked against what the threads delivered (MoveCheck), and with GIL-bound reads
in-line is tried after (InlineTrial)."""

from __future__ import annotations

import pickle
import statistics
import time
from typing import Optional

from .. import _stoker
from ..workers import arena as _arena


class KindChooser:
    """`whole_batches`: batch jobs; `auto_count`: num_workers='auto' (the count is auto's to
    choose, else `count` processes, as asked)."""

    def __init__(self, whole_batches: bool, auto_count: bool, count: int) -> None:
        self._chooser = _stoker.WorkerKindChooser(whole_batches)
        self._whole_batches = whole_batches
        self._auto_count = auto_count
        self._count = count
        self._handover: Optional[tuple[float, float]] = None
        self._measuring = 0.0  # the training loop's CPU time spent timing the hand-over
        self._unpicklable = ""  # why a batch job's batch could not be handed over
        self._costs: Optional[tuple] = None  # per batch, what the count came from (observe)
        self._gil_bound = False

    def batch(self, objects) -> None:
        """A delivered batch's object values: a batch job's batch (still in this process's
        memory, before any move to a device) times its hand-over from a worker process once,
        on the training loop's thread (that CPU time is not the loop's own)."""
        if self._whole_batches and self._handover is None:
            start = time.thread_time()
            self._handover, self._unpicklable = handover(objects[0][0])
            self._measuring = time.thread_time() - start

    def observe(self, loader, threads: Optional[int], cores: int,
                structure) -> Optional[tuple[bool, str, int]]:
        """After each batch handed out: None while measuring, then (processes, the reason,
        how many). `structure()`: the samples' (a worker process pickles it back)."""
        if self._whole_batches and self._handover is None:
            return None  # batch() times a batch job's hand-over first
        pack, unpack = self._handover or (0.0, 0.0)
        decision = self._chooser.observe(loader, threads, cores, pack, unpack, self._measuring)
        if decision is None:
            return None
        to_processes, reason, workers, why, self._costs, self._gil_bound = decision
        if to_processes and (unpicklable := self._unpicklable or _unpicklable(structure())):
            # A worker process sends its samples' structure back pickled: one whose types
            # cannot be (a namedtuple or class made inside a function) stays on threads.
            return False, f"{reason}; but {unpicklable}, so worker threads", 0
        if not to_processes:
            return False, reason, 0
        if self._auto_count:
            return True, f"{reason}; {why}", workers
        return True, f"{reason}; {self._count} worker process(es), as num_workers asks", \
            self._count

    def inline_read(self) -> Optional[float]:
        """Once decided: the CPU seconds a batch's reads took on the threads, where the reads
        are GIL-bound (an in-line trial's prediction: InlineTrial); else None."""
        return self._costs[0] if self._gil_bound and self._costs is not None else None

    def keep(self, warm_cpu: dict, started: int, cores: int) -> tuple[int, str]:
        """After the `started` processes' warm-up: how many to keep (num_workers='auto'; else
        all), from the CPU time a warm one took a batch (`warm_cpu`: worker: seconds), and the
        reason's clause ("" if all are kept)."""
        if not self._auto_count or not warm_cpu or self._costs is None:
            return started, ""
        return _stoker.processes_to_keep(self._costs, statistics.median(warm_cpu.values()),
                                         started, cores)


def handover(batch) -> tuple[tuple[float, float], str]:
    """A batch's hand-over from a worker process, timed on its code (arena.handover_cost),
    and "" or why it cannot be handed over at all (it does not pickle: (0, 0) then)."""
    try:
        return _arena.handover_cost(batch), ""
    except Exception as e:  # noqa: BLE001 (a lock, a generator, ...)
        return (0.0, 0.0), f"its batches do not pickle ({type(e).__name__}: {e})"


def _unpicklable(structure) -> str:
    """Why samples of `structure` could not cross to a worker process ("" if they can)."""
    try:
        pickle.dumps(structure, protocol=pickle.HIGHEST_PROTOCOL)
    except Exception as e:  # noqa: BLE001 (PicklingError, AttributeError, TypeError, ...)
        return f"its samples do not pickle ({type(e).__name__}: {e})"
    return ""


class Delivered:
    """The batches one setting delivered to the training loop: into a Window (src/tune/
    worker_kind.h), the time from each to the next in an epoch (its read and the loop's step),
    and an epoch's first batch's wait, except in the setting's first epoch (its start-up);
    `bounded`: none after the epoch in which the window reached Window.longest (the setting
    left: its first epochs, as the new setting's window, checked between epochs, holds the
    new one's); `from_start`: the first epoch's first batch's wait counts too (the engine
    pipeline's threads: their few batches before auto decides come in pairs, two threads
    finishing together: from the first one on alone, 2 threads of pure-Python reads measured
    8.9 and 12.0 ms a batch where their whole epochs' median was 14-16 ms, on 2 busy cores;
    the threads' start-up, a few milliseconds, is far from the processes'); `skip_s`: none in
    this many seconds after the setting began, nor the gap to the first batch after them (the
    engine pipeline's processes' start, kCheckStartSeconds); `skip_batches`: none for this
    many batches first (those read ahead before a switch to in-line, handed out at once);
    `warm`: `window` is the one a check compares with, from the setting's second epoch on
    (SettingWindows: compare warm with warm), and `bounded` ends it when that one is longest.
    Beside the window, the loop's own time between batches (`step`)."""

    def __init__(self, bounded: bool = False, from_start: bool = False,
                 skip_s: float = 0.0, skip_batches: int = 0, warm: bool = False) -> None:
        self._windows = _stoker.SettingWindows() if warm else None
        self._window = _stoker.Window()
        self._bounded = bounded
        self._from_start = from_start
        self._closed = False  # bounded, and longest as an epoch ended
        self.last: Optional[float] = None  # when the last batch of this epoch was handed out
        self.epochs = 0  # ended on this setting
        self.batches = 0  # all handed out, the first of each epoch too
        self._first = time.perf_counter()
        self._skip_until: Optional[float] = self._first + skip_s if skip_s else None
        self._skip_batches = skip_batches
        self._steps, self._step_s = 0, 0.0  # the loop's time from a batch to its next ask

    @property
    def window(self):
        """What a check compares with (a copy, with `warm`)."""
        return self._windows.compared if self._windows is not None else self._window

    @property
    def before(self):
        """What a check after leaving this setting compares with: its SettingWindows (with
        `warm`: check_switch says which part it compared), else its Window."""
        return self._windows if self._windows is not None else self._window

    def _add(self, seconds: float) -> None:
        if self._windows is not None:
            self._windows.add(seconds)
        else:
            self._window.add(seconds)

    @property
    def seconds(self) -> float:
        """Since this setting began."""
        return time.perf_counter() - self._first

    @property
    def step(self) -> float:
        """The loop's mean seconds from a batch handed out to its next ask."""
        return self._step_s / self._steps if self._steps else 0.0

    def batch(self, asked: float, got: float) -> None:
        if self.last is not None and not self._closed:
            self._steps += 1
            self._step_s += asked - self.last
        if self._closed:
            pass
        elif self._skip_batches:
            self._skip_batches -= 1
        elif self._skip_until is not None:  # measured from the next batch after it on
            self._skip_until = None if got >= self._skip_until else self._skip_until
        elif self.last is not None:
            self._add(got - self.last)
        elif self.epochs or self._from_start:
            self._add(got - asked)
        self.last = got
        self.batches += 1

    def epoch_end(self) -> None:
        self.last = None
        self.epochs += 1
        if self._windows is not None:
            self._windows.epoch_end()
        warm = self._windows.warm if self._windows is not None else self._window
        self._closed = self._bounded and warm.longest()

    def left(self, setting: str) -> dict:
        """What was spent on this setting, left: stats()["worker_type_left"]'s entry; `windows`,
        the measuring windows its check took (kCheckMinBatches batches and kCheckMinSeconds
        each)."""
        w = self.window
        windows = min(w.batches / _stoker.CHECK_MIN_BATCHES, w.seconds / _stoker.CHECK_MIN_SECONDS)
        return {"setting": setting, "epochs": self.epochs, "batches": self.batches,
                "seconds": self.seconds, "windows": windows}


class MoveCheck:
    """worker_type='auto' on the engine pipeline checks its move from threads to processes:
    the batches delivered on the threads while it measured (Delivered, `from_start`), then,
    once moved(), those the processes delivered, until check_switch (src/tune/worker_kind.h)
    keeps them or goes back."""

    def __init__(self) -> None:
        self.threads_delivered = Delivered(from_start=True)
        self.processes_delivered: Optional[Delivered] = None
        self.threads = 0  # the threads reading when auto moved, to go back to
        self.now = ""  # the processes' setting, named

    def delivered(self, asked: float, ended: bool) -> None:
        """A batch delivered (`asked` for then; it came now), or the epoch's end."""
        d = self.processes_delivered or self.threads_delivered
        if ended:
            d.epoch_end()
        else:
            d.batch(asked, time.perf_counter())

    def moved(self, threads: int, processes: int) -> "MoveCheck":
        """Moved from `threads` threads (reading then: the tuner may have moved the count),
        which a move back returns to, to `processes` processes."""
        self.threads = threads
        self.processes_delivered = Delivered(skip_s=_stoker.CHECK_START_SECONDS)
        self.now = f"{processes} worker process{'es' if processes > 1 else ''}"
        return self

    @property
    def threads_name(self) -> str:
        return f"{self.threads} worker thread{'s' if self.threads > 1 else ''}"

    def verdict(self) -> tuple[str, str]:
        """("measuring" | "keep" | "go back", the reason naming both measured times)."""
        return _stoker.check_switch(self.threads_delivered.window,
                                    self.processes_delivered.window, self.threads_name, self.now)

    def left(self) -> dict:
        return self.processes_delivered.left(self.now)


class InlineTrial:
    """worker_type='auto' with GIL-bound reads, once settled on threads or processes (`now`,
    what it delivered: `before`): reading in-line is tried where the model puts it faster
    (inline_trial, src/tune/worker_kind.h), and checked as a switch is: kept, or back to
    `now` (check_switch). `restore`: what going back needs (the pipeline's)."""

    def __init__(self, before: Delivered, now: str, skip_batches: int, restore) -> None:
        self.before, self.now, self.restore = before, now, restore
        self._inline = Delivered(skip_batches=skip_batches)

    @staticmethod
    def worth(read_s: Optional[float], now: Delivered, name: str) -> tuple[bool, str]:
        """Whether to try in-line after settling on `now` (`name`), and the reason's clause;
        `read_s`: KindChooser.inline_read()."""
        if read_s is None:
            return False, ""
        return _stoker.inline_trial(read_s, now.step, now.window, name)

    def delivered(self, asked: float, ended: bool) -> None:
        if ended:
            self._inline.epoch_end()
        else:
            self._inline.batch(asked, time.perf_counter())

    def verdict(self) -> tuple[str, str]:
        return _stoker.check_switch(self.before.window, self._inline.window, self.now,
                                    "in-line")

    def left(self, kept: bool) -> dict:
        """stoker.stats()["worker_type_left"]'s entry: `now`'s when in-line was kept, else
        in-line's."""
        return self.before.left(self.now) if kept else self._inline.left("in-line")
