"""stoker.DataLoader: torch.utils.data.DataLoader's arguments, on stoker's C++ engine.

This module keeps torch's surface (the arguments, the public attributes and the rules on them,
iter(), len(), epochs, state_dict()); what the arguments mean is resolved once into a Plan
(plan.py), and the loading is delegated to the plan's pipeline (pipelines.py: the engine's or
the stream's)."""

from __future__ import annotations

import contextlib
import inspect
import os
import types
import warnings
import weakref
from typing import Any, Callable, Iterator, NamedTuple, Optional, Sequence, Union

from .. import _stoker, logs
from . import compat, pipelines
from .defaults import DEFAULTS
from .iterator import EpochIterator
from .plan import resolve, torch_attributes
from .seeding import WorkerSetup


# Called (no arguments) as each loader is made: stoker/__init__.py adds the framework
# integrations' (stoker.integrations.install_available), which sit above the loader.
ON_MADE: list[Callable[[], None]] = []


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
      shuffle: True, or for a native data set in object storage 'global' / 'window' (True
        chooses by the object cache; stats()["shuffle"] says which, docs/storage.md).
      pin_memory: 'auto' pins batch buffers for a GPU, within ``pin_budget`` bytes.
      memory_limit: bytes the loader may hold in all (0: half of the memory available): batch
        buffers, device slots, a RAM cache and worker processes count; batches in flight are
        lowered to fit, a limit too small for one is an error saying what would fit.
      device: None (batches on the CPU) or 'cuda[:N]': batches arrive already on the GPU,
        copied on a side stream while the previous batch trains (the "data prefetcher"); the
        CPU, with one log line, where no GPU answers.
      persistent_workers: workers always persist (and the next epoch is prefetched); None
        (default) is torch's False without the warning that an explicit False gives worker
        processes.
      prefetch_factor: batches in flight are ``prefetch_factor * max(1, num_workers)``.
      on_error: 'raise' (default) raises a failed sample's exception, with its type and
        traceback and a note naming the sample; 'skip' replaces the sample with another one
        (up to ``max_skipped`` over the loader's life) and goes on.
      native: torchvision's ImageFolder whose transform stoker implements is read and
        transformed in C++ (the rest of a pipeline in Python; docs/python.md); native=False
        runs it all in Python. stats()["pipeline"] says which path ran and why.
      keep_on_host: names of fields that stay in host memory when batches go to a GPU.
      remote: ``stoker.ray_workers(n, ...)`` adds n Ray actors as workers that take the
        excess of a map-style data set's reads; the batches stay those of a local loader, in
        order (docs/remote.md).
      collate_fn, batch_sampler (any iterable of index lists), batch_size=None and
        iterable data sets: each batch is made whole by a worker (fetch and collate_fn, or
        the next batch of that worker's stream), in parallel, and handed to the training
        loop without pickling its tensors. Arguments that do not act as in torch warn once; docs/python.md
        lists every difference.
      seed_per_sample: True seeds torch's, random's and numpy's global generators before each
        __getitem__ of a Python data set from the sample's seed (the loader's seed, the epoch,
        the sample's index): its random draws are then the same on any number and kind of
        workers and ranks, and after a resume (about 1 us a sample). Its reads run in worker
        processes (threads share those generators) or in-line. report() says what repeats.

    ``trace("run.json")`` (or ``with loader.tracing("run.json"):``) records where the time
    goes, as a timeline to open in Perfetto.

    Epochs: each ``iter(loader)`` starts the next epoch (or the one ``set_epoch`` named,
    the loader's or its sampler's; called after ``iter()`` and before its first batch, as
    Lightning calls it, it names that iterator's epoch);
    ``state_dict()`` / ``load_state_dict()`` save and restore the position mid-epoch, and
    restoring yields exactly the batches that were still to come.
    """

    def __init__(
        self,
        dataset,
        batch_size: Optional[int] = DEFAULTS.batch_size,
        shuffle: Union[bool, str, None] = None,
        sampler=None,
        batch_sampler=None,
        num_workers: Union[int, str] = DEFAULTS.num_workers,
        collate_fn: Optional[Callable] = None,
        pin_memory: Union[bool, str] = DEFAULTS.pin_memory,
        drop_last: bool = DEFAULTS.drop_last,
        timeout: float = DEFAULTS.timeout,
        worker_init_fn: Optional[Callable[[int], None]] = None,
        multiprocessing_context=None,
        generator=None,
        *,
        prefetch_factor: Optional[int] = None,
        persistent_workers: Optional[bool] = None,
        pin_memory_device: str = DEFAULTS.pin_memory_device,
        in_order: bool = DEFAULTS.in_order,
        device=None,
        on_error: str = DEFAULTS.on_error,
        max_skipped: int = DEFAULTS.max_skipped,
        seed: Optional[int] = None,
        pin_budget: int = DEFAULTS.pin_budget,
        memory_limit: int = DEFAULTS.memory_limit,
        device_depth: int = DEFAULTS.device_depth,
        worker_type: str = DEFAULTS.worker_type,
        native: bool = DEFAULTS.native,
        keep_on_host: Sequence[str] = DEFAULTS.keep_on_host,
        remote=None,
        seed_per_sample: bool = DEFAULTS.seed_per_sample,
    ) -> None:
        # The arguments as given: what the loader pickles (never its running engine), and what
        # vars(loader) shows, as frameworks re-make loaders from it. A count or kind that
        # 'auto' resolved to, read back from an attribute, is 'auto' again.
        arguments = {name: value for name, value in locals().items() if name in _PARAMETERS}
        num_workers = arguments["num_workers"] = _requested(num_workers)
        worker_type = arguments["worker_type"] = _requested(worker_type)
        own_before = set(self.__dict__)
        # The engine's log lines (its advice among them) on the `stoker` logger (logs.py).
        logs.route()
        plan = resolve(
            dataset, batch_size, shuffle, sampler, batch_sampler, num_workers, collate_fn,
            pin_memory, drop_last, timeout, worker_init_fn, multiprocessing_context, generator,
            prefetch_factor=prefetch_factor, persistent_workers=persistent_workers,
            pin_memory_device=pin_memory_device, in_order=in_order, device=device,
            on_error=on_error, max_skipped=max_skipped, seed=seed, pin_budget=pin_budget,
            memory_limit=memory_limit, device_depth=device_depth, worker_type=worker_type,
            native=native,
            keep_on_host=keep_on_host, remote=remote, seed_per_sample=seed_per_sample)
        for hook in ON_MADE:  # e.g. Accelerate's prepare() made to keep stoker iterating
            hook()
        for message in plan.warnings:
            warnings.warn(message, UserWarning, stacklevel=2)
        self._plan = plan
        self._arguments = arguments
        self._multiprocessing_context = plan.multiprocessing_context
        self._setup = WorkerSetup(worker_init_fn, plan.generator, bool(persistent_workers))
        self.timeout = timeout  # as given, as torch keeps it (its timeout message prints it)
        self.seed = seed  # as given: the seed of each epoch's order is in state_dict()
        self._epoch = 0  # the next epoch iter() starts, without a sampler that says
        self._resume: Optional[tuple[int, int]] = None
        # The current iterator, held weakly: it holds the loader, and a reference cycle would
        # leave loaders to the cyclic garbage collector, which runs on whatever thread happens
        # to allocate (possibly a worker of this loader).
        self._iterator = None
        # torch's public attributes, with its values; then the ones that define the batches
        # are frozen, as in torch.
        for name, value in torch_attributes(
                plan, dataset, batch_size=batch_size, shuffle=shuffle, sampler=sampler,
                batch_sampler=batch_sampler, drop_last=drop_last, generator=generator,
                collate_fn=collate_fn, prefetch_factor=prefetch_factor).items():
            setattr(self, name, value)
        if self.sampler is not plan.sampler:  # torch's attribute only, not the order's
            compat.give_set_epoch(self.sampler, self)
        self._pipeline = pipelines.build(plan, dict(
            dataset=self.dataset, sampler=self.sampler, batch_sampler=self.batch_sampler,
            batch_size=self.batch_size, drop_last=self.drop_last), self._setup)
        # stoker's own arguments as given, also public, so that the loader can be made again
        # from its attributes (as Lightning does to add a DistributedSampler).
        stoker_arguments = dict(
            worker_init_fn=worker_init_fn, pin_memory=pin_memory,
            persistent_workers=bool(persistent_workers), pin_memory_device=pin_memory_device,
            in_order=in_order, device=device, on_error=on_error, max_skipped=max_skipped,
            pin_budget=pin_budget, memory_limit=memory_limit, device_depth=device_depth,
            native=native, keep_on_host=keep_on_host, remote=remote,
            seed_per_sample=seed_per_sample)
        for name, value in stoker_arguments.items():
            setattr(self, name, value)
        # The requested count and kind in vars(loader) (what Lightning re-makes a loader from);
        # the attributes answer what runs now (num_workers, worker_type: properties).
        self.__dict__["num_workers"] = num_workers
        self.__dict__["worker_type"] = worker_type
        self._own = frozenset(set(self.__dict__) - own_before) | {"_own", "_initialized"}
        self._initialized = True
        logs.drain()

    def __reduce__(self):
        """Pickles the arguments as given (with a worker_init_fn set since), the data set and
        sampler among them, and the epoch to start next: the loader comes back working, with
        no workers until its first iter(), as torch's does. A subclass's own attributes come
        back as they were."""
        arguments = dict(self._arguments, worker_init_fn=self.worker_init_fn,
                         timeout=self.timeout)
        extra = {name: value for name, value in self.__dict__.items() if name not in self._own}
        return (_remake, (type(self), arguments, extra, self._epoch, self._resume))

    # --- the torch DataLoader surface -----------------------------------------------------

    __class_getitem__ = classmethod(types.GenericAlias)  # DataLoader[T], as torch's

    @property
    def __class__(self):
        return compat.torch_compatible_class(type(self))

    def __setattr__(self, name: str, value) -> None:
        if name in compat.FROZEN_ATTRIBUTES and self.__dict__.get("_initialized", False):
            raise ValueError(f"{name} attribute should not be set after "
                             f"{type(self).__name__} is initialized")
        if name == "worker_init_fn" and "_setup" in self.__dict__:
            # Frameworks set it on a loader they were given (Lightning's
            # seed_everything(workers=True)): workers that start from now on call it.
            self._setup.worker_init_fn = value
        super().__setattr__(name, value)

    @property
    def multiprocessing_context(self):
        return self._multiprocessing_context

    @multiprocessing_context.setter
    def multiprocessing_context(self, context) -> None:
        self._multiprocessing_context = compat.check_multiprocessing_context(
            context, self.num_workers)

    @property
    def num_workers(self) -> int:
        """The workers reading now (worker_type='auto' may move to one process per core); with
        num_workers='auto', an int that a DataLoader made from it takes as 'auto'."""
        return _resolved(self._pipeline.num_workers, self.__dict__.get("num_workers"))

    @num_workers.setter
    def num_workers(self, workers: int) -> None:
        self._pipeline.num_workers = workers
        self.__dict__["num_workers"] = workers  # requested now

    @property
    def worker_type(self) -> str:
        """'thread' or 'process': the kind of worker reading now (stats() says why); with
        worker_type='auto', a str that a DataLoader made from it takes as 'auto'."""
        return _resolved(self._pipeline.worker_type, self.__dict__.get("worker_type"))

    @property
    def worker_type_reason(self) -> str:
        return self._pipeline.worker_type_reason

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
        return len(self._pipeline)

    def __iter__(self) -> Iterator:
        previous = self._iterator
        if previous is not None:
            previous._stale = True
        if self._resume is not None:
            (epoch, batch), self._resume = self._resume, None
        else:
            epoch, batch = self._sampler_epoch_or_next(), 0
        self._pipeline.start(epoch, batch)
        self._epoch = epoch + 1
        iterator = EpochIterator(self, epoch, batch)
        self._iterator = iterator
        return iterator

    def set_epoch(self, epoch: int) -> None:
        """Starts `epoch` at the next iter() (as ``sampler.set_epoch`` does for a sampler).
        Called after iter() and before that iterator's first batch, as Lightning calls it
        (iter(), then ``sampler.set_epoch``), it names that iterator's epoch, as a sampler
        that draws its order at the first batch would: an iterator at its epoch's start on
        stoker's own order (``seed=``, a native data set) starts `epoch` instead, and one
        resumed at the end of its epoch (a state taken after an epoch's last batch) starts
        a later `epoch` from where that state's draws left off."""
        epoch = int(epoch)
        self._sampler_set_epoch(epoch)
        self._epoch = epoch
        it = self._iterator
        if it is None or it._stale or it._done or it._yielded:
            return
        own_order_at_start = it._first_batch == 0 and self._plan.sampler is None
        if it._epoch != epoch and (own_order_at_start or (it._at_end and epoch > it._epoch)):
            self._pipeline.start(epoch, 0)
            it._epoch, it._first_batch, it._at_end = epoch, 0, False
        if it._epoch == epoch:
            self._epoch = epoch + 1

    def state_dict(self) -> dict[str, Any]:
        """Where the loader stands: restoring it yields exactly the batches still to come."""
        it = self._iterator
        between = it is None or it._stale or it._done
        return self._pipeline.state_dict(
            self._resume, self._sampler_epoch_or_next() if between else None)

    def global_state_dict(self) -> dict[str, Any]:
        """The state of every rank merged into one (``stoker.merge_states``): where
        torch.distributed is initialized, every rank must call it (it gathers the ranks'
        states). A loader on any number of ranks, workers or batch size restores it with
        ``load_state_dict``, reading each sample left in the epoch once over its ranks."""
        from .elastic import global_state

        return global_state(self.state_dict())

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._resume = self._pipeline.load_state_dict(state)
        self._sampler_set_epoch(self._resume[0])

    # --- stoker's own --------------------------------------------------------------------

    def stats(self) -> dict[str, Any]:
        """Throughput, time the training loop waited, worker busy time, queue depth, slabs,
        which pipeline runs (``pipeline``) and which kind of worker reads and why
        (``worker_type``, ``worker_type_reason``, ``worker_pids``)."""
        logs.drain()
        return self._pipeline.stats()

    def report(self) -> "Report":
        """A verdict on the run so far, from stats(): e.g. ``input-bound: the training loop
        waited 43% of its time; reads are the busiest stage at 97% of 2 cores; more workers
        would not help: CPU saturated; try: record shards / ...``. ``str()`` gives that line;
        the keys give the numbers behind it (``verdict``, ``wait_fraction``, ``busiest``,
        ``busiest_load``, ``worker_cores``, ``cpu_cores``, ``more_workers``,
        ``suggestions``, ...), ``reproducibility`` ('order and augmentation' or 'order')
        with ``reproducibility_reason``, and ``plan``, how the arguments were resolved. A stream's
        report is the training loop's waits only (it runs outside the engine)."""
        report = Report(self._pipeline.report(), plan=str(self._plan))
        logs.drain()
        return report

    def skipped_samples(self) -> list[SkippedSample]:
        """Each distinct sample that failed under ``on_error='skip'`` in the batches handed
        out so far, in index order, with its name (file path or record, where the data set
        has one) and the reason. ``stats()["skipped"]`` counts failed reads (a replacement
        that failed too counts again), ``stats()["bad_samples"]`` the samples listed here."""
        report: dict[int, SkippedSample] = {}
        for index, name, reason in self._pipeline.skipped():
            if index not in report:
                report[index] = SkippedSample(index, name or _sample_name(self.dataset, index),
                                              reason)
        return [report[i] for i in sorted(report)]

    def set_workers(self, workers: int) -> None:
        """Changes the worker count while running; nothing is lost or reordered."""
        self._pipeline.set_workers(int(workers))

    def set_depth(self, depth: int) -> None:
        self._pipeline.set_depth(int(depth))

    def trace(self, path: Optional[Union[str, os.PathLike]], *,
              max_events: int = _stoker.TRACE_MAX_EVENTS) -> None:
        """Records a timeline of the loading from the next batch on, written to ``path`` as
        Chrome trace-event JSON (open it in https://ui.perfetto.dev or chrome://tracing): each
        worker's sample reads and chunks (a worker process's jobs on its own track), each batch
        from opened to ready to taken, the training loop's waits for data and its steps in
        between, copies to the device, queue depth and pinned bytes (a stream's: the training
        loop's waits and steps). The file is written by ``trace(None)``, ``close()``, garbage
        collection, or the next ``trace(path)``. Past ``max_events`` events it keeps the
        newest and says so (its metadata and the log). Raises OSError if the file cannot be
        created."""
        self._pipeline.trace(None if path is None else os.fspath(path), max_events)

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
        self._pipeline.close()
        logs.drain()

    def __del__(self) -> None:
        pipeline = self.__dict__.get("_pipeline")
        if pipeline is not None:
            pipeline.release()

    # --- internals ------------------------------------------------------------------------

    def _sampler_epoch_or_next(self) -> int:
        """The epoch the next iter() starts: the sampler's (set_epoch), else one more."""
        epoch = getattr(self._plan.sampler, "epoch", None)
        return int(epoch) if isinstance(epoch, int) else self._epoch

    def _sampler_set_epoch(self, epoch: int) -> None:
        if self._plan.sampler is not None and hasattr(self._plan.sampler, "set_epoch"):
            self._plan.sampler.set_epoch(epoch)


_PARAMETERS = frozenset(list(inspect.signature(DataLoader.__init__).parameters)[1:])


class _AutoCount(int):
    """A count that 'auto' resolved to: an int, that DataLoader(num_workers=...) takes as
    'auto' (frameworks re-make loaders from their attributes)."""


class _AutoKind(str):
    """A kind of worker that worker_type='auto' resolved to, taken as 'auto' again."""


def _resolved(value, requested):
    if requested != "auto":
        return value
    return _AutoCount(value) if isinstance(value, int) else _AutoKind(value)


def _requested(value):
    return "auto" if isinstance(value, (_AutoCount, _AutoKind)) else value


def _remake(cls, arguments: dict, extra: dict, epoch: int, resume):
    """A pickled DataLoader (of `cls`, a subclass maybe), made again from its arguments."""
    loader = cls.__new__(cls)
    with warnings.catch_warnings():  # said when it was made
        warnings.simplefilter("ignore")
        DataLoader.__init__(loader, **arguments)
    for name, value in extra.items():
        object.__setattr__(loader, name, value)
    loader._epoch, loader._resume = epoch, resume
    return loader


class Report(dict):
    """DataLoader.report(): a dict of the verdict and its numbers; str() is the verdict's
    text."""

    def __str__(self) -> str:
        return self["text"]
