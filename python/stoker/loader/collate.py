"""Batches of the batch path and of streams: torch's default_collate (into ordinary memory),
pinning by worker threads, and the move of a finished batch to the device."""

from __future__ import annotations

import sys
from typing import Callable

from ..workers import jobs


def _torch():
    return sys.modules.get("torch")


def default_collate(auto_collation: bool) -> Callable:
    """torch's default_collate (batches) or default_convert (batch_size=None)."""
    torch = _torch()
    if torch is None:
        raise TypeError("stoker: batching without torch needs a collate_fn")
    return _default_collate if auto_collation else torch.utils.data.default_convert


def _default_collate(batch):
    """torch's default_collate, except where it stacks a batch's tensors: in a worker, torch's
    stacks them into a new shared-memory segment per batch (the way its workers hand batches
    over); stoker's hand them over otherwise, so this stacks them into ordinary memory."""
    global _collate_fn_map
    from torch.utils.data._utils import collate

    if _collate_fn_map is None:
        _collate_fn_map = {**collate.default_collate_fn_map, _torch().Tensor: _stack}
    return collate.collate(batch, collate_fn_map=_collate_fn_map)


_collate_fn_map = None


def _stack(batch, *, collate_fn_map=None):
    torch = _torch()
    if batch[0].is_nested or batch[0].layout != torch.strided:  # torch's errors
        from torch.utils.data._utils import collate

        return collate.collate_tensor_fn(batch, collate_fn_map=collate_fn_map)
    return torch.stack(batch, 0)


def mover(device, pin: bool) -> Callable:
    """What a batch path's batch goes through in the training loop: its tensors (in any
    nesting) moved to `device` (a _stoker.Device) if it is a CUDA device; a batch for the CPU
    as it is. With `pin` (set where a GPU reads the batches) worker threads pin the collate
    output first (pinned()), so the copy is an asynchronous DMA."""
    if not device.is_cuda:
        return lambda batch: batch
    torch = _torch()
    target = torch.device(str(device))
    return lambda batch: _tree_map(
        batch, lambda t: t.to(target, non_blocking=pin and t.is_pinned()))


def pinned(collate_fn: Callable) -> Callable:
    """collate_fn, its tensors then copied into pinned memory by the worker thread that made
    them (not in worker processes: their batches are in shared memory)."""
    def collate(samples):
        batch = collate_fn(samples)
        return batch if jobs.in_worker_process else _tree_map(batch, lambda t: t.pin_memory())
    return collate


def _tree_map(obj, fn: Callable):
    torch = _torch()
    if isinstance(obj, torch.Tensor):
        return fn(obj)
    if isinstance(obj, tuple) and hasattr(obj, "_fields"):
        return type(obj)(*(_tree_map(x, fn) for x in obj))
    if isinstance(obj, (list, tuple)):
        return type(obj)(_tree_map(x, fn) for x in obj)
    if isinstance(obj, dict):
        values = {k: _tree_map(v, fn) for k, v in obj.items()}
        try:
            return values if type(obj) is dict else type(obj)(values)
        except TypeError:
            return values
    return obj
