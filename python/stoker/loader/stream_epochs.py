"""Iterable data sets on the training process's side: worker w iterates its own copy of the
data set (on a thread, or in a worker process serving StreamJobs, stoker/workers/jobs.py) and
the training loop takes batches from the workers in turn, as PyTorch's loader does;
docs/architecture.md says why streams are not engine jobs.
"""

from __future__ import annotations

import atexit
import copy
import errno
import pickle
import queue
import sys
import threading
import weakref
from typing import Callable, Optional

from .. import _stoker
from ..workers import arena as _arena
from ..workers import startup
from ..workers.jobs import END, StreamJobs, is_datapipe
from ..workers.processes import rebuild_error
from .stream_start import BackgroundStart

# How long a stream worker waits to hand a batch over before it looks whether it was stopped.
_PUT_POLL_S = 0.1

# What an epoch's next() returns after its last batch (None is a batch a collate_fn may make).
EPOCH_END = object()


def _torch():
    return sys.modules.get("torch")


class _Failure:
    def __init__(self, error: BaseException) -> None:
        self.error = error


class StreamEpoch:
    """One epoch over a stream: a producer per worker fills its own bounded queue, and the
    training loop takes from the workers in turn (round-robin, skipping workers whose stream
    ended), so a deterministic stream gives torch's batches in torch's order.

    Producers run on threads of their own: with worker threads a producer iterates its copy
    of the data set; with worker processes it asks its worker for the batches it made since
    the last request (ProcessPool.call, the GIL released while it waits) and decodes them. Nothing here
    holds the loader, so an abandoned epoch never keeps a loader alive; stop() ends it.
    """

    def __init__(self, *, dataset, workers: int, depth: int, collate_fn, batch_size,
                 drop_last: bool, epoch: int, base_seed: int, init: Callable,
                 pool, states: Optional[list], ended: Optional[list], cursor: int,
                 want_state: bool, finish: Callable, seed: Optional[int],
                 loader_epoch: int) -> None:
        self._finish = finish
        self._stop = threading.Event()
        self._want_state = want_state
        self.workers = workers
        self.states = list(states) if states is not None else [None] * max(workers, 1)
        self.ended = list(ended) if ended is not None else [False] * max(workers, 1)
        # Whether a worker's stream ended while its last batch handed out was made (a short
        # last batch): its END is still to come, but a position saved now must say it ended
        # (the data set's state may already be back at its start).
        self.last = [False] * max(workers, 1)
        self.cursor = cursor
        self.depth = depth  # each worker's queue (and a worker process's batches made ahead)
        # Batches the loop found not ready while another worker had batches ready (taken in
        # turn, they wait): a stream whose batches come in bursts (deeper_stream_depth).
        self.blocked = 0
        self._jobs: list[StreamJobs] = []  # the copies read on worker threads
        if workers == 0:  # the calling thread iterates (worker info stays None, as in torch)
            self._inline = StreamJobs(dataset, collate_fn, batch_size, drop_last)
            self._inline.begin(self.states[0], seed, loader_epoch)
            return
        self._queues = [queue.Queue(maxsize=depth) for _ in range(workers)]
        self._threads = []
        for w in range(workers):
            if self.ended[w]:
                continue
            if pool is not None:
                target, extra = self._ask_process, (pool, epoch, (self.states[w], seed,
                                                                  loader_epoch))
            else:
                jobs = StreamJobs(_own_copy(dataset), collate_fn, batch_size, drop_last)
                self._jobs.append(jobs)
                target, extra = self._iterate, (jobs, base_seed, init, self.states[w], seed,
                                                loader_epoch)
            thread = threading.Thread(target=self._produce, args=(target, w, *extra),
                                      daemon=True, name=f"stoker stream worker {w}")
            thread.start()
            self._threads.append(thread)

    # --- producers ----------------------------------------------------------------------

    def _produce(self, target: Callable, w: int, *args) -> None:
        # Whatever escapes a producer ends its worker's stream with that error, in its turn:
        # the training loop never waits for a producer that is gone.
        try:
            target(w, *args)
        except BaseException as e:
            _note(e, w)
            self._put(w, _Failure(e))
            self._put(w, END)

    def _put(self, w: int, item) -> bool:
        while not self._stop.is_set():
            try:
                self._queues[w].put(item, timeout=_PUT_POLL_S)
                return True
            except queue.Full:
                pass
        return False

    def _iterate(self, w: int, jobs: StreamJobs, base_seed: int, init, state, seed,
                 loader_epoch: int) -> None:
        init(w, jobs.dataset, self.workers, base_seed)  # an error ends the stream (_produce)
        jobs.begin(state, seed, loader_epoch)
        while not self._stop.is_set():
            try:
                batch = jobs.next_batch()
            except StopIteration:
                self._put(w, END)
                return
            except Exception as e:  # as torch: reported in turn, and the worker goes on
                _note(e, w)
                if not self._put(w, _Failure(e)):
                    return
                continue
            if not self._put(w, (batch, jobs.state() if self._want_state else None,
                                 jobs.exhausted)):
                return

    def _ask_process(self, w: int, pool, epoch: int, begin: tuple) -> None:
        state, seed, loader_epoch = begin
        depth = None
        while not self._stop.is_set():
            if depth != self.depth:  # the batches it makes ahead follow the queue's depth
                depth = self.depth
                args = pickle.dumps((state, self._want_state, depth, seed, loader_epoch),
                                    protocol=pickle.HIGHEST_PROTOCOL)
            reply = pool.call(w, epoch, args)
            if not reply[0]:
                if not self._stop.is_set():
                    self._put(w, _Failure(_stoker.WorkerError(
                        f"{reply[1]}; the rest of its stream (worker {w}) is lost")))
                    self._put(w, END)
                return
            _, failed, blob, pid = reply
            try:
                objects, errors = pickle.loads(blob)
                items = ([_Failure(rebuild_error(errors[0][1], _where(w, pid)))]
                         if failed else [_from_worker(item, w, pid)
                                         for item in _arena.loads(objects[0], pid)])
            except OSError as e:
                if e.errno == errno.ESRCH:  # it died after replying: its next call says how
                    continue
                items = [_Failure(e)]
            except Exception as e:  # a reply that does not unpickle here
                items = [_Failure(e)]
            for item in items:
                if not self._put(w, item) or item is END:
                    return

    @property
    def asked_worker_info(self) -> bool:
        """Read in-line: whether the stream asked get_worker_info() as it began."""
        return self.workers == 0 and self._inline.asked_worker_info

    def set_depth(self, depth: int) -> None:
        """Each worker's queue holds `depth` batches from now on (the memory cap lowers it; a
        worker process makes as many ahead from its next request on)."""
        self.depth = depth
        for q in getattr(self, "_queues", ()):
            with q.mutex:
                q.maxsize = depth
                q.not_full.notify_all()

    def in_flight(self) -> int:
        """Batches queued, and one per producer still running (making one, or holding one
        for a full queue, or a reply's); in-line: none."""
        if self.workers == 0:
            return 0
        return (sum(q.qsize() for q in self._queues)
                + sum(thread.is_alive() for thread in self._threads))

    def buffered_bytes(self) -> int:
        """What the copies of the data set read in this process hold for later (their
        buffered_bytes(), e.g. a shuffle buffer's); a worker process's counts in its memory."""
        copies = [self._inline] if self.workers == 0 else self._jobs
        return sum(int(getattr(jobs.dataset, "buffered_bytes", _none)()) for jobs in copies)

    # --- the training loop's side --------------------------------------------------------

    def next(self, timeout: float):
        """The next batch, or EPOCH_END at the end of the epoch (a batch may be None: what a
        collate_fn that drops a bad batch returns, as torch's loader yields it)."""
        if self.workers == 0:
            if self.ended[0]:
                return EPOCH_END
            try:
                batch = self._inline.next_batch()
            except StopIteration:
                self.ended[0] = True
                return EPOCH_END
            if self._want_state:
                self.states[0] = self._inline.state()
            self.last[0] = self._inline.exhausted
            return self._finish(batch)
        while not all(self.ended):
            w = self.cursor
            while self.ended[w]:
                w = (w + 1) % self.workers
            if self._queues[w].empty() and any(
                    q.qsize() for v, q in enumerate(self._queues) if v != w and not self.ended[v]):
                self.blocked += 1
            try:
                item = self._queues[w].get(timeout=timeout or None)
            except queue.Empty:
                raise RuntimeError(f"DataLoader timed out after {timeout} seconds") from None
            if item is END:
                self.ended[w] = True
                continue
            self.cursor = (w + 1) % self.workers
            if isinstance(item, _Failure):
                raise item.error
            batch, state, self.last[w] = item
            self.states[w] = state
            return self._finish(batch)
        return EPOCH_END

    def stop(self, wait: bool) -> None:
        """Ends the epoch's producers; each finishes at most the batch it is making. With
        `wait`, returns when they have ended (only for producers that cannot be inside user
        code, which may never return: those of worker processes once their pool stopped);
        otherwise waits a little and leaves the rest to end on their own (daemon threads)."""
        self._stop.set()
        for thread in getattr(self, "_threads", ()):
            if thread is not threading.current_thread():
                thread.join(None if wait else _PUT_POLL_S * 2)


