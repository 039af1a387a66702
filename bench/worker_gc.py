"""What a worker process's garbage collections cost it, with and without gc.freeze() at its
start (stoker's worker processes freeze what they inherit: stoker/workers/main.py).

    python bench/worker_gc.py [--samples 200000] [--rounds 3] [--smoke]

A process that imported torch and stoker forks a child, as a worker process starts; the child
reads a data set that keeps a RAM cache of its samples (small dicts that survive, so the
collector's older generations run), once as forked and once after gc.freeze(). Printed for
each: the collections by generation, their total and longest pause, and the child's private
memory (Private_Clean + Private_Dirty of /proc/self/smaps_rollup) past what the same cache
takes in a freshly forked child that never collects (gc.disable()): the pages a collection
wrote in objects shared copy-on-write with the parent.
"""

from __future__ import annotations

import gc
import json
import os
import time

import torch  # noqa: F401 - the training process's heap, as a worker inherits it

import bench_args
import stoker  # noqa: F401


def private_bytes() -> int:
    total = 0
    with open("/proc/self/smaps_rollup") as f:
        for line in f:
            if line.startswith(("Private_Clean:", "Private_Dirty:")):
                total += int(line.split()[1]) * 1024
    return total


def child(mode: str, samples: int, out_fd: int) -> None:
    if mode == "frozen":
        gc.freeze()
    elif mode == "never":
        gc.disable()
    pauses: dict[int, list[float]] = {0: [], 1: [], 2: []}
    started = {}

    def watch(phase, info):
        if phase == "start":
            started["t"] = time.perf_counter()
        else:
            pauses[info["generation"]].append(time.perf_counter() - started["t"])
    gc.callbacks.append(watch)
    before = private_bytes()
    cache = {}
    start = time.perf_counter()
    for i in range(samples):  # a data set keeping each sample it read
        cache[i] = {"x": [i, i + 1], "name": f"sample-{i}"}
    seconds = time.perf_counter() - start
    result = {"mode": mode, "seconds": seconds, "private_mib": (private_bytes() - before) / 2**20,
              "collections": {g: len(p) for g, p in pauses.items()},
              "pause_ms": 1e3 * sum(sum(p) for p in pauses.values()),
              "longest_ms": 1e3 * max((max(p) for p in pauses.values() if p), default=0.0)}
    os.write(out_fd, json.dumps(result).encode())
    os._exit(0)


def run(mode: str, samples: int) -> dict:
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(r)
        child(mode, samples, w)
    os.close(w)
    data = b""
    while chunk := os.read(r, 65536):
        data += chunk
    os.close(r)
    os.waitpid(pid, 0)
    return json.loads(data)


def main() -> None:
    a = bench_args.parse(bench_args.parser(__doc__, samples=200000, rounds=3),
                         dict(rounds=1, samples=20000), "one round of 20,000 samples")
    print(f"worker_gc: {len(gc.get_objects())} objects tracked in the parent; a child caches "
          f"{a.samples} samples")
    rows = {m: [run(m, a.samples) for _ in range(a.rounds)] for m in ("never", "forked",
                                                                        "frozen")}
    base = sorted(r["private_mib"] for r in rows["never"])[a.rounds // 2]
    for mode in ("forked", "frozen"):
        r = sorted(rows[mode], key=lambda r: r["private_mib"])[a.rounds // 2]  # the median
        print(f"  {mode:<7} collections {r['collections']}, paused {r['pause_ms']:.1f} ms in all "
              f"(longest {r['longest_ms']:.1f} ms), private memory past the cache's "
              f"{r['private_mib'] - base:.1f} MiB, {r['seconds']:.2f} s")


if __name__ == "__main__":
    main()
