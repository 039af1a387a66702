"""Is the machine the limit? Samples/s and the cores each process used, for torch's DataLoader
in-line (`num_workers=0`) and stoker in-line, on worker processes and on auto, alternated.

    python bench/worker_cpu.py [--workload cheap] [--rounds 3] [--processes 2]

Each loader reads an epoch to warm up, then `--epochs` epochs timed as one span; the cores used
are CPU time over that span, of the training process (all its threads) and of each worker
process, whose time waiting for a core (its threads' run delay) is shown beside it: when the
processes' cores add up to the machine's and the workers wait for a core, more overlap cannot
help, only less CPU per sample. Workloads are python_bench.py's map-style ones.
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
from python_bench import BytecodeDataset, CheapDataset, _touch  # noqa: E402

def schedstat(pid: int) -> tuple[float, float]:
    """Seconds process `pid`'s threads together ran on a core, and were runnable but waited
    for one, so far (/proc/<pid>/task/*/schedstat, in nanoseconds)."""
    ran = waited = 0.0
    try:
        tasks = list(pathlib.Path(f"/proc/{pid}/task").iterdir())
    except OSError:
        return 0.0, 0.0
    for task in tasks:
        try:
            fields = (task / "schedstat").read_text().split()
        except OSError:
            continue  # a thread that ended
        ran, waited = ran + int(fields[0]) / 1e9, waited + int(fields[1]) / 1e9
    return ran, waited


def measure(loader, samples: int, epochs: int, workers) -> dict:
    for batch in loader:
        _touch(batch)
    pids = [os.getpid()] + workers()
    before = [schedstat(p) for p in pids]
    start = time.perf_counter()
    for _ in range(epochs):
        for batch in loader:
            _touch(batch)
    wall = time.perf_counter() - start
    used = [tuple((x - y) / wall for x, y in zip(schedstat(p), b)) for p, b in zip(pids, before)]
    return {"rate": epochs * samples / wall, "parent": used[0][0],
            "workers": [u[0] for u in used[1:]], "delays": [u[1] for u in used[1:]]}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--workload", choices=["cheap", "gil"], default="cheap")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--epochs", type=int, default=4)
    p.add_argument("--processes", type=int, default=2)
    p.add_argument("--smoke", action="store_true")
    a = p.parse_args()
    torch.set_num_threads(1)
    if a.workload == "cheap":
        dataset, batch_size = CheapDataset(5000 if a.smoke else 50000), 256
    else:
        dataset, batch_size = BytecodeDataset(256 if a.smoke else 2048, 2000), 64
    if a.smoke:
        a.rounds, a.epochs = 1, 1
    n = len(dataset)
    settings = {
        "torch in-line": lambda: tud.DataLoader(dataset, batch_size=batch_size, shuffle=True),
        "stoker in-line": lambda: stoker.DataLoader(dataset, batch_size=batch_size, shuffle=True,
                                                    num_workers=0),
        f"stoker process {a.processes}": lambda: stoker.DataLoader(
            dataset, batch_size=batch_size, shuffle=True, num_workers=a.processes,
            worker_type="process"),
        "stoker auto": lambda: stoker.DataLoader(dataset, batch_size=batch_size, shuffle=True),
    }
    rates: dict[str, list[float]] = {k: [] for k in settings}
    print(f"worker_cpu: {a.workload}, {n} samples, batch {batch_size}, "
          f"{len(os.sched_getaffinity(0))} cores; cores used over {a.epochs} epochs")
    for _ in range(a.rounds):
        for name, make in settings.items():
            loader = make()
            workers = getattr(loader, "stats", None)
            m = measure(loader, n, a.epochs,
                        (lambda: list(loader.stats()["worker_pids"])) if workers else list)
            if workers:
                loader.close()
            rates[name].append(m["rate"])
            side = " ".join(f"{c:.2f} (waited {d:.2f})" for c, d in zip(m["workers"], m["delays"]))
            print(f"  {name:<18} {m['rate']:10.0f} samples/s  training process {m['parent']:.2f}"
                  + (f"  workers {side}" if side else ""), flush=True)
    base = statistics.median(rates["torch in-line"])
    print("  medians, over torch in-line: " + "; ".join(
        f"{k} {statistics.median(v):.0f} ({statistics.median(v) / base:.2f}x)"
        for k, v in rates.items()))


if __name__ == "__main__":
    main()
