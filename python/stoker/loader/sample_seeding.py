"""``seed_per_sample=True``: torch's, random's and numpy's global generators seeded from each
sample's seed before its ``__getitem__``.

Seeding a Mersenne twister through its ``seed()`` runs its 624-word initialisation behind a
Python call: measured 5-6 us for ``random.seed``, 3 us for ``numpy.random.seed`` and 1.6 us
for torch's ``default_generator.manual_seed`` a sample, 30% of the throughput of 2 workers
reading a cheap ``__getitem__`` (a crop, a flip and a jitter of a 32x32 image). So random's and
numpy's legacy twisters are written in place by the extension (``seed_sample_generators``:
624 words of SplitMix64 from the seed, the position that makes the next draw generate, the
cached normal deviate dropped, as their ``seed()`` does) at addresses found here and checked
once per process: after a ``seed()`` the words read in place must equal ``getstate()``'s, and
numpy's cached deviate must be where a normal draw puts it. A generator whose check fails
(another Python, another numpy) is seeded through its ``seed()``. torch's state is not
reachable: it is seeded through ``manual_seed``, the cheapest of the three."""

from __future__ import annotations

import ctypes
import os
import random
import sys
from typing import Optional

import numpy

from .. import _stoker

_TWISTER_WORDS = 624
_WORD = ctypes.c_uint32 * _TWISTER_WORDS


def _torch():
    return sys.modules.get("torch")


def _random_in_place() -> Optional[tuple]:
    """(words address, position address) of random's twister, if CPython's layout (the object
    header, then the position, then the 624 words) is checked to hold."""
    instance = random._inst
    header = object.__basicsize__
    words, position = id(instance) + header + ctypes.sizeof(ctypes.c_int), id(instance) + header
    kept = random.getstate()
    try:
        for seed in (12345, 2**63 + 7):
            random.seed(seed)
            random.random()  # a draw: the position moves off 624
            version, state, _ = random.getstate()
            if (version != 3 or tuple(_WORD.from_address(words)) != state[:-1]
                    or ctypes.c_int.from_address(position).value != state[-1]):
                return None
        return words, position
    finally:
        random.setstate(kept)


def _numpy_in_place() -> Optional[tuple]:
    """(words, position, has_gauss, gauss) addresses of numpy's legacy global generator, if its
    bit generator is an MT19937 (whose state struct is the 624 words, then the position) and
    its RandomState holds the cached deviate after a pointer to its copy of the bit
    generator's struct (numpy's aug_bitgen_t), each checked against get_state()."""
    state = numpy.random.mtrand._rand
    bits = getattr(state, "_bit_generator", None)
    if type(bits).__name__ != "MT19937":
        return None
    words = bits.ctypes.state_address
    position = words + ctypes.sizeof(_WORD)
    base, size = id(state), type(state).__basicsize__
    pointers = [ctypes.c_void_p.from_address(base + at).value or 0 for at in range(0, size - 7, 8)]
    try:  # the RandomState's bitgen_t (its first field the state address), then aug_bitgen_t
        bitgen = base + 8 * pointers.index(words)
        gauss_pointer = 8 * pointers.index(bitgen)
    except ValueError:
        return None
    has_gauss, gauss = base + gauss_pointer + 8, base + gauss_pointer + 16
    kept = numpy.random.get_state()
    try:
        for seed in (12345, 99):
            numpy.random.seed(seed)
            numpy.random.standard_normal()  # one of a pair: the other one is cached
            _, key, pos, cached, value = numpy.random.get_state()
            if (tuple(_WORD.from_address(words)) != tuple(key.tolist())
                    or ctypes.c_int.from_address(position).value != pos
                    or cached != 1 or ctypes.c_int.from_address(has_gauss).value != 1
                    or ctypes.c_double.from_address(gauss).value != value):
                return None
        return words, position, has_gauss, gauss
    finally:
        numpy.random.set_state(kept)


class _Setup:
    """Per process: what seed_sample_generators writes in place, and the generators it does
    not, seeded through their seed() (`slow`)."""

    pid: Optional[int] = None
    slow: tuple = ()


def _set_up() -> None:
    torch = _torch()
    random_at = _random_in_place()
    numpy_at = _numpy_in_place()
    _stoker.configure_sample_seeding(
        (random._inst, numpy.random.mtrand._rand), random._inst if random_at else None,
        *(random_at or (0, 0)), *(numpy_at or (0, 0, 0, 0)),
        torch.default_generator.manual_seed if torch is not None else None)
    _Setup.slow = tuple(seed for at, seed in ((random_at, _seed_random), (numpy_at, _seed_numpy),
                                              (torch, _seed_torch_once_loaded)) if not at)
    _Setup.pid = os.getpid()


def _seed_torch_once_loaded(seed: int) -> None:
    """torch was not loaded at _set_up(): seeded here if the data set loaded it since."""
    torch = _torch()
    if torch is not None:
        torch.default_generator.manual_seed(seed)


def _seed_random(seed: int) -> None:
    random.seed(seed)


def _seed_numpy(seed: int) -> None:
    numpy.random.seed(seed >> 32)


def seed_generators(seed: Optional[int] = None) -> Optional[int]:
    """Seeds torch's (where loaded), random's and numpy's global generators from `seed`, by
    default the sample being read (``stoker.sample_seed()``); returns the seed, or None
    outside a read (nothing seeded)."""
    if _Setup.pid != os.getpid():
        _set_up()
    return _seed(seed)


def _seed(seed: Optional[int] = None) -> Optional[int]:
    seed = _stoker.seed_sample_generators(seed)
    if seed is not None:
        for slow in _Setup.slow:
            slow(seed)
    return seed


class SeededReads:
    """A Python data set read with ``seed_per_sample=True``: before each ``__getitem__``,
    torch's, random's and numpy's global generators are seeded from the sample's seed
    (``stoker.sample_seed()``: a function of the loader's seed, the epoch and the sample's
    index), so that its random draws are the same whichever worker, of whichever kind, reads
    it, and after any resume. In the training process (in-line reads; the first sample, read
    for its layout) the generators are set back after the read: the training loop's random
    stream stays its own. Worker threads share those generators, so such a loader's workers
    are processes (plan.py). A data set's ``__getitems__`` is not used: each sample is seeded
    on its own."""

    wraps_user_dataset = True  # get_worker_info().dataset is the user's

    def __init__(self, dataset) -> None:
        self.dataset = dataset
        self._home = os.getpid()  # the training process (a forked worker keeps the value)

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, index):
        pid = os.getpid()
        if _Setup.pid != pid:
            _set_up()
        if pid != self._home:
            _seed()
            return self.dataset[index]
        kept = _generator_states()
        try:
            _seed()
            return self.dataset[index]
        finally:
            _set_generator_states(kept)


def _generator_states() -> tuple:
    torch = _torch()
    return (torch.get_rng_state() if torch is not None else None, random.getstate(),
            numpy.random.get_state())


def _set_generator_states(states: tuple) -> None:
    torch_state, random_state, numpy_state = states
    if torch_state is not None:
        _torch().set_rng_state(torch_state)
    random.setstate(random_state)
    numpy.random.set_state(numpy_state)
