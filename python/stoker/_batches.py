"""The batch path: a worker makes a whole batch (the samples of a batch -> collate_fn, or the
next batch of its own stream), where the per-sample path (python/src/py_dataset.h) writes
each sample into its row of a fixed-layout slab.

Map-style data sets with a ``collate_fn``, a ``batch_sampler`` of any batch sizes, or
``batch_size=None`` run on the engine as a data set of *batch jobs* (BatchJobs): engine
"sample" k is batch k of the epoch, one per engine batch, so tickets, in-order delivery,
prefetch, errors in batch order, the error policy, close() and both kinds of worker are the
engine's. Iterable data sets run as streams (StreamEpoch): worker w iterates its own copy of
the data set and the training loop takes batches from the workers in turn, as PyTorch's
loader does; docs/architecture.md says why streams are not engine jobs.
"""

from __future__ import annotations

import atexit
import copy
import errno
import itertools
import pickle
import queue
import sys
import threading
import weakref
from typing import Callable, Optional

from . import _arena, _stoker, _workers

# Set in worker processes (python/stoker/_worker.py): no pinning there, the training process
# reads their batches from shared memory.
in_worker_process = False

# How long a stream worker waits to hand a batch over before it looks whether it was stopped.
_PUT_POLL_S = 0.1


def _torch():
    return sys.modules.get("torch")


def is_stream(dataset) -> bool:
    """An iterable-style data set: torch's IterableDataset, or iterable without __getitem__."""
    torch = _torch()
    if torch is not None and isinstance(dataset, torch.utils.data.IterableDataset):
        return True
    return hasattr(dataset, "__iter__") and not hasattr(dataset, "__getitem__")


def is_datapipe(dataset) -> bool:
    """A torch IterDataPipe: torch's loader shuffles, seeds and shards its graph itself."""
    torch = _torch()
    return torch is not None and isinstance(dataset, torch.utils.data.IterDataPipe)


def _prepare_datapipe(dataset, seed: Optional[int]):
    """What torch's loader does to an IterDataPipe before a worker iterates it: shards it over
    every worker of every rank (its sharding_filter steps keep this worker's share) and seeds
    its shuffle steps with the epoch's seed, which all workers share."""
    from torch.utils.data import get_worker_info, graph_settings

    torch = _torch()
    info = get_worker_info()
    worker, workers = (info.id, info.num_workers) if info is not None else (0, 1)
    dist = torch.distributed
    world, rank = ((dist.get_world_size(), dist.get_rank())
                   if dist.is_available() and dist.is_initialized() else (1, 0))
    graph_settings.apply_sharding(dataset, workers * world, worker * world + rank)
    if seed is not None:
        dataset = graph_settings.apply_random_seed(dataset, torch.Generator().manual_seed(seed))
    return dataset


def default_collate(auto_collation: bool) -> Callable:
    """torch's default_collate (batches) or default_convert (batch_size=None)."""
    torch = _torch()
    if torch is None:
        raise TypeError("stoker: batching without torch needs a collate_fn")
    return _default_collate if auto_collation else torch.utils.data.default_convert


def _default_collate(batch):
    """torch's default_collate, except where it stacks a batch's tensors: in a worker, torch's
    stacks them into a new shared-memory segment per batch (the way its workers hand batches
    over); stoker's hand them over otherwise, so this stacks them into ordinary memory."""
    global _collate_fn_map
    from torch.utils.data._utils import collate

    if _collate_fn_map is None:
        _collate_fn_map = {**collate.default_collate_fn_map, _torch().Tensor: _stack}
    return collate.collate(batch, collate_fn_map=_collate_fn_map)


_collate_fn_map = None


def _stack(batch, *, collate_fn_map=None):
    torch = _torch()
    if batch[0].is_nested or batch[0].layout != torch.strided:  # torch's errors
        from torch.utils.data._utils import collate

        return collate.collate_tensor_fn(batch, collate_fn_map=collate_fn_map)
    return torch.stack(batch, 0)


def user_dataset(dataset):
    """The data set get_worker_info() names: the user's, not the wrapper stoker reads it through
    (a job wrapper, or _torchvision.HybridFolder)."""
    return dataset.dataset if getattr(type(dataset), "wraps_user_dataset", False) else dataset


