"""The two kinds of worker, on the Python side: worker processes (started with
multiprocessing, served by stoker/workers/main.py), and the errors they send back."""

from __future__ import annotations

import functools
import importlib
import multiprocessing
import os
import pickle
import socket
import sys
import threading
import time
from typing import Any, Callable, NamedTuple, Optional

from .. import _stoker
from . import arena as _arena
from . import main as _worker

# How long close() gives worker processes to exit when asked (EOF on their socket: one
# waiting for a job exits at once, with code 0) before SIGTERM, and after SIGTERM before
# SIGKILL.
_ASKED_S = 0.1
_GRACE_S = 0.5


def mp_context(multiprocessing_context):
    """The multiprocessing context: the one given (name or context), else fork on Linux, as
    PyTorch."""
    if multiprocessing_context is None:
        methods = multiprocessing.get_all_start_methods()
        return multiprocessing.get_context("fork" if "fork" in methods else methods[0])
    if isinstance(multiprocessing_context, str):
        return multiprocessing.get_context(multiprocessing_context)
    return multiprocessing_context


class ProcessWorkers:
    """Starts, restarts and reaps the worker processes of one loader; the C++ ProcessPool
    (python/src/py_workers.h) drives them."""

    def __init__(self, dataset, count: int, context, base_seed: int,
                 worker_init_fn: Optional[Callable[[int], None]]) -> None:
        self._dataset = dataset
        self._count = count
        self._context = context
        self._base_seed = base_seed
        self._worker_init_fn = worker_init_fn
        self._use_getitems = hasattr(dataset, "__getitems__")
        self._processes: dict[int, Any] = {}
        self._retired: list = []
        self._ended: dict[int, int] = {}  # pid: exit code, of the workers started again
        self._lock = threading.Lock()

    def make_pool(self):
        """The C++ pool that drives these workers. It holds this object (not the other way
        round, so that no reference cycle runs through C++, where the collector cannot see it)."""
        item = "batch" if hasattr(self._dataset, "job_args") else "sample"
        return _stoker.ProcessPool(self._spawn, functools.partial(decode_reply, item=item),
                                   self._reap, self._exitcode, self._count)

    def _spawn(self, worker_id: int):
        """Starts worker `worker_id` (again); returns (fd of the parent's end, pid)."""
        with self._lock:
            old = self._processes.pop(worker_id, None)
        if old is not None:
            _arena.forget(old.pid)
            old.join(_GRACE_S)  # dead already: reap it now (no zombie)
            if old.exitcode is None:
                self._retired.append(old)
            else:
                with self._lock:
                    self._ended[old.pid] = old.exitcode
        parent, child = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        method = self._context.get_start_method()
        forked = method == "fork"
        # A forkserver's worker is the server's child, not ours.
        parent_pid = None if method == "forkserver" else os.getpid()
        # A forked worker inherits every fd: it closes the other workers' sockets and the
        # slabs' memfds (it is sent those it needs), so that EOF means what it should.
        close_fds = (list(_stoker.inherited_fds()) + [parent.fileno()]) if forked else []
        process = self._context.Process(
            target=_worker.main, name=f"stoker worker {worker_id}", daemon=True,
            args=(child, self._dataset, worker_id, self._count,
                  self._base_seed, self._worker_init_fn, close_fds, parent_pid,
                  self._use_getitems,
                  # PR_SET_PDEATHSIG fires when the thread that forked exits, not the process:
                  # only for workers started from the main thread (a restarted worker is
                  # started by an engine thread); EOF on the socket covers the others.
                  threading.current_thread() is threading.main_thread(),
                  "torch" in sys.modules))
        try:
            process.start()
        finally:
            child.close()
        with self._lock:
            self._processes[worker_id] = process
        return parent.detach(), process.pid

    def _exitcode(self, pid: int) -> Optional[int]:
        """Worker `pid`'s exit code (negative: the signal that killed it), which the pool
        asks for when multiprocessing reaped the worker before the pool read its status (a
        Process that starts reaps its finished siblings); None if not known."""
        with self._lock:
            if pid in self._ended:
                return self._ended[pid]
            found = [p for p in (*self._processes.values(), *self._retired) if p.pid == pid]
        return found[0].exitcode if found else None

    def retire(self, pool, keep: int) -> None:
        """Keeps workers 0..keep-1 of `pool` (this object's) and lets the others go: their
        sockets shut down (each exits at EOF, reaped with the others at close) and the arenas
        this process mapped from them unmapped. The kept workers' get_worker_info() still
        says the count they started with."""
        pool.retire(keep)
        with self._lock:
            gone = [self._processes.pop(i) for i in sorted(self._processes) if i >= keep]
            self._retired.extend(gone)
        for p in gone:
            _arena.forget(p.pid)

    def processes(self) -> list:
        """The worker processes now running (multiprocessing.Process objects), by worker id."""
        with self._lock:
            return [self._processes[i] for i in sorted(self._processes)]

    def _reap(self) -> None:
        """Called by the pool when the loader closes, its sockets shut down: waits briefly for
        the workers to exit, then SIGTERM, then SIGKILL, and reaps every worker. Their Process
        objects stay open (torch's iterator lists them: exitcode and join() answer) and close
        their descriptors when collected."""
        with self._lock:
            processes = list(self._processes.values()) + self._retired
            self._processes.clear()
            self._retired = []
        for p in processes:
            _arena.forget(p.pid)
        deadline = time.monotonic() + _ASKED_S
        for p in processes:
            p.join(max(0.0, deadline - time.monotonic()))
        for p in processes:
            if p.exitcode is None:
                p.terminate()
        for p in processes:
            p.join(_GRACE_S)
            if p.exitcode is None:
                p.kill()
                p.join()


class DecodedReply(NamedTuple):
    """A worker process's reply blob as ProcessPool (python/src/py_workers.cc) reads it, by
    name (docs/worker_protocol.md, *Replies by name*)."""

    objects: Optional[list]  # each row's object values, or None without object slots
    failures: dict  # {row: exception}


def decode_reply(blob: bytes, worker_id: int, pid: int, indices: list,
                 item: str = "sample") -> DecodedReply:
    """A worker's reply blob, decoded; `indices` (the rows' sample indices, for the messages)
    may be empty when no row's status failed."""
    objects, errors = pickle.loads(blob)
    if objects is not None and item == "batch":  # whole batches, their tensors in arenas
        objects = [_arena.loads(o, pid) if isinstance(o, bytes) else o for o in objects]
    elif objects is not None and len(objects) == 1 and isinstance(objects[0], _arena.Packed):
        objects = [_arena.loads(objects[0].blob, pid)]  # a probe's sample
    return DecodedReply(objects, {
        row: rebuild_error(info, f"stoker: raised in DataLoader worker process {worker_id} "
                                 f"(pid {pid}) while reading {item} {indices[row]}")
        for row, info in errors})


def rebuild_error(info, where: str) -> BaseException:
    """The worker's exception, with its type where it can be rebuilt here (as torch's
    ExceptionWrapper), else RuntimeError; `where` and its traceback text go into a note."""
    module, qualname, message, text, pickled = info
    exception: Optional[BaseException] = None
    if pickled is not None:
        try:
            exception = pickle.loads(pickled)
        except Exception:
            exception = None
    if exception is None:
        try:
            cls = importlib.import_module(module)
            for part in qualname.split("."):
                cls = getattr(cls, part)
            exception = cls(message)
        except Exception:
            exception = RuntimeError(f"{module}.{qualname}: {message}")
    note = f"{where}; original traceback:\n{text.rstrip()}"
    if hasattr(exception, "add_note"):
        exception.add_note(note)
    return exception
