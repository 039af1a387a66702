"""The DataLoader's arguments, resolved once: ``resolve()`` checks every argument (torch's
checks in torch's order and words, then stoker's) and decides the mode, what the workers read,
the order of the samples, the kind of worker and why, the device, pinning, the seeds and the
depth, as a frozen ``Plan``. Nothing here starts anything: the pipelines (engine_pipeline.py,
stream_pipeline.py) are built from the plan. Its repr is the plan as report() prints it."""

from __future__ import annotations

import copy
import dataclasses
import sys
from typing import Any, Optional

from .. import _stoker
from ..datasets.native import NativeDataset
from ..datasets.torchvision import hybrid_equivalent, native_equivalent
from ..distributed import DistributedSampler
from ..remote.pool import SLOTS
from ..workers.jobs import BatchJobs, is_datapipe, is_stream
from ..workers.processes import mp_context
from . import compat
from .collate import default_collate
from .defaults import DEFAULTS, PREFETCH_FACTOR
from .host import Host, cores, cpu_share  # noqa: F401 (the plan's host; re-exported)
from .sample_seeding import SeededReads
from .seeding import TorchRandomOrder, reproducibility

SAMPLES, BATCH_JOBS, STREAM = "samples", "batch jobs", "stream"
WORKER_TYPES = ("auto", "thread", "process")
SHUFFLE_MODES = ("global", "window")  # shuffle= besides True/False (LoaderOptions::shuffle_mode)

# num_workers='auto' starts with a worker per core of this rank's share; the engine's tuner
# moves the count and the batches in flight both ways (src/tune/tuner.h): more while they wait,
# up to the CPU budget while they compute, at most _stoker.default_max_workers (host_share.h).


@dataclasses.dataclass(frozen=True)
class Plan:
    """How a DataLoader runs, decided once from its arguments."""

    mode: str  # SAMPLES (the engine batches samples), BATCH_JOBS (a worker makes a whole
    # batch: collate_fn, batch_sampler, batch_size=None), STREAM (an iterable data set)
    pipeline: str  # what reads, and why (stats()["pipeline"])
    order: str  # sequential, random, distributed, custom sampler, torch's samplers, stream
    worker_type: str  # 'thread' or 'process' to start with
    worker_type_reason: str
    measure_worker_type: bool  # worker_type='auto': the first batches (a stream's: epoch 1) decide
    num_workers: int
    process_count: int  # worker processes, if processes read
    tune_workers: bool  # the engine's tuner moves the count
    max_workers: int
    remote_workers: int
    tune_remote: bool  # num_workers='auto' with remote=: the loader asks for remote workers
    depth: int  # batches in flight (engine), or per worker (stream)
    batch_size: Optional[int]  # the engine's (1 for batch jobs) or the stream's
    drop_last: bool
    shuffle: bool  # the loader's (a batch job's order may shuffle)
    engine_shuffle: bool  # the engine's permutation
    seed: int  # the loader's (state_dict()["seed"])
    engine_seed: int  # the engine's (its permutation and the samples' seeds)
    rank: int
    world_size: int
    shard_drop_last: bool
    device: str
    pin_memory: str  # 'on', 'off' or 'auto' (the engine's); a stream pins 'on' or 'off'
    pin_always: bool  # pin_memory='on': batch jobs pin their batches even for the CPU
    native: bool  # a native data set, read in C++
    on_error: str
    max_skipped: int
    pin_budget: int
    memory_limit: int  # LoaderOptions::memory_limit (0: half of MemAvailable)
    device_depth: int
    keep_on_host: tuple
    # What a resumed or re-shaped run repeats: 'order and augmentation' or 'order', and why
    # (report()).
    reproducibility: str = "order"
    reproducibility_reason: str = ""
    warnings: tuple = ()  # for arguments that do not act as in torch, said once
    log: tuple = ()  # lines for the log, said when the loader is made
    # What the pipelines are built of (left out of the repr).
    dataset: Any = dataclasses.field(default=None, repr=False)  # what the workers read
    sampler: Any = dataclasses.field(default=None, repr=False)  # the one the engine follows
    order_length: Optional[int] = None  # a custom sampler's positions (read at each epoch)
    collate_fn: Any = dataclasses.field(default=None, repr=False)  # a stream's or batch jobs'
    worker_init_fn: Any = dataclasses.field(default=None, repr=False)
    multiprocessing_context: Any = dataclasses.field(default=None, repr=False)  # as checked
    context: Any = dataclasses.field(default=None, repr=False)  # the one processes start with
    remote: Any = dataclasses.field(default=None, repr=False)  # stoker.ray_workers(...)
    generator: Any = dataclasses.field(default=None, repr=False)
    warn_not_persistent: bool = False  # persistent_workers=False given, for processes
    # The engine's shuffle: 'auto' (global while a native data set fits its object cache, else
    # windowed over its storage blocks), 'global' or 'window' (shuffle='global' / 'window').
    shuffle_mode: str = "auto"
    tune_depth: bool = False  # a stream's prefetch_factor left to stoker (deeper_stream_depth)

    def __str__(self) -> str:
        shown = ("mode", "pipeline", "order", "worker_type", "worker_type_reason",
                 "num_workers", "depth", "device", "pin_memory", "seed")
        return "; ".join(f"{name}={getattr(self, name)!r}" for name in shown)


