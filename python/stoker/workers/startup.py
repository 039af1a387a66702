"""A worker's start-up, the same for every kind of worker (threads, worker processes, Ray
actors, stream workers): PyTorch's worker semantics (seeds, ``get_worker_info``,
``worker_init_fn``) and the error info a failed call sends back."""

from __future__ import annotations

import pickle
import random
import sys
import threading
import traceback
from typing import Any, Callable, Optional


def start_worker(worker_id: int, num_workers: int, base_seed: int, dataset,
                 worker_init_fn: Optional[Callable[[int], None]], *, own_process: bool):
    """Starts worker `worker_id` of `num_workers` as PyTorch starts its workers: in a process
    of its own (`own_process`: a worker process or a Ray actor), torch on one thread, the
    process's generators seeded with ``base_seed + worker_id`` and get_worker_info() set; on a
    thread of this process (the engine's worker threads, a stream's), get_worker_info() set
    for that thread (its seed is ``base_seed + worker_id``; the generators are the training
    process's). Then ``worker_init_fn(worker_id)``. On a thread its error is raised (the
    engine, or the stream, reports it); in a process of its own it is returned as error_info,
    which the worker reports with every job, as the reason its rows fail."""
    seed = base_seed + worker_id
    if own_process:
        torch = sys.modules.get("torch")
        if torch is not None:
            torch.set_num_threads(1)
        seed_worker(base_seed, worker_id)
        set_torch_worker_info(worker_id, num_workers, seed, dataset)
    else:
        set_thread_worker_info(worker_id, num_workers, seed, dataset)
    if worker_init_fn is None:
        return None
    if not own_process:
        worker_init_fn(worker_id)
        return None
    try:
        worker_init_fn(worker_id)
    except Exception as e:
        return error_info(e)
    return None


def seed_worker(base_seed: int, worker_id: int) -> int:
    """Seeds this process as PyTorch seeds its workers; returns the worker's seed."""
    seed = base_seed + worker_id
    random.seed(seed)
    torch = sys.modules.get("torch")
    if torch is not None:
        torch.manual_seed(seed)
    if "numpy" in sys.modules:
        import numpy as np

        np.random.seed(_numpy_state(base_seed, worker_id))
    return seed


def _numpy_state(base_seed: int, worker_id: int):
    torch = sys.modules.get("torch")
    if torch is not None:
        from torch.utils.data._utils.worker import _generate_state

        return _generate_state(base_seed, worker_id)
    # Without torch: numpy's own seed sequence over the same entropy.
    import numpy as np

    return np.random.SeedSequence([worker_id, base_seed & 0xFFFFFFFF, base_seed >> 32]).generate_state(4)


def set_torch_worker_info(worker_id: int, num_workers: int, seed: int, dataset: Any) -> None:
    torch = sys.modules.get("torch")
    if torch is None:
        return
    from torch.utils.data._utils import worker as torch_worker

    torch_worker._worker_info = torch_worker.WorkerInfo(
        id=worker_id, num_workers=num_workers, seed=seed, dataset=dataset)


def error_info(exc: BaseException):
    try:
        pickled: Optional[bytes] = pickle.dumps(exc)
        pickle.loads(pickled)  # an exception whose __init__ takes other arguments fails here
    except Exception:
        pickled = None
    text = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    return (type(exc).__module__, type(exc).__qualname__, str(exc), text, pickled)


_thread_info = threading.local()


def _thread_aware_get_worker_info():
    # Runs with torch.utils.data._utils.worker's globals (its __code__ is swapped in below):
    # this thread's stoker worker info if any, else torch's own (a torch worker process's).
    # A thread watching (asks_worker_info) notes that it was asked.
    local = _stoker_thread_worker_info  # noqa: F821
    info = getattr(local, "info", None)
    if info is not None:
        return info
    if getattr(local, "watching", False):
        local.asked = True
    return _worker_info  # noqa: F821


def install_thread_worker_info() -> bool:
    """Makes torch.utils.data.get_worker_info() answer on stoker's worker threads.

    torch's get_worker_info() returns the module global ``_worker_info``, which is per
    process. The function's code is replaced, in place, by code that first looks at a
    thread-local (set on stoker's worker threads only) and otherwise returns that global as
    before, so every reference to the function (also ``from torch.utils.data import
    get_worker_info`` made earlier) answers per thread, and torch's own worker processes are
    unaffected."""
    torch = sys.modules.get("torch")
    if torch is None:
        return False
    from torch.utils.data._utils import worker as torch_worker

    if getattr(torch_worker, "_stoker_thread_worker_info", None) is None:
        torch_worker._stoker_thread_worker_info = _thread_info
        torch_worker.get_worker_info.__code__ = _thread_aware_get_worker_info.__code__
    return True


def asks_worker_info(call: Callable[[], Any]) -> tuple[Any, bool]:
    """call()'s result, and whether it asked torch's get_worker_info() on this thread: a
    stream that does takes its worker's share, as torch's documentation tells it to
    (worker_type='auto' gives such a stream more than one worker). Nothing else changes:
    get_worker_info() answers as before."""
    if not install_thread_worker_info():
        return call(), False
    _thread_info.watching, _thread_info.asked = True, False
    try:
        return call(), _thread_info.asked
    finally:
        _thread_info.watching = False


def set_thread_worker_info(worker_id: int, num_workers: int, seed: int, dataset) -> None:
    """What get_worker_info() answers on this thread from now on."""
    if install_thread_worker_info():
        from torch.utils.data._utils.worker import WorkerInfo

        extra = {"worker_method": "thread"} if "worker_method" in getattr(
            WorkerInfo, "__dataclass_fields__", {}) else {}
        _thread_info.info = WorkerInfo(id=worker_id, num_workers=num_workers, seed=seed,
                                       dataset=dataset, **extra)
