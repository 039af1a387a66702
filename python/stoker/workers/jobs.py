"""What a worker runs: the jobs of the batch path, where a worker makes a whole batch (the
samples of a batch -> collate_fn, or the next batch of its own stream), where the per-sample
path (python/src/py_dataset.h) writes each sample into its row of a fixed-layout slab.

Map-style data sets with a ``collate_fn``, a ``batch_sampler`` of any batch sizes, or
``batch_size=None`` run on the engine as a data set of *batch jobs* (BatchJobs): engine
"sample" k is batch k of the epoch, one per engine batch, so tickets, in-order delivery,
prefetch, errors in batch order, the error policy, close() and both kinds of worker are the
engine's. Iterable data sets run as streams (StreamJobs, one per worker; the training
process's side is stoker/loader/streams.py). Both are pickled to worker processes by this
module's path; nothing here imports the loader.
"""

from __future__ import annotations

import ctypes
import pickle
import resource
import sys
import time
from typing import TYPE_CHECKING, Callable, Optional

from .. import _stoker
from .startup import asks_worker_info

if TYPE_CHECKING:
    from . import arena as _arena

# Set in worker processes (stoker/workers/main.py): no pinning there, the training process
# reads their batches from shared memory.
in_worker_process = False


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


def user_dataset(dataset):
    """The data set get_worker_info() names: the user's, not the wrapper stoker reads it through
    (a job wrapper, or _torchvision.HybridFolder)."""
    while getattr(type(dataset), "wraps_user_dataset", False):
        dataset = dataset.dataset
    return dataset


class BatchJobs:
    """A map-style data set of batch jobs: item k of epoch e is batch k of that epoch, fetched
    and collated. The loader sets each epoch's batches (`set_epoch`: a list of index lists,
    or of indices with ``batch_size=None``) as it starts, with the next epoch's where they
    could be drawn ahead of it, so that the engine's reads across the epoch boundary are kept;
    a read of an epoch with no batches yet gives None, and is dropped as that epoch starts
    (`kept`). Worker processes get a job's batches with the job (``job_args``), since
    their copy of this object is the one they started with."""

    wraps_user_dataset = True  # user_dataset() unwraps it

    def __init__(self, dataset, collate_fn: Callable, auto_collation: bool, size: int) -> None:
        self.dataset = dataset
        self.collate_fn = collate_fn
        self.auto_collation = auto_collation
        self.size = size
        self._epoch: Optional[int] = None  # the running one
        self._epochs: dict = {}  # epoch -> its batches: the running one's, the next one's
        # Epochs read before their batches were set (each such read gave None): what was read
        # of them is dropped as they start (kept()).
        self._missed: set = set()
        self.job_batches: Optional[dict] = None  # a worker process's current job's batches

    def __len__(self) -> int:
        return self.size

    @property
    def batches(self) -> Optional[list]:
        """The running epoch's batches (None before the first)."""
        return self._epochs.get(self._epoch)

    def kept(self, epoch: int, batches: list) -> bool:
        """Whether what was read of `epoch` so far read `batches` (drawn ahead), else it must
        be dropped. Asked once, as the epoch starts."""
        missed = epoch in self._missed
        self._missed.discard(epoch)
        return not missed and self._epochs.get(epoch) == batches

    def set_epoch(self, epoch: int, batches: list, ahead: Optional[list] = None) -> None:
        """Epoch `epoch` runs now, reading `batches`, and the next reads `ahead` if it was
        drawn ahead (else what is read of it is dropped as it starts); others are dropped."""
        epochs = {epoch: batches}
        if ahead is not None:
            epochs[epoch + 1] = ahead
        self._epoch, self._epochs = epoch, epochs

    def _batches(self, epoch: Optional[int]) -> Optional[list]:
        batches = self._epochs.get(self._epoch if epoch is None else epoch)
        if batches is None:
            self._missed.add(epoch)
        return batches

    def __getitem__(self, k: int):
        if self.job_batches is not None:  # in a worker process: the job's own
            return self.run(k, self.job_batches[k])
        batches = self._batches(_stoker.sample_epoch())
        return self.run(k, batches[k] if batches is not None else None)

    def run(self, k: int, batch):
        if batch is None:  # an epoch whose batches are not drawn yet: dropped as it starts
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

    def call(self, k: int, args: bytes, init_failed: bool, arenas: "_arena.Arenas") -> list:
        """A worker process's warm-up (ProcessPool.call; worker_type='auto' moving a loader to
        processes: warming.py), so that its first jobs pay neither its first batches (the first
        collates, its heap growing) nor the making of its arenas. `args`: (batches, steady,
        hold): the batches are made and written into an arena one after another, each dropped,
        until one takes at most `steady` seconds and touches no new memory (its heap has grown
        to what a batch needs, and is kept: _keep_heap); then `hold` arenas of the largest
        one's size are made ready, one for each batch the worker will have in flight. Returns
        [them, as (fd, inode, size, bytes), for the training process to map ahead
        (arena.fault_in); the least CPU time of this process a batch took to make, its
        hand-over apart, in seconds (None if none was made), from which worker_type='auto'
        decides how many processes to keep (processes_to_keep, src/tune/worker_kind.cc)]. An
        error is the real read's to report."""
        if init_failed:
            return INIT_FAILED
        batches, steady, hold = pickle.loads(args)
        largest, cpu = 0, None
        for batch in batches:
            start, faults, on_cpu = time.perf_counter(), _faults(), time.process_time()
            made = self.run(k, batch)
            if made is not None:
                took = time.process_time() - on_cpu
                cpu = took if cpu is None else min(cpu, took)
                blob = arenas.dumps(made)
                largest = max(largest, arenas.written(blob))
                arenas.discard(blob)
            if time.perf_counter() - start <= steady and _faults() - faults < 16:
                break
        if not largest:
            return [[], cpu]
        if in_worker_process:
            _keep_heap()
        return [arenas.reserve(largest, hold), cpu]

    def job_args(self, ks: list, epoch: int) -> bytes:
        batches = self._batches(epoch)
        return pickle.dumps([batches[k] for k in ks] if batches is not None
                            else [None] * len(ks), protocol=pickle.HIGHEST_PROTOCOL)

    def __getstate__(self):  # pickled for spawn: the epochs' batches travel with the jobs
        return {**self.__dict__, "_epochs": {}, "_missed": set()}


