"""stoker.DataLoader against torch.utils.data.DataLoader, from Python, in the same run.

    python bench/python_bench.py [--workload seed003 tiny] [--runs 3] [--json]

Workloads:
  seed003  seed 003's benchmark: its HeavyDataset (1024 x float32 3x224x224 made with
           torch.rand, __getitem__ sleeps 5 ms), batch 64, shuffled, and its training loop
           (Linear(150528, 10) with Adam on this machine's CPU, plus a 10 ms sleep every 5th
           batch). Prints epoch times, and the compute-only bound: the same loop over batches
           made in advance.
  jpeg     the native image pipelines (train and val, image folder, batch 64, 2 workers)
           through stoker.DataLoader against the same from `stoker bench -w jpeg` (C++), on
           the same generated JPEGs, alternated --runs times. Not in the default set.
  tiny     60000 float32 samples of 784 plus an int64 label (MNIST-like), batch 256,
           shuffled, from in-memory tensors: stoker.ArrayDataset against TensorDataset, and a
           consumer that touches each batch (sums it).
PyTorch runs with num_workers 0, 1, 2, 4 (persistent workers) and the best is the baseline.
Figures are medians over --runs epochs after a warm-up epoch.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import statistics
import sys
import time

import torch
import torch.utils.data as tud

import stoker

TORCH_WORKERS = (0, 1, 2, 4)


# --- seed 003 --------------------------------------------------------------------------------

# The seed's own HeavyDataset, from its script (examples/seed003_prefetch.py).
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "examples"))
from seed003_prefetch import HeavyDataset  # noqa: E402


class Trainer:
    """seed 003's train_epoch, with the model made once so every loader trains the same."""

    def __init__(self) -> None:
        torch.manual_seed(0)
        self.model = torch.nn.Linear(224 * 224 * 3, 10)
        self.criterion = torch.nn.CrossEntropyLoss()
        self.optimizer = torch.optim.Adam(self.model.parameters())

    def step(self, i, inputs, labels) -> None:
        inputs = inputs.view(inputs.size(0), -1)
        if i % 5 == 0:
            time.sleep(0.01)
        self.optimizer.zero_grad()
        loss = self.criterion(self.model(inputs), labels)
        loss.backward()
        self.optimizer.step()

    def epoch(self, batches) -> float:
        start = time.perf_counter()
        for i, (inputs, labels) in enumerate(batches):
            self.step(i, inputs, labels)
        return time.perf_counter() - start


def seed003(runs: int, smoke: bool) -> dict:
    dataset = HeavyDataset(size=128 if smoke else 1024, sleep_time=0.005)
    trainer = Trainer()
    made = list(tud.DataLoader(dataset, batch_size=64, shuffle=True))  # compute-only bound
    trainer.epoch(made)  # warm-up: Adam's state, allocator caches
    compute = statistics.median(trainer.epoch(made) for _ in range(runs))
    del made

    def measure(loader) -> float:
        trainer.epoch(loader)  # warm-up: worker start, first epoch
        return statistics.median(trainer.epoch(loader) for _ in range(runs))

    torch_times = {}
    for w in (0, 2) if smoke else TORCH_WORKERS:
        loader = tud.DataLoader(dataset, batch_size=64, shuffle=True, num_workers=w,
                                pin_memory=False, persistent_workers=w > 0)
        torch_times[w] = measure(loader)
        del loader
    stoker_loader = stoker.DataLoader(dataset, batch_size=64, shuffle=True)
    stoker_time = measure(stoker_loader)
    stats = stoker_loader.stats()
    best = min(torch_times, key=torch_times.get)
    return {
        "workload": "seed003",
        "samples": len(dataset),
        "compute_only_s": compute,
        "torch_epoch_s": torch_times,
        "torch_best_workers": best,
        "stoker_epoch_s": stoker_time,
        "stoker_workers": stats["workers"],
        "stoker_wait_fraction": stats["wait_fraction"],
        "speedup": torch_times[best] / stoker_time,
        "stoker_over_compute": stoker_time / compute,
    }


# --- tiny ------------------------------------------------------------------------------------

def tiny(runs: int, smoke: bool) -> dict:
    n = 3000 if smoke else 60000
    g = torch.Generator().manual_seed(0)
    x = torch.rand(n, 784, generator=g)
    y = torch.randint(0, 10, (n,), generator=g)

    def measure(loader) -> float:
        def epoch():
            start = time.perf_counter()
            total = 0.0
            for images, labels in loader:
                total += float(images[:, 0].sum()) + float(labels[0])
            return time.perf_counter() - start

        epoch()
        return n / statistics.median(epoch() for _ in range(runs))

    torch_rates = {}
    for w in (0, 2) if smoke else TORCH_WORKERS:
        loader = tud.DataLoader(tud.TensorDataset(x, y), batch_size=256, shuffle=True,
                                num_workers=w, persistent_workers=w > 0)
        torch_rates[w] = measure(loader)
        del loader
    stoker_loader = stoker.DataLoader(stoker.ArrayDataset(x, y), batch_size=256, shuffle=True)
    rate = measure(stoker_loader)
    best = max(torch_rates, key=torch_rates.get)
    return {
        "workload": "tiny",
        "samples": n,
        "torch_samples_per_s": torch_rates,
        "torch_best_workers": best,
        "stoker_samples_per_s": rate,
        "stoker_workers": stoker_loader.stats()["workers"],
        "speedup": rate / torch_rates[best],
    }


