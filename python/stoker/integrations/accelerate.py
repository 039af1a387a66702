"""Hugging Face Accelerate with stoker: ``accelerator.prepare(loader)`` keeps stoker iterating.

Accelerate's ``prepare_data_loader`` (what ``Accelerator.prepare`` calls) and
``skip_first_batches`` return its own loader, a ``DataLoaderShard`` (or ``DataLoaderDispatcher``,
``SkipDataLoader``) that iterates an inner torch DataLoader (``base_dataloader``) made from the
given loader's attributes, with Accelerate's sharded batch sampler. ``install()`` wraps both
functions: given a ``stoker.DataLoader``, the inner loader is a stoker.DataLoader with the same
batches (Accelerate's data set, batch sampler, collate_fn, generator, worker_init_fn) and the
stoker loader's own requested settings (num_workers='auto', worker_type, device, ...), so
Accelerate's device placement, RNG synchronisation, gradient-accumulation end detection and
state keep working around stoker. Other loaders are passed through untouched.

    import stoker.integrations.accelerate
    stoker.integrations.accelerate.install()  # done for you when a stoker.DataLoader is made
                                              # after `import accelerate`
"""

from __future__ import annotations

import functools
import threading

__all__ = ["install", "installed", "stoker_loader_like"]

# The batches are Accelerate's: these come from the loader it built, the rest from stoker's.
_SAMPLING = ("dataset", "batch_size", "shuffle", "sampler", "batch_sampler", "drop_last",
             "collate_fn", "generator", "worker_init_fn", "timeout")
_lock = threading.Lock()
_installed = False


def installed() -> bool:
    return _installed


def install() -> None:
    """Wraps accelerate's prepare_data_loader and skip_first_batches (idempotent)."""
    global _installed
    with _lock:
        if _installed:
            return
        import accelerate.accelerator as accelerator_module
        import accelerate.data_loader as data_loader_module

        for name in ("prepare_data_loader", "skip_first_batches"):
            original = getattr(data_loader_module, name)
            wrapped = _keeping_stoker(original)
            for module in (data_loader_module, accelerator_module):
                if getattr(module, name, None) is original:
                    setattr(module, name, wrapped)
        _installed = True


def _keeping_stoker(original):
    @functools.wraps(original)
    def wrapper(dataloader, *args, **kwargs):
        result = original(dataloader, *args, **kwargs)
        source = _stoker_loader(dataloader)
        if source is None:
            return result
        return _with_stoker_inside(result, source)

    wrapper.__stoker_wrapped__ = original
    return wrapper


def _stoker_loader(loader):
    """The stoker.DataLoader `loader` is, or wraps (as Accelerate's loaders do), or None. By the
    real type: an Accelerate loader reports its inner loader's class as its own."""
    from ..loader.dataloader import DataLoader

    while loader is not None:
        if issubclass(type(loader), DataLoader):
            return loader
        loader = getattr(loader, "__dict__", {}).get("base_dataloader")
    return None


def _with_stoker_inside(result, source):
    """`result` (Accelerate's loader) iterating a stoker loader like its torch one."""
    inner = result.__dict__.get("base_dataloader")
    if inner is None:  # skip_first_batches without an adapter: a plain torch DataLoader
        return stoker_loader_like(result, source)
    if _stoker_loader(inner) is None:
        result.base_dataloader = stoker_loader_like(inner, source)
        if hasattr(result, "dl_state_dict"):
            result.dl_state_dict = result.base_dataloader.state_dict()
    return result


def stoker_loader_like(loader, source):
    """A stoker.DataLoader with `loader`'s batches (a torch DataLoader's: its data set, batch
    sampler or sampler, collate_fn, generator, worker_init_fn, timeout) and the requested
    settings of the stoker.DataLoader `source` (num_workers, worker_type, pin_memory, device,
    on_error, ...)."""
    from torch.utils.data import IterableDataset

    from ..loader.dataloader import DataLoader

    arguments = {name: value for name, value in source._arguments.items()
                 if name not in _SAMPLING}
    arguments.update(collate_fn=loader.collate_fn, generator=loader.generator,
                     worker_init_fn=loader.worker_init_fn, timeout=loader.timeout)
    if isinstance(loader.dataset, IterableDataset):
        return DataLoader(loader.dataset, batch_size=loader.batch_size,
                          drop_last=loader.drop_last, **arguments)
    if loader.batch_sampler is not None:
        return DataLoader(loader.dataset, batch_sampler=loader.batch_sampler, **arguments)
    return DataLoader(loader.dataset, batch_size=None, sampler=loader.sampler, **arguments)
