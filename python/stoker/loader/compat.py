"""torch.utils.data.DataLoader's surface for stoker.DataLoader: its argument checks (same order,
same messages; plan.py calls them), the public attributes it sets and the rules on them, and
the warning for each argument stoker does not honour as torch does. Nothing here imports torch
(it is used only when the program imported it)."""

from __future__ import annotations

import math
import multiprocessing
import os
import sys
import warnings
import weakref
from typing import Any, Optional

# torch's DataLoader raises if these are assigned after __init__ (they define the batches).
FROZEN_ATTRIBUTES = ("batch_size", "batch_sampler", "sampler", "drop_last", "dataset",
                     "persistent_workers")

# More workers than this is more than stoker's own tuner would start (num_workers='auto').
MAX_SENSIBLE_WORKERS = 32


def _torch():
    return sys.modules.get("torch")


def warn(message: str) -> None:
    """A UserWarning from the user's call site (shown once per message by default)."""
    warnings.warn(f"stoker: {message}", UserWarning, stacklevel=4)


def default_collate(auto_collation: bool = True):
    """torch's default_collate (default_convert without batching: batch_size=None), or None
    without torch."""
    torch = _torch()
    if torch is None:
        return None
    return torch.utils.data.default_collate if auto_collation else torch.utils.data.default_convert


def check_arguments(*, num_workers, timeout, prefetch_factor, persistent_workers, sampler,
                    shuffle, batch_sampler, batch_size, drop_last) -> list[str]:
    """torch's ValueErrors for impossible combinations, in torch's order and words, and its
    warning for too many workers (returned). num_workers may be 'auto' (more than zero)."""
    workers = 1 if num_workers == "auto" else int(num_workers)
    if workers < 0:
        raise ValueError("num_workers option should be non-negative; use num_workers=0 to "
                         "disable multiprocessing.")
    if timeout < 0:
        raise ValueError("timeout option should be non-negative")
    if workers == 0 and prefetch_factor is not None:
        raise ValueError("prefetch_factor option could only be specified in multiprocessing."
                         "let num_workers > 0 to enable multiprocessing, otherwise set "
                         "prefetch_factor to None.")
    if prefetch_factor is not None and prefetch_factor < 0:
        raise ValueError("prefetch_factor option should be non-negative")
    if prefetch_factor == 0:  # torch's loader accepts it, then fails as its workers start
        raise ValueError("prefetch_factor must be greater than 0 with workers (each worker "
                         "reads prefetch_factor batches ahead)")
    if persistent_workers and workers == 0:
        raise ValueError("persistent_workers option needs num_workers > 0")
    if sampler is not None and shuffle:
        raise ValueError("sampler option is mutually exclusive with shuffle")
    if batch_sampler is not None:
        if batch_size != 1 or shuffle or sampler is not None or drop_last:
            raise ValueError("batch_sampler option is mutually exclusive with batch_size, "
                             "shuffle, sampler, and drop_last")
    elif batch_size is None and drop_last:
        raise ValueError("batch_size=None option disables auto-batching and is mutually "
                         "exclusive with drop_last")
    elif batch_size is not None and (isinstance(batch_size, bool) or int(batch_size) < 1):
        raise ValueError(f"batch_size should be a positive integer value, but got "
                         f"batch_size={batch_size}")
    if num_workers != "auto" and workers > max(MAX_SENSIBLE_WORKERS, os.cpu_count() or 1):
        return [
            f"This DataLoader will create {workers} worker threads in total. stoker's own "
            f"tuner (num_workers='auto') would start at most {MAX_SENSIBLE_WORKERS} on this "
            "system. Please be aware that excessive worker creation might get DataLoader "
            "running slow or even freeze, lower the worker number to avoid potential "
            "slowness/freeze if necessary."]
    return []


def check_multiprocessing_context(context, num_workers: int):
    """torch's checks of multiprocessing_context; returns the context (a name becomes the
    context object, as in torch)."""
    if context is None:
        return None
    if num_workers == 0:
        raise ValueError("multiprocessing_context can only be used with multi-process loading "
                         f"(num_workers > 0), but got num_workers={num_workers}")
    if isinstance(context, str):
        methods = multiprocessing.get_all_start_methods()
        if context not in methods:
            raise ValueError("multiprocessing_context option should specify a valid start "
                             f"method in {methods!r}, but got "
                             f"multiprocessing_context={context!r}")
        context = multiprocessing.get_context(context)
    if not isinstance(context, multiprocessing.context.BaseContext):
        raise TypeError("multiprocessing_context option should be a valid context object or a "
                        "string specifying the start method, but got "
                        f"multiprocessing_context={context}")
    return context


