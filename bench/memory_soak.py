"""A long run with worker processes: nothing grows, nothing is left behind (issue 23).

Each epoch makes a new loader over worker processes and either reads the whole epoch or
breaks out of it early (every third epoch, at a random batch, with batches in flight), then
drops the loader. After each epoch it records the training process's resident memory
(VmRSS), its open descriptors, its child processes and the entries in /dev/shm.

    python bench/memory_soak.py [--epochs 200] [--warmup 10] [--smoke]

Prints the curve's summary (RSS at the end of warm-up, lowest, highest and last after it,
the drift), and the descriptors, children and /dev/shm entries before and after. Exits 1 if
the resident memory after warm-up left a band of --tolerance (5%) around its value at the end
of warm-up, or anything was left behind.
"""

from __future__ import annotations

import os
import random
import time

import numpy as np

import bench_args
import stoker

MiB = 1 << 20


def rss() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


def descriptors() -> int:
    return len(os.listdir("/proc/self/fd"))


def children() -> list:
    """This process's live child processes (zombies reaped by the loader do not count)."""
    out = []
    for task in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{task}/children") as f:
                out += [int(p) for p in f.read().split()]
        except OSError:
            pass
    return out


def shm_entries() -> set:
    """Our entries in /dev/shm: other programs on the machine make and remove theirs; ours are
    named for stoker or carry this process's pid (torch's shared tensors, torch_<pid>_...)."""
    try:
        return {e for e in os.listdir("/dev/shm") if "stoker" in e or f"_{os.getpid()}_" in e}
    except OSError:
        return set()


class Samples:
    def __init__(self, n: int, sample_bytes: int):
        self.n, self.sample_bytes = n, sample_bytes

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        return {"x": np.full(self.sample_bytes, i & 255, np.uint8), "i": np.int64(i)}


def epoch(data, batch: int, workers: int, e: int, rng: random.Random) -> int:
    loader = stoker.DataLoader(data, batch_size=batch, shuffle=True, num_workers=workers,
                               worker_type="process", seed=e)
    stop_at = rng.randrange(1, len(data) // batch) if e % 3 == 2 else None
    taken = 0
    for b in loader:
        assert int(b["x"][0, 0]) == int(b["i"][0]) & 255
        taken += 1
        if taken == stop_at:
            break
    del loader
    return taken


def main() -> int:
    p = bench_args.parser(__doc__, epochs=200, warmup=10, samples=2048, batch=64, sample_kb=16,
                          workers=2, tolerance=0.05)
    args = bench_args.parse(p, dict(epochs=6, warmup=2, samples=512),
                            "a few epochs: checks it works only")
    rng = random.Random(0)
    data = Samples(args.samples, args.sample_kb * 1024)
    fds, kids, shm = descriptors(), children(), shm_entries()
    curve = []
    start = time.perf_counter()
    for e in range(args.epochs):
        epoch(data, args.batch, args.workers, e, rng)
        curve.append(rss())
    elapsed = time.perf_counter() - start
    # Workers exit once their loader is dropped; give the last ones a moment to be reaped.
    deadline = time.monotonic() + 10
    while children() and time.monotonic() < deadline:
        time.sleep(0.05)
    after = curve[args.warmup - 1:]
    ref = after[0]
    low, high = min(after), max(after)
    drift = max(high - ref, ref - low) / ref
    fds_after, kids_after, shm_added = descriptors(), children(), shm_entries() - shm
    print(f"memory_soak: {args.epochs} epochs ({elapsed:.0f} s), a new loader each, "
          f"{args.workers} worker processes, every third epoch broken off early")
    print(f"  RSS after epoch {args.warmup}: {ref / MiB:.1f} MiB; after it lowest "
          f"{low / MiB:.1f}, highest {high / MiB:.1f}, last {curve[-1] / MiB:.1f} MiB: "
          f"within {100 * drift:.1f}% (limit {100 * args.tolerance:.0f}%)")
    marks = sorted({0, args.warmup - 1, len(curve) // 2, len(curve) - 1})
    print("  curve: " + ", ".join(f"epoch {m + 1} {curve[m] / MiB:.1f}" for m in marks))
    print(f"  descriptors {fds} -> {fds_after}, child processes {len(kids)} -> "
          f"{len(kids_after)}, /dev/shm entries added {len(shm_added)}")
    ok = (drift <= args.tolerance and fds_after == fds and len(kids_after) == len(kids)
          and not shm_added)
    print("memory_soak: " + ("ok" if ok else "FAILED"))
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
