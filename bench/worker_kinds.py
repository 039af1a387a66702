"""The batch path (a collate_fn) on worker threads against worker processes, beside torch's
DataLoader, in the same run: what worker_type='auto' chooses between.

    python bench/worker_kinds.py [--workload padding randn index] [--rounds 2] [--smoke]

Workloads (batch 64, shuffled, a collate_fn, so every batch is made whole by a worker):
  padding  python_bench's padding case: float32 samples of L x 64, L from 16 to 256, padded
           with pad_sequence (4 MB batches).
  randn    per-sample torch.randn(3, 128, 128) scaled and shifted (torch ops that release
           the GIL), stacked.
  index    rows of a tensor made in advance, scaled, stacked (memory-bound).
For each: samples/s of torch's num_workers=0 and of stoker with worker_type 'thread',
'process' and 'auto' (which kind auto chose), over 2 epochs after a warm-up one, `--rounds`
times alternated, medians; and the CPU time a sample costs in the training process and in
the worker processes (/proc/<pid>/stat) with worker_type='process'.
"""

from __future__ import annotations

import argparse
import os
import pathlib
import statistics
import sys
import time

import torch
import torch.utils.data as tud

import stoker

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from python_bench import VariableLength, _descendants, _touch, pad_collate  # noqa: E402


class Randn(tud.Dataset):
    def __init__(self, samples: int) -> None:
        self.samples = samples

    def __len__(self) -> int:
        return self.samples

    def __getitem__(self, i: int):
        return torch.randn(3, 128, 128).mul_(0.5).add_(0.1), i


class Index(tud.Dataset):
    def __init__(self, samples: int) -> None:
        self.x = torch.rand(256, 3, 128, 128, generator=torch.Generator().manual_seed(0))
        self.samples = samples

    def __len__(self) -> int:
        return self.samples

    def __getitem__(self, i: int):
        return self.x[i % len(self.x)] * 0.5, i


def stack_collate(samples):
    return torch.stack([x for x, _ in samples]), torch.tensor([i for _, i in samples])


WORKLOADS = {
    "padding": (lambda smoke: VariableLength(1280 if smoke else 20000), pad_collate),
    "randn": (lambda smoke: Randn(256 if smoke else 2048), stack_collate),
    "index": (lambda smoke: Index(512 if smoke else 8192), stack_collate),
}


def _cpu_s(pid: int) -> float:
    fields = pathlib.Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def measure(loader, samples: int, epochs: int) -> tuple[float, dict]:
    """Samples/s over `epochs` epochs after a warm-up one, and the CPU seconds each process
    of the tree used meanwhile."""
    for batch in loader:
        _touch(batch)
    pids = _descendants(os.getpid())
    before = {p: _cpu_s(p) for p in pids}
    start = time.perf_counter()
    for _ in range(epochs):
        for batch in loader:
            _touch(batch)
    seconds = time.perf_counter() - start
    cpu = {p: _cpu_s(p) - before[p] for p in pids if pathlib.Path(f"/proc/{p}").exists()}
    return epochs * samples / seconds, cpu


def run(name: str, rounds: int, smoke: bool) -> dict:
    make, collate = WORKLOADS[name]
    dataset = make(smoke)
    n, epochs = len(dataset), 1 if smoke else 2
    rates: dict[str, list[float]] = {k: [] for k in ("torch0", "thread", "process", "auto")}
    chosen, cpu_main, cpu_workers = [], [], []
    for _ in range(rounds):
        loader = tud.DataLoader(dataset, batch_size=64, shuffle=True, collate_fn=collate)
        rates["torch0"].append(measure(loader, n, epochs)[0])
        for kind in ("thread", "process", "auto"):
            loader = stoker.DataLoader(dataset, batch_size=64, shuffle=True,
                                       collate_fn=collate, worker_type=kind)
            rate, cpu = measure(loader, n, epochs)
            rates[kind].append(rate)
            if kind == "auto":
                chosen.append(loader.worker_type)
            if kind == "process":
                total = epochs * n
                cpu_main.append(cpu.get(os.getpid(), 0.0) / total * 1e6)
                cpu_workers.append(sum(v for p, v in cpu.items() if p != os.getpid())
                                   / total * 1e6)
            loader.close()
    median = {k: statistics.median(v) for k, v in rates.items()}
    return {
        "workload": name, "samples_per_s": median, "rounds": rates, "auto_chose": chosen,
        "process_over_thread": median["process"] / median["thread"],
        "auto_over_torch0": median["auto"] / median["torch0"],
        "process_us_per_sample": {"training process": statistics.median(cpu_main),
                                  "workers": statistics.median(cpu_workers)},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workload", nargs="+", default=list(WORKLOADS), choices=WORKLOADS)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--smoke", action="store_true",
                        help="tiny sizes, one round: checks the harness, measures nothing")
    args = parser.parse_args()
    for name in args.workload:
        r = run(name, 1 if args.smoke else args.rounds, args.smoke)
        rate = r["samples_per_s"]
        print(f"{name}: samples/s (medians of {len(r['rounds']['auto'])} rounds) torch "
              f"num_workers=0 {rate['torch0']:,.0f}, stoker threads {rate['thread']:,.0f}, "
              f"processes {rate['process']:,.0f}, auto {rate['auto']:,.0f} (chose "
              f"{', '.join(r['auto_chose'])})")
        cpu = r["process_us_per_sample"]
        print(f"  processes / threads {r['process_over_thread']:.2f}x; auto / torch "
              f"{r['auto_over_torch0']:.2f}x; with processes a sample costs "
              f"{cpu['workers']:.1f} us of CPU in the workers, {cpu['training process']:.1f} "
              f"us in the training process")


if __name__ == "__main__":
    main()