def resolve(dataset, batch_size: Optional[int] = DEFAULTS.batch_size,
            shuffle: Optional[bool] = None,
            sampler=None, batch_sampler=None, num_workers=DEFAULTS.num_workers,
            collate_fn=None, pin_memory=DEFAULTS.pin_memory,
            drop_last: bool = DEFAULTS.drop_last, timeout: float = DEFAULTS.timeout,
            worker_init_fn=None, multiprocessing_context=None, generator=None, *,
            prefetch_factor: Optional[int] = None, persistent_workers: Optional[bool] = None,
            pin_memory_device: str = DEFAULTS.pin_memory_device,
            in_order: bool = DEFAULTS.in_order, device=None,
            on_error: str = DEFAULTS.on_error, max_skipped: int = DEFAULTS.max_skipped,
            seed: Optional[int] = None, pin_budget: int = DEFAULTS.pin_budget,
            memory_limit: int = DEFAULTS.memory_limit,
            device_depth: int = DEFAULTS.device_depth, worker_type: str = DEFAULTS.worker_type,
            native: bool = DEFAULTS.native, keep_on_host=DEFAULTS.keep_on_host, remote=None,
            seed_per_sample: bool = DEFAULTS.seed_per_sample,
            host: Optional[Host] = None) -> Plan:
    """The plan of a DataLoader with these arguments (DataLoader's), or the ValueError (or
    TypeError) that torch's DataLoader, or stoker, raises for them."""
    host = host if host is not None else Host.here()
    shuffle_mode = "auto"
    if isinstance(shuffle, str):  # stoker's: which shuffle (docs/storage.md)
        if shuffle not in SHUFFLE_MODES:
            raise ValueError(f"shuffle must be True, False, 'global' or 'window', not "
                             f"{shuffle!r}")
        shuffle_mode, shuffle = shuffle, True
    warnings = list(compat.check_arguments(
        num_workers=num_workers, timeout=timeout, prefetch_factor=prefetch_factor,
        persistent_workers=persistent_workers, sampler=sampler, shuffle=shuffle,
        batch_sampler=batch_sampler, batch_size=batch_size, drop_last=drop_last))
    context = compat.check_multiprocessing_context(
        multiprocessing_context, 1 if num_workers == "auto" else int(num_workers))
    if worker_type not in WORKER_TYPES:
        raise ValueError(f"worker_type must be 'auto', 'thread' or 'process', not "
                         f"{worker_type!r}")
    _enum(_stoker.ErrorPolicy, "on_error", on_error)
    if int(memory_limit) < 0:
        raise ValueError(f"memory_limit should be a number of bytes (0: half of the memory "
                         f"available), but got memory_limit={memory_limit!r}")
    common = dict(on_error=on_error, max_skipped=int(max_skipped), pin_budget=int(pin_budget),
                  memory_limit=int(memory_limit), device_depth=int(device_depth),
                  keep_on_host=tuple(str(name) for name in keep_on_host),
                  worker_init_fn=worker_init_fn, generator=generator,
                  multiprocessing_context=context)
    if is_stream(dataset):
        if shuffle_mode != "auto":
            raise ValueError(f"stoker: shuffle={shuffle_mode!r} orders a map-style data set; a "
                             f"stream's order is its own (its shard shuffle and buffer)")
        if seed_per_sample:
            raise ValueError("stoker: seed_per_sample=True seeds each read of a map-style data "
                             "set's __getitem__; an iterable data set's workers iterate their "
                             "own copies, seeded per worker as in torch")
        return _stream(dataset, batch_size, shuffle, sampler, batch_sampler, num_workers,
                       collate_fn, pin_memory, drop_last, context,
                       prefetch_factor, device, worker_type, remote, host, warnings, common)
    if collate_fn is not None and collate_fn is compat.default_collate():
        collate_fn = None  # stoker's own batching is default_collate's
    mode = SAMPLES
    if collate_fn is not None or batch_size is None or (
            batch_sampler is not None and not _is_torch_batch_sampler(batch_sampler)):
        mode = BATCH_JOBS
    if mode == BATCH_JOBS and seed_per_sample:
        raise ValueError("stoker: seed_per_sample=True seeds each sample's __getitem__ as the "
                         "engine reads it; with a collate_fn, a custom batch_sampler or "
                         "batch_size=None a worker makes whole batches, which it does not "
                         "seed per sample yet: use the default collate and torch's "
                         "BatchSampler, or seed inside __getitem__ from stoker.sample_seed()")
    if mode == BATCH_JOBS:
        # The engine runs batch jobs (stoker/workers/jobs.py), one per engine batch; engine
        # sample k is batch k, in order (each epoch's batches from torch's samplers).
        read = _batch_jobs(dataset, batch_size, sampler, batch_sampler, drop_last, collate_fn)
        engine_batch_size, engine_drop_last, engine_sampler, engine_shuffle = 1, False, None, None
        pipeline = (f"python: batches of {type(dataset).__name__}, fetched and collated in "
                    f"workers")
    else:
        engine_batch_size, engine_sampler, engine_drop_last = batch_size, sampler, drop_last
        engine_shuffle = shuffle
        if batch_sampler is not None:  # torch's BatchSampler: its sampler, batched natively
            engine_batch_size, engine_sampler, engine_drop_last = (
                batch_sampler.batch_size, batch_sampler.sampler, batch_sampler.drop_last)
        read, pipeline = _what_reads(dataset, native)
    is_native = isinstance(read, NativeDataset)
    if shuffle_mode == "window" and not is_native:
        raise ValueError("stoker: shuffle='window' orders a native data set read by blocks "
                         "through a cache (stoker.WebDataset over s3:// or http(s):// URLs, "
                         "stoker.ParquetDataset); this data set's order is drawn as torch "
                         "draws it: use shuffle=True")
    if remote is not None and is_native:
        # Served through its __getitem__ (the same C++ read, with the sample's seed), by the
        # local workers too: one more copy per sample than the native path.
        is_native = False
        pipeline += " (read through __getitem__, on local and remote workers)"

    workers_given = num_workers != "auto"
    workers = host.cpu_share if num_workers == "auto" else int(num_workers)
    # The engine's tuner counts threads: with remote workers the local count stays fixed and,
    # with 'auto', the loader asks for remote workers itself (RemoteWorkerTuner, src/tune/worker_kind.cc).
    tune = num_workers == "auto" and remote is None
    max_workers = 0
    if tune:
        max_workers = _stoker.default_max_workers(host.cpu_share, python_reads=not is_native)
    remote_count = remote.count if remote is not None else 0
    depth = (PREFETCH_FACTOR if prefetch_factor is None else int(prefetch_factor)) * max(
        1, workers + SLOTS * remote_count)

    # Which samples, in which order: natively (sequential, random, sharded), or a custom
    # sampler's order read at the start of each epoch.
    rank, world, shard_drop_last, order_length = 0, 1, False, None
    seed_given = seed is not None
    engine_seed_arg = seed
    engine_shuffle = bool(engine_shuffle)
    kind = "distributed" if isinstance(engine_sampler, DistributedSampler) else (
        _torch_sampler_kind(engine_sampler) if engine_sampler is not None else None)
    order = kind or "sequential"
    if kind == "distributed" and (is_native or type(engine_sampler) is DistributedSampler):
        rank, world = engine_sampler.rank, engine_sampler.num_replicas
        shard_drop_last, engine_shuffle = engine_sampler.drop_last, engine_sampler.shuffle
        engine_seed_arg, seed_given = engine_sampler.seed, True
    elif kind == "random":
        engine_shuffle = True
        generator = engine_sampler.generator if engine_sampler.generator is not None else generator
    if not is_native and remote is None and not seed_given and "torch" in sys.modules and (
            kind == "random" or (kind is None and engine_sampler is None and engine_shuffle)):
        # torch's order: each epoch's permutation drawn when the epoch starts, as torch's
        # RandomSampler draws it (the same order for the same seed, the same draws from the
        # generator); the epoch's seed is in state_dict(), so that a resumed epoch is the same.
        # Without torch loaded there is none to follow: stoker's own order.
        engine_sampler = TorchRandomOrder(
            dataset, engine_sampler.generator if kind == "random" else generator)
        order, order_length, engine_shuffle = ("random, as torch's RandomSampler",
                                               len(dataset), False)
    elif not is_native and kind == "distributed" and type(engine_sampler) is not (
            DistributedSampler):
        # torch's DistributedSampler: its own order (its seed + epoch) and share of this rank,
        # read at each epoch, so that each rank reads the samples it would with torch's loader.
        order = "torch's DistributedSampler, at each epoch"
        order_length = _length(engine_sampler)
        rank, world, shard_drop_last, engine_shuffle = 0, 1, False, False
    elif kind is None and engine_sampler is not None:
        # A custom sampler is read when each epoch starts, once, as torch reads it; until then
        # the engine has as many positions (and reads nothing). A sampler may be longer than
        # the data set (replacement, num_samples): placeholders are sample 0.
        order, order_length = "custom sampler", _length(engine_sampler)
    elif engine_shuffle and kind is None:
        order = "random"
    # Nothing is drawn from torch's generators here (torch's loader draws nothing when it is
    # made): the workers' base seed is drawn as each epoch starts (seeding.WorkerSetup); a
    # native data set's own permutation is seeded by the generator's next draw, peeked at.
    # torch's order: the engine's seed is only stoker.sample_seed()'s base; the order's own
    # seed is drawn at each epoch (and saved in state_dict()), so the loader has none.
    torch_order = isinstance(engine_sampler, TorchRandomOrder)
    engine_seed = (int(engine_seed_arg) if seed_given else
                   (host.peek_seed(generator) if engine_shuffle or torch_order else 0))
    public_seed = 0 if torch_order else engine_seed
    public_shuffle = engine_shuffle or torch_order
    if mode == BATCH_JOBS:
        order = "torch's samplers, at each epoch"
        public_shuffle = bool(shuffle) and sampler is None and batch_sampler is None
        public_seed = int(seed) if seed is not None else 0

    seeded = seed_per_sample and not is_native  # a native data set's draws are per sample
    if seeded:
        read = SeededReads(read)
        if worker_type == "thread" and workers > 0:
            warnings.append("stoker: worker_type='thread' reads in worker processes under "
                            "seed_per_sample=True: each read seeds torch's, random's and "
                            "numpy's global generators, which threads share")
    if is_native:
        worker_type_chosen, reason = "thread", "a native data set reads in C++, on threads"
    elif workers == 0:
        if worker_type == "process":
            raise ValueError("worker_type='process' needs num_workers >= 1")
        worker_type_chosen, reason = "thread", "num_workers=0 reads in the training loop"
    elif seeded and worker_type != "process":
        worker_type_chosen, reason = "process", (
            "seed_per_sample=True: each read seeds the global generators, which worker "
            "threads would share")
    elif worker_type == "auto":
        worker_type_chosen, reason = "thread", "auto: measuring the first batches on threads"
    else:
        worker_type_chosen, reason = worker_type, "asked for"
    # With remote=, too: the GIL's share is measured on the local reads only, and remote
    # workers are asked for once the local ones, threads or processes, are saturated.
    measure = not is_native and not seeded and worker_type == "auto" and workers > 0
    # With processes, one worker per core of this rank's share unless told otherwise.
    process_count = workers if workers_given else host.cpu_share
    if worker_type_chosen == "process":
        workers, tune = process_count, False
    resolved_device = _device(device)
    warnings += compat.unhonoured(
        native=is_native, worker_type=worker_type, multiprocessing_context=context,
        worker_init_fn=worker_init_fn, pin_memory=pin_memory, has_gpu=host.gpu,
        pin_memory_device=pin_memory_device, in_order=in_order)
    engine_pin = pin_memory
    if isinstance(pin_memory, bool):
        # As torch: True pins only where a GPU will read the batches.
        engine_pin = "on" if pin_memory and host.gpu else ("auto" if pin_memory else "off")
    _enum(_stoker.PinMemory, "pin_memory", str(engine_pin))
    return Plan(
        mode=mode, pipeline=pipeline, order=order, worker_type=worker_type_chosen,
        worker_type_reason=reason, measure_worker_type=measure, num_workers=workers,
        process_count=process_count, tune_workers=tune, max_workers=max_workers,
        remote_workers=remote_count, tune_remote=num_workers == "auto" and remote is not None,
        depth=depth, batch_size=int(engine_batch_size), drop_last=bool(engine_drop_last),
        shuffle=public_shuffle, engine_shuffle=engine_shuffle, seed=public_seed,
        engine_seed=engine_seed, rank=rank, world_size=world,
        shard_drop_last=shard_drop_last, device=resolved_device, pin_memory=str(engine_pin),
        pin_always=pin_memory == "on", native=is_native, warnings=tuple(warnings),
        **reproducibility(is_native, seeded, _foreign(engine_sampler if mode != BATCH_JOBS else (
            batch_sampler if batch_sampler is not None else sampler))),
        dataset=read, sampler=engine_sampler, order_length=order_length, collate_fn=collate_fn,
        context=mp_context(context) if not is_native else None, remote=remote,
        warn_not_persistent=persistent_workers is False, shuffle_mode=shuffle_mode, **common)


