"""Remote workers on Ray against local ones, on one machine of two cores (issue 13).

A CPU-bound data set (SHA-256 rounds over a buffer, which release the GIL, then a uint8
224x224x3 crop made from the digest) read by three set-ups, one after another, in one run:

  local-only     the training process pinned to core 0 (taskset): its loop and one worker
  local+remote   the same, plus one remote worker: a Ray actor on a Ray node pinned to core 1
  two local      the training process on cores 0 and 1 with two local workers, no Ray
  auto+remote    as local+remote with num_workers='auto': the loader asks for the remote
                 worker itself (local first) once its local worker is saturated, and only
                 then starts its actor (the first epoch pays the start-up)

and prints samples/s for each, local+remote / local-only (the issue's target: >= 1.6) and
local+remote / two local (target: >= 0.85). The Ray node is a ray.cluster_utils.Cluster
started by this process after pinning itself to core 1, so its processes (and the actor)
inherit core 1; each measurement runs in a child started with taskset.

    .venv-test/bin/python bench/ray_bench.py            # about a minute
    .venv-test/bin/python bench/ray_bench.py --smoke    # checks the harness, measures nothing
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
import time

import numpy as np

CROP = (224, 224, 3)


class HashCrops:
    """Sample i: `rounds` SHA-256 passes over a 64 KiB buffer made from i, the digest expanded
    into a uint8 224x224x3 crop, and its label."""

    def __init__(self, n: int, rounds: int) -> None:
        self.n = n
        self.rounds = rounds

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int):
        # update() of 64 KiB releases the GIL (hashlib does above 2 KiB; the constructor's data
        # does not): the work runs on as many cores as there are workers, as a native
        # decoder's would.
        block = i.to_bytes(8, "little") * (1 << 13)
        digest = b""
        for _ in range(self.rounds):
            h = hashlib.sha256()
            h.update(block)
            h.update(digest)
            digest = h.digest()
        crop = np.frombuffer(digest * (np.prod(CROP) // 32 + 1), np.uint8)[:np.prod(CROP)]
        return crop.reshape(CROP), np.int64(i)


def measure(setup: str, address: str, n: int, rounds: int, epochs: int) -> dict:
    """One set-up in this (pinned) process: samples/s over the last epoch (the first ones
    start the workers)."""
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import stoker

    remote = None
    if setup in ("local+remote", "auto+remote"):
        import ray

        ray.init(address=address, log_to_driver=False)
        remote = stoker.ray_workers(1)
    workers = {"two-local": 2, "auto+remote": "auto"}.get(setup, 1)
    loader = stoker.DataLoader(HashCrops(n, rounds), batch_size=16, shuffle=True, seed=1,
                               num_workers=workers, remote=remote, worker_type="thread")
    rate = 0.0
    for _ in range(epochs):
        start, samples = time.perf_counter(), 0
        for images, _labels in loader:
            samples += len(images)
        rate = samples / (time.perf_counter() - start)
    result = {"setup": setup, "samples_per_s": rate, "cores": sorted(os.sched_getaffinity(0))}
    if remote is not None:
        stats = loader.stats()
        result["remote"] = stats["remote"]
        result["network"] = {k: stats[k] for k in stats if k.startswith("network_")}
        result["report"] = str(loader.report())
    loader.close()
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true", help="tiny run, no verdict")
    parser.add_argument("--samples", type=int, default=640)
    parser.add_argument("--rounds", type=int, default=40, help="SHA-256 passes per sample")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--measure", help=argparse.SUPPRESS)
    parser.add_argument("--address", help=argparse.SUPPRESS)
    parser.add_argument("--epochs", type=int, default=2, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.measure:
        print(json.dumps(measure(args.measure, args.address, args.samples, args.rounds,
                                 args.epochs)))
        return
    if args.smoke:
        args.samples, args.rounds, args.epochs = 64, 2, 1
    if len(os.sched_getaffinity(0)) < 2 or os.cpu_count() < 2:
        sys.exit("ray_bench needs two cores")
    from ray.cluster_utils import Cluster

    # The Ray node and everything it starts run on core 1 (inherited affinity).
    os.sched_setaffinity(0, {1})
    cluster = Cluster(initialize_head=True, head_node_args=dict(
        num_cpus=1, object_store_memory=200 << 20, include_dashboard=False))
    results = []
    try:
        for setup, cores in (("local-only", "0"), ("local+remote", "0"), ("two-local", "0,1"),
                             ("auto+remote", "0")):
            out = subprocess.run(
                ["taskset", "-c", cores, sys.executable, os.path.abspath(__file__),
                 "--measure", setup, "--address", cluster.address, "--samples",
                 str(args.samples), "--rounds", str(args.rounds), "--epochs", str(args.epochs)],
                check=True, capture_output=True, text=True)
            results.append(json.loads(out.stdout.strip().splitlines()[-1]))
    finally:
        cluster.shutdown()
    rates = {r["setup"]: r["samples_per_s"] for r in results}
    summary = {
        "results": results,
        "remote_over_local": rates["local+remote"] / rates["local-only"],
        "remote_over_two_local": rates["local+remote"] / rates["two-local"],
    }
    if args.json:
        print(json.dumps(summary, indent=1))
    if args.smoke:
        return
    for r in results:
        print(f"{r['setup']:>13} (cores {','.join(map(str, r['cores']))}): "
              f"{r['samples_per_s']:8.1f} samples/s")
        if "network" in r:
            n = r["network"]
            print(f"{'':>15}network stage: {n['network_bytes_per_second'] / 1e6:.1f} MB/s, "
                  f"threads waited {n['network_wait_s']:.1f} s for {n['network_units']} "
                  f"units, the actor read {n['network_read_s']:.1f} s and idled "
                  f"{n['network_idle_s']:.1f} s of it; {r['report'].split(';')[0]}")
    print(f"local+remote / local-only: {summary['remote_over_local']:.2f}x (target >= 1.6)")
    print(f"local+remote / two local:  {summary['remote_over_two_local']:.2f}x "
          f"(target >= 0.85)")


if __name__ == "__main__":
    main()