def unhonoured(*, native: bool, worker_type: str, multiprocessing_context,
               worker_init_fn, pin_memory, has_gpu: bool, pin_memory_device: str,
               in_order: bool) -> list[str]:
    """One warning per argument that does not act as it does in torch, saying what stoker
    does instead."""
    said = []
    if multiprocessing_context is not None and (native or worker_type == "thread"):
        why = "a native data set" if native else "worker_type='thread'"
        said.append(f"multiprocessing_context is not used: {why} reads on threads, in this "
                    "process")
    if worker_init_fn is not None and native:
        said.append("worker_init_fn is not called: a native data set's workers run no Python")
    if pin_memory is True and not has_gpu:
        said.append("'pin_memory' argument is set as true but no accelerator is found, then "
                    "device pinned memory won't be used.")
    if pin_memory_device:
        said.append(f"pin_memory_device={pin_memory_device!r} is not used: pinned memory "
                    "serves any GPU; pass device='cuda:N' to have batches arrive on that GPU")
    if not in_order:
        said.append("in_order=False is not used: batches are always delivered in order (the "
                    "workers go on reading the batches after a slow one, up to the prefetch "
                    "depth)")
    return [f"stoker: {message}" for message in said]


class LoaderEpoch:
    """A sampler's ``set_epoch(epoch)`` that sets its loader's next epoch. Frameworks call
    ``loader.sampler.set_epoch`` as each epoch starts (Lightning does, with its own epoch
    count, also in a resumed process whose loader is new); torch's RandomSampler and
    SequentialSampler have none, so a loader whose order or samples' seeds count its epochs
    (``seed=``, ``seed_per_sample=True``, a native data set) would start a resumed run at
    epoch 0. The loader is held weakly; a copy or a pickle of the sampler drops it."""

    def __init__(self, loader=None) -> None:
        self._loader = weakref.ref(loader) if loader is not None else None

    def __call__(self, epoch: int) -> None:
        loader = self._loader() if self._loader is not None else None
        if loader is not None:
            loader.set_epoch(epoch)

    def __reduce__(self):
        return LoaderEpoch, ()


def give_set_epoch(sampler, loader) -> None:
    """Gives `sampler` (the loader's public one) a LoaderEpoch for `loader`, unless it has a
    set_epoch of its own (DistributedSampler's, a user's), which the loader reads itself."""
    if sampler is None:
        return
    own = getattr(sampler, "set_epoch", None)
    if own is not None and not isinstance(own, LoaderEpoch):
        return
    try:
        sampler.set_epoch = LoaderEpoch(loader)
    except AttributeError:  # a sampler with __slots__
        pass


def public_attributes(dataset, num_workers: int, *, batch_size, shuffle, sampler,
                      batch_sampler, drop_last, generator, collate_fn,
                      prefetch_factor) -> dict[str, Any]:
    """The attributes torch's DataLoader sets from these arguments, with torch's values: a
    sampler and a BatchSampler made when none was given (with torch loaded), batch_size None
    and drop_last False under a batch_sampler, default_collate for no collate_fn
    (default_convert with batch_size=None), prefetch_factor None without workers."""
    torch = _torch()
    if batch_sampler is not None:
        batch_size, drop_last = None, False
    if sampler is None and torch is not None:
        data = torch.utils.data
        sampler = (data.RandomSampler(dataset, generator=generator) if shuffle
                   else data.SequentialSampler(dataset))
    if batch_size is not None and batch_sampler is None and torch is not None:
        batch_sampler = torch.utils.data.BatchSampler(sampler, batch_size, drop_last)
    if num_workers > 0 and prefetch_factor is None:
        prefetch_factor = 2
    return {
        "dataset": dataset,
        "batch_size": batch_size,
        "drop_last": bool(drop_last),
        "sampler": sampler,
        "batch_sampler": batch_sampler,
        "generator": generator,
        "collate_fn": (collate_fn if collate_fn is not None
                       else default_collate(batch_sampler is not None)),
        "prefetch_factor": prefetch_factor,
    }


def sized(dataset) -> Optional[int]:
    try:
        return len(dataset)
    except TypeError:
        return None


def batches(samples: int, batch_size: int, drop_last: bool) -> int:
    return samples // batch_size if drop_last else math.ceil(samples / batch_size)


_compatible: dict[type, type] = {}


def torch_compatible_class(cls: type) -> type:
    """`cls` itself, or with torch loaded, a class derived from both `cls` and
    torch.utils.data.DataLoader: what a stoker.DataLoader reports as its ``__class__``, so that
    ``isinstance(loader, torch.utils.data.DataLoader)`` holds (isinstance consults
    ``__class__``) without stoker importing torch or deriving from it (see docs/python.md)."""
    torch = _torch()
    if torch is None or issubclass(cls, torch.utils.data.DataLoader):
        return cls
    if cls not in _compatible:
        try:
            _compatible[cls] = type(cls.__name__, (cls, torch.utils.data.DataLoader),
                                    {"__module__": cls.__module__, "__doc__": cls.__doc__,
                                     "__qualname__": cls.__qualname__})
        except TypeError:  # bases that cannot be combined: every isinstance check asks here
            _compatible[cls] = cls
    return _compatible[cls]
