"""stoker.tune() on Python data sets: the tuner's choice against the best of a full grid.

    python bench/tune_python.py [--workload gil|sleep] [--grid] [--plot FILE] [--json]

gil: a pure-Python __getitem__ (a loop of integer arithmetic, ~2 ms per sample) that holds
the GIL: worker_type='auto' moves it to worker processes, and the tuner's CPU budget counts
them. sleep: seed 003's data set, a 5 ms sleep per 3x224x224 float32 sample (latency-bound).
Measured under whatever else runs on the machine: compare the ratio, not absolute figures.
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np

import stoker


class GilBound:
    """Each sample costs about `work` iterations of pure Python (the GIL held throughout)."""

    def __init__(self, n: int = 2048, work: int = 20000) -> None:
        self.n, self.work = n, work

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int):
        acc = i
        for k in range(self.work):
            acc = (acc * 31 + k) % 1000003
        return np.full((64,), acc, dtype=np.float32), i


class Sleepy:
    """Seed 003's HeavyDataset: a 5 ms sleep, then a 3x224x224 float32 sample."""

    def __init__(self, n: int = 1024) -> None:
        self.n = n
        self.sample = np.random.default_rng(0).random((3, 224, 224), dtype=np.float32)

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int):
        time.sleep(0.005)
        return self.sample, i


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--workload", choices=("gil", "sleep"), default="gil")
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--measure", type=float, default=2.0)
    parser.add_argument("--grid", action="store_true", help="also every fixed configuration")
    parser.add_argument("--grid-workers", type=int, nargs="+", default=[1, 2, 4, 8])
    parser.add_argument("--grid-depth", type=int, nargs="+", default=[2, 4, 8])
    parser.add_argument("--repeat", type=int, help="rounds, alternated; figures are medians "
                        "(default 3 with --grid, else 1)")
    parser.add_argument("--plot", help="a .png or .svg chart of the grid")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    data, batch = (GilBound(), 32) if args.workload == "gil" else (Sleepy(), 64)
    result = stoker.tune(data, batch, seconds=args.seconds, measure=args.measure,
                         grid=args.grid, grid_workers=args.grid_workers,
                         grid_depth=args.grid_depth, repeat=args.repeat, plot=args.plot,
                         quiet=args.json)
    if args.json:
        print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
