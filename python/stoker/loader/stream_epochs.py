"""Iterable data sets on the training process's side: worker w iterates its own copy of the
data set (on a thread, or in a worker process serving StreamJobs, stoker/workers/jobs.py) and
the training loop takes batches from the workers in turn, as PyTorch's loader does;
docs/architecture.md says why streams are not engine jobs.
"""

from __future__ import annotations

import atexit
import sys
import weakref
from typing import Optional

from ..workers import startup
from ..workers.jobs import is_datapipe
from .stream_producers import StreamEpoch
from .stream_start import BackgroundStart


def _torch():
    return sys.modules.get("torch")


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

    def inline_now(self) -> bool:
        """Read in-line from the next batch on, mid-epoch, where one worker thread reads
        (StreamEpoch.to_inline); False where that cannot be (use_inline at the epoch's end)."""
        if self._epoch is None or self._pool is not None or not self._epoch.to_inline():
            return False
        self._workers, self._processes = 0, None
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
