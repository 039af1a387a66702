"""Data sets for test_row_reader.py, in a module of their own (no torch import) that worker
processes and Ray actors import to unpickle them. None of them has __getitem__: with
__getitems__, the loader never calls it, whichever the worker."""

import numpy as np


def sample(i):
    """Row i: an array, a number and two object values (a str and bytes)."""
    return {"x": np.full(3, i, dtype=np.int64), "half": i / 2, "name": f"s{i}",
            "tag": f"t{i}".encode()}


class OnlyGetitems:
    """__len__ and __getitems__ alone, 24 rows."""

    def __len__(self):
        return 24

    def __getitems__(self, indices):
        return [sample(i) for i in indices]


class DropsLast(OnlyGetitems):
    """A call for several rows returns one sample too few; a call for one row is right."""

    def __getitems__(self, indices):
        got = super().__getitems__(indices)
        return got[:-1] if len(got) > 1 else got


class OneTooMany(OnlyGetitems):
    """Every call returns one sample more than asked for."""

    def __getitems__(self, indices):
        return super().__getitems__(list(indices) + [0])


class RaisesAt(OnlyGetitems):
    """A call that asks for row `bad` raises."""

    def __init__(self, bad=5):
        self.bad = bad

    def __getitems__(self, indices):
        if self.bad in indices:
            raise ValueError(f"row {self.bad} is bad")
        return super().__getitems__(indices)


class SeedInGetitems(OnlyGetitems):
    """Each sample holds what stoker.sample_seed() returned in the call that read it (the low
    62 bits, -1 for None) and the call's first index."""

    def __getitems__(self, indices):
        import stoker

        seed = stoker.sample_seed()
        seed = -1 if seed is None else seed & ((1 << 62) - 1)
        return [{"i": i, "seed": seed, "first": indices[0]} for i in indices]


class SeedInGetitem:
    """Each sample holds stoker.sample_seed() as __getitem__ saw it (the low 62 bits, -1 for
    None)."""

    def __len__(self):
        return 24

    def __getitem__(self, i):
        import stoker

        seed = stoker.sample_seed()
        return {"i": i, "seed": -1 if seed is None else seed & ((1 << 62) - 1)}
