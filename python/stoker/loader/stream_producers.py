"""One epoch of a stream (stream_epochs.py's Streams makes one each epoch): a producer per
worker, on a thread of its own, iterating its copy of the data set (worker threads) or asking
its worker process for batches, each into a bounded queue; the training loop takes from the
workers in turn. An epoch read by one worker thread can move in-line mid-epoch (to_inline).
"""

from __future__ import annotations

import copy
import errno
import pickle
import queue
import threading
from typing import Callable, Optional

from .. import _stoker
from ..workers import arena as _arena
from ..workers.jobs import END, StreamJobs, is_datapipe
from ..workers.processes import rebuild_error

# How long a stream worker waits to hand a batch over before it looks whether it was stopped.
_PUT_POLL_S = 0.1

# What an epoch's next() returns after its last batch (None is a batch a collate_fn may make).
EPOCH_END = object()


class _Failure:
    def __init__(self, error: BaseException) -> None:
        self.error = error


class StreamEpoch:
    """One epoch over a stream: a producer per worker fills its own bounded queue, and the
    training loop takes from the workers in turn (round-robin, skipping workers whose stream
    ended), so a deterministic stream gives torch's batches in torch's order.

    Producers run on threads of their own: with worker threads a producer iterates its copy
    of the data set; with worker processes it asks its worker for the batches it made since
    the last request (ProcessPool.call, the GIL released while it waits) and decodes them.
    Nothing here holds the loader, so an abandoned epoch never keeps a loader alive; stop()
    ends it.
    """

    def __init__(self, *, dataset, workers: int, depth: int, collate_fn, batch_size,
                 drop_last: bool, epoch: int, base_seed: int, init: Callable,
                 pool, states: Optional[list], ended: Optional[list], cursor: int,
                 want_state: bool, finish: Callable, seed: Optional[int],
                 loader_epoch: int) -> None:
        self._finish = finish
        self._stop = threading.Event()
        self._reclaim = threading.Event()  # to_inline(): the one worker thread stops
        self._held: list = []  # what that thread made before it stopped, handed out first
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
        while not self._stop.is_set() and not self._reclaim.is_set():
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

    def to_inline(self) -> bool:
        """Moves an epoch read by one worker thread in-line, mid-epoch (auto left a thread's
        trial): the thread stops after the batch it is making, the batches it made are handed
        out first, and then the training loop's thread reads on from the same copy of the
        stream, so the epoch goes on where it was, each batch once. False where it cannot:
        worker processes, or several threads (each holds its share of the stream)."""
        if self.workers != 1 or len(self._jobs) != 1 or self.ended[0]:
            return False
        self._reclaim.set()
        thread, q = self._threads[0], self._queues[0]
        while True:  # what it made, and the batch it was making (it may wait on a full queue)
            try:
                self._held.append(q.get(timeout=0.005))
            except queue.Empty:
                if not thread.is_alive():
                    break
        while not q.empty():
            self._held.append(q.get_nowait())
        self._inline, self.workers = self._jobs[0], 0
        return True

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
            if self._held:  # made by the worker thread before to_inline()
                item = self._held.pop(0)
                if item is END:
                    self.ended[0] = True
                    return EPOCH_END
                if isinstance(item, _Failure):
                    raise item.error
                batch, self.states[0], self.last[0] = item
                return self._finish(batch)
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
