"""What a plan depends on besides the DataLoader's arguments: this rank's cores, the GPU,
the seed source (plan.py's Host)."""

from __future__ import annotations

import dataclasses
import sys
from typing import Any, Callable

from .. import _stoker
from .seeding import peek_seed


@dataclasses.dataclass(frozen=True)
class Host:
    """What the plan depends on besides the arguments: the cores of this rank's share, whether
    torch's GPU answers (torch loaded), whether any GPU does, and the seed source (its next
    draw, peeked at: the generator is left as it was)."""

    cores: int
    cpu_share: int
    has_gpu: bool  # torch is loaded and torch.cuda.is_available()
    gpu: bool  # torch's GPU if torch is in use, else any the engine finds
    peek_seed: Callable[[Any], int] = dataclasses.field(repr=False)

    @staticmethod
    def here() -> "Host":
        from ..cuda import cuda_available

        torch = sys.modules.get("torch")
        has_gpu = torch is not None and torch.cuda.is_available()
        return Host(cores=cores(), cpu_share=cpu_share(), has_gpu=has_gpu,
                    gpu=has_gpu if torch is not None else cuda_available(),
                    peek_seed=peek_seed)


def cores() -> int:
    """The cores this process may run on (its affinity)."""
    return _stoker.host_share()[0]


def cpu_share() -> int:
    """This rank's whole cores: ranks that torchrun started on one node (LOCAL_WORLD_SIZE)
    divide them among themselves, by the engine's own rule (stoker/frontend/host_share.h)."""
    return max(1, int(_stoker.host_share()[1]))
