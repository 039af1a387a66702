"""Ranks sharing one node, each with num_workers='auto', against the best split by hand.

    torchrun --standalone --nproc_per_node=2 bench/ddp_tune.py --folder DIR [--json]

Each rank reads its shard of an image folder through the train pipeline (decode-bound: its
workers compute) and takes batches as fast as they come. First every rank runs
num_workers='auto' (the tuner's share of the node is the cores divided by LOCAL_WORLD_SIZE),
then each fixed count of workers per rank in --splits, in --repeat rounds. Rank 0 prints, per
configuration, the ranks' summed throughput (the median of the rounds), their workers, and
their busy workers (worker busy time over wall time, summed over ranks, the most of any round)
against the node's cores, then the ratio of 'auto' to the best split.
Measured under whatever else runs on the machine: compare ratios, not absolute figures.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time

import torch
import torch.distributed as dist

import stoker
from stoker import transforms as T


def run(loader, warmup: float, measure: float) -> list[float]:
    """[samples/s, workers, busy workers, depth, tuner changes] of this rank over `measure`
    seconds after `warmup`."""
    start = time.perf_counter()
    first = None
    while True:
        for _ in loader:
            now = time.perf_counter()
            if first is None:
                if now - start >= warmup:
                    first = (now, loader.stats())
            elif now - first[0] >= measure:
                s, took = loader.stats(), now - first[0]
                busy = (s["worker_busy_s"] - first[1]["worker_busy_s"]) / took
                return [(s["samples"] - first[1]["samples"]) / took, s["workers"], busy,
                        s["depth"], s["tuner_changes"]]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--folder", required=True, help="an image folder (class subfolders)")
    parser.add_argument("--seconds", type=float, default=5.0, help="the tuner's run")
    parser.add_argument("--measure", type=float, default=3.0, help="seconds measured")
    parser.add_argument("--splits", type=int, nargs="+", default=[1, 2],
                        help="fixed workers per rank to compare")
    parser.add_argument("--repeat", type=int, default=3,
                        help="rounds, alternated; figures are medians")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()

    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    data = stoker.ImageFolder(args.folder, transform=T.train(224))
    sampler = stoker.DistributedSampler(data)
    configs = ["auto", *args.splits]
    runs: dict[str, list[dict]] = {str(c): [] for c in configs}
    # Rounds of every configuration, alternated so that the machine's changing load falls on
    # all of them alike; each figure is the median of its rounds.
    for _ in range(args.repeat):
        for workers in configs:
            loader = stoker.DataLoader(data, batch_size=64, sampler=sampler, num_workers=workers)
            warmup = args.seconds if workers == "auto" else 1.0
            mine = torch.tensor(run(loader, warmup, args.measure), dtype=torch.float64)
            loader.close()
            every = [torch.zeros_like(mine) for _ in range(world)]
            dist.all_gather(every, mine)
            runs[str(workers)].append({"samples_per_s": sum(float(r[0]) for r in every),
                                       "workers": [int(r[1]) for r in every],
                                       "busy_workers": sum(float(r[2]) for r in every),
                                       "depth": [int(r[3]) for r in every],
                                       "changes": [int(r[4]) for r in every]})
    rows = []
    for workers in configs:
        mine = sorted(runs[str(workers)], key=lambda r: r["samples_per_s"])
        middle = mine[(len(mine) - 1) // 2]  # the median round's workers, busy and depth
        rows.append({"workers_per_rank": workers,
                     "samples_per_s": statistics.median(r["samples_per_s"] for r in mine),
                     "runs": [r["samples_per_s"] for r in runs[str(workers)]],
                     "workers": middle["workers"],
                     "busy_workers": max(r["busy_workers"] for r in mine),
                     "depth": middle["depth"], "changes": middle["changes"]})
    if rank == 0:
        cores = len(os.sched_getaffinity(0))
        best = max(rows[1:], key=lambda r: r["samples_per_s"])
        result = {"ranks": world, "cores": cores, "runs": rows, "best_split": best,
                  "ratio": rows[0]["samples_per_s"] / best["samples_per_s"]}
        if args.json:
            print(json.dumps(result, indent=2))
        else:
            print(f"{world} ranks on {cores} cores (measured under load: compare ratios)")
            for r in rows:
                print(f"  workers per rank {str(r['workers_per_rank']):>4}: "
                      f"{r['samples_per_s']:8.0f} samples/s ({min(r['runs']):.0f}-"
                      f"{max(r['runs']):.0f}), workers {r['workers']}, "
                      f"busy workers up to {r['busy_workers']:.2f} of {cores} cores, "
                      f"depth {r['depth']}, tuner changes {r['changes']}")
            print(f"auto / best split by hand ({best['workers_per_rank']} per rank): "
                  f"{result['ratio']:.2f}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
