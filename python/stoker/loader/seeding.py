"""Random draws where torch's DataLoader makes them, and none elsewhere.

torch's loader draws nothing when it is made; each epoch's iterator draws the workers' base seed
from ``loader.generator`` (or torch's default generator) and, with ``shuffle=True``, its
RandomSampler draws the epoch's permutation. stoker draws the same, at the same moments, so that
a script's random stream (the model's initial weights, its augmentations) and the order of the
samples are the same with either loader for the same seed."""

from __future__ import annotations

import contextlib
import copy
import functools
import os
import sys
from typing import Any, Callable, Optional

from .. import _stoker


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


@functools.cache
def _openmp(torch) -> bool:
    return "parallel backend: OpenMP" in torch.__config__.parallel_info()


@contextlib.contextmanager
def _on_this_thread(torch):
    """torch's work in the block runs on the calling thread alone. torch.randperm fills its
    n values with a parallel loop past 32k of them; under OpenMP the team's threads then spin
    waiting for more work (libgomp's default), taking a core from the workers: measured, the
    training process's OpenMP thread used 17% of the samples of an epoch of 50,000 cheap
    samples on 2 cores, and the epoch ran 10-15% slower. The permutation is the same."""
    threads = torch.get_num_threads()
    if threads == 1 or not _openmp(torch):
        yield
        return
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


class TorchRandomOrder:
    """torch's RandomSampler's permutations (without replacement), each drawn when its epoch
    starts from the same source torch's draws from: a seed from torch's default generator, or
    the sampler's own ``generator``. ``draw()`` gives the epoch's order. The
    permutations are of the samples the data set had when the loader was made: the engine's
    order has that many positions, and a data set that grew or shrank since is read as a
    sequential order reads it (those samples, and iter() warns)."""

    def __init__(self, dataset, generator) -> None:
        self._length = len(dataset)
        self.generator = generator

    def __len__(self) -> int:
        return self._length

    def draw(self):
        """The epoch's permutation, drawn as torch's sampler draws it (a resumed epoch is
        drawn again from its generators' states at its start: Generators)."""
        torch = _torch()
        n = self._length
        if self.generator is None:
            generator = torch.Generator()
            generator.manual_seed(int(torch.empty((), dtype=torch.int64).random_().item()))
        else:
            generator = self.generator
        with _on_this_thread(torch):
            order = torch.randperm(n, generator=generator).numpy()
            if self.generator is not None:
                # torch's sampler, run to its end, draws one more (empty) permutation's worth.
                torch.randperm(n, generator=generator)
        return order


def _sources(generators: list) -> list:
    """The generators drawn from, each once (the loader's and a sampler's may be one), None
    being torch's default generator."""
    torch = _torch()
    sources = [g if g is not None else torch.default_generator for g in generators]
    return list({id(g): g for g in sources}.values())


class DrawSources:
    """What a map-style loader's epochs draw from at iter(): torch's generators (the workers'
    base seed; torch's samplers' permutations: the loader's generator, the samplers' own, or
    torch's default generator) and a sampler that is Stateful (``state_dict()`` and
    ``load_state_dict()``, as torchdata's), whose next order is its own state's.

    ``state()`` is what a loader's state carries of them: mid-epoch, as they were when the
    epoch began (its draws are made again on resume, giving the same order and base seed) and
    the generators as they are now; between epochs, as they are now. ``load()`` sets the
    generators to those states (the draws of the epochs after a resume are the uninterrupted
    run's, as torchdata's samplers carry their generator) and returns what the resumed
    epoch's draws start from, for ``begin()``."""

    def __init__(self, generators: list, stateful, setup: WorkerSetup) -> None:
        self._generators = _sources(generators) if _torch() is not None else []
        self.stateful, self.setup = stateful, setup
        self._start: Optional[dict] = None  # the running epoch's, as it began

    def begin(self, replay: Optional[dict]) -> Optional[list]:
        """As an epoch's iter() begins, before its draws: the sources as they are (a fresh
        epoch) or as the resumed one's began (`replay`, from load()); returns the generators'
        states to set back once the replayed draws are made (end())."""
        if replay is None:
            self._start = self._snapshot()
            return None
        keep = self._states()
        self._set(replay)
        self._start = replay
        return keep

    def end(self, keep: Optional[list]) -> None:
        if keep is not None:
            self._set({"generators": keep})

    def state(self, begun: bool) -> dict:
        now = self._snapshot()
        return {"begun": begun, "start": self._start if begun else now,
                "generators": now["generators"]}

    def load(self, state: dict) -> Optional[dict]:
        if len(state["generators"]) != len(self._generators):
            raise ValueError(f"stoker: the state's order draws from {len(state['generators'])} "
                             f"torch generators, this loader's from {len(self._generators)}: "
                             f"pass the same sampler, shuffle and generator= to resume")
        if not state["begun"]:
            self._set(state["start"])
            return None
        self._set({"generators": state["generators"]})
        return state["start"]

    def _states(self) -> list:
        return [g.get_state() for g in self._generators]

    def _snapshot(self) -> dict:
        return {"generators": self._states(), "base_seed": self.setup.base_seed,
                "sampler": (copy.deepcopy(self.stateful.state_dict())
                            if self.stateful is not None else None)}

    def _set(self, snapshot: dict) -> None:
        for g, state in zip(self._generators, snapshot["generators"]):
            g.set_state(state)
        if "base_seed" in snapshot:
            self.setup.base_seed = snapshot["base_seed"]
        if self.stateful is not None and snapshot.get("sampler") is not None:
            self.stateful.load_state_dict(copy.deepcopy(snapshot["sampler"]))


