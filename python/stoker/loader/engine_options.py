"""What the engine pipeline hands the C++ loader: stoker::LoaderOptions and its Shard, the
training loop's CUDA stream, and the element types of a batch's arrays."""

from __future__ import annotations

import sys

from .. import _stoker
from .plan import Plan


def element_types(structure) -> list[str]:
    types: dict[int, str] = {}

    def walk(node):
        if node[0] == "array":
            types[node[1]] = node[2]
        elif node[0] in ("seq", "map"):
            for child in node[-1]:
                walk(child)

    walk(structure)
    return [types[f] for f in sorted(types)]


def training_stream(plan: Plan) -> int:
    """The training loop's CUDA stream: batches copied to the GPU make it wait for their copy;
    with pin_memory=True a pinned slab is refilled only after the work queued on it when its
    batch was freed (the loop's own x.to("cuda", non_blocking=True)) has run."""
    torch = sys.modules.get("torch")
    if torch is None or not torch.cuda.is_available():
        return 0
    on_gpu = _stoker.Device(plan.device).is_cuda
    if not (on_gpu or plan.pin_memory == "on"):
        return 0
    on = torch.device(plan.device) if on_gpu else None
    return torch.cuda.current_stream(on).cuda_stream


def options(**fields) -> "_stoker.LoaderOptions":
    """stoker::LoaderOptions (include/stoker/options.h), field by field."""
    options = _stoker.LoaderOptions()
    for name, value in fields.items():
        setattr(options, name, value)
    return options


def shard(rank: int, world_size: int, drop_last: bool) -> "_stoker.Shard":
    shard = _stoker.Shard()
    shard.rank, shard.world_size, shard.drop_last = rank, world_size, drop_last
    return shard