def _none() -> int:
    return 0


def _where(w: int, pid: int) -> str:
    return f"stoker: raised in DataLoader worker process {w} (pid {pid}) while reading its stream"


def _from_worker(item, w: int, pid: int):
    """One item of a stream worker's reply (workers/main.py, _run_call), as the queue holds it."""
    if isinstance(item, bytes):
        return _arena.loads(item, pid)
    if isinstance(item, tuple):  # ("error", the worker's exception info)
        return _Failure(rebuild_error(item[1], _where(w, pid)))
    return item  # END


def _own_copy(dataset):
    """Each worker thread iterates its own copy of the data set, as each of torch's worker
    processes does (state set in __iter__ stays the worker's). An IterDataPipe's whole graph
    is copied: sharding sets each worker's share in its steps."""
    try:
        return copy.deepcopy(dataset) if is_datapipe(dataset) else copy.copy(dataset)
    except Exception:
        return dataset


def _note(error: BaseException, w: int) -> None:
    error.add_note(f"stoker: raised in DataLoader worker {w} while reading its stream")


class Streams:
    """An iterable data set's loader state across epochs: its workers (threads, or processes
    that persist across epochs), the current epoch, and a position to resume from."""

    def __init__(self, *, dataset, workers: int, depth: int, collate_fn, batch_size,
                 drop_last: bool, setup, processes, finish,
                 generator=None) -> None:
        self._dataset = dataset
        self._generator = generator  # an IterDataPipe's seed for each epoch is drawn from it
        self._workers = workers
        self._depth = depth
        self._collate_fn = collate_fn
        self._batch_size = batch_size
        self._drop_last = drop_last
        self._setup = setup  # seeding.WorkerSetup: worker_init_fn and each epoch's base seed
        self._finish = finish
        self._stateful = (hasattr(dataset, "state_dict") and hasattr(dataset, "load_state_dict"))
        self._pool = None
        self._base_seed = 0  # the pass's, drawn at start()
        # worker_type='auto': processes starting in the background, not yet read from.
        self._starting: Optional[BackgroundStart] = None
        self._epoch: Optional[StreamEpoch] = None
        self.pending: Optional[dict] = None  # a loaded position, for the next start()
        # Passes started: worker processes tell a new pass from an abandoned one's last
        # requests by it (whatever epoch numbers set_epoch() gives).
        self._passes = 0
        self.closed = False
        _open_streams.add(self)
        # Makes the ProcessWorkers over this stream's jobs, given the base seed: started with
        # the first epoch, whose iter() draws it (as torch's loader), not when the loader is
        # made.
        self._processes = processes

    def pids(self) -> list:
        return list(self._pool.pids()) if self._pool is not None else []

    def resident_bytes(self) -> int:
        """The worker processes' own memory (their Pss_Anon estimates)."""
        return self._pool.resident_bytes() if self._pool is not None else 0

    def buffered_bytes(self) -> int:
        """What the data set's copies read in the training process hold for later."""
        return self._epoch.buffered_bytes() if self._epoch is not None else 0

    def in_flight(self) -> int:
        return self._epoch.in_flight() if self._epoch is not None else 0

    def set_depth(self, depth: int) -> None:
        """Each worker's queue depth, from now on (the memory cap's)."""
        self._depth = depth
        if self._epoch is not None:
            self._epoch.set_depth(depth)

    def blocked(self) -> int:
        """The current epoch's batches found not ready while another worker had batches ready."""
        return self._epoch.blocked if self._epoch is not None and self._workers else 0

    def __len__(self) -> int:
        length = len(self._dataset)  # TypeError without __len__, as torch
        if self._batch_size is None:
            return length
        if self._drop_last:
            return length // self._batch_size
        return -(-length // self._batch_size)

    def _init_thread(self, w: int, dataset, workers: int, base_seed: int) -> None:
        startup.start_worker(w, workers, base_seed, dataset, self._setup.worker_init_fn,
                             own_process=False)

    def start(self, epoch: int) -> None:
        """Starts the next pass over the stream, the loader's epoch `epoch`."""
        if self.closed:
            raise RuntimeError("stoker: the DataLoader is closed")
        self.stop()
        # torch's iterator draws an IterDataPipe's shared seed, then the workers' base seed.
        pipe_seed = self._epoch_seed()
        base_seed = self._base_seed = self._setup.begin_epoch()
        if self._processes is not None:
            self._pool = self._processes(base_seed).make_pool()
            self._processes = None
            self._pool.start()
        self._passes += 1
        pending, self.pending = self.pending, None
        # In-line and one worker iterate the same one copy (auto moves from one to the other).
        if pending is not None and max(pending["workers"], 1) != max(self._workers, 1):
            raise ValueError(f"stoker: the state is for a stream read by {pending['workers']} "
                             f"workers, this loader has {self._workers}: a stream's state is "
                             f"each worker's own data set state, which cannot be split over "
                             f"other workers or ranks; resume it with the same num_workers "
                             f"and ranks")
        self._epoch = StreamEpoch(
            dataset=self._dataset, workers=self._workers, depth=self._depth,
            collate_fn=self._collate_fn, batch_size=self._batch_size,
            drop_last=self._drop_last, epoch=self._passes, base_seed=base_seed,
            init=self._init_thread, pool=self._pool,
            states=pending and pending["states"], ended=pending and pending["ended"],
            cursor=pending["cursor"] if pending else 0, want_state=self._stateful,
            finish=self._finish, seed=pipe_seed, loader_epoch=epoch)

    @property
    def asked_worker_info(self) -> bool:
        """Whether the epoch running, read in-line, asked get_worker_info() as it began."""
        return self._epoch is not None and self._epoch.asked_worker_info

    def use_processes(self, processes, workers: int) -> None:
        """From the next start() on, `workers` worker processes read (worker_type='auto'
        chose them after epochs read in-line); `processes` makes their ProcessWorkers, given
        the base seed."""
        self._workers, self._processes = workers, processes

    def start_in_background_now(self, processes, workers: int) -> None:
        """`workers` worker processes (worker_type='auto' chose them while a pass is read
        in-line; `processes` makes their ProcessWorkers, given the base seed) are forked now,
        in the middle of this pass, with its base seed (not for a `Stateful` stream: see
        `stateful`); use_started() moves the stream to them at a later start, once they are
        up."""
        self._starting = BackgroundStart(processes(self._base_seed), workers)

    @property
    def stateful(self) -> bool:
        """The stream has state_dict()/load_state_dict(): a copy of it forked mid-pass would
        carry that pass's position."""
        return self._stateful

    @property
    def starting(self) -> int:
        """The worker processes starting in the background (0: none)."""
        return self._starting.count if self._starting is not None else 0

    def use_started(self, wait: float = 0.0) -> bool:
        """From the next start() on, the processes started in the background read, if they
        are all up within `wait` seconds (else False: the next epoch is read in-line too)."""
        if self._starting is None or not self._starting.ready(wait):
            return False
        started, self._starting = self._starting, None
        self._pool, self._workers, self._processes = started.pool, started.count, None
        return True

    def use_threads(self, workers: int) -> None:
        """From the next start() on, `workers` worker threads read (worker_type='auto' chose
        them for a stream whose reads wait, after epochs read in-line)."""
        self._workers, self._processes = workers, None

    def use_inline(self) -> None:
        """From the next start() on, read in-line again (worker_type='auto' measured the worker
        processes slower than in-line, stream_pipeline.py): the processes end now, between
        epochs."""
        if self._pool is not None:
            self._pool.stop()  # as close(): producers waiting on their workers return at once
        self.stop(wait=self._pool is not None)
        if self._pool is not None:
            self._pool.finish()
            self._pool = None
        self._workers, self._processes = 0, None

    def _epoch_seed(self) -> Optional[int]:
        """An IterDataPipe's: drawn as torch's loader draws it for each epoch, from the
        generator or torch's default one (so torch.manual_seed repeats the order)."""
        if not is_datapipe(self._dataset):
            return None
        torch = _torch()
        return int(torch.empty((), dtype=torch.int64).random_(generator=self._generator))

    def next(self, timeout: float):
        return self._epoch.next(timeout)

    def position(self) -> dict:
        """Where the current epoch stands: each worker's data set state after its last batch
        handed out, which workers' streams ended, and whose turn is next."""
        if not self._stateful:
            raise TypeError(
                f"stoker: cannot save the position in a stream of {type(self._dataset).__name__}"
                f": it has no state_dict()/load_state_dict() (torchdata's Stateful protocol), "
                f"so there is no way to resume it mid-epoch")
        e = self._epoch
        return {"workers": self._workers, "states": list(e.states),
                "ended": [ended or last for ended, last in zip(e.ended, e.last)],
                "cursor": e.cursor}

    def load(self, position: Optional[dict]) -> None:
        if position is not None and not self._stateful:
            raise TypeError(f"stoker: cannot resume a stream of {type(self._dataset).__name__}:"
                            f" it has no load_state_dict()")
        self.pending = position

    def stop(self, wait: bool = False) -> None:
        if self._epoch is not None:
            self._epoch.stop(wait)
            self._epoch = None

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        if self._starting is not None:  # started, never used
            self._starting.stop()
            self._starting = None
        if self._pool is not None:
            self._pool.stop()  # producers waiting on their workers return at once
        self.stop(wait=self._pool is not None)  # they end before the pool closes their sockets
        if self._pool is not None:
            self._pool.finish()
            self._pool = None


# Streams still open at interpreter exit are closed before the interpreter goes (their
# producer threads must not be left inside a call into the extension).
_open_streams: "weakref.WeakSet[Streams]" = weakref.WeakSet()


@atexit.register
def _close_open_streams() -> None:
    for streams in list(_open_streams):
        streams.close()
