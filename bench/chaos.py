"""Chaos rounds for worker processes (issue: nothing lost, nothing left behind).

1. Worker deaths: each round makes a loader over worker processes (map-style, or batch jobs
   with a collate_fn), SIGKILLs one of its workers at a random batch of the epoch, as the OOM
   killer does, and checks that the epoch still delivers every sample exactly once.
2. Parent deaths: each round starts a training process whose loader's workers were started
   from its main thread or from another thread, SIGKILLs it mid-epoch, and checks that after
   1 s no worker is alive, nothing was added to /dev/shm, and this process's descriptors are
   unchanged.

    python bench/chaos.py [--rounds 50] [--parent-rounds 20] [--smoke]

Prints one line per kind and exits 1 if any round failed.
"""

from __future__ import annotations

import os
import pathlib
import random
import signal
import subprocess
import sys
import textwrap
import time

import numpy as np

import bench_args
import stoker

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "tests" / "support"))
from worker_harness import alive  # noqa: E402


class Squares:
    def __init__(self, n):
        self.n = n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        time.sleep(0.0005)  # a read worth a worker: the deaths land mid-job too
        return np.full(4, i, np.int64)


def collate(samples):
    return np.stack(samples)


def worker_death_round(rng, batch_jobs):
    n, batch = 512, 16
    kw = {"collate_fn": collate} if batch_jobs else {}
    loader = stoker.DataLoader(Squares(n), batch_size=batch, shuffle=True, num_workers=2,
                               worker_type="process", seed=rng.randrange(1 << 30), **kw)
    kill_at = rng.randrange(n // batch - 1)
    seen = []
    for b, x in enumerate(loader):
        x = x[0] if isinstance(x, (list, tuple)) else x
        seen += [int(v) for v in np.asarray(x)[:, 0]]
        if b == kill_at:
            pids = [p for p in loader.stats()["worker_pids"] if p > 0]
            os.kill(rng.choice(pids), signal.SIGKILL)
    deaths = loader.stats()["worker_deaths"]
    loader.close()
    return sorted(seen) == list(range(n)), deaths


PARENT = textwrap.dedent("""
    import sys, threading, time, numpy as np, stoker
    class Slow:
        def __len__(self): return 100000
        def __getitem__(self, i):
            time.sleep(0.002)
            return np.full(4, i, np.int64)
    def run():
        loader = stoker.DataLoader(Slow(), batch_size=8, num_workers=2, worker_type="process")
        it = iter(loader)
        next(it)
        print(*loader.stats()["worker_pids"], flush=True)
        for _ in it:
            pass
    if sys.argv[1] == "thread":
        threading.Thread(target=run).start()
    else:
        run()
""")


def parent_death_round(where):
    shm_before = set(os.listdir("/dev/shm"))
    fds_before = len(os.listdir("/proc/self/fd"))
    proc = subprocess.Popen([sys.executable, "-c", PARENT, where], stdout=subprocess.PIPE,
                            text=True)
    pids = [int(p) for p in proc.stdout.readline().split()]
    proc.kill()
    proc.wait()
    proc.stdout.close()
    time.sleep(1.0)
    left = [p for p in pids if alive(p)]
    # Other programs on the machine make and remove entries too: ours are named for stoker or
    # carry one of our pids (torch's shared tensors, torch_<pid>_...).
    ours = [str(proc.pid)] + [str(p) for p in pids]
    added = {e for e in set(os.listdir("/dev/shm")) - shm_before
             if "stoker" in e or any(f"_{pid}_" in e for pid in ours)}
    fds_after = len(os.listdir("/proc/self/fd"))
    for p in left:  # do not leave them for the next round
        os.kill(p, signal.SIGKILL)
    return len(pids) == 2 and not left and not added and fds_after == fds_before, left, added


def main():
    args = bench_args.parse(bench_args.parser(__doc__, rounds=50, parent_rounds=20, seed=0),
                            dict(rounds=2, parent_rounds=2), "2 rounds of each")
    rng = random.Random(args.seed)
    failed = 0
    for kind in ("map-style", "batch jobs"):
        ok = deaths = 0
        start = time.monotonic()
        for _ in range(args.rounds):
            good, d = worker_death_round(rng, kind == "batch jobs")
            ok += good
            deaths += d
        failed += args.rounds - ok
        print(f"worker SIGKILLed at a random batch, {kind}: {ok}/{args.rounds} epochs with every "
              f"sample exactly once; {deaths} deaths seen and replaced "
              f"({time.monotonic() - start:.1f} s)")
    ok = 0
    for r in range(args.parent_rounds):
        good, left, added = parent_death_round("main" if r % 2 == 0 else "thread")
        ok += good
        if not good:
            print(f"  round {r}: workers alive after 1 s: {left}; added to /dev/shm: {added}")
    failed += args.parent_rounds - ok
    print(f"training process SIGKILLed (workers started from the main thread or another): "
          f"{ok}/{args.parent_rounds} rounds with no worker alive after 1 s, nothing added to "
          f"/dev/shm, this process's descriptors unchanged")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