def sampler_generators(sampler) -> list:
    """The generators `sampler` (or a BatchSampler's sampler) draws from, None for torch's
    default one: torch's random samplers' ``generator``."""
    return [getattr(s, "generator") for s in (sampler, getattr(sampler, "sampler", None))
            if s is not None and hasattr(s, "generator")]


def stateful(sampler):
    """The sampler whose state decides its order (it, or a BatchSampler's), if it keeps one
    (``state_dict()`` and ``load_state_dict()``), else None."""
    for candidate in (sampler, getattr(sampler, "sampler", None)):
        if callable(getattr(candidate, "state_dict", None)) and callable(
                getattr(candidate, "load_state_dict", None)):
            return candidate
    return None


class EpochDraws:
    """The draws of an epoch's iter() (the workers' base seed, then torch's permutation) made
    ahead of it, so that the engine reads the epoch's first batches while the one before ends,
    and iter() draws nothing new when nothing else drew from those generators in between:
    ``take()`` then moves them as the draws would have (the same numbers, the same states
    after) and the epoch reads this order; else it draws for real and the batches read ahead
    are dropped. torch's draws come at iter() because the training loop's own draws (dropout,
    augmentations on the CPU) move the generator between epochs: drawn ahead, that is
    noticed, not hidden."""

    def __init__(self, epoch: int, setup: WorkerSetup, generator,
                 draw: Callable[[], Any]) -> None:
        """`draw()`: the epoch's order, drawn from `generator` (None: torch's default
        generator)."""
        self.epoch = epoch
        self._sources = _sources([setup.generator, generator])
        self._before = [g.get_state() for g in self._sources]
        try:
            self._seed = (draw_seed(setup.generator)
                          if setup.base_seed is None or not setup.persistent else None)
            self.order = draw()
            self._after = [g.get_state() for g in self._sources]
        finally:
            for g, state in zip(self._sources, self._before):
                g.set_state(state)

    def unmoved(self) -> bool:
        """Whether no generator moved since the draws were made."""
        torch = _torch()
        return all(torch.equal(g.get_state(), s) for g, s in zip(self._sources, self._before))

    def take(self, setup: WorkerSetup) -> bool:
        """At the epoch's iter(): True, the draws made as iter() would (the generators moved,
        the workers' base seed set), if no generator moved since they were drawn ahead."""
        if not self.unmoved():
            return False
        for g, state in zip(self._sources, self._after):
            g.set_state(state)
        if self._seed is not None:
            setup.base_seed = self._seed
        return True


class TorchOrderFeed:
    """torch's permutations (TorchRandomOrder) given to the engine: each epoch's drawn at its
    iter(), or drawn ahead and taken (EpochDraws), and the next one's drawn ahead."""

    def __init__(self, sampler: TorchRandomOrder, setup: WorkerSetup) -> None:
        self.sampler, self.setup = sampler, setup
        self._ahead: Optional[EpochDraws] = None

    def take(self, epoch: int, batch: int) -> bool:
        """As iter() starts `epoch` at `batch`: whether its draws were made ahead and taken
        (the generators and the workers' base seed moved as they would have); else nothing
        moved."""
        ahead = self._ahead
        return (ahead is not None and ahead.epoch == epoch and batch == 0
                and ahead.take(self.setup))

    def redraw_ahead(self, loader) -> None:
        """Draws the next epoch's order ahead again if the generators moved since it was:
        worker_type='auto' moved reads on threads, whose random transforms draw from this
        process's generators, to worker processes, and the threads' last reads have ended.
        Otherwise that epoch's first batches, read ahead, would be dropped at its iter()."""
        ahead = self._ahead
        if ahead is not None and not ahead.unmoved():
            following = self._draw_ahead(ahead.epoch)
            self._ahead = (following if loader.order_ahead(following.epoch, following.order)
                           else None)

    def _draw_ahead(self, epoch: int) -> EpochDraws:
        return EpochDraws(epoch, self.setup, self.sampler.generator, self.sampler.draw)

    def start(self, loader, epoch: int, batch: int, took: bool) -> None:
        """Gives `loader` epoch `epoch`'s order (after take(): drawn now unless `took`, and
        then resumed there, what was read ahead with another order dropped) and, before the
        epoch starts, the next one's."""
        if not took:
            order = self.sampler.draw()
        following = self._draw_ahead(epoch + 1)
        self._ahead = following if loader.order_ahead(following.epoch, following.order) else None
        if not took:
            loader.resume(epoch, order, batch)


