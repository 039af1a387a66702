"""Sharding for distributed training: which rank reads which samples."""

from __future__ import annotations

import itertools
import os
import sys
from typing import Iterator, Optional

from . import _stoker


def _torch_distributed():
    try:
        import torch.distributed as dist
    except ImportError:
        return None
    if dist.is_available() and dist.is_initialized():
        return dist
    return None


def world() -> tuple[int, int]:
    """(rank, world size) of this process: from torch.distributed when it is initialized,
    else from the RANK and WORLD_SIZE variables that torchrun sets, else (0, 1)."""
    dist = _torch_distributed()
    if dist is not None:
        return dist.get_rank(), dist.get_world_size()
    return int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))


class DistributedSampler:
    """The samples one rank reads, with the rules of torch.utils.data.DistributedSampler.

    The epoch's order (shuffled with ``seed + epoch`` when ``shuffle``) is padded by repeating
    it from its start to a multiple of ``num_replicas`` (or cut to one with ``drop_last``), and
    rank ``r`` takes positions ``r, r + num_replicas, ...``: every rank gets the same number of
    samples, so no rank waits for another at the end of an epoch. With ``shuffle=False`` the
    partition equals torch's exactly; a shuffled one follows the same rules with stoker's own
    generator. ``num_replicas`` and ``rank`` default to torch.distributed's, or to the
    WORLD_SIZE and RANK that torchrun sets.

    Passed to ``stoker.DataLoader(sampler=...)`` the order is computed in C++ and the next
    epoch is prefetched; it can also be iterated like any sampler (e.g. by torch's DataLoader).
    Call ``set_epoch(epoch)`` at the start of each epoch, as with torch's.
    """

    def __init__(
        self,
        dataset,
        num_replicas: Optional[int] = None,
        rank: Optional[int] = None,
        shuffle: bool = True,
        seed: int = 0,
        drop_last: bool = False,
    ) -> None:
        default_rank, default_world = world()
        self.num_replicas = default_world if num_replicas is None else int(num_replicas)
        self.rank = default_rank if rank is None else int(rank)
        if self.num_replicas < 1:
            raise ValueError(f"num_replicas must be at least 1, not {self.num_replicas}")
        if not 0 <= self.rank < self.num_replicas:
            raise ValueError(
                f"Invalid rank {self.rank}, rank should be in the interval [0, {self.num_replicas - 1}]"
            )
        self.dataset = dataset
        self.dataset_size = len(dataset)
        self.shuffle = bool(shuffle)
        self.seed = int(seed)
        self.drop_last = bool(drop_last)
        self.epoch = 0
        n, r = self.dataset_size, self.num_replicas
        self.num_samples = n // r if drop_last else -(-n // r)
        self.total_size = self.num_samples * r

    def set_epoch(self, epoch: int) -> None:
        self.epoch = int(epoch)

    def __len__(self) -> int:
        return self.num_samples

    def __iter__(self) -> Iterator[int]:
        order = _stoker.epoch_order(
            self.dataset_size, self.shuffle, self.seed, self.epoch, self.rank,
            self.num_replicas, self.drop_last,
        )
        return iter(order.tolist())


def split_by_rank(iterable, rank: Optional[int] = None, world_size: Optional[int] = None):
    """Items ``rank, rank + world_size, ...`` of `iterable`: one rank's share of a stream under
    DistributedDataParallel. `rank` and `world_size` default to torch.distributed's, or to the
    RANK and WORLD_SIZE that torchrun sets (stoker.world())."""
    if rank is None or world_size is None:
        rank, world_size = world()
    return itertools.islice(iterable, rank, None, world_size)


def split_by_worker(iterable):
    """Items ``id, id + num_workers, ...`` of `iterable` in a DataLoader worker (per
    torch.utils.data.get_worker_info()); all of them outside one."""
    torch = sys.modules.get("torch")
    info = torch.utils.data.get_worker_info() if torch is not None else None
    if info is None:
        return iter(iterable)
    return itertools.islice(iterable, info.id, None, info.num_workers)
