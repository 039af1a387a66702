"""stoker.tune(): run a data set briefly with num_workers='auto' and say what the tuner chose,
its throughput, and optionally what a full grid of fixed configurations gives (seed 000's
brute-force search, for comparison)."""

from __future__ import annotations

import statistics
import sys
import time
from typing import Any, Callable, Optional, Sequence

from . import _stoker
from .loader import DataLoader
from .progress import Bar

# Batches taken before a measurement starts (threads start, slabs fault in, worker_type='auto'
# decides).
_WARMUP_BATCHES = 4


def _reached(timeline: list[tuple[float, int]], rate: float, window: float = 1.0) -> float:
    """The first time from which every `window` seconds (starting at a batch) delivered at
    least `rate` samples/s; `timeline` holds (seconds, samples so far) after each batch."""
    reached, j = 0.0, 0
    for i, (t0, n0) in enumerate(timeline):
        j = max(j, i)
        while j < len(timeline) and timeline[j][0] < t0 + window:
            j += 1
        if j == len(timeline):
            break
        t1, n1 = timeline[j]
        if (n1 - n0) / (t1 - t0) < rate:
            reached = t1
    return reached


def _drive(loader: DataLoader, warmup: float, measure: float,
           step: Optional[Callable[[Any], None]]) -> dict[str, Any]:
    """Takes batches, epoch after epoch, calling `step` on each, for `warmup` seconds (and at
    least a few batches), then measures `measure` seconds more."""
    start = time.perf_counter()
    changes, settled, peak = 0, 0.0, 0
    timeline: list[tuple[float, int]] = []
    first: Optional[tuple[float, dict[str, Any]]] = None  # when the measurement started
    while True:
        for batch in loader:
            if step is not None:
                step(batch)
            del batch
            stats = loader.stats()
            now = time.perf_counter() - start
            timeline.append((now, stats["samples"]))
            peak = max(peak, stats["slab_bytes"])
            if stats["tuner_changes"] != changes:
                changes, settled = stats["tuner_changes"], now
            if first is None:
                if now >= warmup and len(timeline) >= _WARMUP_BATCHES:
                    first = (now, stats)
            elif now - first[0] >= measure:
                took = now - first[0]
                rate = (stats["samples"] - first[1]["samples"]) / took
                return {"samples_per_s": rate,
                        "wait_pct": 100 * (stats["consumer_wait_s"]
                                           - first[1]["consumer_wait_s"]) / took,
                        "reached_s": _reached(timeline, 0.9 * rate), "settled_s": settled,
                        "peak_slab_bytes": peak, "stats": stats}


def _fixed(dataset, batch_size: int, workers: int, depth: int, pin: bool, measure: float,
           step, loader_args: dict) -> dict[str, Any]:
    """One run of a grid point: a fixed configuration, measured after a warm-up."""
    loader = DataLoader(dataset, batch_size, num_workers=workers, pin_memory=pin, **loader_args)
    loader.set_depth(depth)
    m = _drive(loader, 0.0, measure, step)
    loader.close()
    return m


def _tuned(dataset, batch_size: int, seconds: float, measure: float, step,
           loader_args: dict) -> dict[str, Any]:
    """One run of the tuner from a cold start, then its measurement."""
    loader = DataLoader(dataset, batch_size, num_workers="auto", **loader_args)
    # A Python data set's workers start with the first iter(): its stats say 0 until then.
    start = {"workers": loader.num_workers, "depth": loader.stats()["depth"]}
    m = _drive(loader, seconds, measure, step)
    loader.close()
    m["start"] = start
    return m


