"""worker_type='auto' on the engine pipeline (EnginePipeline's, engine_pipeline.py): the first
batches read on threads and measured (KindChooser), the move of the reads to worker processes
(a batch job's warmed first), the check of that move against what the threads delivered
(MoveCheck), and, with GIL-bound reads, the in-line trial after it (InlineTrial): each decided
between two batches, nothing lost or reordered."""

from __future__ import annotations

from ..workers import warming
from ..workers.processes import ProcessWorkers
from .plan import cores
from .worker_choice import InlineTrial

# How long the training loop waits for worker processes to warm up when worker_type='auto'
# moves batch jobs to them (a padding collate's took 15-30 ms on 2 cores): past this the
# threads go on reading while it ends (a data set whose batches take seconds), and the move
# is checked from the hand-over on.
_WARM_WAIT_S = 2.0


class EngineWorkers:
    """The worker-kind methods of EnginePipeline, over its attributes: plan, _loader, _jobs,
    _setup, _pool, _workers, _warming, _choice, _check, _moving, _inline_read, _remote,
    _thread_count, _torch_order, _threads_ending, worker_type, num_workers,
    worker_type_reason, left; and _engine_workers(), _warn_not_persistent(),
    log_worker_type()."""

    def _start_processes(self, count: int, warn: bool = True, warm: bool = False) -> bool:
        """Starts `count` worker processes and sends reads to them from now on; `warm` (batch
        jobs): once each has made batches until one was as quick as on the threads and made
        ready the arenas its batches in flight need, which the training loop waits for (up to
        _WARM_WAIT_S, the threads reading after that until the warm-up ends). Whether they
        were warmed and took over within that wait."""
        if warn:
            self._warn_not_persistent()
        workers = ProcessWorkers(self.plan.dataset, count, self.plan.context,
                                 self._setup.base_seed, self._setup.worker_init_fn)
        pool = workers.make_pool()
        pool.start()
        self._workers, self._pool = workers, pool
        if not (warm and self._jobs is not None and self._jobs.batches):
            self._loader.use_processes(pool)
            return False
        # A fresh process's first batches cost several (its first collate, its arenas made and
        # faulted in, the copy-on-write faults after the fork): paid here, with the threads
        # stopped (on a small machine they would take the cores the warm-up needs), in the
        # epoch that decided, rather than by the next one's first batches. A short epoch
        # (a few milliseconds) would otherwise pay it in full, once per run all the same.
        stats = self._loader.stats()  # a batch job's time on the threads
        steady = stats["worker_busy_s"] / max(1, self._loader.thread_reads())
        hold = warming.arenas_in_flight(stats["depth"], count)
        self._loader.set_workers(self._engine_workers(0))
        self._warming = warming.Warming(self._loader, pool, self._jobs.batches, steady, hold)
        return self._warming.wait(_WARM_WAIT_S)

    def _stop_warming(self) -> None:
        """close(): a warm-up still running ends now, its pool stopped and, if the loader
        never got it, its processes reaped (the loader's close reaps those it got)."""
        warm, self._warming = self._warming, None
        if warm is not None:
            warm.stop()

    def _choose_worker_type(self) -> None:
        """worker_type='auto': once the first batches were read on threads, moves GIL-bound
        reads to processes (between batches, on this thread: nothing is lost or reordered)."""
        # The local threads (the engine's others wait for remote workers); None: all of them.
        threads = None if self._remote is None else self.num_workers
        decision = self._choice.observe(self._loader, threads, cores(), self._handle.structure)
        if decision is None:
            return
        choice, self._choice = self._choice, None
        to_processes, self.worker_type_reason, count = decision
        check, self._check = self._check, None
        if self._remote is None:  # remote workers read besides: no in-line
            self._inline_read = choice.inline_read()
        if to_processes:
            reading = self._loader.stats()["workers"] - self._engine_workers(0)
            handed = self._start_processes(count, warm=True)
            if handed:
                # Warm, the processes measured their own reads, without the threads' share of
                # the GIL: as many are kept as those need beside the training loop.
                keep, why = choice.keep(self._warming.cpu, count, cores())
                if keep < count:
                    self._workers.retire(self._pool, keep)
                    warming.top_up(self._pool, self._jobs.batches, warming.arenas_in_flight(
                        self._loader.stats()["depth"], keep))
                    count, self.worker_type_reason = keep, self.worker_type_reason + why
            if check is not None:  # checked from the hand-over on (_check_switch)
                self._check, self._moving = check, (max(1, reading), count)
                if handed or self._warming is None:
                    self._moved()
                else:  # the threads read on; the loop's wait for the warm-up is not theirs
                    check.threads_delivered.last = None
            self.worker_type = "process"
            self.num_workers = count
            self._loader.set_workers(self._engine_workers())
            if self._torch_order is not None:
                self._threads_ending = self._loader.thread_reads()
        elif check is not None:
            self._try_inline(check.threads_delivered, check.threads_name)
        self.log_worker_type()

    def _moved(self) -> None:
        """The processes read now: MoveCheck measures them from here."""
        threads, processes = self._moving
        self._moving = None
        self._check.moved(threads, processes)

    def _check_switch(self) -> None:
        """After auto's move to processes, each batch until MoveCheck keeps or leaves them
        (measured from their hand-over: a batch job's warm-up may end after the move); then,
        in-line tried, until InlineTrial keeps it or goes back."""
        if self._moving is not None:
            if self._warming is not None and self._warming.handed:
                self._moved()
            return
        verdict, why = self._check.verdict()
        if verdict == "measuring":
            return
        check, self._check = self._check, None
        if isinstance(check, InlineTrial):
            return self._inline_verdict(check, verdict, why)
        if verdict == "go back":
            self._loader.use_threads()  # returns once no read is left in a process
            self._pool.finish()
            self._pool = self._workers = None
            self.worker_type = "thread"
            self.num_workers = self._thread_count[0] = check.threads
            self._loader.set_workers(self._engine_workers())
            self.left.append(check.left())
        self.worker_type_reason = f"auto: {why}; the switch: {self.worker_type_reason}"
        if verdict == "go back":
            self._try_inline(check.threads_delivered, check.threads_name)
        else:
            self._try_inline(check.processes_delivered, check.now)
        self.log_worker_type()

    def _try_inline(self, now, name: str) -> None:
        """Once auto settled on `name` (threads or processes; `now`, what they delivered),
        with GIL-bound reads: in-line from now on where the model puts it faster (InlineTrial,
        checked by _check_switch). Processes are kept, idle, until it is."""
        worth, why = InlineTrial.worth(self._inline_read, now, name)
        self._inline_read = None  # tried once
        if not worth:
            return
        if self._pool is not None:
            self._loader.use_threads()  # returns once no read is left in a process
        restore = (self.worker_type, self.num_workers)
        self.worker_type, self.num_workers = "thread", 0
        self._thread_count[0] = 0
        self._loader.set_workers(self._engine_workers())
        # The batches read ahead come at once: not in-line's.
        self._check = InlineTrial(now, name, self._loader.stats()["depth"] + 1, restore)
        self.worker_type_reason += f"; {why}"

    def _inline_verdict(self, trial: InlineTrial, verdict: str, why: str) -> None:
        """InlineTrial's verdict: in-line kept (the processes, idle since, stopped), or back to
        the setting it left."""
        self.left.append(trial.left(kept=verdict == "keep"))
        if verdict == "keep":
            if self._pool is not None:
                self._pool.finish()
                self._pool = self._workers = None
        else:
            self.worker_type, self.num_workers = trial.restore
            if self._pool is not None:
                self._loader.use_processes(self._pool)
                if self._torch_order is not None:
                    self._threads_ending = self._loader.thread_reads()
            else:
                self._thread_count[0] = self.num_workers
            self._loader.set_workers(self._engine_workers())
        self.worker_type_reason = f"auto: {why}; before: {self.worker_type_reason}"
        self.log_worker_type()

    def _after_threads_end(self) -> None:
        """After a move to processes, at each batch until no read ended on a thread since the
        last (the threads' chunks in flight are done): the next epoch's order is drawn ahead
        again if their random transforms drew from this process's generators since."""
        self._torch_order.redraw_ahead(self._loader)
        reads = self._loader.thread_reads()
        self._threads_ending = reads if reads != self._threads_ending else None
