"""The engine pipeline: a map-style data set's samples (or batch jobs) read by the C++ engine
(stoker._stoker.Loader) on worker threads, worker processes or Ray actors, and each delivered
batch made into what the training loop gets. Built from a Plan (plan.py); the DataLoader
delegates to it through the protocol of protocol.py."""

from __future__ import annotations

import dataclasses

import functools
import logging
import time
from typing import Optional

import numpy

from .. import _stoker
from ..remote.pool import RemoteWorkers
from ..workers.jobs import user_dataset
from ..workers.processes import ProcessWorkers
from ..workers.startup import start_worker
from ..workers import warming
from . import compat, engine_options
from .assemble import batch_builder, converter
from .collate import mover, pinned
from .engine_state import EngineStates
from .engine_workers import EngineWorkers
from .protocol import EPOCH_END, Pipeline
from .plan import BATCH_JOBS, Plan, engine_enum
from .seeding import (BatchesAhead, DrawSources, TorchOrderFeed, TorchRandomOrder,
                      WorkerSetup, epoch_batches, peek_seed, sampler_generators, stateful)
from .worker_choice import KindChooser, MoveCheck

_log = logging.getLogger("stoker")

class EnginePipeline(EngineStates, EngineWorkers, Pipeline):
    """`index`: torch's public attributes the batches of a batch job's epoch follow (dataset,
    sampler, batch_sampler, batch_size, drop_last), as the DataLoader holds them."""

    def __init__(self, plan: Plan, index: dict, setup: WorkerSetup) -> None:
        super().__init__(plan)
        self._index = index
        self._setup = setup
        self._torch_order = (TorchOrderFeed(plan.sampler, setup)
                             if isinstance(plan.sampler, TorchRandomOrder) else None)
        self._jobs = plan.dataset if plan.mode == BATCH_JOBS else None
        if self._jobs is not None:
            # Each epoch's batches, drawn at iter() and, where they can be, ahead.
            self._epoch_batches = functools.partial(epoch_batches, index, plan.shuffle,
                                                    plan.seed)
            self._batches_ahead = BatchesAhead(self._epoch_batches, index["batch_sampler"],
                                               index["sampler"], setup)
        # What a Python data set's epochs draw from (a native one's draw nothing), carried by
        # state_dict(); a loaded state's: the resumed epoch's draws at its start (_replay),
        # and the state as loaded, until start() (_loaded_draws).
        self._sources: Optional[DrawSources] = None
        if not plan.native:
            drawn = plan.sampler if self._jobs is None else (
                index["batch_sampler"] if index["batch_sampler"] is not None
                else index["sampler"])
            self._sources = DrawSources([plan.generator, *sampler_generators(drawn)],
                                        stateful(drawn), setup)
        self._replay: Optional[dict] = None
        self._loaded_draws: Optional[dict] = None
        self._remote: Optional[RemoteWorkers] = None
        self._workers: Optional[ProcessWorkers] = None
        self._pool = None
        self._warming: Optional[warming.Warming] = None  # _start_processes(warm=True)
        # After auto's move to processes, until the threads' reads end: _after_threads_end.
        self._threads_ending: Optional[int] = None
        self._thread_count = [0]
        if plan.native:
            self._handle = plan.dataset._handle
        else:
            # No reference to self from here: the C++ data set holds it, and a cycle through
            # C++ would keep the pipeline alive.
            thread_count = self._thread_count = [self.num_workers]
            dataset = user_dataset(plan.dataset)

            def start(worker_id: int) -> None:  # once per worker thread, as it starts
                start_worker(worker_id, thread_count[0], setup.base_seed, dataset,
                             setup.worker_init_fn, own_process=False)
            self._worker_start = start
            self._handle = self._new_handle()
        # The two decisions taken while it runs (src/tune/worker_kind.cc): worker_type='auto',
        # and with num_workers='auto' and remote=, how many remote workers to use.
        self._choice = (KindChooser(self._jobs is not None, plan.tune_workers,
                                    plan.process_count) if plan.measure_worker_type else None)
        self._remote_tuning = _stoker.RemoteWorkerTuner() if plan.tune_remote else None
        # worker_type='auto', measuring what it chose (_check_switch): its move to processes
        # (MoveCheck), then in-line tried where it may be faster (InlineTrial).
        self._check = MoveCheck() if plan.measure_worker_type else None
        self._inline_read: Optional[float] = None  # KindChooser.inline_read(), once decided
        self._moving: Optional[tuple] = None  # MoveCheck.moved()'s, until the hand-over
        # Worker processes start with the first epoch, whose iter() draws their base seed.
        self._processes_due = self.worker_type == "process"
        if self._processes_due:
            self._warn_not_persistent()
        if plan.remote is not None:
            # Remote workers are set up now: their base seed is the one the first iter() would
            # draw, peeked at (the generator does not move; nor does it at each iter()).
            setup.base_seed, setup.persistent = peek_seed(setup.generator), True
            # Engine threads num_workers.. drive the remote workers; a unit is read locally
            # when no remote worker's slot is free.
            self._remote = RemoteWorkers(plan.remote, plan.dataset, self.num_workers,
                                         self.num_workers + plan.remote.count,
                                         setup.base_seed, setup.worker_init_fn,
                                         active=0 if plan.tune_remote else None)
        self._order = None  # the custom sampler's order of the epoch running, once read
        # A data set of URL shards: its store's counters before the engine below prefetches.
        self._storage = getattr(plan.dataset, "object_storage", None) if plan.native else None
        self._storage_start = self._storage() if self._storage is not None else {}
        # Construction reads nothing, as torch's: a Python data set's workers start with the
        # first iter(), and so do those following a custom sampler (a native data set's
        # otherwise prefetch at once).
        self._reading = plan.native and plan.order_length is None
        self._loader = self._new_loader()
        # The kinds of worker besides threads (the engine's executors); the loader has no
        # workers yet, so nothing was read elsewhere. Worker processes join at the first
        # start() (_processes_due).
        if self._remote is not None:
            self._loader.use_remote(self._remote)
        if not plan.measure_worker_type:
            self.log_worker_type()
        self._build = self._convert = None
        self._as_arrays = False  # fields taken as numpy arrays (no torch), else as capsules
        # A native data set's object columns (ParquetDataset's strings) come with the batch's
        # indices, on this side.
        self._objects_of = getattr(plan.dataset, "_batch_objects", None) if plan.native else None
        if plan.native:
            self._make_batches(plan.dataset._structure())
        if self._jobs is not None:
            self._finish_batch_jobs(self._loader.device().is_cuda or plan.pin_always)
        self._samples = compat.sized(index["dataset"])
        # Elastic resume (elastic.py) needs stoker's own order of a sized data set.
        self._elastic = (self._jobs is None and plan.order_length is None
                         and self._samples is not None)
        # An epoch resumed on another topology: (epoch, consumed ranges, samples this rank
        # reads in it); and one loaded, which the next start() resumes: (epoch, consumed,
        # order, batch).
        self._resumed: Optional[tuple] = None
        self._pending: Optional[tuple] = None
        # len() follows the data set's length where the order is of all its samples:
        # stoker's own, or torch's RandomSampler's permutations (TorchRandomOrder).
        self._follows_len = ((plan.order_length is None
                              or isinstance(plan.sampler, TorchRandomOrder))
                             and plan.world_size == 1 and self._jobs is None)

    # --- the protocol -------------------------------------------------------------------

    def start(self, epoch: int, batch: int) -> None:
        replay, self._replay, self._loaded_draws = self._replay, None, None
        keep = self._sources.begin(replay) if self._sources is not None else None
        try:
            self._start(epoch, batch)
        finally:
            if self._sources is not None:
                self._sources.end(keep)

    def _start(self, epoch: int, batch: int) -> None:
        feed = self._torch_order
        took = feed is not None and feed.take(epoch, batch)
        if not self.plan.native:  # as torch's iter(): the workers' base seed, then the order
            if not took:
                self._setup.begin_epoch()
            if self._processes_due:
                self._processes_due = False
                self._start_processes(self.plan.process_count, warn=False)
        samples = compat.sized(self._index["dataset"])
        if self._samples is not None and samples is not None and samples != self._samples:
            compat.warn(f"the data set has {samples} samples, {self._samples} when this "
                        f"DataLoader was made: it reads those {self._samples} (make a new "
                        "DataLoader to read them all)")
        if self._jobs is not None:
            batches = self._epoch_batches(epoch)
            if len(batches) != len(self._jobs):
                raise ValueError(f"stoker: the batch sampler made {len(batches)} batches this "
                                 f"epoch and {len(self._jobs)} before: stoker needs the same "
                                 f"number in every epoch")
            kept = self._jobs.kept(epoch, batches)  # else what was read ahead is dropped
            self._jobs.set_epoch(epoch, batches, self._batches_ahead(epoch + 1))
            if not kept:
                self._loader.restart_fresh(epoch)
        if feed is not None:
            feed.start(self._loader, epoch, batch, took)
            if not took:  # resumed with the order drawn now
                return self._start_reading()
        elif self.plan.order_length is not None:
            order = list(self.plan.sampler)
            if order != self._order:  # a custom sampler's new order: drop the old prefetch
                self._loader.set_order(order)
                if self._order is not None:
                    self._loader.restart_fresh(epoch)
                self._order = order
        pending, self._pending = self._pending, None
        if pending is not None and pending[0] == epoch:
            _, consumed, order, batch = pending
            self._loader.resume(epoch, order, batch)
            self._resumed = (epoch, consumed, len(order))
        else:
            self._loader.restore(epoch, batch)
        self._start_reading()

    def _start_reading(self) -> None:
        if not self._reading:
            self._reading = True
            self._loader.set_workers(self._engine_workers())

    def next(self, timeout: float):
        asked = time.perf_counter() if self._check is not None else 0.0
        raw = self._loader.next(timeout)
        if self._check is not None:
            self._check.delivered(asked, raw is None)
        if raw is None:
            return EPOCH_END
        if self._build is None:
            self._make_batches(self._handle.structure())
        # One call: the fields and object values, and the handle's hold on the slab let go
        # (the tensors keep the buffer; returning them all recycles it).
        fields, objects = raw.take(self._as_arrays)
        if self._choice is not None:
            self._choice.batch(objects)  # before it decides: a batch job's hand-over timed
            self._choose_worker_type()
        else:
            if self._check is not None:
                self._check_switch()
            if self._threads_ending is not None:
                self._after_threads_end()
        if self._remote_tuning is not None and self._remote_tuning.due():
            self._tune_remote()
        arrays = self._convert(fields)
        if self._objects_of is not None:
            return self._build(arrays, self._objects_of(raw.indices()))
        return self._build(arrays, objects)

    def __len__(self) -> int:
        index = self._index
        sampler = index["batch_sampler"] if index["batch_sampler"] is not None else (
            index["sampler"])
        len(sampler)  # as torch's: TypeError for a sampler without __len__
        samples = compat.sized(index["dataset"])
        if self._follows_len and samples is not None and samples != self._samples:
            # As torch's, len() follows a data set that grew or shrank (iter() warns).
            return compat.batches(samples, self.plan.batch_size, self.plan.drop_last)
        return self._loader.batches_per_epoch

    def _stats(self) -> dict:
        stats = self._loader.stats()
        if self._remote is not None:
            stats["remote"] = self._remote.stats()
        if self._storage_start:  # the store is the process's: counted from the loader's start
            stats["object_storage"] = {k: v - self._storage_start.get(k, 0)
                                       for k, v in self._storage().items()}
        return stats

    def pids(self) -> list:
        return list(self._pool.pids()) if self._pool is not None else []

    def deaths(self) -> int:
        return self._pool.deaths() if self._pool is not None else 0

    def processes(self) -> list:
        return self._workers.processes() if self._workers is not None else []

    def _report(self) -> dict:
        report = self._loader.report()
        deaths = self.deaths()
        if deaths:  # worker processes killed (the OOM killer) and replaced
            report["worker_deaths"] = deaths
            report["text"] += (f"; {deaths} worker process{'es' if deaths > 1 else ''} died "
                               f"reading and {'were' if deaths > 1 else 'was'} replaced, "
                               f"{'their' if deaths > 1 else 'its'} samples read again (if "
                               f"the OOM killer: fewer workers or a memory cap)")
        return report

    def skipped(self) -> list:
        return self._loader.skipped_samples()

    def set_workers(self, workers: int) -> None:
        if self._reading:
            self._loader.set_workers(self._engine_workers(workers))
        self.num_workers = workers
        self._thread_count[0] = workers

    def set_depth(self, depth: int) -> None:
        self._loader.set_depth(depth)

    def trace(self, path: Optional[str], max_events: int) -> None:
        self._loader.trace(path, max_events)

    def close(self) -> None:
        if self._loader.closed:
            return
        self._stop_warming()
        if self._remote is not None:
            self._remote.stop()  # threads waiting for a remote worker return at once
        try:
            self._loader.trace(None)
        finally:
            self._loader.close()

    def release(self) -> None:
        # The C++ loader writes a trace still recording as it goes (a failure is logged).
        loader = getattr(self, "_loader", None)
        if loader is not None and not loader.closed:
            self._stop_warming()
            if self._remote is not None:
                self._remote.stop()
            loader.close()

    def _new_loader(self):
        plan = self.plan
        return _stoker.Loader(self._handle, engine_options.options(
            batch_size=plan.batch_size, shuffle=plan.engine_shuffle, seed=plan.engine_seed,
            shuffle_mode=engine_enum(_stoker.ShuffleMode, plan.shuffle_mode),
            drop_last=plan.drop_last,
            shard=engine_options.shard(plan.rank, plan.world_size, plan.shard_drop_last),
            workers=self._engine_workers() if self._reading else 0, depth=plan.depth,
            on_error=engine_enum(_stoker.ErrorPolicy, plan.on_error),
            max_skipped=plan.max_skipped, device=plan.device, device_depth=plan.device_depth,
            stream=engine_options.training_stream(plan),
            pin_memory=engine_enum(_stoker.PinMemory, plan.pin_memory),
            pin_budget=plan.pin_budget, memory_limit=plan.memory_limit,
            tune_workers=plan.tune_workers,
            max_workers=plan.max_workers, keep_on_host=list(plan.keep_on_host)),
            # torch's permutations go to the engine itself (order_ahead, resume) through
            # the identity; a custom sampler's order is set at each epoch.
            None if plan.order_length is None else
            numpy.arange(plan.order_length) if isinstance(plan.sampler, TorchRandomOrder) else
            [0] * plan.order_length,
            shared_slabs=not plan.native and self.worker_type == "process"
            or plan.measure_worker_type)

    def _new_handle(self):
        # Reads nothing: the layout comes from the first sample a worker reads.
        handle = _stoker.PyDataset(self.plan.dataset, self._jobs is not None, self._worker_start)
        if self._jobs is not None:
            handle.set_batch_jobs(self._jobs.job_args)
        return handle

    def reseed(self, seed: int) -> None:
        """The engine's seed (the samples' seeds' base, stoker.sample_seed()) set to `seed`:
        that of a loaded state whose order is torch's (drawn from torch's generator when the
        loader was made: a resumed process's may differ). Before the first read only: the C++
        loader (which closes its data set's handle) is made again, with a new handle."""
        if self._reading:
            raise ValueError("stoker: the state's samples were seeded from another seed than "
                             "this loader's, which has read already: load the state into a "
                             "loader that has not been iterated, or pass seed=")
        self.plan = dataclasses.replace(self.plan, engine_seed=int(seed))
        self._loader.close()
        self._handle = self._new_handle()
        self._loader = self._new_loader()
        if self._remote is not None:
            self._loader.use_remote(self._remote)

    # --- what the engine pipeline adds --------------------------------------------------

    @property
    def remote(self) -> Optional[RemoteWorkers]:
        return self._remote

    def set_remote_active(self, active: int) -> None:
        """Uses `active` remote workers from now on (the engine's threads follow)."""
        self._remote.set_active(active)
        self._loader.set_workers(self._engine_workers())

    def _warn_not_persistent(self) -> None:
        # Only when passed: a warning for torch's default could not be silenced.
        if self.plan.warn_not_persistent:
            compat.warn("worker processes persist across epochs (persistent_workers=False is "
                        "not honoured): changes made to the data set in this process after "
                        "they started are not seen by them")

    def _engine_workers(self, local: Optional[int] = None) -> int:
        """The engine's worker threads: the local workers (`local`, else num_workers) and one
        per slot of the remote workers in use."""
        local = self.num_workers if local is None else local
        return local + (self._remote.threads if self._remote is not None else 0)

    def _tune_remote(self) -> None:
        before = self._remote.active
        decision = self._remote_tuning.observe(self._loader, self.num_workers, before,
                                               self._remote.size)
        if decision is None or decision[0] == before:
            return
        active, wait, load = decision
        self.set_remote_active(active)
        _log.info("stoker: remote workers %d -> %d (the training loop waited %.0f%%, "
                  "local workers %.0f%% busy)", before, active, 100 * wait, 100 * load)

    def _finish_batch_jobs(self, pin: bool) -> None:
        """The batch path's last step: batches moved to the device, pinned first by worker
        threads."""
        if pin:
            self._jobs.collate_fn = pinned(self._jobs.collate_fn)
        move = mover(self._loader.device(), pin)
        self._as_arrays = False
        self._convert = lambda fields: None  # a batch job's batch is its one object value
        self._build = lambda arrays, objects: move(objects[0][0])

    def _make_batches(self, structure) -> None:
        """How a delivered batch becomes what the training loop gets, once the layout is
        known (a Python data set's, from the first sample read)."""
        self._build = batch_builder(structure, None)
        self._as_arrays, self._convert = converter(
            engine_options.element_types(structure), self._loader.device().is_cuda)