def tune(dataset, batch_size: int, *, seconds: float = 5.0, measure: float = 2.0,
         step: Optional[Callable[[Any], None]] = None, grid: bool = False,
         grid_workers: Sequence[int] = (1, 2, 4, 8), grid_depth: Sequence[int] = (2, 4, 8),
         repeat: Optional[int] = None, plot: Optional[str] = None, quiet: bool = False,
         **loader_args) -> dict[str, Any]:
    """Runs `dataset` through a ``DataLoader(num_workers='auto')`` for `seconds`, then measures
    the configuration the tuner chose for `measure` seconds, and prints and returns it.

    step: your training step, called with each batch (default: none, which measures the
        loader alone: then the tuner sees a training loop that always waits).
    grid: also measure every fixed configuration, workers x depth (x pinning where a GPU
        answers: pin_memory only changes anything there), `measure` seconds each after a
        warm-up: much slower. The result then has ``grid``, ``best`` and ``ratio`` (tuned
        over best).
    repeat: rounds of the tuner's run and the grid, alternated so that a machine's changing
        load falls on all of them alike; every figure is the median of its rounds (default 3
        with the grid, else 1). One short point on a busy machine is good to about +-25%, and
        the best of a grid of single points is the luckiest draw.
    plot: a .png or .svg file for the chart of the grid (needs grid=True and matplotlib).
    loader_args: passed to every DataLoader (shuffle, device, worker_type, ...).

    The result has the keys of ``stoker tune --json``: ``tuned`` (workers, depth (of the
    median run), samples_per_s, runs (each round's), wait_pct, reached_s (from when on every
    second delivered at least 90% of samples_per_s), settled_s (when it last changed
    anything), changes, last_change, peak_slab_bytes, worker_type), ``cpu_cores``,
    ``rounds``, and with the grid ``grid`` (each point with its ``runs``), ``best``,
    ``ratio``, and ``choice_ratio`` (the tuned configuration's own grid point over the best,
    where the grid has it).
    """
    if plot is not None and not grid:
        raise ValueError("plot= needs grid=True")
    rounds = repeat if repeat else (3 if grid else 1)
    loader_args.setdefault("shuffle", True)
    pins: tuple[bool, ...] = ()
    if grid:
        torch = sys.modules.get("torch")
        pins = (False, True) if torch is not None and torch.cuda.is_available() else (False,)
    configs = [(workers, depth, pin) for pin in pins for depth in grid_depth
               for workers in grid_workers]
    tuned_runs: list[dict[str, Any]] = []
    fixed_runs: list[list[dict[str, Any]]] = [[] for _ in configs]
    with Bar(f"tune: {type(dataset).__name__}", unit="run", quiet=quiet) as bar:
        done = 0
        for _ in range(rounds):
            tuned_runs.append(_tuned(dataset, batch_size, seconds, measure, step, loader_args))
            done += 1
            bar.update_to(done, rounds * (1 + len(configs)))
            # Each fixed point that waits would log what the tuner would do: noise here.
            level = _stoker.log_level()
            _stoker.set_log_level(_stoker.LogLevel.warning)
            try:
                for (workers, depth, pin), runs in zip(configs, fixed_runs):
                    runs.append(_fixed(dataset, batch_size, workers, depth, pin, measure, step,
                                       loader_args))
                    done += 1
                    bar.update_to(done)
            finally:
                _stoker.set_log_level(level)

    def median(runs: list[dict[str, Any]], key: str) -> float:
        return statistics.median(m[key] for m in runs)

    # The configuration reported is that of the median run.
    middle = sorted(tuned_runs, key=lambda m: m["samples_per_s"])[(rounds - 1) // 2]
    s = middle["stats"]
    start_workers, start_depth = middle["start"]["workers"], middle["start"]["depth"]
    result: dict[str, Any] = {
        "target": type(dataset).__name__, "batch_size": batch_size,
        "cpu_cores": s["cpu_cores"], "rounds": rounds,
        "start": {"workers": start_workers, "depth": start_depth},
        "tuned": {"workers": s["workers"], "depth": s["depth"], "pin": "auto",
                  "worker_type": s["worker_type"],
                  "samples_per_s": median(tuned_runs, "samples_per_s"),
                  "runs": [m["samples_per_s"] for m in tuned_runs],
                  "configurations": [{"workers": m["stats"]["workers"],
                                      "depth": m["stats"]["depth"],
                                      "changes": m["stats"]["tuner_changes"]}
                                     for m in tuned_runs],
                  "wait_pct": median(tuned_runs, "wait_pct"),
                  "reached_s": median(tuned_runs, "reached_s"),
                  "settled_s": median(tuned_runs, "settled_s"),
                  "changes": s["tuner_changes"], "last_change": s["tuner"],
                  "peak_slab_bytes": max(m["peak_slab_bytes"] for m in tuned_runs)}}
    say = (lambda *a: None) if quiet else print
    t = result["tuned"]
    say(f"{result['target']} (batch {batch_size}, {result['cpu_cores']:g} cores)")
    say(f"tuned: {t['workers']} {t['worker_type']} workers, depth {t['depth']} (from "
        f"{start_workers} and {start_depth}): {t['samples_per_s']:.0f} samples/s "
        f"({min(t['runs']):.0f}-{max(t['runs']):.0f} in {rounds} rounds), waited "
        f"{t['wait_pct']:.1f}%; within 90% of that from {t['reached_s']:.1f} s on, settled "
        f"after {t['settled_s']:.1f} s, {t['changes']} changes, last: "
        f"{t['last_change'] or 'none'}")
    if grid:
        say(f"grid (each point {measure:g} s after its first batches, median of {rounds} "
            f"rounds):")
        points = []
        for (workers, depth, pin), runs in zip(configs, fixed_runs):
            rates = [m["samples_per_s"] for m in runs]
            point = {"workers": workers, "depth": depth, "pin": "on" if pin else "off",
                     "samples_per_s": statistics.median(rates), "runs": rates,
                     "wait_pct": median(runs, "wait_pct"),
                     "peak_slab_bytes": max(m["peak_slab_bytes"] for m in runs)}
            say(f"  workers {workers:>3}  depth {depth:>3}  pin {point['pin']:<4}"
                f"{point['samples_per_s']:>10.0f} samples/s ({min(rates):.0f}-{max(rates):.0f})"
                f"  waited {point['wait_pct']:5.1f}%")
            points.append(point)
        best = max(points, key=lambda p: p["samples_per_s"])
        result.update(grid=points, best=best, ratio=t["samples_per_s"] / best["samples_per_s"])
        # The tuned configuration as a fixed point of the same grid, where it has one: how
        # well the tuner chose, apart from how its own runs went.
        same = [p for p in points
                if (p["workers"], p["depth"], p["pin"]) == (t["workers"], t["depth"], "off")]
        if same:
            result["choice_ratio"] = same[0]["samples_per_s"] / best["samples_per_s"]
        say(f"best fixed: workers {best['workers']}, depth {best['depth']}, pin {best['pin']}: "
            f"{best['samples_per_s']:.0f} samples/s; tuned / best fixed: {result['ratio']:.2f}"
            + (f"; the tuned configuration as a fixed point / best: "
               f"{result['choice_ratio']:.2f}" if same else ""))
        if plot is not None:
            from .tuning_chart import plot as draw
            draw(result, plot)
            say(f"chart: {plot}")
    return result
