"""Is `auto` ever the wrong choice? For each workload, torch's DataLoader at every num_workers
(best kept), stoker at each fixed setting (in-line `num_workers=0`, threads 1/2/4, processes
1/2/4) and stoker on auto, in one run; then the same with a training step that costs CPU.

    python bench/auto_matrix.py [--workload stream padding ...] [--epochs 5] [--smoke] [--json]
        [--costs 1 10 100] [--epoch-s 0.01 0.1 1 10] [--seed N [--draws 4]] [--before]

Throughput is over epochs 2..E together (the first epoch's start-up is excluded for every
loader; a switch auto makes later is counted); a setting whose epochs 2..E take under
MIN_MEASURED_S is run again with a new loader, up to MOST_ROUNDS times, and the median round
kept. Then the best fixed setting, auto and torch's best run REMATCH_ROUNDS more times,
alternated, and the summary compares their medians. With `--step`, each batch is followed by
a training step of matrix products on one thread (`--python-step`: Python bytecode that holds
the GIL) whose cost is calibrated to the workload's per-batch time on stoker's 2 threads, so
the loop is balanced, and the figure is steps per second (the consumer's CPU competes with
the workers', as in training).

Workloads (python_bench.py's data sets, sized for about a second an epoch on 2 cores):
  stream    small tensors from an IterableDataset sharded by get_worker_info(), batch 256
  padding   512 variable-length samples, a padding collate_fn, batch 64
  gil       a __getitem__ computing in Python bytecode (holds the GIL), batch 64
  sleep     seed 003's data set (5 ms of sleep a sample), batch 64
  cheap     dict samples with a string, batch 256
  tvfolder  torchvision ImageFolder, RandomResizedCrop + flip + normalize (needs torchvision)
  tvjitter  the same with ColorJitter (needs torchvision)
  tiny      native: 60k x 784 float32, batch 256 (threads only: native reads run in C++)
  jpeg      native: stoker.ImageFolder with T.train(224) (threads only)
  index     worker_kinds.py's: rows of a tensor made in advance, scaled, stacked by a
            collate_fn (the batch path; memory-bound), 2048 samples, batch 64
  short     the short cheap stream of issue 46: 4096 small tensors (~2 us a sample), batch 32,
            128 batches an epoch (the kind a user writes to test a pipeline)
  fetch     a stream sharded by get_worker_info() whose samples each wait 200 us (a fetch:
            a sleep, the GIL released) and then cost 5 us of Python, 2048 samples, batch 32
  streams   streams of small tensors sharded by get_worker_info(), each sample spinning on the
            clock for `--costs` microseconds (Python work that holds the GIL), sized for an
            epoch of each of `--epoch-s` seconds in-line, batch 32: one row per pair
  drawn     with `--seed N`: `--draws` such streams of a cost drawn log-uniformly from 1-100 us,
            an epoch from 0.01-10 s and a batch from 16-256 (new shapes for each seed)
`--before`: also runs auto with the rules of before its decisions were checked (issue 46: the
processes start as soon as the model predicts a saving, and a switch is never compared with
what it left), alternated with auto in the rematch, to compare the two in one run.
Per row, `left` is what auto's run spent on a setting it then left (a switch measured slower
than the setting before it: a stream's to worker processes, the engine pipeline's from threads
to processes): the measuring windows its check took (target: at most 1), epochs, batches,
seconds; '-' if none. The summary line per workload: auto over the best fixed stoker setting
and over torch's best, each marked with its target (`ok`: >= 0.95 and >= 1.0; `MISS` below);
how far the best fixed setting's own rounds spread (a ratio within it of the target is the
machine's noise); '=' where auto chose that very setting.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import math
import os
import pathlib
import random
import statistics
import sys
import time

import torch
import torch.utils.data as tud

import stoker

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from python_bench import (BytecodeDataset, CheapDataset, HeavyDataset,  # noqa: E402
                          SmallTensorStream, VariableLength, _jpeg_folder, _rate, _touch,
                          pad_collate)
from worker_kinds import Index, stack_collate  # noqa: E402

# The targets of issue 46: auto over the best fixed stoker setting, and over torch's best.
TARGET_BEST, TARGET_TORCH = 0.95, 1.0

CORES = len(os.sched_getaffinity(0))
TORCH_WORKERS = (0, 1, 2, 4)
FIXED = [("inline", dict(num_workers=0))] + [
    (f"{kind} {n}", dict(num_workers=n, worker_type=kind))
    for kind in ("thread", "process") for n in (1, 2, 4)]


class CostStream(tud.IterableDataset):
    """`samples` small tensors, each costing `cost_us` microseconds of Python work (a spin on
    the clock, holding the GIL as parsing does), each worker reading its share."""

    def __init__(self, samples: int, cost_us: float) -> None:
        self.samples, self.cost_us = samples, cost_us

    def __iter__(self):
        info = tud.get_worker_info()
        first, step = (info.id, info.num_workers) if info is not None else (0, 1)
        base = torch.arange(32, dtype=torch.float32)
        cost, clock = self.cost_us * 1e-6, time.perf_counter
        for i in range(first, self.samples, step):
            end = clock() + cost
            while clock() < end:
                pass
            yield base * i, i


def per_sample(cost_us: float, batch: int) -> float:
    """Seconds a sample of CostStream takes read in-line (its spin, the tensor made, collated),
    measured now over 2000 samples: it sizes the epochs on this machine as it is."""
    ds = CostStream(2000, cost_us)
    collate = tud.default_collate
    start = time.perf_counter()
    it = iter(ds)
    for _ in range(2000 // batch):
        collate([next(it) for _ in range(batch)])
    return (time.perf_counter() - start) / (2000 // batch * batch)


def cost_stream(cost_us: float, epoch_s: float, batch: int, smoke: bool) -> "Workload":
    n = max(batch * 4, round(epoch_s / per_sample(cost_us, batch)))
    if smoke:
        n = max(batch * 4, n // 8)
    name = f"stream {cost_us:g}us {epoch_s:g}s b{batch}"
    return Workload(name, CostStream(n, cost_us), batch, n, loader_args={})


class Workload:
    def __init__(self, name, dataset, batch_size, samples, loader_args=None, native=False,
                 torch_dataset=None):
        self.name, self.dataset, self.batch_size = name, dataset, batch_size
        self.samples, self.native = samples, native
        self.loader_args = {"shuffle": True} if loader_args is None else loader_args
        self.torch_dataset = torch_dataset  # the native workloads' torch equivalent


class FetchStream(tud.IterableDataset):
    """`samples` small tensors, each waiting `wait_us` microseconds (a fetch: a sleep, the GIL
    released) and then costing `cost_us` of Python work, each worker reading its share."""

    def __init__(self, samples: int, wait_us: float, cost_us: float) -> None:
        self.samples, self.wait_us, self.cost_us = samples, wait_us, cost_us

    def __iter__(self):
        info = tud.get_worker_info()
        first, step = (info.id, info.num_workers) if info is not None else (0, 1)
        base = torch.arange(32, dtype=torch.float32)
        wait, cost, clock = self.wait_us * 1e-6, self.cost_us * 1e-6, time.perf_counter
        for i in range(first, self.samples, step):
            time.sleep(wait)
            end = clock() + cost
            while clock() < end:
                pass
            yield base * i, i


def workloads(names, smoke, costs=(), epoch_s=(), seed=None, draws=0):
    scale = 8 if smoke else 1
    out = {}
    for name in names:
        if name == "short":
            out[name] = Workload(name, SmallTensorStream(4096), 32, 4096, loader_args={})
        elif name == "streams":
            for c in costs:
                for e in epoch_s:
                    w = cost_stream(c, e, 32, smoke)
                    out[w.name] = w
        elif name == "drawn":
            if seed is None:
                print("auto_matrix: drawn skipped: it needs --seed")
                continue
            rng = random.Random(seed)
            for _ in range(draws):
                c = round(math.exp(rng.uniform(math.log(1), math.log(100))), 1)
                e = round(math.exp(rng.uniform(math.log(0.01), math.log(10))), 3)
                w = cost_stream(c, e, rng.choice((16, 32, 64, 128, 256)), smoke)
                out[w.name] = w
        elif name == "fetch":
            n = 2048 // scale
            out[name] = Workload(name, FetchStream(n, 200, 5), 32, n, loader_args={})
        elif name == "index":
            n = 2048 // scale
            out[name] = Workload(name, Index(n), 64, n,
                                 loader_args={"shuffle": True, "collate_fn": stack_collate})
        elif name == "stream":
            n = 160000 // scale
            out[name] = Workload(name, SmallTensorStream(n), 256, n, loader_args={})
        elif name == "padding":
            out[name] = Workload(name, VariableLength(512), 64, 512,
                                 loader_args={"shuffle": True, "collate_fn": pad_collate})
        elif name == "gil":
            probe = BytecodeDataset(1, 2000)
            steps = max(100, int(2000 * _rate(probe, [0] * 50) * 0.0005))  # ~0.5 ms a sample
            n = 2048 // scale
            out[name] = Workload(name, BytecodeDataset(n, steps), 64, n)
        elif name == "sleep":
            n = 256 // scale * 2 if smoke else 256
            out[name] = Workload(name, HeavyDataset(size=n, sleep_time=0.005), 64, n)
        elif name == "cheap":
            n = 50000 // scale
            out[name] = Workload(name, CheapDataset(n), 256, n)
        elif name in ("tvfolder", "tvjitter"):
            try:
                import torchvision
                import torchvision.transforms as tvt
            except ImportError:
                print(f"auto_matrix: {name} skipped: torchvision is not installed")
                continue
            steps = [tvt.RandomResizedCrop(224), tvt.RandomHorizontalFlip()]
            if name == "tvjitter":
                steps.append(tvt.ColorJitter(0.4, 0.4, 0.4))
            steps += [tvt.ToTensor(),
                      tvt.Normalize((0.485, 0.456, 0.406), (0.229, 0.224, 0.225))]
            ds = torchvision.datasets.ImageFolder(_jpeg_folder(256 // scale * 2 if smoke
                                                               else 256),
                                                  transform=tvt.Compose(steps))
            out[name] = Workload(name, ds, 64, len(ds))
        elif name == "tiny":
            n = 60000 // scale
            g = torch.Generator().manual_seed(0)
            x, y = torch.rand(n, 784, generator=g), torch.randint(0, 10, (n,), generator=g)
            out[name] = Workload(name, stoker.ArrayDataset(x, y), 256, n, native=True,
                                 torch_dataset=tud.TensorDataset(x, y))
        elif name == "jpeg":
            root = _jpeg_folder(256 // scale * 2 if smoke else 256)
            ds = stoker.ImageFolder(root, transform=stoker.transforms.train(224))
            out[name] = Workload(name, ds, 64, len(ds), native=True)
    return out


class Step:
    """A training step that costs CPU: `count` 256x256 matrix products on one thread."""

    def __init__(self, count: int) -> None:
        g = torch.Generator().manual_seed(0)
        self.a = torch.rand(256, 256, generator=g)
        self.count = count

    def __call__(self) -> None:
        x = self.a
        for _ in range(self.count):
            x = torch.mm(x, self.a).mul_(1e-3)

    @staticmethod
    def calibrated(seconds: float) -> "Step":
        return _calibrated(Step, 20, seconds)


def _calibrated(make, probe: int, seconds: float):
    """`make(count)` whose call takes about `seconds`, timed on a warm call of `probe` counts."""
    step = make(probe)
    step()
    start = time.perf_counter()
    step()
    per = (time.perf_counter() - start) / probe
    return make(max(1, round(seconds / per)))


class PythonStep:
    """A training step in Python bytecode that holds the GIL all along (an environment stepped
    in Python, per-batch bookkeeping): `count` iterations of arithmetic. A worker thread
    reading beside it competes for the GIL rather than running while it does."""

    def __init__(self, count: int) -> None:
        self.count = count

    def __call__(self) -> None:
        x = 0
        for i in range(self.count):
            x = (x + i * 7) % 1000003

    @staticmethod
    def calibrated(seconds: float) -> "PythonStep":
        return _calibrated(PythonStep, 20000, seconds)


def run(loader, samples: int, epochs: int, step, each=None) -> tuple[float, int, float]:
    """Samples/s over epochs 2..epochs as one span, the batches of one epoch, and samples/s
    over all the epochs, epoch 1's start-up counted (what a run of `epochs` takes); `each`, a
    list, gets each of epochs 2..'s samples/s (a switch's cost shows in one of them)."""
    batches = 0
    first = time.perf_counter()
    for batch in loader:  # epoch 1: start-up, not timed
        _touch(batch)
        batches += 1
        if step is not None:
            step()
    start = last = time.perf_counter()
    for _ in range(epochs - 1):
        for batch in loader:
            _touch(batch)
            if step is not None:
                step()
        if each is not None:
            now = time.perf_counter()
            each.append(samples / (now - last))
            last = now
    end = time.perf_counter()
    return (epochs - 1) * samples / (end - start), batches, epochs * samples / (end - first)


# A measurement of epochs 2..E shorter than this is repeated (a new loader each round, at most
# MOST_ROUNDS) and the median round's rate kept: the padding workload's 4 epochs take ~15 ms,
# where one page-cache or scheduler hiccup moved a single round by 2x.
MIN_MEASURED_S = 0.5
MOST_ROUNDS = 5
# After the sweep, the best fixed stoker setting, auto and torch's best are run this many more
# times, alternated, and compared by their medians: the best of seven settings measured once
# each is biased upward by the noise it was picked on (a winner's curse of about one standard
# deviation, 5-10% a single run here), which alone put auto at 0.90-0.95 of a setting it chose.
REMATCH_ROUNDS = 2


def median_of_rounds(once, samples: int, each=None):
    """(rate, extra) of the median round of `once(each_round)` -> (samples/s, extra), run
    until MIN_MEASURED_S of measured time or MOST_ROUNDS; `each` gets that round's list."""
    rounds, measured = [], 0.0
    while not rounds or (measured < MIN_MEASURED_S and len(rounds) < MOST_ROUNDS):
        each_round: list = []
        rate, extra = once(each_round)
        rounds.append((rate, extra, each_round))
        measured += samples / rate
    rate, extra, each_round = sorted(rounds, key=lambda r: r[0])[len(rounds) // 2]
    if each is not None:
        each.extend(each_round)
    return rate, extra


@contextlib.contextmanager
def rules_before():
    """auto as before issue 46 (a stream's processes start as soon as the model predicts a
    saving, and the switch is never checked): the start free, the check never done."""
    ext = stoker._stoker
    saved = ext.PROCESS_START_SECONDS, ext.check_switch
    ext.PROCESS_START_SECONDS, ext.check_switch = 0.0, lambda *a: ("measuring", "")
    # Nor started mid-epoch in the background (the early start came with issue 46 too).
    choice = getattr(stoker.loader, "stream_choice", None)
    early = choice._EARLY_EVERY if choice is not None else None
    if choice is not None:
        choice._EARLY_EVERY = sys.maxsize
    try:
        yield
    finally:
        ext.PROCESS_START_SECONDS, ext.check_switch = saved
        if choice is not None:
            choice._EARLY_EVERY = early


def left_of(stats: dict) -> str:
    """What auto spent on settings it then left: '-' if none."""
    return "; ".join(f"{d['setting']}: {d.get('windows', float('nan')):.1f} windows, "
                     f"{d['epochs']} ep, {d['batches']} b, {d['seconds']:.3f} s"
                     for d in stats.get("worker_type_left", ())) or "-"


def mark(ratio, target: float) -> str:
    """A ratio with its target's verdict: '1.02 ok', '0.77 MISS'."""
    if ratio is None:
        return "-"
    return f"{ratio:.2f} {'ok' if ratio >= target else 'MISS'}"


def measure_workload(w: Workload, epochs: int, step_factory, smoke: bool,
                     settings: list | None = None, rematch_rounds: int | None = None,
                     torch_workers: tuple | None = None, before: bool = False) -> dict:
    """`settings`: the fixed settings to try, by FIXED's names (default all; with `smoke`
    inline, thread 2 and process 2); `rematch_rounds` (default REMATCH_ROUNDS, none with
    `smoke`); `torch_workers` (default TORCH_WORKERS, 0 and 2 with `smoke`); `before`: auto
    with the rules of before issue 46 too, alternated in the rematch."""
    results, chosen = {}, None
    torch_ds = w.torch_dataset if w.native else w.dataset
    step = None
    calibrate = None
    # stoker at each fixed setting (native: threads only), then auto.
    fixed = [(n, a) for n, a in FIXED if not (w.native and a.get("worker_type") == "process")]
    if settings is not None or smoke:
        keep = settings if settings is not None else ("inline", "thread 2", "process 2")
        fixed = [f for f in fixed if f[0] in keep]
    if step_factory is not None:
        # Balanced: the step costs what a batch costs on stoker's 2 threads.
        loader = stoker.DataLoader(w.dataset, batch_size=w.batch_size, num_workers=2,
                                   **({} if w.native else {"worker_type": "thread"}),
                                   **w.loader_args)
        rate, batches, _ = run(loader, w.samples, 2, None)
        loader.close()
        calibrate = w.samples / rate / max(batches, 1)
        step = step_factory(calibrate)

    def stoker_rate(args: dict, each=None, old=False) -> float:
        def once(each_round):
            with rules_before() if old else contextlib.nullcontext():
                loader = stoker.DataLoader(w.dataset, batch_size=w.batch_size, **args,
                                           **w.loader_args)
                try:
                    rate, _, whole = run(loader, w.samples, epochs, step, each_round)
                    return rate, (loader.stats(), whole)
                finally:
                    loader.close()
        return median_of_rounds(once, w.samples * (epochs - 1), each)

    def torch_rate(n: int) -> float:
        def once(_):
            loader = tud.DataLoader(torch_ds, batch_size=w.batch_size, num_workers=n,
                                    persistent_workers=n > 0, **w.loader_args)
            return run(loader, w.samples, epochs, step)[0], None
        return median_of_rounds(once, w.samples * (epochs - 1))[0]

    # With epoch 1 counted (the median round's): whether a start-up auto did not pay, or
    # paid later, was worth it over a run this long.
    whole_rates = {}

    def swept(key: str, args: dict, each=None) -> tuple:
        rate, (stats, whole_rates[key]) = stoker_rate(args, each)
        return rate, stats

    rate_of = {f"stoker {name}": (lambda args=args: stoker_rate(args)[0]) for name, args in fixed}
    for name, args in fixed:
        results[f"stoker {name}"] = swept(f"stoker {name}", args)[0]
    auto_epochs: list = []
    results["stoker auto"], stats = swept("stoker auto", {}, auto_epochs)
    rate_of["stoker auto"] = lambda: stoker_rate({})[0]
    left = left_of(stats)
    if before:
        results["stoker auto before"], _ = stoker_rate({}, old=True)
        rate_of["stoker auto before"] = lambda: stoker_rate({}, old=True)[0]
    chosen = (f"{stats.get('worker_type', 'thread')} {stats.get('workers')}"
              if stats.get("workers") else "inline")
    if torch_ds is not None:
        for n in torch_workers or ((0, 2) if smoke else TORCH_WORKERS):
            results[f"torch {n}"] = torch_rate(n)
            rate_of[f"torch {n}"] = lambda n=n: torch_rate(n)
    best_fixed = max((k for k in results
                      if k.startswith("stoker ") and not k.startswith("stoker auto")),
                     key=results.get)
    torch_keys = [k for k in results if k.startswith("torch ")]
    torch_best = max(torch_keys, key=results.get) if torch_keys else None
    # The rematch: the sweep's winners and auto again, alternated; their medians compared.
    rounds = {k: [results[k]] for k in (best_fixed, "stoker auto", torch_best) if k}
    if before:
        rounds["stoker auto before"] = [results["stoker auto before"]]
    if rematch_rounds is None:
        rematch_rounds = 0 if smoke else REMATCH_ROUNDS
    for _ in range(rematch_rounds):
        for k in rounds:
            rounds[k].append(rate_of[k]())
    final = {k: statistics.median(v) for k, v in rounds.items()}
    auto = final["stoker auto"]
    # How far the best fixed setting's own rounds spread: a ratio nearer 1 than that is the
    # machine's noise, not auto's choice (more so where auto chose that very setting).
    best_rounds = rounds[best_fixed]
    spread = (max(best_rounds) - min(best_rounds)) / final[best_fixed]
    best_whole = max((k for k in whole_rates if k != "stoker auto"), key=whole_rates.get)
    return {"workload": w.name, "step_ms": None if calibrate is None else 1e3 * calibrate,
            "step": "python" if step_factory is PythonStep.calibrated else "torch",
            "samples_per_s": results, "rematch": rounds, "auto_epochs": auto_epochs,
            "auto_chose": chosen, "auto_reason": stats.get("worker_type_reason"),
            "auto_left": left,
            "before_over_best_fixed": (final["stoker auto before"] / final[best_fixed]
                                       if before else None),
            "best_fixed": best_fixed, "torch_best": torch_best,
            "same_setting": best_fixed == f"stoker {chosen}", "best_fixed_spread": spread,
            "auto_over_best_fixed": auto / final[best_fixed],
            "with_epoch_1": whole_rates, "best_fixed_with_epoch_1": best_whole,
            "auto_over_best_with_epoch_1": whole_rates["stoker auto"] / whole_rates[best_whole],
            "auto_over_torch_best": auto / final[torch_best] if torch_best else None}


def main() -> None:
    names = ["stream", "padding", "gil", "sleep", "cheap", "tvfolder", "tvjitter", "tiny",
             "jpeg", "index", "short", "fetch", "streams", "drawn"]
    default = names[:12] + ["streams"]
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--workload", nargs="+", default=default, choices=names)
    p.add_argument("--costs", nargs="+", type=float, default=[1, 10, 100],
                   help="the streams' costs a sample, microseconds")
    p.add_argument("--epoch-s", nargs="+", type=float, default=[0.01, 0.1, 1, 10],
                   help="the streams' epochs in-line, seconds")
    p.add_argument("--seed", type=int, help="draws --draws new stream shapes ('drawn' added)")
    p.add_argument("--draws", type=int, default=4)
    p.add_argument("--before", action="store_true",
                   help="also auto with the rules of before issue 46, alternated")
    p.add_argument("--epochs", type=int, default=5)
    p.add_argument("--no-step", action="store_true", help="skip the training-step variants")
    p.add_argument("--python-step", action="store_true",
                   help="the training step in Python bytecode, holding the GIL (PythonStep), "
                        "instead of torch's matrix products")
    p.add_argument("--smoke", action="store_true")
    p.add_argument("--json", action="store_true")
    a = p.parse_args()
    global MIN_MEASURED_S
    if a.smoke:
        MIN_MEASURED_S = 0  # one round each
        a.epochs, a.workload = 2, [n for n in a.workload if n not in ("tvfolder", "tvjitter")]
    if a.seed is not None and "drawn" not in a.workload:
        a.workload.append("drawn")
    torch.set_num_threads(1)  # the training thread: one core, the workers the rest
    # The loaders' advice at fixed settings ("... would change ..."): not in the tables.
    logging.getLogger("stoker").setLevel(logging.WARNING)
    rows = []
    for w in workloads(a.workload, a.smoke, a.costs, a.epoch_s, a.seed, a.draws).values():
        stepped = PythonStep.calibrated if a.python_step else Step.calibrated
        for step_factory in (None,) if a.no_step else (None, stepped):
            rows.append(measure_workload(w, a.epochs, step_factory, a.smoke, before=a.before))
            if not a.json:
                show(rows[-1])
    if a.json:
        print(json.dumps(rows, indent=1))
        return
    print(f"\nauto_matrix summary ({CORES} cores; epochs 2-{a.epochs}; samples/s, "
          f"or steps x batch with a step)")
    print(f"  {'workload':<36} {'auto chose':<12} {'best fixed':<18} {'auto/best':>9} "
          f"{'spread':>6} {'torch best':<10} {'auto/torch':>10}"
          + (f" {'before/best':>11}" if a.before else "") + f" {'with ep 1':>9}  left")
    for r in rows:
        kind = "pystep" if r["step"] == "python" else "step"
        name = r["workload"] + (f" +{kind} {r['step_ms']:.1f}ms" if r["step_ms"] else "")
        best = ("= " if r["same_setting"] else "") + r["best_fixed"]
        print(f"  {name:<36} {r['auto_chose']:<12} {best:<18} "
              f"{mark(r['auto_over_best_fixed'], TARGET_BEST):>9} {r['best_fixed_spread']:6.2f} "
              f"{r['torch_best'] or '-':<10} {mark(r['auto_over_torch_best'], TARGET_TORCH):>10}"
              + (f" {r['before_over_best_fixed']:11.2f}" if a.before else "")
              + f" {r['auto_over_best_with_epoch_1']:9.2f}  {r['auto_left']}")
    misses = [r for r in rows if r["auto_over_best_fixed"] < TARGET_BEST
              or (r["auto_over_torch_best"] or TARGET_TORCH) < TARGET_TORCH]
    print(f"  targets (auto/best >= {TARGET_BEST}, auto/torch >= {TARGET_TORCH}): "
          f"{len(rows) - len(misses)} of {len(rows)} rows hold")
    print("  (best fixed '= ...': auto chose that very setting; spread: (max - min) / median "
          "of the best fixed setting's own rounds; with ep 1: auto over the best fixed setting "
          f"with epoch 1's start-up counted, epochs 1-{a.epochs} of the sweep's rounds; left: "
          "the windows a check took on a setting then left, target <= 1)")


def show(r: dict) -> None:
    kind = " Python" if r["step"] == "python" else ""
    head = r["workload"] + (f" + a {r['step_ms']:.1f} ms{kind} step" if r["step_ms"] else "")
    print(f"{head}: auto chose {r['auto_chose']} ({r['auto_reason']})")
    print(f"  left: {r['auto_left']}")
    print("  auto by epoch from 2: " + " ".join(f"{v:.0f}" for v in r["auto_epochs"]))
    whole = r["with_epoch_1"]
    for k, v in sorted(r["samples_per_s"].items(), key=lambda kv: -kv[1]):
        print(f"  {k:<18} {v:10.0f}" + (f"   with epoch 1: {whole[k]:10.0f}" if k in whole
                                        else ""))
    if len(next(iter(r["rematch"].values()))) > 1:
        print("  rematch (all rounds, the median compared): " + "; ".join(
            f"{k} " + " ".join(f"{v:.0f}" for v in vs) for k, vs in r["rematch"].items()))


if __name__ == "__main__":
    main()