class BatchJobs:
    """A map-style data set of batch jobs: item k is batch k of the current epoch, fetched
    and collated. ``batches`` is set for each epoch by the loader (a list of index lists, or
    of indices with ``batch_size=None``); worker processes get a job's batches with the job
    (``job_args``), since their copy of this object is the one they started with."""

    wraps_user_dataset = True  # user_dataset() unwraps it

    def __init__(self, dataset, collate_fn: Callable, auto_collation: bool, size: int) -> None:
        self.dataset = dataset
        self.collate_fn = collate_fn
        self.auto_collation = auto_collation
        self.size = size
        self.batches: Optional[list] = None
        self.job_batches: Optional[dict] = None  # a worker process's current job's batches

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, k: int):
        if self.job_batches is not None:  # in a worker process: the job's own
            return self.run(k, self.job_batches[k])
        return self.run(k, self.batches[k] if self.batches is not None else None)

    def run(self, k: int, batch):
        if batch is None:  # read ahead before the first epoch: dropped at iter()
            return None
        try:
            if not self.auto_collation:
                return self.collate_fn(self.dataset[batch])
            getitems = getattr(self.dataset, "__getitems__", None)
            samples = getitems(batch) if getitems is not None else [self.dataset[i] for i in batch]
            return self.collate_fn(samples)
        except Exception as e:
            e.add_note(f"stoker: in batch {k}, samples {_summary(batch)}")
            raise

    def job_args(self, ks: list) -> bytes:
        return pickle.dumps([self.batches[k] for k in ks] if self.batches is not None
                            else [None] * len(ks), protocol=pickle.HIGHEST_PROTOCOL)

    def __getstate__(self):  # pickled for spawn: the epoch's batches travel with the jobs
        return {**self.__dict__, "batches": None}


def _summary(batch) -> str:
    if not isinstance(batch, list):
        return str(batch)
    return str(batch) if len(batch) <= 8 else f"[{', '.join(map(str, batch[:8]))}, ...]"


class StreamJobs:
    """One worker's stream: iterates its copy of the data set and forms batches from it, as
    torch's _IterableDatasetFetcher does. In a worker process, ``call`` serves the training
    process's requests (python/stoker/_worker.py)."""

    wraps_user_dataset = True  # user_dataset() unwraps it

    def __init__(self, dataset, collate_fn: Callable, batch_size: Optional[int],
                 drop_last: bool) -> None:
        self.dataset = dataset
        self.collate_fn = collate_fn
        self.batch_size = batch_size
        self.drop_last = drop_last
        self._epoch = -1
        self._iterator = None
        self._ended = False
        # In a worker process (call()): batches made before they were asked for, up to
        # `_ahead` of them.
        self._ready: list = []
        self._want_state = False
        self._ahead = 1

    def begin(self, state, seed: Optional[int] = None) -> None:
        """A new pass over the stream, from `state` (the data set's state_dict()) if given;
        `seed`: the epoch's seed of an IterDataPipe's shuffle steps."""
        if state is not None:
            self.dataset.load_state_dict(state)
        if is_datapipe(self.dataset):
            self.dataset = _prepare_datapipe(self.dataset, seed)
        self._iterator = iter(self.dataset)
        self._ended = False

    def next_batch(self):
        """The next batch; StopIteration at the end of the stream."""
        if self._ended:
            raise StopIteration
        if self.batch_size is None:
            return self.collate_fn(next(self._iterator))
        samples = []
        for _ in range(self.batch_size):
            try:
                samples.append(next(self._iterator))
            except StopIteration:
                self._ended = True
                break
        if not samples or (self.drop_last and len(samples) < self.batch_size):
            raise StopIteration
        return self.collate_fn(samples)

    @property
    def exhausted(self) -> bool:
        """Whether the pass over the stream has ended (maybe while making the last batch)."""
        return self._ended

    def state(self):
        return self.dataset.state_dict() if hasattr(self.dataset, "state_dict") else None

    def call(self, epoch: int, args: bytes, init_failed: bool,
             arenas: "_arena.Arenas") -> list:
        """A worker process's request for the next batches of epoch `epoch`: the ones made
        since the last request (prepare()), else the next one; each item a batch as
        `arenas.dumps` made it of (batch, the data set's state after it), an exception, or
        END. The first request of an epoch starts the pass (from the state in `args`).
        Requests of an older epoch (an abandoned one's last) get [END]. If the worker's
        worker_init_fn failed, the first request of an epoch gets INIT_FAILED (the worker
        reports that error) and the stream ends there."""
        state, self._want_state, self._ahead, seed = pickle.loads(args)
        if epoch < self._epoch:
            return [END]
        if epoch > self._epoch:
            for item in self._ready:  # made for an abandoned epoch: nobody takes them
                if isinstance(item, bytes):
                    arenas.discard(item)
            self._ready = []
            self._epoch = epoch
            self._ended = True  # until the pass has begun: an error here ends the stream
            if init_failed:
                return INIT_FAILED
            self.begin(state, seed)
        if not self._ready:
            self._ready.append(self._make(arenas))
        items, self._ready = self._ready, []
        return items

    def prepare(self, arenas: "_arena.Arenas") -> bool:
        """Makes one more batch for the next request, if fewer than `ahead` wait and the
        stream goes on; whether it made one. The worker calls it between requests, so it
        works while the training process takes its batches and asks again, and a reply
        carries every batch made meanwhile (one round trip for several batches when the
        training process is slow to ask)."""
        if (self._epoch < 0 or len(self._ready) >= self._ahead
                or (self._ready and self._ready[-1] is END)):
            return False
        self._ready.append(self._make(arenas))
        return True

    def _make(self, arenas: "_arena.Arenas"):
        """The next batch dumped into an arena, END, or the exception that made it fail."""
        try:
            batch = self.next_batch()
            return arenas.dumps((batch, self.state() if self._want_state else None,
                                 self._ended))
        except StopIteration:
            return END
        except Exception as e:  # reported in turn; the stream goes on, as torch's
            return e