def _stream(dataset, batch_size, shuffle, sampler, batch_sampler, num_workers, collate_fn,
            pin_memory, drop_last, multiprocessing_context, prefetch_factor, device,
            worker_type, remote, host: Host, warnings: list, common: dict) -> Plan:
    """An iterable data set: each worker iterates its own copy (stream_pipeline.py)."""
    if remote is not None:
        raise ValueError("stoker: remote workers read map-style data sets (samples, or "
                         "batches with a collate_fn or batch sampler); streams run on local "
                         "workers only")
    pipe = is_datapipe(dataset)
    if pipe and shuffle is not None:  # as torch: the pipe's shuffle steps are turned on/off
        from torch.utils.data import graph_settings

        dataset = graph_settings.apply_shuffle_settings(dataset, shuffle=shuffle)
    for name, value in (("shuffle", None if pipe else shuffle), ("sampler", sampler),
                        ("batch_sampler", batch_sampler)):
        if value not in (None, False):
            raise ValueError(f"DataLoader with IterableDataset: expected unspecified {name} "
                             f"option, but got {name}={value}")
    # 'auto' with a worker type asked for is one worker: every worker iterates its own copy of
    # the stream, so a data set that does not shard itself by get_worker_info() would be read
    # once per worker (torch's default, num_workers=0, reads it once).
    workers = 1 if num_workers == "auto" else int(num_workers)
    if worker_type == "process" and workers == 0:
        raise ValueError("worker_type='process' needs num_workers >= 1")
    # Both auto: epoch 1 is read in-line and measured, and from epoch 2 on worker threads read
    # a stream whose reads wait (choose_stream_threads, src/tune/worker_kind.h), or worker
    # processes where they would save time (choose_stream_workers): one, or one per core for a
    # stream that asked get_worker_info() as it began (it shards itself).
    measure = num_workers == "auto" and worker_type == "auto"
    # auto: processes, as torch's workers: each iterates its own copy of the data set with its
    # own globals and seeded generators, and a stream's Python code (parsing, tokenizing) runs
    # on every core. Threads (asked for) suit streams that wait on I/O.
    if measure:
        workers, chosen = 0, "thread"
        reason = "auto: epoch 1 read in-line and measured, to choose in-line, threads or processes"
    elif worker_type == "auto":
        chosen = "process" if workers > 0 else "thread"
        reason = ("auto: a stream is read by worker processes, each iterating its own copy, "
                  "as torch's" if workers > 0 else "num_workers=0 reads in the training loop")
    else:
        chosen, reason = worker_type, "asked for"
    resolved, log = _device(device), ()
    if _stoker.Device(resolved).is_cuda and not host.has_gpu:
        resolved, log = "cpu", ("stoker: no GPU answers; batches stay on the CPU",)
    pin = _stoker.Device(resolved).is_cuda or (pin_memory is True and host.has_gpu)
    return Plan(
        mode=STREAM, pipeline=f"python: a stream of {type(dataset).__name__}, iterated and "
                              f"collated in each worker",
        order="stream", worker_type=chosen, worker_type_reason=reason,
        reproducibility="order", reproducibility_reason=(
            "a stream's order and random draws are its data set's: resumed from its state, "
            "its workers seeded per worker as in torch"),
        measure_worker_type=measure, num_workers=workers, process_count=1 if measure else workers,
        tune_workers=False, max_workers=0, remote_workers=0, tune_remote=False,
        depth=PREFETCH_FACTOR if prefetch_factor is None else int(prefetch_factor),
        tune_depth=prefetch_factor is None,
        batch_size=None if batch_size is None else int(batch_size), drop_last=bool(drop_last),
        shuffle=bool(shuffle), engine_shuffle=False, seed=0, engine_seed=0, rank=0,
        world_size=1, shard_drop_last=False, device=resolved,
        pin_memory="on" if pin else "off", pin_always=False, native=False,
        warnings=tuple(warnings), log=log, dataset=dataset,
        collate_fn=collate_fn if collate_fn is not None else default_collate(
            batch_size is not None),
        context=mp_context(multiprocessing_context) if chosen == "process" or measure else None,
        **common)


