"""What auto's move from threads to worker processes costs, epoch by epoch: the padding workload
(auto_matrix.py's: 512 variable-length samples, a padding collate_fn, batch 64) on auto against
the fixed `process 2`, each round a new loader traced (loader.trace).

    python bench/auto_switch.py [--rounds 5] [--smoke]

Printed per round: each epoch's samples/s and epochs 2-5 together (auto_matrix.py's figure);
for auto, the first jobs of the processes after the move as the training process saw them
(sent to replied, ms) and the loop's longest wait in epoch 2. Then the medians of epochs 2-5.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import statistics
import sys
import tempfile
import time

import torch

import stoker

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from python_bench import VariableLength, _touch, pad_collate  # noqa: E402

EPOCHS = 5


def one_round(dataset, args: dict, trace: str) -> dict:
    loader = stoker.DataLoader(dataset, batch_size=64, shuffle=True, collate_fn=pad_collate,
                               **args)
    loader.trace(trace)
    spans = []
    for _ in range(EPOCHS):
        start = time.perf_counter()
        for batch in loader:
            _touch(batch)
        spans.append(time.perf_counter() - start)
    chose = f"{loader.stats().get('worker_type')} {loader.stats().get('workers')}"
    loader.close()
    events = json.loads(pathlib.Path(trace).read_text())["traceEvents"]
    jobs = sorted((e for e in events if e.get("name") == "job"), key=lambda e: e["ts"])
    waits = [e["dur"] / 1e3 for e in sorted((e for e in events
                                             if e.get("name") == "wait for batch"),
                                            key=lambda e: e["ts"])]
    n = len(dataset)
    per_epoch = len(waits) // EPOCHS if waits else 0
    return {"chose": chose, "epochs": [n / s for s in spans],
            "measured": (EPOCHS - 1) * n / sum(spans[1:]),
            "first_jobs_ms": [e["dur"] / 1e3 for e in jobs[:4]],
            "epoch2_longest_wait_ms": max(waits[per_epoch:2 * per_epoch], default=0.0)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--smoke", action="store_true", help="one round each")
    a = p.parse_args()
    if a.smoke:
        a.rounds = 1
    torch.set_num_threads(1)
    dataset = VariableLength(512)
    medians = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name, args in (("auto", {}), ("process 2", {"num_workers": 2,
                                                       "worker_type": "process"})):
            measured = []
            for r in range(a.rounds):
                out = one_round(dataset, args, os.path.join(tmp, f"{r}.json"))
                measured.append(out["measured"])
                line = (f"  {name:<9} round {r}: epochs "
                        + " ".join(f"{x / 1e3:.0f}k" for x in out["epochs"])
                        + f" | 2-{EPOCHS}: {out['measured'] / 1e3:.0f}k/s")
                if name == "auto":
                    line += (f"; chose {out['chose']}; first process jobs (ms) "
                             + " ".join(f"{x:.2f}" for x in out["first_jobs_ms"])
                             + f"; epoch 2's longest wait {out['epoch2_longest_wait_ms']:.2f} ms")
                print(line, flush=True)
            medians[name] = statistics.median(measured)
    auto, fixed = medians["auto"], medians["process 2"]
    print(f"auto_switch: epochs 2-{EPOCHS}, medians: auto {auto:.0f}, process 2 {fixed:.0f} "
          f"samples/s: auto {auto / fixed:.2f}x")


if __name__ == "__main__":
    main()
