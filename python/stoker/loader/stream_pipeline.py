"""The stream pipeline: an iterable data set, each worker (a thread, or a worker process)
iterating its own copy (stream_epochs.py), batches taken from the workers in turn. It runs
outside the engine, so its stats, report and trace are its own: the training loop's waits for
batches and the steps in between, measured here."""

from __future__ import annotations

import atexit
import collections
import json
import logging
import os
import time
import weakref
from typing import Optional

from .. import _stoker
from ..distributed import world
from ..workers.jobs import StreamJobs
from ..workers.processes import ProcessWorkers
from . import elastic
from .collate import mover, pinned
from .plan import Plan
from .protocol import EPOCH_END, Pipeline
from .stream_choice import Check, Choice
from .stream_epochs import Streams
from .stream_memory import StreamMemory

_log = logging.getLogger("stoker")
# How often, in batches, a check that can go back mid-epoch (Check.mid_epoch) asks whether its
# window is measured: check_switch's call every batch would be a cheap stream's read's share.
_MID_EPOCH_EVERY = 4


class StreamPipeline(Pipeline):
    exact_len = False

    def __init__(self, plan: Plan, setup) -> None:
        super().__init__(plan)
        for line in plan.log:
            _log.info(line)
        pin = plan.pin_memory == "on"
        collate = plan.collate_fn
        # The ProcessWorkers, once started (torch's iterator lists the processes); no reference
        # to self from the factory (the streams hold it).
        made: list[ProcessWorkers] = []
        self._made = made
        processes = None
        self._choice: Optional[Choice] = None
        self._check: Optional[Check] = None  # after a switch: is it faster (Check)?
        if self.worker_type == "process":
            jobs = StreamJobs(plan.dataset, collate, plan.batch_size, plan.drop_last)

            def make(base_seed: int) -> ProcessWorkers:
                made.append(ProcessWorkers(jobs, plan.num_workers, plan.context, base_seed,
                                           setup.worker_init_fn))
                return made[0]
            processes = make
        elif plan.measure_worker_type:  # epoch 1 in-line, measured (Choice)
            jobs = StreamJobs(plan.dataset, collate, plan.batch_size, plan.drop_last)

            def make(base_seed: int, count: int) -> ProcessWorkers:
                made.append(ProcessWorkers(jobs, count, plan.context, base_seed,
                                           setup.worker_init_fn))
                return made[0]
            self._choice = Choice(make)
            self._inline = (self.worker_type, self.num_workers)
        if pin and self.worker_type != "process":
            collate = pinned(collate)
        self._streams = Streams(
            dataset=plan.dataset, workers=plan.num_workers, depth=plan.depth,
            collate_fn=collate, batch_size=plan.batch_size, drop_last=plan.drop_last,
            setup=setup, processes=processes, finish=mover(_stoker.Device(plan.device), pin),
            generator=plan.generator)
        self._memory = StreamMemory(plan.memory_limit, plan.depth, self._streams,
                                    plan.num_workers, self.worker_type == "process")
        self.reported_len: Optional[int] = None  # len(dataset) when len(loader) was asked
        self._epoch = 0  # the epoch running
        # Batches taken since the depth was last looked at, and the epoch's waits beside ready
        # batches then (plan.tune_depth: deeper_stream_depth).
        self._depth_window = (0, 0)
        self._depth_asked = plan.depth
        self._timing = _Timing()
        self._trace: Optional[_Trace] = None
        self.log_worker_type()

    def start(self, epoch: int, batch: int) -> None:
        if self._check is not None:
            self._check_switch()
        if self._choice is not None:
            self._choose()
        self._streams.start(epoch)
        self._depth_window = (0, 0)  # the new epoch counts its waits from 0
        self._epoch = epoch

    def next(self, timeout: float):
        asked = time.perf_counter()
        cpu = time.thread_time() if self._choice is not None else 0.0
        batch = self._streams.next(timeout)
        if batch is not EPOCH_END:
            got = time.perf_counter()
            self._timing.batch(asked, got, self._trace)
            self._memory.batch(batch)
            if self.plan.tune_depth and self.num_workers > 1:
                self._deepen()
            if self._choice is not None:
                self._choice.batch(asked, got, batch, time.thread_time() - cpu)
                self._start_early()
            elif self._check is not None:
                self._check.delivered.batch(asked, got)
                if self._check.mid_epoch and not self._check.delivered.batches % _MID_EPOCH_EVERY:
                    self._check_switch(mid_epoch=True)
        elif self._choice is not None:
            self._choice.epoch_end(self._streams.asked_worker_info)
        elif self._check is not None:
            self._check.delivered.epoch_end()
        return batch

    def _deepen(self) -> None:
        """Every window of batches: where the loop waited on a worker while another had batches
        ready, each queue doubles (deeper_stream_depth), as far as the memory cap lets it."""
        start, blocked0 = self._depth_window
        self._depth_window = (start + 1, blocked0)
        if start + 1 < _stoker.STREAM_DEPTH_WINDOW:
            return
        blocked = self._streams.blocked()
        depth, why = _stoker.deeper_stream_depth(self._depth_asked, start + 1,
                                                 max(0, blocked - blocked0))
        self._depth_window = (0, blocked)
        if depth != self._depth_asked:
            self._depth_asked = depth
            self._memory.want(depth)
            _log.info("stoker: %s", why)

    def _choose(self) -> None:
        """Between epochs, once epoch 1 (and more, if short) was measured in-line: in-line on,
        worker threads from now on for a stream whose reads wait (they start at once), or
        worker processes (one, or more for a stream that takes its worker's share) once the
        epochs read in-line lost by the model what starting them costs (else in-line for the
        next epoch, and asked again after it). Processes started in the background while the
        choice was first measured (_start_early) read from the first epoch boundary at which
        they are up; the loop waits for them there where an epoch read in-line would lose
        more, by the model, than the whole start costs."""
        starting = self._streams.starting
        if starting:
            if self._streams.use_started(self._choice.wait_for(starting)):
                self._use_processes(starting)
            return
        decision = self._choice.decide()
        if decision is None:
            return
        kind, workers, reason, start = decision
        self.worker_type_reason = reason
        if not start:
            return
        before = self._choice.delivered.before
        if kind == "process":
            make = self._choice.make
            self._streams.use_processes(lambda seed: make(seed, workers), workers)
            self._use_processes(workers)
            return
        self._decided()
        if kind == "thread":
            self._streams.use_threads(workers)
            self._memory.set_workers(workers, False)
            self.worker_type, self.num_workers = "thread", workers
            self._check = Check(before, "in-line",
                                f"{workers} worker thread{'s' if workers > 1 else ''}",
                                resume=self._choice if self._choice.trial else None,
                                mid_epoch=workers == 1)
        self._choice = None

    def _start_early(self) -> None:
        """Mid-epoch, on in-line's batches while the choice is first measured (every
        _EARLY_EVERY once measured): where the model picks processes and the batches read
        in-line lost by it what their forks cost, they start in the background now, so that
        they may read the very next epoch (decided at the epoch's end, they would start then
        and that epoch pay their start). Not for a `Stateful` stream (a copy forked mid-pass
        would carry the pass's position), nor while processes start already."""
        if self._streams.starting or self._streams.stateful:
            return
        early = self._choice.early(self._streams.asked_worker_info)
        if early is None:
            return
        workers, reason = early
        make = self._choice.make
        self._streams.start_in_background_now(lambda seed: make(seed, workers), workers)
        self._choice.unmeasured()  # the forks are not in-line's time between batches
        self.worker_type_reason = reason
        self._decided()

    def _use_processes(self, workers: int) -> None:
        """The processes started in the background read from this epoch on, checked against
        in-line's warm epochs (Check)."""
        self._memory.set_workers(workers, True)
        self.worker_type, self.num_workers = "process", workers
        self._check = Check(self._choice.delivered.before, "in-line",
                            f"{workers} worker process{'es' if workers > 1 else ''}",
                            self._choice.costs, workers)
        self._choice = None
        self._decided()

    def _check_switch(self, mid_epoch: bool = False) -> None:
        """Between epochs, after a switch: once a window of batches was delivered on the new
        setting, keep it or go back in-line (check_switch, src/tune/worker_kind.h); a
        setting left is not tried again (no Choice is made anew; a thread's trial left, the
        Choice it was tried before goes on without threads). `mid_epoch`: asked after a
        batch, for one worker thread (Check.mid_epoch), which hands the stream back to the
        loop's thread where it stands, so that leaving it costs one window, not the epoch."""
        c = self._check
        verdict, why = _stoker.check_switch(c.before, c.delivered.window, c.left, c.now)
        if verdict == "measuring":
            return
        if verdict == "go back":
            if not mid_epoch:
                self._streams.use_inline()
            elif not self._streams.inline_now():
                return  # decided at the epoch's end
            else:
                why = why.replace(f"back to {c.left}:", f"back to {c.left} mid-epoch:", 1)
            self._made.clear()
            self.worker_type, self.num_workers = self._inline
            self._memory.set_workers(self.num_workers, False)
            d = c.delivered
            self.left.append(d.left(c.now))
            why += c.learned()
            if c.resume is not None:
                self._choice = c.resume
                self._choice.trial, self._choice.threads_tried = False, True
        self.worker_type_reason = f"auto: {why}; the switch: {self.worker_type_reason}"
        self._check = None
        self._decided()

    def _decided(self) -> None:
        if self._trace is not None:  # the decision on the timeline, with its evidence
            now = time.perf_counter()
            self._trace.event(f"workers: {self.worker_type_reason}", now, now)
        self.log_worker_type()

    def __len__(self) -> int:
        self.reported_len = len(self.plan.dataset)
        return len(self._streams)

    def state_dict(self, resume, next_epoch: Optional[int]) -> dict:
        rank, world_size = world()
        where = {"version": elastic.VERSION, "rank": rank, "world_size": world_size}
        if resume is not None:
            return {**where, "epoch": resume[0], "stream": self._streams.pending}
        if next_epoch is not None:
            return {**where, "epoch": next_epoch, "stream": None}
        return {**where, "epoch": self._epoch, "stream": self._streams.position()}

    def load_state_dict(self, state: dict) -> tuple[int, int]:
        if "stream" not in state:
            raise ValueError("stoker: the state is not a stream's")
        position = state["stream"]
        if position is not None and not position.get("merged"):
            saved = state.get("world_size", world()[1])
            # In-line and one worker read alike (auto moves a stream between them).
            if max(position["workers"], 1) != max(self.num_workers, 1) or saved != world()[1]:
                if saved != 1:
                    raise ValueError(
                        f"stoker: the state is one rank's of {saved}, saved with "
                        f"{position['workers']} workers; on other ranks or workers, merge "
                        f"every rank's state first (stoker.merge_states, or "
                        f"loader.global_state_dict() when saving)")
                state = elastic.merge_states([state])
                position = state["stream"]
        if position is not None and position.get("merged"):
            n = max(self.num_workers, 1)  # each worker takes its part of the rest itself
            position = {"workers": self.num_workers, "states": [position["dataset"]] * n,
                        "ended": [False] * n, "cursor": 0}
        self._streams.load(position)
        return int(state["epoch"]), 0

    def _stats(self) -> dict:
        memory, _ = self._memory.look()
        return {"workers": self.num_workers, "device": self.plan.device,
                **self._timing.stats(), **memory}

    def pids(self) -> list:
        return self._streams.pids()

    def processes(self) -> list:
        # Not those starting in the background while the stream is read in-line.
        return self._made[0].processes() if self._made and self.worker_type == "process" else []

    def _report(self) -> dict:
        stats = self._timing.stats()
        memory, line = self._memory.look()
        keys = {key: memory[key] for key in ("memory_limit", "memory_used", "memory_peak")}
        if not stats["batches"]:
            return {"verdict": "no data yet", "text": f"no data yet; {line}", "memory": line,
                    **stats, **keys}
        readers = (f"from {self.num_workers} {self.worker_type} worker(s)" if self.num_workers
                   else "read in-line")
        text = (f"stream: the training loop waited {stats['wait_fraction']:.0%} of its time "
                f"for {stats['batches']} batches {readers}; the engine's analysis (busiest "
                f"stage, more workers) covers map-style data sets; {line}")
        return {"verdict": "stream", "text": text, "memory": line, **stats, **keys}

    def trace(self, path: Optional[str], max_events: int) -> None:
        if self._trace is not None:
            self._trace.write()
            self._trace = None
        if path is not None:
            self._trace = _Trace(path, max_events)

    def skipped(self) -> list:
        return []  # a stream's errors are always raised

    def set_workers(self, workers: int) -> None:
        raise ValueError("stoker: a stream's workers each read their own shard: their count "
                         "is fixed (num_workers=)")

    def set_depth(self, depth: int) -> None:
        raise ValueError("stoker: a stream's depth is prefetch_factor batches per worker")

    def close(self) -> None:
        self._streams.close()
        self.trace(None, 0)

    def release(self) -> None:
        self.close()


