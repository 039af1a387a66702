"""stoker.DataLoader: torch.utils.data.DataLoader's arguments, on stoker's C++ engine."""

from __future__ import annotations

import contextlib
import copy
import logging
import os
import sys
import time
import types
import warnings
import weakref
from typing import Any, Callable, Iterator, NamedTuple, Optional, Sequence, Union

from . import _batches, _compat, _remote, _stoker
from ._batch import converter, plan
from ._cuda import cuda_available
from ._datasets import NativeDataset
from ._distributed import DistributedSampler
from ._torchvision import hybrid_equivalent, native_equivalent
from ._workers import ProcessWorkers, mp_context, thread_worker_start

_log = logging.getLogger("stoker")

# worker_type='auto' measures reads from the first batch handed out (the start-up is left
# out) over at least this many more batches and samples: long enough for the threads to meet
# at the GIL, short next to an epoch.
_AUTO_MIN_BATCHES = 3
_AUTO_MIN_READS = 16
# The reads keep the GIL busy (CPU time of the worker threads while they hold it, over wall
# time) for at least this share of the time, and not much more than all of it: GIL-bound.
# Pure-Python __getitem__s on two threads keep it busy ~95% of the time (measured on a 2-core
# machine), cheap Python samples ~40-60% (the training loop's thread takes the rest); one that
# sleeps or waits for I/O ~1-3%; one whose work releases the GIL (numpy, PIL, torch ops) runs
# on several cores at once, so its threads' CPU time exceeds the wall time.
# Other processes competing for the cores take CPU time, not GIL time: a thread that holds the
# GIL while it waits for a core keeps the others out all the same. So the lower bound is
# checked on the CPU time scaled by the share of their runnable time the reading threads got a
# core (CPU time plus run-queue delay, Stats::worker_run_delay, over CPU time): unscaled, a
# pure-Python read on two threads measured ~50% at a load average of 3.5 on 2 cores and
# 12-17% with 10-14 other sessions spinning (load 4-13), below the threshold.
# The scale overstates (threads woken to take the GIL wait for a core too) and is at most
# _AUTO_LOAD_SCALE (the tuner's kRunDelayScale, src/tune/tuner.h): a sleeper's reads wait for
# a core after each wake-up, and the scale must not make their 1-5% look like a busy GIL; at
# 6 both stay on their side of the threshold down to and up to 6.7% unscaled. Load only ever
# lowers the unscaled share, so the upper bound (work in parallel) is checked on it.
# The batch path (collate_fn, batch_sampler, batch_size=None) has no upper bound: a batch job
# runs Python between its native calls (the fetch loop, the collate's walk of the samples)
# and a process adds only a streamed copy of the batch into its arena, so work that releases
# the GIL is no reason to stay on threads there. Processes against threads, side by side on
# 2 cores (bench/worker_kinds.py): a padding collate (its reads busy 0.8-1.4 of the wall
# time) 2.0x, per-sample randn stacked (1.06) 1.7x, a tensor indexed and stacked (0.25) 1.2x.
_AUTO_GIL_BUSY = 0.4
_AUTO_GIL_PARALLEL = 1.25
_AUTO_LOAD_SCALE = 6.0

# num_workers='auto' starts with one worker per core of this rank's share and lets the
# engine's tuner move the count and the batches in flight both ways (src/tune/tuner.h): many
# workers at a time when they mostly wait (a Python __getitem__ on files, sleeps, or torch ops
# that release the GIL), up to the CPU budget when they compute, fewer when they sit idle.
_AUTO_MAX_WORKERS_NATIVE_PER_CORE = 8
_AUTO_MAX_WORKERS_PYTHON = 32


class SkippedSample(NamedTuple):
    """A sample that failed under on_error='skip' (DataLoader.skipped_samples())."""
    index: int  # in the data set
    name: str  # a file path or record, where the data set has one; else ''
    reason: str  # the exception, as its first failure raised it


def _sample_name(dataset, index: int) -> str:
    """torchvision's DatasetFolder convention: ``samples[i]`` is ``(path, class)``."""
    samples = getattr(dataset, "samples", None)
    try:
        path = samples[index][0]
    except Exception:  # not that convention
        return ""
    return path if isinstance(path, str) else ""


def _gil_bound(busy: float, on_cpu: float, delayed: float,
               whole_batches: bool = False) -> tuple[bool, float]:
    """Whether reads that kept the GIL busy `busy` of the wall time (its CPU time over wall
    time) are GIL-bound, given the worker threads' CPU time `on_cpu` and run-queue delay
    `delayed` over the same time; and the scale applied for that delay. `whole_batches`:
    the reads are batch jobs (no upper bound)."""
    scale = min(_AUTO_LOAD_SCALE, (on_cpu + delayed) / on_cpu) if on_cpu > 0 else 1.0
    parallel = busy > _AUTO_GIL_PARALLEL and not whole_batches
    return _AUTO_GIL_BUSY <= scale * busy and not parallel, scale


def _cores() -> int:
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return max(1, cores or 1)


