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
from .plan import Plan, cpu_share
from .protocol import EPOCH_END, Pipeline
from .stream_epochs import Streams
from .stream_memory import StreamMemory
from .worker_choice import Delivered, handover

_log = logging.getLogger("stoker")


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
        self._choice: Optional[_Choice] = None
        self._check: Optional[_Check] = None  # after a switch: is it faster (_Check)?
        if self.worker_type == "process":
            jobs = StreamJobs(plan.dataset, collate, plan.batch_size, plan.drop_last)

            def make(base_seed: int) -> ProcessWorkers:
                made.append(ProcessWorkers(jobs, plan.num_workers, plan.context, base_seed,
                                           setup.worker_init_fn))
                return made[0]
            processes = make
        elif plan.measure_worker_type:  # epoch 1 in-line, measured (_Choice)
            jobs = StreamJobs(plan.dataset, collate, plan.batch_size, plan.drop_last)

            def make(base_seed: int, count: int) -> ProcessWorkers:
                made.append(ProcessWorkers(jobs, count, plan.context, base_seed,
                                           setup.worker_init_fn))
                return made[0]
            self._choice = _Choice(make)
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
            elif self._check is not None:
                self._check.delivered.batch(asked, got)
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
        next epoch, and asked again after it)."""
        decision = self._choice.decide()
        if decision is None:
            return
        kind, workers, reason, start = decision
        self.worker_type_reason = reason
        if not start:
            return
        self._decided()
        before = self._choice.delivered.window
        if kind == "process":
            make = self._choice.make
            self._streams.use_processes(lambda seed: make(seed, workers), workers)
            self._memory.set_workers(workers, True)
            self.worker_type, self.num_workers = "process", workers
            self._check = _Check(before, "in-line",
                                 f"{workers} worker process{'es' if workers > 1 else ''}",
                                 self._choice.costs, workers)
        elif kind == "thread":
            self._streams.use_threads(workers)
            self._memory.set_workers(workers, False)
            self.worker_type, self.num_workers = "thread", workers
            self._check = _Check(before, "in-line",
                                 f"{workers} worker thread{'s' if workers > 1 else ''}")
        self._choice = None

    def _check_switch(self) -> None:
        """Between epochs, after a switch: once a window of batches was delivered on the new
        setting, keep it or go back in-line (check_switch, src/tune/worker_kind.h); a
        setting left is not tried again (no _Choice is made anew)."""
        c = self._check
        verdict, why = _stoker.check_switch(c.before, c.delivered.window, c.left, c.now)
        if verdict == "measuring":
            return
        if verdict == "go back":
            self._streams.use_inline()
            self._made.clear()
            self.worker_type, self.num_workers = self._inline
            self._memory.set_workers(self.num_workers, False)
            d = c.delivered
            self.left.append(d.left(c.now))
            why += c.learned()
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
        return self._made[0].processes() if self._made else []

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


class _Choice:
    """A stream on num_workers='auto' and worker_type='auto', read in-line: its batches after
    each epoch's first, timed in the training loop (the read: the time in next(); the step:
    the time between batches), one batch handed over on the worker's code, and whether the
    stream asked get_worker_info() as it began (it shards itself), then choose_stream_workers
    (src/tune/worker_kind.h) at the next epoch's start."""

    def __init__(self, make) -> None:
        self.make = make  # the worker processes' ProcessWorkers, given the base seed, count
        # In-line's first epochs (to Window.longest), for the check after a switch.
        self.delivered = Delivered(bounded=True)
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

    def epoch_end(self, asked_worker_info: bool) -> None:
        self._got = None
        self._shards = self._shards or asked_worker_info
        self.delivered.epoch_end()

    def decide(self) -> Optional[tuple[str, int, str, bool]]:
        """None while measuring, else ('inline' | 'thread' | 'process', workers, the reason,
        whether to switch now)."""
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
        threads, why_threads = _stoker.choose_stream_threads(
            *costs, waits / n, cores, self._shards)
        if threads:
            return "thread", threads, why_threads, True
        if self._unpicklable:
            return "inline", 0, f"auto: in-line ({self._unpicklable}; {why_threads})", True
        workers, reason = _stoker.choose_stream_workers(*costs, cores, self._shards)
        if not workers:
            return "inline", 0, f"{reason}; {why_threads}", True
        d = self.delivered
        start, why = _stoker.stream_worth_starting(
            *costs, workers, cores, d.batches / max(d.epochs, 1), d.epochs,
            _stoker.PROCESS_START_SECONDS)
        if not start:
            return "inline", 0, f"auto: in-line for now ({why}); the model: {reason}", False
        return "process", workers, f"{reason}; {why}", True


def _run_delay_ns() -> Optional[int]:
    """The calling thread's time runnable but waiting for a CPU, ns (Linux's schedstat), or
    None where there is no such file."""
    try:
        with open("/proc/thread-self/schedstat") as f:
            return int(f.read().split()[1])
    except (OSError, IndexError, ValueError):
        return None


class _Check:
    """After auto switched a stream from `left` to `now`: `before`, the window measured on
    `left`; `delivered`, the new setting's, until check_switch keeps it or goes back."""

    def __init__(self, before, left: str, now: str, costs: Optional[tuple] = None,
                 workers: int = 0) -> None:
        self.before, self.left, self.now = before, left, now
        self.costs, self.workers = costs, workers  # what the model predicted `now` from
        self.delivered = Delivered()

    def learned(self) -> str:
        """The reason's clause for a switch left: the hand-over a batch that would explain
        what `now` delivered (learn_handover, src/tune/worker_kind.h), against the one timed."""
        if self.costs is None:
            return ""
        pack, unpack = _stoker.learn_handover(*self.costs, self.workers, cpu_share(),
                                              self.delivered.window.mean())
        return (f"; so a hand-over cost about {1e3 * (pack + unpack):.3f} ms a batch, not the "
                f"{1e3 * (self.costs[2] + self.costs[3]):.3f} ms timed")


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