# --- jpeg: the native image pipeline from Python against the same from the command line -----

def jpeg(runs: int, smoke: bool, stoker_bin: str) -> dict:
    """`stoker bench -w jpeg --no-baseline` (C++: image folder, batch 64, 2 workers) and the
    same pipelines through stoker.DataLoader on the same files, alternated `runs` times."""
    import subprocess

    cli, py = {"train": [], "val": []}, {"train": [], "val": []}
    epochs = 2 if smoke else 3
    data_dir = None
    for _ in range(runs):
        args = [stoker_bin, "bench", "-w", "jpeg", "--no-baseline", "--json",
                "--epochs", str(epochs)] + (["--smoke"] if smoke else [])
        out = json.loads(subprocess.run(args, check=True, capture_output=True,
                                        text=True).stdout)
        out = out["workloads"][0] if "workloads" in out else out
        data_dir = out["data_dir"]
        for name in ("train", "val"):
            cli[name].append(out[name]["stoker"]["folder"]["images_per_s"])
            pipeline = stoker.transforms.train() if name == "train" else stoker.transforms.val()
            ds = stoker.ImageFolder(pathlib.Path(data_dir) / "folder", transform=pipeline)
            loader = stoker.DataLoader(ds, batch_size=64, shuffle=True, num_workers=2,
                                       prefetch_factor=2)
            times = []
            for _ in range(epochs):
                start = time.perf_counter()
                for images, labels in loader:
                    pass
                times.append(time.perf_counter() - start)
            loader.close()
            py[name].append(len(ds) / statistics.median(times[1:] if epochs > 1 else times))
    result = {"workload": "jpeg", "data_dir": data_dir}
    for name in ("train", "val"):
        result[name] = {
            "cli_images_per_s": statistics.median(cli[name]),
            "python_images_per_s": statistics.median(py[name]),
            "python_over_cli": statistics.median(p / c for p, c in zip(py[name], cli[name])),
        }
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workload", nargs="+", default=["seed003", "tiny"],
                        choices=["seed003", "tiny", "jpeg"])
    parser.add_argument("--stoker-bin", default=str(pathlib.Path(__file__).resolve().parents[1]
                                                   / "build" / "stoker"),
                        help="jpeg: the stoker command line to compare with")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--smoke", action="store_true",
                        help="tiny sizes, one run: checks the harness, measures nothing")
    args = parser.parse_args()
    runs = 1 if args.smoke else args.runs
    workloads = {"seed003": seed003, "tiny": tiny,
                 "jpeg": lambda r, s: jpeg(r, s, args.stoker_bin)}
    results = [workloads[w](runs, args.smoke) for w in args.workload]
    if args.json:
        print(json.dumps(results, indent=2))
        return
    for r in results:
        if r["workload"] == "seed003":
            torch_s = ", ".join(f"{w}: {t:.2f}" for w, t in r["torch_epoch_s"].items())
            print(f"seed003: epoch s, torch by num_workers {{{torch_s}}}; stoker "
                  f"{r['stoker_epoch_s']:.2f} ({r['stoker_workers']} threads, waited "
                  f"{100 * r['stoker_wait_fraction']:.1f}%); compute only "
                  f"{r['compute_only_s']:.2f}")
            print(f"  stoker / torch best: {r['speedup']:.2f}x faster; stoker epoch / compute "
                  f"only: {r['stoker_over_compute']:.3f}")
        elif r["workload"] == "jpeg":
            for name in ("train", "val"):
                p = r[name]
                print(f"jpeg {name}: images/s from Python {p['python_images_per_s']:,.0f}, from "
                      f"the command line {p['cli_images_per_s']:,.0f}: Python / CLI "
                      f"{p['python_over_cli']:.3f}")
        else:
            torch_r = ", ".join(f"{w}: {v:,.0f}" for w, v in r["torch_samples_per_s"].items())
            print(f"tiny: samples/s, torch by num_workers {{{torch_r}}}; stoker "
                  f"{r['stoker_samples_per_s']:,.0f}")
            print(f"  stoker / torch best: {r['speedup']:.1f}x")


if __name__ == "__main__":
    main()