class BatchesAhead:
    """A batch-jobs loader's next epoch's batches drawn ahead of its iter(), where the samplers
    are torch's own (`draw(epoch)`: the batch sampler run, or the sampler and batch size, as
    at iter()), so that the engine's reads across the epoch boundary can be kept: iter()
    still draws the epoch's batches as torch's loader does (the training loop may have drawn
    from the generator since, or changed a sampler's weights or epoch), and what was read
    ahead is kept if they are the same. The draws ahead are undone (EpochDraws). A sampler of
    another type may count its epochs or draw from elsewhere: it is only run at iter()."""

    def __init__(self, draw: Callable[[int], list], batch_sampler, sampler,
                 setup: WorkerSetup) -> None:
        self._draw, self.setup = draw, setup
        if batch_sampler is not None:
            drawn = batch_sampler.sampler if _is_torch(batch_sampler, "BatchSampler") else None
        else:
            drawn = sampler  # None: stoker's own order, which draws from nothing
        self._drawable = (batch_sampler is None and sampler is None) or any(
            _is_torch(drawn, name) for name in _DRAWABLE_SAMPLERS)
        self._generator = getattr(drawn, "generator", None)

    def __call__(self, epoch: int) -> Optional[list]:
        """`epoch`'s batches drawn now, the draws undone, or None if the samplers do not
        allow it."""
        if not self._drawable:
            return None
        if _torch() is None:  # no samplers: stoker's own order, which draws from nothing
            return self._draw(epoch)
        return EpochDraws(epoch, self.setup, self._generator,
                          lambda: self._draw(epoch)).order


# torch's samplers whose iteration has no effect but its draws from a generator (undone): the
# same draw at iter() gives the same batches unless the generator, the weights or the epoch
# changed in between (then the batches read ahead are dropped).
_DRAWABLE_SAMPLERS = ("SequentialSampler", "RandomSampler", "SubsetRandomSampler",
                      "WeightedRandomSampler", "DistributedSampler")


def epoch_batches(index: dict, shuffle: bool, seed: int, epoch: int) -> list:
    """Epoch `epoch`'s batches of sample indices (of indices, with batch_size=None), as
    torch's loader draws them at iter() from its attributes (`index`)."""
    if index["batch_sampler"] is not None:
        return [list(b) for b in index["batch_sampler"]]
    if index["sampler"] is not None:
        order = list(index["sampler"])
    else:
        order = _stoker.epoch_order(len(index["dataset"]), shuffle, seed, epoch, 0, 1,
                                    False).tolist()
    if index["batch_size"] is None:
        return order
    size = index["batch_size"]
    end = len(order) - len(order) % size if index["drop_last"] else len(order)
    return [order[i:i + size] for i in range(0, end, size)]


def _is_torch(sampler, name: str) -> bool:
    """Whether `sampler` is torch.utils.data's `name` itself (not a subclass)."""
    torch = _torch()
    return torch is not None and type(sampler) is getattr(torch.utils.data, name, None)


def reproducibility(native: bool, seeded: bool, foreign_sampler) -> dict:
    """What a resumed run (or one on other workers) repeats, and why (report()).
    `foreign_sampler`: the sampler when its order is neither torch's nor stoker's, else None."""
    if foreign_sampler is not None and stateful(foreign_sampler) is None:
        return dict(reproducibility="order, if the sampler repeats it",
                    reproducibility_reason=f"the sampler ({type(foreign_sampler).__name__}) is "
                    f"not Stateful (state_dict, load_state_dict): a resumed epoch reads it again")
    if native:
        return dict(reproducibility="order and augmentation",
                    reproducibility_reason="a native data set's random draws are per sample "
                    "(seed, epoch, index)")
    if seeded:
        return dict(reproducibility="order and augmentation",
                    reproducibility_reason="seed_per_sample=True: each __getitem__ draws from "
                    "generators seeded by (seed, epoch, sample index)")
    return dict(reproducibility="order",
                reproducibility_reason="a Python __getitem__'s random draws depend on the "
                "worker that reads it (seed_per_sample=True makes them per sample)")