class _End:
    """The end of a worker's stream."""

    def __reduce__(self):
        return "END"


END = _End()
# What an epoch's next() returns after its last batch (None is a batch a collate_fn may make).
EPOCH_END = object()
INIT_FAILED = object()


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
                 want_state: bool, finish: Callable, seed: Optional[int]) -> None:
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
        if workers == 0:  # the calling thread iterates (worker info stays None, as in torch)
            self._inline = StreamJobs(dataset, collate_fn, batch_size, drop_last)
            self._inline.begin(self.states[0], seed)
            return
        self._queues = [queue.Queue(maxsize=depth) for _ in range(workers)]
        self._threads = []
        for w in range(workers):
            if self.ended[w]:
                continue
            if pool is not None:
                args = pickle.dumps((self.states[w], want_state, depth, seed),
                                    protocol=pickle.HIGHEST_PROTOCOL)
                target, extra = self._ask_process, (pool, epoch, args)
            else:
                jobs = StreamJobs(_own_copy(dataset), collate_fn, batch_size, drop_last)
                target, extra = self._iterate, (jobs, base_seed, init, self.states[w], seed)
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

    def _iterate(self, w: int, jobs: StreamJobs, base_seed: int, init, state, seed) -> None:
        init(w, jobs.dataset, self.workers, base_seed)  # an error ends the stream (_produce)
        jobs.begin(state, seed)
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

    def _ask_process(self, w: int, pool, epoch: int, args: bytes) -> None:
        while not self._stop.is_set():
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
                items = ([_Failure(_workers.rebuild_error(errors[0][1], _where(w, pid)))]
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


def _where(w: int, pid: int) -> str:
    return f"stoker: raised in DataLoader worker process {w} (pid {pid}) while reading its stream"


def _from_worker(item, w: int, pid: int):
    """One item of a stream worker's reply (_worker._run_call), as the queue holds it."""
    if isinstance(item, bytes):
        return _arena.loads(item, pid)
    if isinstance(item, tuple):  # ("error", the worker's exception info)
        return _Failure(_workers.rebuild_error(item[1], _where(w, pid)))
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


def split_by_rank(iterable, rank: Optional[int] = None, world_size: Optional[int] = None):
    """Items ``rank, rank + world_size, ...`` of `iterable`: one rank's share of a stream under
    DistributedDataParallel. `rank` and `world_size` default to torch.distributed's, or to the
    RANK and WORLD_SIZE that torchrun sets (stoker.world())."""
    from ._distributed import world

    if rank is None or world_size is None:
        rank, world_size = world()
    return itertools.islice(iterable, rank, None, world_size)


def split_by_worker(iterable):
    """Items ``id, id + num_workers, ...`` of `iterable` in a DataLoader worker (per
    torch.utils.data.get_worker_info()); all of them outside one."""
    torch = _torch()
    info = torch.utils.data.get_worker_info() if torch is not None else None
    if info is None:
        return iter(iterable)
    return itertools.islice(iterable, info.id, None, info.num_workers)


class Streams:
    """An iterable data set's loader state across epochs: its workers (threads, or processes
    that persist across epochs), the current epoch, and a position to resume from."""

    def __init__(self, *, dataset, workers: int, depth: int, collate_fn, batch_size,
                 drop_last: bool, base_seed: int, worker_init_fn, processes, finish,
                 generator=None) -> None:
        self._dataset = dataset
        self._generator = generator  # an IterDataPipe's seed for each epoch is drawn from it
        self._workers = workers
        self._depth = depth
        self._collate_fn = collate_fn
        self._batch_size = batch_size
        self._drop_last = drop_last
        self._base_seed = base_seed
        self._worker_init_fn = worker_init_fn
        self._finish = finish
        self._stateful = (hasattr(dataset, "state_dict") and hasattr(dataset, "load_state_dict"))
        self._pool = None
        self._epoch: Optional[StreamEpoch] = None
        self.pending: Optional[dict] = None  # a loaded position, for the next start()
        # Passes started: worker processes tell a new pass from an abandoned one's last
        # requests by it (whatever epoch numbers set_epoch() gives).
        self._passes = 0
        self.closed = False
        _open_streams.add(self)
        if processes is not None:  # ProcessWorkers over this stream's jobs
            self._pool = processes.make_pool()
            self._pool.start()

    def pids(self) -> list:
        return list(self._pool.pids()) if self._pool is not None else []

    def __len__(self) -> int:
        length = len(self._dataset)  # TypeError without __len__, as torch
        if self._batch_size is None:
            return length
        if self._drop_last:
            return length // self._batch_size
        return -(-length // self._batch_size)

    def _init_thread(self, w: int, dataset, workers: int, base_seed: int) -> None:
        _workers.set_thread_worker_info(w, workers, base_seed + w, dataset)
        if self._worker_init_fn is not None:
            self._worker_init_fn(w)

    def start(self) -> None:
        """Starts the next pass over the stream (a new epoch)."""
        if self.closed:
            raise RuntimeError("stoker: the DataLoader is closed")
        self.stop()
        self._passes += 1
        pending, self.pending = self.pending, None
        if pending is not None and pending["workers"] != self._workers:
            raise ValueError(f"stoker: the state is for a stream read by {pending['workers']} "
                             f"workers, this loader has {self._workers}")
        self._epoch = StreamEpoch(
            dataset=self._dataset, workers=self._workers, depth=self._depth,
            collate_fn=self._collate_fn, batch_size=self._batch_size,
            drop_last=self._drop_last, epoch=self._passes, base_seed=self._base_seed,
            init=self._init_thread, pool=self._pool,
            states=pending and pending["states"], ended=pending and pending["ended"],
            cursor=pending["cursor"] if pending else 0, want_state=self._stateful,
            finish=self._finish, seed=self._epoch_seed())

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


def mover(device: str, pin: bool) -> Callable:
    """What a batch path's batch goes through in the training loop: its tensors (in any
    nesting) moved to `device` ('cuda[:N]'); a batch for the CPU as it is. With `pin` (set
    where a GPU reads the batches) worker threads pin the collate output first (pinned()), so
    the copy is an asynchronous DMA."""
    if not device.startswith("cuda"):
        return lambda batch: batch
    torch = _torch()
    target = torch.device(device)
    return lambda batch: _tree_map(
        batch, lambda t: t.to(target, non_blocking=pin and t.is_pinned()))


def pinned(collate_fn: Callable) -> Callable:
    """collate_fn, its tensors then copied into pinned memory by the worker thread that made
    them (not in worker processes: their batches are in shared memory)."""
    def collate(samples):
        batch = collate_fn(samples)
        return batch if in_worker_process else _tree_map(batch, lambda t: t.pin_memory())
    return collate


def _tree_map(obj, fn: Callable):
    torch = _torch()
    if isinstance(obj, torch.Tensor):
        return fn(obj)
    if isinstance(obj, tuple) and hasattr(obj, "_fields"):
        return type(obj)(*(_tree_map(x, fn) for x in obj))
    if isinstance(obj, (list, tuple)):
        return type(obj)(_tree_map(x, fn) for x in obj)
    if isinstance(obj, dict):
        values = {k: _tree_map(v, fn) for k, v in obj.items()}
        try:
            return values if type(obj) is dict else type(obj)(values)
        except TypeError:
            return values
    return obj
