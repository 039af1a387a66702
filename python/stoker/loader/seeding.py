"""Random draws where torch's DataLoader makes them, and none elsewhere.

torch's loader draws nothing when it is made; each epoch's iterator draws the workers' base seed
from ``loader.generator`` (or torch's default generator) and, with ``shuffle=True``, its
RandomSampler draws the epoch's permutation. stoker draws the same, at the same moments, so that
a script's random stream (the model's initial weights, its augmentations) and the order of the
samples are the same with either loader for the same seed."""

from __future__ import annotations

import os
import sys
from typing import Any, Callable, Optional


def _torch():
    return sys.modules.get("torch")


def draw_seed(generator) -> int:
    """A 63-bit seed drawn as torch's loader draws its workers' base seed: from `generator`, or
    from torch's default generator (so torch.manual_seed makes runs repeat), or at random
    without torch."""
    torch = _torch()
    if torch is not None:
        return int(torch.empty((), dtype=torch.int64).random_(generator=generator).item())
    if generator is not None:
        raise TypeError("generator= needs torch")
    return int.from_bytes(os.urandom(8), "little") >> 1


def peek_seed(generator) -> int:
    """The seed draw_seed(generator) would give now, leaving the generator as it was: what a
    native data set's own permutation is seeded with when the loader is made (torch.manual_seed
    repeats it, and the script's random stream does not move)."""
    torch = _torch()
    if torch is None:
        return draw_seed(generator)
    source = generator if generator is not None else torch.default_generator
    state = source.get_state()
    try:
        return draw_seed(generator)
    finally:
        source.set_state(state)


class WorkerSetup:
    """What a worker is started with: ``worker_init_fn`` (the loader's attribute, which
    frameworks set after the loader is made) and the base seed of the epoch that started it,
    drawn as each epoch starts (`begin_epoch`), as torch draws it: at every iter(), or at the
    first only with ``persistent_workers=True``."""

    def __init__(self, worker_init_fn: Optional[Callable[[int], None]], generator,
                 persistent: bool) -> None:
        self.worker_init_fn = worker_init_fn
        self.generator = generator
        self.persistent = persistent
        self.base_seed: Optional[int] = None  # None until the first epoch starts

    def begin_epoch(self) -> int:
        if self.base_seed is None or not self.persistent:
            self.base_seed = draw_seed(self.generator)
        return self.base_seed


class TorchRandomOrder:
    """torch's RandomSampler's permutations (without replacement), each drawn when its epoch
    starts from the same source torch's draws from: a seed from torch's default generator, or
    the sampler's own ``generator``. ``draw()`` gives the epoch's order and what it was drawn
    from, which ``draw(state)`` replays (a resumed epoch is the interrupted one). The
    permutations are of the samples the data set had when the loader was made: the engine's
    order has that many positions, and a data set that grew or shrank since is read as a
    sequential order reads it (those samples, and iter() warns)."""

    def __init__(self, dataset, generator) -> None:
        self._length = len(dataset)
        self.generator = generator

    def __len__(self) -> int:
        return self._length

    def draw(self, state: Optional[Any] = None) -> tuple[list, Any]:
        torch = _torch()
        n = self._length
        if state is None:
            if self.generator is None:
                state = int(torch.empty((), dtype=torch.int64).random_().item())
            else:
                state = self.generator.get_state()
        generator = torch.Generator()
        if isinstance(state, int):
            generator.manual_seed(state)
        else:
            generator.set_state(state)
            if self.generator is not None:  # the user's generator moves as torch's would
                self.generator.set_state(state)
                generator = self.generator
        order = torch.randperm(n, generator=generator).tolist()
        if self.generator is not None:
            # torch's sampler, run to its end, draws one more (empty) permutation's worth.
            torch.randperm(n, generator=generator)
        return order, state