class _Timing:
    """The training loop's time waiting for batches, against the time since the first one
    was asked for."""

    def __init__(self) -> None:
        self._first: Optional[float] = None
        self._last: Optional[float] = None  # when the last batch was handed out
        self._batches = 0
        self._wait = 0.0

    def batch(self, asked: float, got: float, trace: Optional["_Trace"]) -> None:
        if self._first is None:
            self._first = asked
        if trace is not None:
            if self._last is not None:
                trace.event("step", self._last, asked)
            trace.event("wait for batch", asked, got)
        self._batches += 1
        self._wait += got - asked
        self._last = got

    def stats(self) -> dict:
        elapsed = (self._last - self._first) if self._first is not None else 0.0
        return {"batches": self._batches, "consumer_wait_s": self._wait, "elapsed_s": elapsed,
                "wait_fraction": self._wait / elapsed if elapsed > 0 else 0.0}


class _Trace:
    """The stream's timeline in Chrome trace-event JSON (the engine's format): the training
    loop's waits for batches and its steps, keeping the newest `max_events`."""

    def __init__(self, path: str, max_events: int) -> None:
        with open(path, "w"):  # OSError now if the file cannot be created
            pass
        self._path = path
        self._events: collections.deque = collections.deque(maxlen=max(1, max_events))
        self._seen = 0
        self._written = False
        _unwritten.add(self)

    def event(self, name: str, start: float, end: float) -> None:
        self._seen += 1
        self._events.append({"name": name, "ph": "X", "pid": os.getpid(), "tid": 0,
                             "ts": start * 1e6, "dur": (end - start) * 1e6})

    def write(self) -> None:
        """Writes the file once (at the latest as the interpreter exits, while it still
        can: a loader left open goes later, when builtins may be gone)."""
        if self._written:
            return
        self._written = True
        _unwritten.discard(self)
        thread = {"name": "thread_name", "ph": "M", "pid": os.getpid(), "tid": 0,
                  "args": {"name": "consumer"}}
        with open(self._path, "w") as f:
            json.dump({"traceEvents": [thread, *self._events],
                       "otherData": {"dropped_events": self._seen - len(self._events)}}, f)


# Traces of streams still recording: written as the interpreter exits.
_unwritten: "weakref.WeakSet[_Trace]" = weakref.WeakSet()


@atexit.register
def _write_unwritten() -> None:
    for trace in list(_unwritten):
        trace.write()