# glibc's mallopt() parameters, and the values it moves them to itself once it has freed an
# array of 32 MiB (DEFAULT_MMAP_THRESHOLD_MAX on 64-bit, and twice that).
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3
_MMAP_THRESHOLD_MAX = 32 << 20


def _keep_heap() -> None:
    """After the warm-up: the heap its batches needed stays this process's. glibc returns free
    memory at the top of the heap to the system, and the warm-up's last batch, freed as it
    ended, was there: a worker's first real batch then faulted its memory in again (padding:
    1,024 faults, 2.9-6.6 ms against 0.5 ms steady; kept, 7 faults and 0.8 ms). Set to what
    glibc's own adjustment reaches (setting them ends it): arrays up to 32 MiB come from the
    heap, which keeps up to 64 MiB free at its top, memory the worker already used. Nothing
    without glibc."""
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return
    mallopt(_M_MMAP_THRESHOLD, _MMAP_THRESHOLD_MAX)
    mallopt(_M_TRIM_THRESHOLD, 2 * _MMAP_THRESHOLD_MAX)


def _faults() -> int:
    """This process's minor page faults so far: memory it touched for the first time."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt


def _summary(batch) -> str:
    if not isinstance(batch, list):
        return str(batch)
    return str(batch) if len(batch) <= 8 else f"[{', '.join(map(str, batch[:8]))}, ...]"


class StreamJobs:
    """One worker's stream: iterates its copy of the data set and forms batches from it, as
    torch's _IterableDatasetFetcher does. In a worker process, ``call`` serves the training
    process's requests (stoker/workers/main.py)."""

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
        self.asked_worker_info = False
        self._watch = False
        # In a worker process (call()): batches made before they were asked for, up to
        # `_ahead` of them.
        self._ready: list = []
        self._want_state = False
        self._ahead = 1

    def begin(self, state, seed: Optional[int] = None, epoch: Optional[int] = None) -> None:
        """A new pass over the stream, from `state` (the data set's state_dict()) if given;
        `seed`: the epoch's seed of an IterDataPipe's shuffle steps; `epoch`: the loader's,
        told to stoker's own streams (their shard order)."""
        if epoch is not None and hasattr(self.dataset, "_stoker_epoch"):
            self.dataset._stoker_epoch(epoch)
        if state is not None:
            self.dataset.load_state_dict(state)
        if is_datapipe(self.dataset):
            self.dataset = _prepare_datapipe(self.dataset, seed)
        # Whether the stream asks get_worker_info() as a pass begins (in its __iter__, or a
        # generator's first step): then it takes its worker's share (worker_type='auto', read
        # in-line, may give it more workers). Its collate is not watched: torch's
        # default_collate asks too.
        self._iterator, self.asked_worker_info = asks_worker_info(lambda: iter(self.dataset))
        self._watch = True
        self._ended = False

    def next_batch(self):
        """The next batch; StopIteration at the end of the stream."""
        if self._ended:
            raise StopIteration
        if self._watch:
            self._watch = False
            samples, asked = asks_worker_info(self._samples)
            self.asked_worker_info = self.asked_worker_info or asked
        else:
            samples = self._samples()
        return self.collate_fn(samples)

    def _samples(self):
        """The next batch's samples (a sample, with batch_size=None)."""
        if self.batch_size is None:
            return next(self._iterator)
        samples = []
        for _ in range(self.batch_size):
            try:
                samples.append(next(self._iterator))
            except StopIteration:
                self._ended = True
                break
        if not samples or (self.drop_last and len(samples) < self.batch_size):
            raise StopIteration
        return samples

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
        reports that error) and the stream ends there. An empty `args` asks whether the
        worker is up (a stream's processes started in the background): [] at once."""
        if not args:
            return []
        state, self._want_state, self._ahead, seed, loader_epoch = pickle.loads(args)
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
            self.begin(state, seed, loader_epoch)
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
