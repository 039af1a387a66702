"""``seed_per_sample=True``: torch's, random's and numpy's global generators seeded from each
sample's seed before its ``__getitem__``.

Seeding a Mersenne twister through its ``seed()`` runs its 624-word initialisation behind a
Python call: measured 5-6 us for ``random.seed``, 3 us for ``numpy.random.seed`` and 1.6-1.8
us for torch's ``default_generator.manual_seed`` a sample, a quarter of the time of the reads
of a cheap ``__getitem__`` (a crop, a flip and a jitter of a 32x32 image; py-spy). So the
extension (``seed_sample_generators``) gives each twister 624 words of SplitMix64 from the
seed (independent steps, not a serial chain), the position that makes the next draw generate
from them, and drops its cached normal deviate, as ``seed()`` does: random's and numpy's
legacy twisters written in place, torch's through ``set_state()`` of a state tensor written
for it (torch's own state is not reachable). The addresses and the layouts are found here and
checked once per process (after a ``seed()`` the words read in place equal ``getstate()``'s;
numpy's cached deviate is where a normal draw puts it; torch's written state reads back
through ``get_state()``); a generator whose check fails (another Python, numpy or torch) is
seeded through its ``seed()``."""

from __future__ import annotations

import ctypes
import functools
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
            numpy.random.standard_normal()
            numpy.random.seed(seed)  # drops a cached deviate
            if ctypes.c_int.from_address(has_gauss).value != 0:
                return None
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


_TORCH_STATE_BYTES = 5056  # aten's CPUGeneratorImplState


def _torch_set_state(torch) -> Optional[tuple]:
    """(a state tensor for seed_sample_generators to write, the call that sets it), if
    torch's CPU generator state has the layout it writes: after manual_seed(s), the seed, the
    position 1 (generate at the next draw), seeded, then the twister's first words from s."""
    generator = torch.default_generator
    kept = generator.get_state()
    try:
        seed = 2**63 + 11
        generator.manual_seed(seed)
        state = generator.get_state()
        if state.dtype != torch.uint8 or state.numel() != _TORCH_STATE_BYTES:
            return None
        head = numpy.frombuffer(state.numpy().tobytes()[:40], numpy.uint64)
        first = seed & 0xFFFFFFFF
        second = (1812433253 * (first ^ (first >> 30)) + 1) & 0xFFFFFFFF
        if head.tolist() != [seed, 1 | 1 << 32, 0, first, second]:
            return None
        buffer = state.clone()
        return buffer, functools.partial(generator.set_state, buffer)
    finally:
        generator.set_state(kept)


def _torch_writes_read_back(torch, buffer) -> bool:
    """Whether a state written by seed_sample_generators reads back through get_state(), and
    gives the same draws each time it is written."""
    kept = _generator_states()  # seeding writes random's and numpy's twisters too
    try:
        _stoker.seed_sample_generators(7)
        back, written = torch.default_generator.get_state().numpy(), buffer.numpy()
        fields = numpy.r_[0:5044, 5048:5053]  # not the struct's padding
        if not numpy.array_equal(back[fields], written[fields]):
            return False
        first = torch.rand(3).tolist(), torch.randn(1).item()
        _stoker.seed_sample_generators(7)
        return (torch.rand(3).tolist(), torch.randn(1).item()) == first
    finally:
        _set_generator_states(kept)


class _Setup:
    """Per process: what seed_sample_generators writes in place, and the generators it does
    not, seeded through their seed() (`slow`)."""

    pid: Optional[int] = None
    slow: tuple = ()


def _set_up() -> None:
    torch = _torch()
    random_at = _random_in_place()
    numpy_at = _numpy_in_place()
    torch_at = _torch_set_state(torch) if torch is not None else None
    twisters = ((random._inst, numpy.random.mtrand._rand), random._inst if random_at else None,
                *(random_at or (0, 0)), *(numpy_at or (0, 0, 0, 0)))
    if torch_at is not None:
        buffer, set_state = torch_at
        _stoker.configure_sample_seeding(*twisters, buffer.data_ptr(), set_state)
        if _torch_writes_read_back(torch, buffer):
            twisters = ((twisters[0], buffer), *twisters[1:])  # the tensor kept alive
            _stoker.configure_sample_seeding(*twisters, buffer.data_ptr(), set_state)
        else:
            torch_at = None
    if torch_at is None:
        _stoker.configure_sample_seeding(
            *twisters, 0, torch.default_generator.manual_seed if torch is not None else None)
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
