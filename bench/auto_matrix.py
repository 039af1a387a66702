"""Is `auto` ever the wrong choice? For each workload, torch's DataLoader at every num_workers
(best kept), stoker at each fixed setting (in-line `num_workers=0`, threads 1/2/4, processes
1/2/4) and stoker on auto, in one run; then the same with a training step that costs CPU.

    python bench/auto_matrix.py [--workload stream padding ...] [--epochs 5] [--smoke] [--json]

Throughput is over epochs 2..E together (the first epoch's start-up is excluded for every
loader; a switch auto makes later is counted); a setting whose epochs 2..E take under
MIN_MEASURED_S is run again with a new loader, up to MOST_ROUNDS times, and the median round
kept. Then the best fixed setting, auto and torch's best run REMATCH_ROUNDS more times,
alternated, and the summary compares their medians. With `--step`, each batch is followed by
a training step of matrix products on one thread whose cost is calibrated to the workload's
per-batch time on stoker's 2 threads, so the loop is balanced, and the figure is steps per
second (the consumer's CPU competes with the workers', as in training).

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
The summary line per workload: auto over the best fixed stoker setting (target >= 0.95) and
over torch's best (target >= 1.0); how far the best fixed setting's own rounds spread (a ratio
within it of 1 is the machine's noise); '=' where auto chose that very setting.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import pathlib
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

CORES = len(os.sched_getaffinity(0))
TORCH_WORKERS = (0, 1, 2, 4)
FIXED = [("inline", dict(num_workers=0))] + [
    (f"{kind} {n}", dict(num_workers=n, worker_type=kind))
    for kind in ("thread", "process") for n in (1, 2, 4)]


class Workload:
    def __init__(self, name, dataset, batch_size, samples, loader_args=None, native=False,
                 torch_dataset=None):
        self.name, self.dataset, self.batch_size = name, dataset, batch_size
        self.samples, self.native = samples, native
        self.loader_args = {"shuffle": True} if loader_args is None else loader_args
        self.torch_dataset = torch_dataset  # the native workloads' torch equivalent


def workloads(names, smoke):
    scale = 8 if smoke else 1
    out = {}
    for name in names:
        if name == "stream":
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
        probe = Step(20)
        probe()
        start = time.perf_counter()
        probe()
        per = (time.perf_counter() - start) / 20
        return Step(max(1, round(seconds / per)))


def run(loader, samples: int, epochs: int, step, each=None) -> tuple[float, int]:
    """Samples/s over epochs 2..epochs as one span, and the batches of one epoch; `each`, a
    list, gets each of those epochs' samples/s (a switch's cost shows in one of them)."""
    batches = 0
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
    return (epochs - 1) * samples / (time.perf_counter() - start), batches


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


def measure_workload(w: Workload, epochs: int, step_factory, smoke: bool,
                     settings: list | None = None, rematch_rounds: int | None = None,
                     torch_workers: tuple | None = None) -> dict:
    """`settings`: the fixed settings to try, by FIXED's names (default all; with `smoke`
    inline, thread 2 and process 2); `rematch_rounds` (default REMATCH_ROUNDS, none with
    `smoke`); `torch_workers` (default TORCH_WORKERS, 0 and 2 with `smoke`)."""
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
        rate, batches = run(loader, w.samples, 2, None)
        loader.close()
        calibrate = w.samples / rate / max(batches, 1)
        step = step_factory(calibrate)
    def stoker_rate(args: dict, each=None) -> float:
        def once(each_round):
            loader = stoker.DataLoader(w.dataset, batch_size=w.batch_size, **args,
                                       **w.loader_args)
            try:
                return run(loader, w.samples, epochs, step, each_round)[0], loader.stats()
            finally:
                loader.close()
        return median_of_rounds(once, w.samples * (epochs - 1), each)

    def torch_rate(n: int) -> float:
        def once(_):
            loader = tud.DataLoader(torch_ds, batch_size=w.batch_size, num_workers=n,
                                    persistent_workers=n > 0, **w.loader_args)
            return run(loader, w.samples, epochs, step)[0], None
        return median_of_rounds(once, w.samples * (epochs - 1))[0]

    rate_of = {f"stoker {name}": (lambda args=args: stoker_rate(args)[0]) for name, args in fixed}
    for key, rate in rate_of.items():
        results[key] = rate()
    auto_epochs: list = []
    results["stoker auto"], stats = stoker_rate({}, auto_epochs)
    rate_of["stoker auto"] = lambda: stoker_rate({})[0]
    chosen = (f"{stats.get('worker_type', 'thread')} {stats.get('workers')}"
              if stats.get("workers") else "inline")
    if torch_ds is not None:
        for n in torch_workers or ((0, 2) if smoke else TORCH_WORKERS):
            results[f"torch {n}"] = torch_rate(n)
            rate_of[f"torch {n}"] = lambda n=n: torch_rate(n)
    best_fixed = max((k for k in results if k.startswith("stoker ") and k != "stoker auto"),
                     key=results.get)
    torch_keys = [k for k in results if k.startswith("torch ")]
    torch_best = max(torch_keys, key=results.get) if torch_keys else None
    # The rematch: the sweep's winners and auto again, alternated; their medians compared.
    rounds = {k: [results[k]] for k in (best_fixed, "stoker auto", torch_best) if k}
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
    return {"workload": w.name, "step_ms": None if calibrate is None else 1e3 * calibrate,
            "samples_per_s": results, "rematch": rounds, "auto_epochs": auto_epochs,
            "auto_chose": chosen, "auto_reason": stats.get("worker_type_reason"),
            "best_fixed": best_fixed, "torch_best": torch_best,
            "same_setting": best_fixed == f"stoker {chosen}", "best_fixed_spread": spread,
            "auto_over_best_fixed": auto / final[best_fixed],
            "auto_over_torch_best": auto / final[torch_best] if torch_best else None}


def main() -> None:
    names = ["stream", "padding", "gil", "sleep", "cheap", "tvfolder", "tvjitter", "tiny",
             "jpeg"]
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--workload", nargs="+", default=names, choices=names)
    p.add_argument("--epochs", type=int, default=5)
    p.add_argument("--no-step", action="store_true", help="skip the training-step variants")
    p.add_argument("--smoke", action="store_true")
    p.add_argument("--json", action="store_true")
    a = p.parse_args()
    global MIN_MEASURED_S
    if a.smoke:
        MIN_MEASURED_S = 0  # one round each
        a.epochs, a.workload = 2, [n for n in a.workload if n not in ("tvfolder", "tvjitter")]
    torch.set_num_threads(1)  # the training thread: one core, the workers the rest
    # The loaders' advice at fixed settings ("... would change ..."): not in the tables.
    logging.getLogger("stoker").setLevel(logging.WARNING)
    rows = []
    for w in workloads(a.workload, a.smoke).values():
        for step_factory in (None,) if a.no_step else (None, Step.calibrated):
            rows.append(measure_workload(w, a.epochs, step_factory, a.smoke))
            if not a.json:
                show(rows[-1])
    if a.json:
        print(json.dumps(rows, indent=1))
        return
    print(f"\nauto_matrix summary ({CORES} cores; epochs 2-{a.epochs}; samples/s, "
          f"or steps x batch with a step)")
    print(f"  {'workload':<20} {'auto chose':<12} {'best fixed':<18} {'auto/best':>9} "
          f"{'spread':>6} {'torch best':<10} {'auto/torch':>10}")
    for r in rows:
        name = r["workload"] + (f" +step {r['step_ms']:.1f}ms" if r["step_ms"] else "")
        best = ("= " if r["same_setting"] else "") + r["best_fixed"]
        print(f"  {name:<20} {r['auto_chose']:<12} {best:<18} "
              f"{r['auto_over_best_fixed']:9.2f} {r['best_fixed_spread']:6.2f} "
              f"{r['torch_best'] or '-':<10} {r['auto_over_torch_best'] or float('nan'):10.2f}")
    print("  (best fixed '= ...': auto chose that very setting; spread: (max - min) / median "
          "of the best fixed setting's own rounds)")


def show(r: dict) -> None:
    head = r["workload"] + (f" + a {r['step_ms']:.1f} ms step" if r["step_ms"] else "")
    print(f"{head}: auto chose {r['auto_chose']} ({r['auto_reason']})")
    print("  auto by epoch from 2: " + " ".join(f"{v:.0f}" for v in r["auto_epochs"]))
    for k, v in sorted(r["samples_per_s"].items(), key=lambda kv: -kv[1]):
        print(f"  {k:<18} {v:10.0f}")
    if len(next(iter(r["rematch"].values()))) > 1:
        print("  rematch (all rounds, the median compared): " + "; ".join(
            f"{k} " + " ".join(f"{v:.0f}" for v in vs) for k, vs in r["rematch"].items()))


if __name__ == "__main__":
    main()