def _cpu_share() -> int:
    """This rank's cores: ranks that torchrun started on one node (LOCAL_WORLD_SIZE) divide
    them among themselves, as the engine's CPU budget does (src/tune/tuner.h)."""
    try:
        ranks = max(1, int(os.environ.get("LOCAL_WORLD_SIZE", "1")))
    except ValueError:
        ranks = 1
    return max(1, _cores() // ranks)


def _draw_seed(generator) -> int:
    """A 63-bit base seed, drawn like torch's samplers draw theirs: from `generator`, or from
    torch's default generator (so torch.manual_seed makes runs repeat), or at random."""
    torch = sys.modules.get("torch")
    if torch is not None:
        t = torch.empty((), dtype=torch.int64).random_(generator=generator)
        return int(t.item()) & ((1 << 63) - 1)
    if generator is not None:
        raise TypeError("generator= needs torch")
    return int.from_bytes(os.urandom(8), "little") >> 1


def _options(**fields) -> "_stoker.LoaderOptions":
    """stoker::LoaderOptions (include/stoker/options.h), field by field."""
    options = _stoker.LoaderOptions()
    for name, value in fields.items():
        setattr(options, name, value)
    return options


def _shard(rank: int, world_size: int, drop_last: bool) -> "_stoker.Shard":
    shard = _stoker.Shard()
    shard.rank, shard.world_size, shard.drop_last = rank, world_size, drop_last
    return shard


def _enum(enum, option: str, value: str):
    """The C++ enum value named `value`, or ValueError naming the choices."""
    members = enum.__members__
    if value not in members:
        choices = list(members)
        names = ", ".join(f"'{c}'" for c in choices[:-1]) + f" or '{choices[-1]}'"
        raise ValueError(f"stoker: {option} must be {names}, not '{value}'")
    return members[value]


def _is_torch_batch_sampler(batch_sampler) -> bool:
    torch = sys.modules.get("torch")
    return torch is not None and type(batch_sampler) is torch.utils.data.BatchSampler


def _length(sampler) -> int:
    """len(sampler), or its length by iterating a copy of it (a sampler without __len__: the
    sampler itself is left as it was, so that a seeded one's first epoch is still its first)."""
    try:
        return len(sampler)
    except TypeError:
        pass
    try:
        probe = copy.deepcopy(sampler)
    except Exception:  # a sampler that does not copy (it holds a lock, a file) is read itself
        probe = sampler
    return sum(1 for _ in probe)


def _torch_sampler_kind(sampler) -> Optional[str]:
    """'sequential', 'random', 'distributed' for torch's own samplers stoker runs natively."""
    torch = sys.modules.get("torch")
    if torch is None:
        return None
    data = torch.utils.data
    if type(sampler) is data.SequentialSampler:
        return "sequential"
    if (type(sampler) is data.RandomSampler and not sampler.replacement
            and sampler._num_samples is None):
        return "random"
    if type(sampler) is data.distributed.DistributedSampler:
        return "distributed"
    return None


class DataLoader:
    """A data loader with torch.utils.data.DataLoader's arguments and meanings, on stoker's
    C++ engine: worker threads write each sample straight into its slot of a recycled batch
    buffer (pinned when it pays), and batches reach PyTorch as tensors without a copy.

    Differences from torch's, all in the user's favour or stated here:
      num_workers: workers. 'auto' (default) starts with one thread per core (of this rank's
        share of the node under torchrun) and tunes the count and the batches in flight
        online, both ways, within a CPU and a memory budget (no grid search); with worker
        processes, one per core of the share. 0 reads on the training loop's thread. A fixed
        count whose training loop waits is told once in the log what 'auto' would do. An
        iterable data set's 'auto' is one worker (each worker iterates its own copy).
      worker_type: 'auto' (default) starts on threads and moves to worker processes when the
        first batches show reads that keep the GIL busy (pure-Python __getitem__; on the
        batch path, with a collate_fn or batch_sampler, reads that compute at all); 'thread'
        or 'process' to choose. Processes write samples straight into shared batch buffers
        (only indices, small objects and errors are pickled); multiprocessing_context picks
        how they start (fork by default on Linux). stats() says which and why.
      pin_memory: 'auto' (default) pins batch buffers when batches go to a GPU, within a
        budget (``pin_budget`` bytes, default a quarter of available memory).
      device: None (batches on the CPU) or 'cuda[:N]': batches arrive already on the GPU,
        copied on a side stream while the previous batch trains (the "data prefetcher"), with
        the current stream made to wait for the copy. Falls back to the CPU, with one log line,
        where no GPU answers.
      persistent_workers: workers always persist (and the next epoch is prefetched); None
        (default) is torch's False without the warning that an explicit False gives worker
        processes.
      prefetch_factor: batches in flight are ``prefetch_factor * max(1, num_workers)``.
      on_error: 'raise' (default) raises a failed sample's exception, with its type and
        traceback and a note naming the sample; 'skip' replaces the sample with another one
        (up to ``max_skipped`` over the loader's life) and goes on.
      native: torchvision's ImageFolder (or DatasetFolder with its default loader) whose
        transform stoker implements (RandomResizedCrop, RandomHorizontalFlip, Resize,
        CenterCrop, ToTensor, Normalize, PILToTensor) is read and transformed in C++, with
        stoker's own random draws. With steps stoker does not implement, the pipeline's
        native head (decode and crop, flip) and tail (ToTensor + Normalize) run in C++ and
        only the other steps in Python, in the workers. native=False runs it all in Python.
        stats()["pipeline"] says which path ran and why.
      keep_on_host: names of fields that stay in host memory when batches go to a GPU.
      remote: ``stoker.ray_workers(n, ...)`` adds n Ray actors, anywhere in a Ray cluster,
        as workers that take the excess of a map-style data set's reads (samples, or whole
        batches with a collate_fn or batch sampler); the batches stay exactly those of a
        local loader, in order; the ranks of a torchrun job share the actors; a lost one is
        replaced (docs/remote.md).
      collate_fn, batch_sampler (any iterable of index lists), batch_size=None and
        iterable data sets: each batch is made whole by a worker (fetch and collate_fn, or
        the next batch of that worker's stream), in parallel, and handed to the training
        loop without pickling its tensors. Arguments that do not act as in torch warn once; docs/python.md
        lists every difference.

    ``trace("run.json")`` (or ``with loader.tracing("run.json"):``) records where the time
    goes, as a timeline to open in Perfetto.

    Epochs: each ``iter(loader)`` starts the next epoch (or the sampler's ``set_epoch`` one);
    ``state_dict()`` / ``load_state_dict()`` save and restore the position mid-epoch, and
    restoring yields exactly the batches that were still to come.
    """

    def __init__(
        self,
        dataset,
        batch_size: Optional[int] = 1,
        shuffle: Optional[bool] = None,
        sampler=None,
        batch_sampler=None,
        num_workers: Union[int, str] = "auto",
        collate_fn: Optional[Callable] = None,
        pin_memory: Union[bool, str] = "auto",
        drop_last: bool = False,
        timeout: float = 0,
        worker_init_fn: Optional[Callable[[int], None]] = None,
        multiprocessing_context=None,
        generator=None,
        *,
        prefetch_factor: Optional[int] = None,
        persistent_workers: Optional[bool] = None,
        pin_memory_device: str = "",
        in_order: bool = True,
        device=None,
        on_error: str = "raise",
        max_skipped: int = 1000,
        seed: Optional[int] = None,
        pin_budget: int = 0,
        device_depth: int = 2,
        worker_type: str = "auto",
        native: bool = True,
        keep_on_host: Sequence[str] = (),
        remote=None,
    ) -> None:
        _compat.check_arguments(
            num_workers=num_workers, timeout=timeout, prefetch_factor=prefetch_factor,
            persistent_workers=persistent_workers, sampler=sampler, shuffle=shuffle,
            batch_sampler=batch_sampler, batch_size=batch_size, drop_last=drop_last)
        torch_arguments = dict(batch_size=batch_size, shuffle=shuffle,
                               sampler=sampler, batch_sampler=batch_sampler,
                               drop_last=drop_last, generator=generator, collate_fn=collate_fn,
                               prefetch_factor=prefetch_factor)
        # stoker's own arguments as given, also public, so that the loader can be made again
        # from its attributes (as Lightning does to add a DistributedSampler).
        stoker_arguments = dict(
            worker_init_fn=worker_init_fn, pin_memory=pin_memory,
            persistent_workers=bool(persistent_workers), pin_memory_device=pin_memory_device,
            in_order=in_order, device=device, on_error=on_error, max_skipped=max_skipped,
            pin_budget=pin_budget, device_depth=device_depth, native=native,
            keep_on_host=keep_on_host, remote=remote)
        if collate_fn is not None and collate_fn is _compat.default_collate():
            collate_fn = None  # stoker's own batching is default_collate's
        self._streams = None
        self._stream_len = None  # a stream's len(dataset) when len(loader) was last asked
        self._jobs = None
        self._remote = None
        self._samples = None  # the map-style data set's length when the loader was made
        if remote is not None and _batches.is_stream(dataset):
            raise ValueError("stoker: remote workers read map-style data sets (samples, or "
                             "batches with a collate_fn or batch sampler); streams run on "
                             "local workers only")
        if _batches.is_stream(dataset):
            self._init_stream(dataset, batch_size, shuffle, sampler, batch_sampler, num_workers,
                              collate_fn, pin_memory, drop_last, timeout, worker_init_fn,
                              multiprocessing_context, generator, prefetch_factor, device,
                              worker_type)
            for name, value in stoker_arguments.items():
                setattr(self, name, value)
            self.generator = generator
            self._initialized = True
            return
        if collate_fn is not None or batch_size is None or (
                batch_sampler is not None and not _is_torch_batch_sampler(batch_sampler)):
            # The batch path: the engine runs batch jobs (python/stoker/_batches.py), one per
            # engine batch; the user's arguments are kept for the attributes below.
            user = (dataset, batch_size, shuffle, sampler, batch_sampler, drop_last, collate_fn)
            self._jobs = self._batch_jobs(dataset, batch_size, shuffle, sampler, batch_sampler,
                                          drop_last, collate_fn)
            dataset, batch_size, shuffle, sampler, batch_sampler, drop_last, collate_fn = (
                self._jobs, 1, None, None, None, False, None)
        if batch_sampler is not None:
            batch_size, sampler, drop_last = self._unwrap_batch_sampler(batch_sampler)
        if batch_size is None:
            raise ValueError("stoker batches samples: batch_size=None is not supported")

        self.dataset = dataset
        self._sampler = sampler  # the one the engine follows (torch's `sampler` may differ)
        self.timeout = timeout  # as given, as torch keeps it (its timeout message prints it)
        self._epoch = 0  # the next epoch iter() starts, without a sampler that says
        self._resume: Optional[tuple[int, int]] = None
        # The current iterator, held weakly: it holds the loader, and a reference cycle would
        # leave loaders to the cyclic garbage collector, which runs on whatever thread happens
        # to allocate (possibly a worker of this loader).
        self._iterator = None

        # torchvision's ImageFolder with a pipeline stoker implements runs in C++ (native=False
        # opts out); what ran, and why, is in stats()["pipeline"].
        self._pipeline = f"python: {type(dataset).__name__}.__getitem__ in workers"
        if self._jobs is not None:
            self._pipeline = (f"python: batches of {type(self._jobs.dataset).__name__}, "
                              f"fetched and collated in workers")
        elif isinstance(dataset, NativeDataset):
            self._pipeline = "native: a stoker data set"
        elif native and collate_fn is None:
            equivalent, why = native_equivalent(dataset)
            if equivalent is not None:
                self._pipeline, dataset = f"native: {why}", equivalent
            elif why != "not a torchvision data set":
                # The ends of the pipeline that stoker implements run natively, the rest in
                # Python, in workers.
                hybrid, hybrid_why = hybrid_equivalent(dataset)
                if hybrid is not None:
                    self._pipeline, dataset = f"python: {hybrid_why} ({why})", hybrid
                else:
                    self._pipeline += f" ({why})"
        native = isinstance(dataset, NativeDataset)
        if remote is not None and native:
            # Served through its __getitem__ (the same C++ read, with the sample's seed), by
            # the local workers too: one more copy per sample than the native path.
            native = False
            self._pipeline += " (read through __getitem__, on local and remote workers)"
        if native and collate_fn is not None:
            raise ValueError("collate_fn works with Python data sets; a native data set's "
                             "batches are already tensors")
        if worker_type not in ("auto", "thread", "process"):
            raise ValueError(f"worker_type must be 'auto', 'thread' or 'process', not "
                             f"{worker_type!r}")
        workers_given = num_workers != "auto"
        # The engine's tuner counts threads: with remote workers the local count stays fixed
        # and, with 'auto', the loader asks for remote workers itself (_tune_remote).
        tune = num_workers == "auto" and remote is None
        self._remote_auto = num_workers == "auto" and remote is not None
        self._remote_last: Optional[dict] = None
        self._remote_batches = 0
        remote_count = remote.count if remote is not None else 0
        max_workers = 0
        if num_workers == "auto":
            num_workers = _cpu_share()
        if tune:
            max_workers = (max(16, _AUTO_MAX_WORKERS_NATIVE_PER_CORE * _cpu_share()) if native
                           else max(_AUTO_MAX_WORKERS_PYTHON, _cpu_share()))
        self.num_workers = int(num_workers)
        self.multiprocessing_context = multiprocessing_context  # checked as torch checks it
        depth = (2 if not prefetch_factor else int(prefetch_factor)) * max(
            1, self.num_workers + _remote.SLOTS * remote_count)

        # Which samples, in which order: natively (sequential, random, sharded), or a custom
        # sampler's order read at the start of each epoch.
        rank, world, shard_drop_last, order = 0, 1, False, None
        seed_given = seed is not None
        self._shuffle = bool(shuffle)
        kind = "distributed" if isinstance(sampler, DistributedSampler) else (
            _torch_sampler_kind(sampler) if sampler is not None else None)
        if kind == "distributed":
            rank, world = sampler.rank, sampler.num_replicas
            shard_drop_last, self._shuffle = sampler.drop_last, sampler.shuffle
            seed, seed_given = sampler.seed, True
        elif kind == "random":
            self._shuffle = True
            generator = sampler.generator if sampler.generator is not None else generator
        elif kind is None and sampler is not None:
            # A custom sampler is read when each epoch starts, once, as torch reads it; until
            # then the engine has as many positions (and reads nothing). A sampler may be
            # longer than the data set (replacement, num_samples): placeholders are sample 0.
            order = [0] * _length(sampler)
        self.seed = int(seed) if seed_given else (_draw_seed(generator) if self._shuffle else 0)

        # PyTorch's base seed of the workers: worker i is seeded with base + i.
        self._worker_seed = _draw_seed(generator) if not native else 0
        self._workers: Optional[ProcessWorkers] = None
        self._pool = None
        self._thread_count = [0]
        self._auto_batches = 0
        self._auto_start = None
        if native:
            self._handle = dataset._handle
            self.worker_type, reason = "thread", "a native data set reads in C++, on threads"
        else:
            # No reference to self from here: the C++ data set holds it, and a cycle through
            # C++ would keep the loader alive.
            thread_count = self._thread_count = [self.num_workers]
            start = thread_worker_start(_batches.user_dataset(dataset), self._worker_seed,
                                        lambda: thread_count[0], worker_init_fn)
            # Reads nothing: the layout comes from the first sample a worker reads.
            self._handle = _stoker.PyDataset(dataset, self._jobs is not None, start)
            self._read_dataset = dataset  # what worker processes read (self.dataset or a wrapper)
            if self._jobs is not None:
                self._handle.set_batch_jobs(self._jobs.job_args)
            if self.num_workers == 0:
                if worker_type == "process":
                    raise ValueError("worker_type='process' needs num_workers >= 1")
                self.worker_type, reason = "thread", "num_workers=0 reads in the training loop"
            elif worker_type == "auto":
                self.worker_type = "thread"
                reason = "auto: measuring the first batches on threads"
            else:
                self.worker_type, reason = worker_type, "asked for"
        self.worker_type_reason = reason
        # With remote=, too: the GIL's share is measured on the local reads only (the threads
        # waiting for remote replies do not count in it), and remote workers are asked for
        # once the local ones, threads or processes, are saturated.
        self._auto_pending = not native and worker_type == "auto" and self.num_workers > 0
        self._context = mp_context(self.multiprocessing_context) if not native else None
        self._worker_init_fn = worker_init_fn
        self._persistent_asked = persistent_workers
        # With processes, one worker per core of this rank's share unless told otherwise.
        self._process_count = self.num_workers if workers_given else _cpu_share()
        if self.worker_type == "process":
            self.num_workers = self._process_count
            tune = False
            self._start_processes()
        if remote is not None:
            # Engine threads num_workers.. drive the remote workers; a unit is read locally
            # when no remote worker's slot is free.
            self._remote = _remote.RemoteWorkers(remote, dataset, self.num_workers,
                                                 self.num_workers + remote.count,
                                                 self._worker_seed, worker_init_fn,
                                                 active=0 if self._remote_auto else None)
            self._handle.use_remote(self._remote)
        self._order = None  # the custom sampler's order of the epoch running, once read
        self._custom_order = order is not None
        self._device = self._resolve_device(device)
        torch = sys.modules.get("torch")
        has_gpu = torch is not None and torch.cuda.is_available()
        # torch's GPU if torch is in use, else any the engine finds.
        gpu = has_gpu if torch is not None else cuda_available()
        _compat.warn_unhonoured(
            native=native, worker_type=worker_type, multiprocessing_context=multiprocessing_context,
            worker_init_fn=worker_init_fn, pin_memory=pin_memory, has_gpu=gpu,
            pin_memory_device=pin_memory_device, in_order=in_order)
        engine_pin_memory = pin_memory
        if isinstance(pin_memory, bool):
            # As torch: True pins only where a GPU will read the batches.
            engine_pin_memory = "on" if pin_memory and gpu else ("auto" if pin_memory else "off")
        # The training loop's stream: batches copied to the GPU make it wait for their copy;
        # with pin_memory=True a pinned slab is refilled only after the work queued on it when
        # its batch was freed (the loop's own x.to("cuda", non_blocking=True)) has run.
        stream = 0
        if has_gpu and (self._device.startswith("cuda") or engine_pin_memory == "on"):
            on = torch.device(self._device) if self._device.startswith("cuda") else None
            stream = torch.cuda.current_stream(on).cuda_stream
        # Construction reads nothing, as torch's: a Python data set's workers start with the
        # first iter(), and so do those following a custom sampler (a native data set's
        # otherwise prefetch at once).
        self._reading = native and order is None
        self._loader = _stoker.Loader(self._handle, _options(
            batch_size=int(batch_size), shuffle=self._shuffle, seed=self.seed,
            drop_last=bool(drop_last), shard=_shard(rank, world, shard_drop_last),
            workers=self._engine_workers() if self._reading else 0, depth=depth,
            on_error=_enum(_stoker.ErrorPolicy, "on_error", on_error),
            max_skipped=int(max_skipped), device=self._device, device_depth=int(device_depth),
            stream=stream,
            pin_memory=_enum(_stoker.PinMemory, "pin_memory", str(engine_pin_memory)),
            pin_budget=int(pin_budget), tune_workers=tune, max_workers=max_workers,
            keep_on_host=[str(name) for name in keep_on_host]), order,
            shared_slabs=not native and self.worker_type == "process" or self._auto_pending)
        if worker_type == "process" or not self._auto_pending:
            self._log_worker_type()
        self._collate_fn = collate_fn  # None: stoker's own batching (default_collate's)
        self._build = self._convert = None
        # A native data set's object columns (ParquetDataset's strings) come with the batch's
        # indices, on this side.
        self._objects_of = getattr(dataset, "_batch_objects", None) if native else None
        if native:
            self._make_batches(dataset._structure())
        if self._jobs is not None:
            on_device = self._loader.stats()["device"] not in ("cpu", "sim")
            self._finish_batch_jobs(user, on_device or pin_memory == "on", seed, generator)
        self._samples = _compat.sized(self.dataset)
        self._follows_len = order is None and world == 1 and self._jobs is None
        self._engine_batch_size, self._engine_drop_last = int(batch_size), bool(drop_last)

        # torch's public attributes, with its values; then the ones that define the batches
        # are frozen, as in torch.
        for name, value in _compat.public_attributes(self, **torch_arguments).items():
            setattr(self, name, value)
        for name, value in stoker_arguments.items():
            setattr(self, name, value)
        self._initialized = True

    # --- construction helpers -------------------------------------------------------------

    def _batch_jobs(self, dataset, batch_size, shuffle, sampler, batch_sampler, drop_last,
                    collate_fn) -> "_batches.BatchJobs":
        """The batch jobs of a map-style data set (collate_fn, any batch_sampler,
        batch_size=None), with torch's argument checks; each epoch's batches are made by
        _epoch_batches."""
        if batch_sampler is not None and (batch_size != 1 or shuffle or sampler is not None
                                          or drop_last):
            raise ValueError("batch_sampler option is mutually exclusive with batch_size, "
                             "shuffle, sampler, and drop_last")
        if sampler is not None and shuffle:
            raise ValueError("sampler option is mutually exclusive with shuffle")
        if batch_size is None and drop_last:
            raise ValueError("batch_size=None option disables auto-batching and is mutually "
                             "exclusive with drop_last")
        auto_collation = batch_sampler is not None or batch_size is not None
        collate = collate_fn if collate_fn is not None else _batches.default_collate(
            auto_collation)
        if batch_sampler is not None:
            size = _length(batch_sampler)
        else:
            samples = _length(sampler) if sampler is not None else len(dataset)
            size = (samples if batch_size is None else samples // int(batch_size) if drop_last
                    else -(-samples // int(batch_size)))
        return _batches.BatchJobs(dataset, collate, auto_collation, size)

    def _finish_batch_jobs(self, user, pin: bool, seed, generator) -> None:
        """The batch path's attributes (the user's arguments), its shuffle and its last
        step: batches moved to the device, pinned first by worker threads."""
        (self.dataset, batch_size, shuffle, self.sampler, self.batch_sampler, self.drop_last,
         self.collate_fn) = user
        self.batch_size = None if batch_size is None or self.batch_sampler is not None else int(
            batch_size)
        self._shuffle = bool(shuffle) and self.sampler is None and self.batch_sampler is None
        if self._shuffle:  # stoker's permutation of the samples, seeded as the engine's
            self.seed = int(seed) if seed is not None else _draw_seed(generator)
        if pin:
            self._jobs.collate_fn = _batches.pinned(self._jobs.collate_fn)
        move = _batches.mover(self._loader.stats()["device"], pin)
        self._convert = lambda raw: None  # a batch job's batch is its one object value
        self._build = lambda arrays, objects: move(objects[0][0])

    def _epoch_batches(self, epoch: int) -> list:
        """Epoch `epoch`'s batches of sample indices (of indices, with batch_size=None)."""
        if self.batch_sampler is not None:
            return [list(b) for b in self.batch_sampler]
        if self.sampler is not None:
            order = list(self.sampler)
        else:
            order = _stoker.epoch_order(len(self.dataset), self._shuffle, self.seed, epoch, 0, 1,
                                        False).tolist()
        if self.batch_size is None:
            return order
        size = self.batch_size
        end = len(order) - len(order) % size if self.drop_last else len(order)
        return [order[i:i + size] for i in range(0, end, size)]

    def _init_stream(self, dataset, batch_size, shuffle, sampler, batch_sampler, num_workers,
                     collate_fn, pin_memory, drop_last, timeout, worker_init_fn,
                     multiprocessing_context, generator, prefetch_factor, device,
                     worker_type) -> None:
        """An iterable data set: each worker iterates its own copy (python/stoker/_batches.py,
        Streams), with torch's argument checks."""
        pipe = _batches.is_datapipe(dataset)
        if pipe and shuffle is not None:  # as torch: the pipe's shuffle steps are turned on/off
            from torch.utils.data import graph_settings

            dataset = graph_settings.apply_shuffle_settings(dataset, shuffle=shuffle)
        for name, value in (("shuffle", None if pipe else shuffle), ("sampler", sampler),
                            ("batch_sampler", batch_sampler)):
            if value not in (None, False):
                raise ValueError(f"DataLoader with IterableDataset: expected unspecified {name} "
                                 f"option, but got {name}={value}")
        if batch_size is None and drop_last:
            raise ValueError("batch_size=None option disables auto-batching and is mutually "
                             "exclusive with drop_last")
        if timeout < 0:
            raise ValueError("timeout option should be non-negative")
        if worker_type not in ("auto", "thread", "process"):
            raise ValueError(f"worker_type must be 'auto', 'thread' or 'process', not "
                             f"{worker_type!r}")
        # 'auto' is one worker: every worker iterates its own copy of the stream, so a data
        # set that does not shard itself by get_worker_info() would be read once per worker
        # (torch's default, num_workers=0, reads it once). A sharded stream's num_workers is
        # the user's to give, as with torch.
        workers = 1 if num_workers == "auto" else int(num_workers)
        if workers < 0:
            raise ValueError("num_workers option should be non-negative; use num_workers=0 "
                             "to disable multiprocessing.")
        if prefetch_factor is not None and prefetch_factor < 1:
            raise ValueError("prefetch_factor option should be a positive integer")
        if worker_type == "process" and workers == 0:
            raise ValueError("worker_type='process' needs num_workers >= 1")
        self.dataset, self.sampler, self.batch_sampler = dataset, None, None
        self._sampler = None
        self.batch_size = None if batch_size is None else int(batch_size)
        self.drop_last, self.collate_fn, self.timeout = bool(drop_last), collate_fn, timeout
        self.num_workers = workers
        self.prefetch_factor = 2 if prefetch_factor is None else int(prefetch_factor)
        self.seed = 0
        self._epoch, self._resume, self._iterator = 0, None, lambda: None
        self._pipeline = (f"python: a stream of {type(dataset).__name__}, iterated and "
                          f"collated in each worker")
        self._worker_seed = _draw_seed(generator)
        # auto: processes, as torch's workers: each iterates its own copy of the data set
        # with its own globals and seeded generators, and a stream's Python code (parsing,
        # tokenizing) runs on every core. Threads (asked for) suit streams that wait on I/O.
        if worker_type == "auto":
            self.worker_type = "process" if workers > 0 else "thread"
            self.worker_type_reason = ("auto: a stream is read by worker processes, each "
                                       "iterating its own copy, as torch's" if workers > 0 else
                                       "num_workers=0 reads in the training loop")
        else:
            self.worker_type, self.worker_type_reason = worker_type, "asked for"
        self._device = self._resolve_device(device)
        torch = sys.modules.get("torch")
        has_gpu = torch is not None and torch.cuda.is_available()
        if self._device.startswith("cuda") and not has_gpu:
            _log.info("stoker: no GPU answers; batches stay on the CPU")
            self._device = "cpu"
        pin = self._device.startswith("cuda") or (pin_memory is True and has_gpu)
        collate = collate_fn if collate_fn is not None else _batches.default_collate(
            batch_size is not None)
        processes = self._workers = None  # torch's iterator lists the worker processes
        if self.worker_type == "process":
            processes = self._workers = ProcessWorkers(
                _batches.StreamJobs(dataset, collate, self.batch_size, self.drop_last), workers,
                mp_context(multiprocessing_context), self._worker_seed, worker_init_fn)
        elif pin:
            collate = _batches.pinned(collate)
        self._streams = _batches.Streams(
            dataset=dataset, workers=workers, depth=self.prefetch_factor, collate_fn=collate,
            batch_size=self.batch_size, drop_last=self.drop_last, base_seed=self._worker_seed,
            worker_init_fn=worker_init_fn, processes=processes,
            finish=_batches.mover(self._device, pin), generator=generator)
        self._log_worker_type()

    @staticmethod
    def _unwrap_batch_sampler(batch_sampler):
        torch = sys.modules.get("torch")
        if torch is None or type(batch_sampler) is not torch.utils.data.BatchSampler:
            raise ValueError("stoker needs batches of one size: batch_sampler may only be a "
                             "torch.utils.data.BatchSampler (pass its sampler instead)")
        return batch_sampler.batch_size, batch_sampler.sampler, batch_sampler.drop_last

    @staticmethod
    def _resolve_device(device) -> str:
        if device is None:
            return "cpu"
        name = str(device)
        if name == "cuda":
            torch = sys.modules.get("torch")
            if torch is not None and torch.cuda.is_available():
                name = f"cuda:{torch.cuda.current_device()}"
        return name

    def _make_batches(self, structure) -> None:
        """How a delivered batch becomes what the training loop gets, once the layout is
        known (a Python data set's, from the first sample read)."""
        self._build = plan(structure, self._collate_fn)
        self._convert = converter(self._element_types(structure),
                                  self._loader.stats()["device"] not in ("cpu", "sim"))

    @staticmethod
    def _element_types(structure) -> list[str]:
        types: dict[int, str] = {}

        def walk(node):
            if node[0] == "array":
                types[node[1]] = node[2]
            elif node[0] in ("seq", "map"):
                for child in node[-1]:
                    walk(child)

        walk(structure)
        return [types[f] for f in sorted(types)]

    # --- the torch DataLoader surface -----------------------------------------------------

    __class_getitem__ = classmethod(types.GenericAlias)  # DataLoader[T], as torch's

    @property
    def __class__(self):
        return _compat.torch_compatible_class(type(self))

    def __setattr__(self, name: str, value) -> None:
        if name in _compat.FROZEN_ATTRIBUTES and self.__dict__.get("_initialized", False):
            raise ValueError(f"{name} attribute should not be set after "
                             f"{type(self).__name__} is initialized")
        super().__setattr__(name, value)

    @property
    def multiprocessing_context(self):
        return self._multiprocessing_context

    @multiprocessing_context.setter
    def multiprocessing_context(self, context) -> None:
        self._multiprocessing_context = _compat.check_multiprocessing_context(
            context, self.num_workers)

    @property
    def _iterator(self):
        """The current epoch's iterator, or None (torch's attribute; frameworks reset it)."""
        return self._iterator_ref()

    @_iterator.setter
    def _iterator(self, iterator) -> None:
        self._iterator_ref = weakref.ref(iterator) if iterator is not None else lambda: None

    @property
    def _auto_collation(self) -> bool:
        """torch's: whether samples are batched (a batch sampler is in use)."""
        return self.batch_sampler is not None

    @property
    def _index_sampler(self):
        """torch's: what yields the indices of one item (a batch, or a sample)."""
        return self.batch_sampler if self._auto_collation else self.sampler

    def __len__(self) -> int:
        if self._streams is not None:
            self._stream_len = len(self.dataset)
            return len(self._streams)
        len(self._index_sampler)  # as torch's: TypeError for a sampler without __len__
        samples = _compat.sized(self.dataset)
        if self._follows_len and samples is not None and samples != self._samples:
            # As torch's, len() follows a data set that grew or shrank (iter() warns).
            return _compat.batches(samples, self._engine_batch_size, self._engine_drop_last)
        return self._loader.batches_per_epoch

    def __iter__(self) -> Iterator:
        samples = _compat.sized(self.dataset)
        if self._samples is not None and samples is not None and samples != self._samples:
            _compat.warn(f"the data set has {samples} samples, {self._samples} when this "
                         f"DataLoader was made: it reads those {self._samples} (make a new "
                         "DataLoader to read them all)")
        previous = self._iterator
        if previous is not None:
            previous._stale = True
        if self._resume is not None:
            epoch, batch = self._resume
            self._resume = None
            self._start(epoch, batch)
        else:
            epoch = self._sampler_epoch_or_next()
            self._start(epoch, 0)
        self._epoch = epoch + 1
        iterator = _Iterator(self)
        self._iterator = iterator
        return iterator

    def set_epoch(self, epoch: int) -> None:
        """Starts `epoch` at the next iter() (as ``sampler.set_epoch`` does for a sampler)."""
        if self._sampler is not None and hasattr(self._sampler, "set_epoch"):
            self._sampler.set_epoch(epoch)
        self._epoch = int(epoch)

    def state_dict(self) -> dict[str, Any]:
        """Where the loader stands: restoring it yields exactly the batches still to come."""
        it = self._iterator
        between = it is None or it._stale or it._done
        if self._streams is not None:
            if self._resume is not None:
                return {"epoch": self._resume[0], "stream": self._streams.pending}
            if between:
                return {"epoch": self._sampler_epoch_or_next(), "stream": None}
            return {"epoch": self._epoch - 1, "stream": self._streams.position()}
        if self._resume is not None:
            epoch, batch = self._resume
        elif between:  # between epochs: the next one from its start
            epoch, batch = self._sampler_epoch_or_next(), 0
        else:
            epoch, batch = self._loader.position()
        return {"epoch": int(epoch), "batch": int(batch), "seed": self.seed,
                "batches_per_epoch": len(self)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if self._streams is not None:
            if "stream" not in state:
                raise ValueError("stoker: the state is not a stream's")
            self._streams.load(state["stream"])
            self._resume = (int(state["epoch"]), 0)
            return
        if int(state.get("batches_per_epoch", len(self))) != len(self):
            raise ValueError(f"the state is for {state['batches_per_epoch']} batches per epoch, "
                             f"this loader has {len(self)}")
        if "seed" in state and int(state["seed"]) != self.seed:
            raise ValueError(f"the state was saved with seed {state['seed']}, this loader has "
                             f"seed {self.seed}: pass seed= (or the same generator) to resume")
        self._resume = (int(state["epoch"]), int(state["batch"]))
        if self._sampler is not None and hasattr(self._sampler, "set_epoch"):
            self._sampler.set_epoch(self._resume[0])

    # --- stoker's own --------------------------------------------------------------------

    def stats(self) -> dict[str, Any]:
        """Throughput, time the training loop waited, worker busy time, queue depth, slabs,
        which pipeline runs (``pipeline``) and which kind of worker reads and why
        (``worker_type``, ``worker_type_reason``, ``worker_pids``)."""
        if self._streams is not None:
            stats = {"workers": self.num_workers, "device": self._device}
            pids = self._streams.pids()
        else:
            stats = self._loader.stats()
            pids = list(self._pool.pids()) if self._pool is not None else []
        stats["pipeline"] = self._pipeline
        stats["worker_type"] = self.worker_type
        stats["worker_type_reason"] = self.worker_type_reason
        stats["worker_pids"] = pids
        if self._remote is not None:
            stats["remote"] = self._remote.stats()
        return stats

    def report(self) -> "Report":
        """A verdict on the run so far, from stats(): e.g. ``input-bound: the training loop
        waited 43% of its time; reads are the busiest stage at 97% of 2 cores; more workers
        would not help: CPU saturated; try: record shards / ...``. ``str()`` gives that line;
        the keys give the numbers behind it (``verdict``, ``wait_fraction``, ``busiest``,
        ``busiest_load``, ``worker_cores``, ``cpu_cores``, ``more_workers``,
        ``suggestions``, ...)."""
        return Report(self._loader.report())

    def skipped_samples(self) -> list[SkippedSample]:
        """Each distinct sample that failed under ``on_error='skip'`` in the batches handed
        out so far, in index order, with its name (file path or record, where the data set
        has one) and the reason. ``stats()["skipped"]`` counts failed reads (a replacement
        that failed too counts again), ``stats()["bad_samples"]`` the samples listed here."""
        if self._streams is not None:  # a stream's errors are always raised
            return []
        report: dict[int, SkippedSample] = {}
        for index, name, reason in self._loader.skipped_samples():
            if index not in report:
                report[index] = SkippedSample(index, name or _sample_name(self.dataset, index),
                                              reason)
        return [report[i] for i in sorted(report)]

    def set_workers(self, workers: int) -> None:
        """Changes the worker count while running; nothing is lost or reordered."""
        if self._streams is not None:
            raise ValueError("stoker: a stream's workers each read their own shard: their "
                             "count is fixed (num_workers=)")
        if self._reading:
            self._loader.set_workers(self._engine_workers(int(workers)))
        self.num_workers = int(workers)
        self._thread_count[0] = int(workers)

    def set_depth(self, depth: int) -> None:
        if self._streams is not None:
            raise ValueError("stoker: a stream's depth is prefetch_factor batches per worker")
        self._loader.set_depth(int(depth))

    def trace(self, path: Optional[Union[str, os.PathLike]], *,
              max_events: int = _stoker.TRACE_MAX_EVENTS) -> None:
        """Records a timeline of the loading from the next batch on, written to ``path`` as
        Chrome trace-event JSON (open it in https://ui.perfetto.dev or chrome://tracing): each
        worker's sample reads and chunks (a worker process's jobs on its own track), each batch
        from opened to ready to taken, the training loop's waits for data and its steps in
        between, copies to the device, queue depth and pinned bytes. The file is written by
        ``trace(None)``, ``close()``, garbage collection, or the next ``trace(path)``. Past
        ``max_events`` events it keeps the newest and says so (its metadata and the log).
        Raises OSError if the file cannot be created."""
        self._loader.trace(None if path is None else os.fspath(path), max_events)

    @contextlib.contextmanager
    def tracing(self, path: Union[str, os.PathLike], *,
                max_events: int = _stoker.TRACE_MAX_EVENTS) -> Iterator["DataLoader"]:
        """``with loader.tracing("run.json"):`` traces what runs inside; the file is written on
        leaving the block."""
        self.trace(path, max_events=max_events)
        try:
            yield self
        finally:
            self.trace(None)

    def close(self) -> None:
        """Stops the workers now (also done when the loader is garbage collected) and writes
        a trace still recording."""
        if self._streams is not None:
            self._streams.close()
            return
        if self._loader.closed:
            return
        if self._remote is not None:
            self._remote.stop()  # threads waiting for a remote worker return at once
        try:
            self._loader.trace(None)
        finally:
            self._loader.close()

    def __del__(self) -> None:
        streams = getattr(self, "_streams", None)
        if streams is not None:
            streams.close()
            return
        # The C++ loader writes a trace still recording as it goes (a failure is logged).
        loader = getattr(self, "_loader", None)
        if loader is not None and not loader.closed:
            remote = getattr(self, "_remote", None)
            if remote is not None:
                remote.stop()
            loader.close()

    # --- internals ------------------------------------------------------------------------

    def _sampler_epoch_or_next(self) -> int:
        """The epoch the next iter() starts: the sampler's (set_epoch), else one more."""
        epoch = getattr(self._sampler, "epoch", None)
        return int(epoch) if isinstance(epoch, int) else self._epoch

    def _start(self, epoch: int, batch: int) -> None:
        if self._streams is not None:
            self._streams.start()
            return
        if self._jobs is not None:
            batches = self._epoch_batches(epoch)
            if len(batches) != len(self._jobs):
                raise ValueError(f"stoker: the batch sampler made {len(batches)} batches this "
                                 f"epoch and {len(self._jobs)} before: stoker needs the same "
                                 f"number in every epoch")
            if batches != self._jobs.batches:  # batches read ahead with the old ones are dropped
                self._jobs.batches = batches
                self._loader.restart_fresh(epoch)
        if self._custom_order:
            order = list(self._sampler)
            if order != self._order:  # a custom sampler's new order: drop the old prefetch
                self._loader.set_order(order)
                if self._order is not None:
                    self._loader.restart_fresh(epoch)
                self._order = order
        self._loader.restore(epoch, batch)
        if not self._reading:
            self._reading = True
            self._loader.set_workers(self._engine_workers())

    def _start_processes(self) -> None:
        """Starts the worker processes and sends reads to them from now on."""
        # Only when passed: a warning for torch's default could not be silenced.
        if self._persistent_asked is False:
            _compat.warn("worker processes persist across epochs (persistent_workers=False is "
                         "not honoured): changes made to the data set in this process after "
                         "they started are not seen by them")
        workers = ProcessWorkers(self._read_dataset, self._process_count, self._context,
                                 self._worker_seed, self._worker_init_fn)
        pool = workers.make_pool()
        pool.start()
        self._workers, self._pool = workers, pool
        self._handle.use_processes(pool)

    def _engine_workers(self, local: Optional[int] = None) -> int:
        """The engine's worker threads: the local workers (`local`, else num_workers) and one
        per slot of the remote workers in use (_remote.SLOTS each)."""
        local = self.num_workers if local is None else local
        return local + (self._remote.threads if self._remote is not None else 0)

    def _tune_remote(self) -> None:
        """num_workers='auto' with remote=: every few batches, asks for one more remote
        worker or gives one back (_remote.next_active), from the stretch since the last
        decision."""
        self._remote_batches += 1
        if self._remote_batches % _remote.TUNE_BATCHES:
            return
        stats, last = self._loader.stats(), self._remote_last
        self._remote_last = stats
        elapsed = stats["elapsed_s"] - last["elapsed_s"] if last is not None else 0.0
        if elapsed <= 0:
            return
        wait = (stats["consumer_wait_s"] - last["consumer_wait_s"]) / elapsed
        # worker_cpu_s also counts the threads waiting on remote workers, which use little.
        load = ((stats["worker_cpu_s"] - last["worker_cpu_s"]) / elapsed
                / max(1.0, min(self.num_workers, stats["cpu_cores"])))
        read = stats["network_read_s"] - last["network_read_s"]
        idle = stats["network_idle_s"] - last["network_idle_s"]
        remote_busy = read / (read + idle) if read + idle > 0 else None
        before = self._remote.active
        active = _remote.next_active(before, self._remote.size, wait, load, remote_busy)
        if active != before:
            self._remote.set_active(active)
            self._loader.set_workers(self._engine_workers())
            _log.info("stoker: remote workers %d -> %d (the training loop waited %.0f%%, "
                      "local workers %.0f%% busy)", before, active, 100 * wait, 100 * load)

    def _log_worker_type(self) -> None:
        _log.info("stoker: %s workers (%s)", self.worker_type, self.worker_type_reason)

    def _choose_worker_type(self) -> None:
        """worker_type='auto': once the first batches were read on threads, moves GIL-bound
        reads to processes (between batches, on this thread: nothing is lost or reordered)."""
        reads, _, _, cpu_s = self._handle.gil_stats()
        now = time.perf_counter()
        stats = self._loader.stats()
        if self._auto_start is None:
            self._auto_start = (reads, cpu_s, now, stats)
            return
        self._auto_batches += 1
        reads -= self._auto_start[0]
        if self._auto_batches < _AUTO_MIN_BATCHES or reads < _AUTO_MIN_READS:
            return
        self._auto_pending = False
        first = self._auto_start[3]
        busy = (cpu_s - self._auto_start[1]) / max(now - self._auto_start[2], 1e-9)
        gil_bound, scale = _gil_bound(
            busy, stats["worker_cpu_s"] - first["worker_cpu_s"],
            stats["worker_run_delay_s"] - first["worker_run_delay_s"], self._jobs is not None)
        # The local threads (the engine's others wait for remote workers).
        threads = stats["workers"] if self._remote is None else self.num_workers
        measured = (f"reads kept the GIL busy {busy:.0%} of the time on {threads} threads, "
                    f"{_cores()} cores")
        if scale > 1.05:
            measured += f" ({scale * busy:.0%} counting their waits for a core)"
        if gil_bound and _cores() >= 2 and threads >= 2:
            self._start_processes()
            self.worker_type = "process"
            self.num_workers = self._process_count
            self._loader.set_workers(self._engine_workers())
            why = ("whole batches made in Python" if busy > _AUTO_GIL_PARALLEL else
                   "GIL-bound")
            self.worker_type_reason = f"auto: {measured}: {why}, so processes"
        else:
            why = ("fewer than 2 cores" if _cores() < 2 else
                   "fewer than 2 threads" if threads < 2 and gil_bound else
                   "work that releases the GIL" if busy > _AUTO_GIL_PARALLEL else
                   "not GIL-bound")
            self.worker_type_reason = f"auto: {measured}: {why}, so threads"
        self._log_worker_type()

    def _next(self):
        if self._streams is not None:
            return self._streams.next(self.timeout)
        raw = self._loader.next(self.timeout)
        if self._auto_pending and raw is not None:
            self._choose_worker_type()
        if self._remote_auto and raw is not None:
            self._tune_remote()
        if raw is None:
            return _batches.EPOCH_END
        if self._build is None:
            self._make_batches(self._handle.structure())
        arrays = self._convert(raw)
        raw.release()  # the tensors keep the buffer; returning them all recycles it
        if self._objects_of is not None:
            return self._build(arrays, self._objects_of(raw.indices()))
        return self._build(arrays, raw.objects)


class Report(dict):
    """DataLoader.report(): a dict of the verdict and its numbers; str() is the verdict's
    text."""

    def __str__(self) -> str:
        return self["text"]


class _Iterator:
    """One epoch of a DataLoader. A new iter() of the same loader ends this one."""

    def __init__(self, loader: DataLoader) -> None:
        self._loader = loader
        self._stale = False
        self._done = False
        # A stream yielding more than the len() it reported (workers that do not shard it)
        # warns from then on, as torch's iterator does: it counts what it yields against the
        # data set's len() as of the last len(loader) before this iter().
        self._reported_len = loader._stream_len
        self._yielded = 0

    def __iter__(self) -> "_Iterator":
        return self

    def __len__(self) -> int:
        return len(self._loader)

    @property
    def _workers(self) -> list:
        """torch's list of worker processes: stoker's, or none while threads read."""
        workers = self._loader._workers
        return workers.processes() if workers is not None else []

    def __next__(self):
        if self._stale:
            raise RuntimeError("stoker: a newer iter() of this DataLoader replaced this iterator")
        if self._done:
            raise StopIteration
        batch = self._loader._next()
        if batch is _batches.EPOCH_END:
            self._done = True
            raise StopIteration
        self._yielded += 1
        if self._reported_len is not None and self._yielded > self._reported_len:
            self._warn_longer_than_reported()
        return batch

    def _warn_longer_than_reported(self) -> None:
        message = (f"Length of IterableDataset {self._loader.dataset} was reported to be "
                   f"{self._reported_len} (when accessing len(dataloader)), but "
                   f"{self._yielded} samples have been fetched. ")
        if self._loader.num_workers > 0:
            message += ("For multiprocessing data-loading, this could be caused by not "
                        "properly configuring the IterableDataset replica at each worker. "
                        "Please see https://pytorch.org/docs/stable/data.html"
                        "#torch.utils.data.IterableDataset for examples.")
        warnings.warn(message, UserWarning, stacklevel=3)