def _foreign(sampler):
    """`sampler` if its order is neither torch's nor stoker's (whose draws a state carries)."""
    known = isinstance(sampler, (TorchRandomOrder, DistributedSampler)) or (
        _torch_sampler_kind(sampler) is not None or _is_torch_batch_sampler(sampler))
    return None if sampler is None or known else sampler


def _what_reads(dataset, native: bool) -> tuple[Any, str]:
    """The data set the workers read and why: torchvision's ImageFolder with a pipeline stoker
    implements runs in C++ (native=False opts out)."""
    pipeline = f"python: {type(dataset).__name__}.__getitem__ in workers"
    if isinstance(dataset, NativeDataset):
        return dataset, "native: a stoker data set"
    if not native:
        return dataset, pipeline
    equivalent, why = native_equivalent(dataset)
    if equivalent is not None:
        return equivalent, f"native: {why}"
    if why == "not a torchvision data set":
        return dataset, pipeline
    # The ends of the pipeline that stoker implements run natively, the rest in Python, in
    # workers.
    hybrid, hybrid_why = hybrid_equivalent(dataset)
    if hybrid is not None:
        return hybrid, f"python: {hybrid_why} ({why})"
    return dataset, pipeline + f" ({why})"


def _batch_jobs(dataset, batch_size, sampler, batch_sampler, drop_last,
                collate_fn) -> BatchJobs:
    """The batch jobs of a map-style data set (collate_fn, any batch_sampler,
    batch_size=None); each epoch's batches are set by the engine pipeline."""
    auto_collation = batch_sampler is not None or batch_size is not None
    collate = collate_fn if collate_fn is not None else default_collate(auto_collation)
    if batch_sampler is not None:
        size = _length(batch_sampler)
    else:
        samples = _length(sampler) if sampler is not None else len(dataset)
        size = (samples if batch_size is None else samples // int(batch_size) if drop_last
                else -(-samples // int(batch_size)))
    return BatchJobs(dataset, collate, auto_collation, size)


def _device(device) -> str:
    if device is None:
        return "cpu"
    name = str(device)
    if name == "cuda":
        torch = sys.modules.get("torch")
        if torch is not None and torch.cuda.is_available():
            name = f"cuda:{torch.cuda.current_device()}"
    return name


def _enum(enum, option: str, value: str):
    """The C++ enum value named `value`, or ValueError naming the choices."""
    members = enum.__members__
    if value not in members:
        choices = list(members)
        names = ", ".join(f"'{c}'" for c in choices[:-1]) + f" or '{choices[-1]}'"
        raise ValueError(f"stoker: {option} must be {names}, not '{value}'")
    return members[value]


def engine_enum(enum, value: str):
    """The C++ enum value of a value the plan checked."""
    return enum.__members__[value]


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


def torch_attributes(plan: Plan, dataset, *, batch_size, shuffle, sampler, batch_sampler,
                     drop_last, generator, collate_fn, prefetch_factor) -> dict[str, Any]:
    """torch's public attributes of a DataLoader with this plan and these arguments: torch's
    values (compat.public_attributes), or a stream's (the data set as its workers read it,
    no sampler, the collate_fn as given)."""
    if plan.mode == STREAM:
        return {"dataset": plan.dataset, "sampler": None, "batch_sampler": None,
                "batch_size": plan.batch_size, "drop_last": plan.drop_last,
                "collate_fn": collate_fn, "prefetch_factor": plan.depth,
                "generator": generator}
    return compat.public_attributes(
        dataset, plan.num_workers, batch_size=batch_size, shuffle=shuffle, sampler=sampler,
        batch_sampler=batch_sampler, drop_last=drop_last, generator=generator,
        collate_fn=collate_fn, prefetch_factor=prefetch_factor)
