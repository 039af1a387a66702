"""The one memory cap (memory_limit) against no cap, in the same run (issue 23).

A bursty consumer takes 2,000 batches from worker processes whose data set keeps a RAM cache
of the samples it made (each worker up to --cache-mb, first come first kept, as
stoker.ImageFolder's cache_bytes does natively). A sampler thread reads, over and over (20 ms
apart; each look takes a while itself, as the kernel walks every page the processes map), the
proportional set size (Pss, /proc/<pid>/smaps_rollup) of the loader's processes together: the
training process and its workers. Pss splits pages shared between them (the shared batch
buffers, copy-on-write pages after fork) so that the sum is the memory they use together.
The training process's own Pss before the loader was made (the interpreter, torch, numpy) is
not the loader's: the loader's peak is the peak of the sum less that baseline. The loader
counts its workers' memory itself from a background thread of its own (`stoker-pss`, reading
their smaps_rollup at most every 2 s): its CPU time over each run is printed too (0 for a
loader without that thread).

    python bench/memory_cap.py [--limit-gb 1.5] [--batches 2000] [--runs 3] [--smoke]
    python bench/memory_cap.py --stream   # the same over a stream with a shuffle buffer

With --stream the data set is an IterableDataset each worker process reads its share of,
through a shuffle buffer of --cache-mb per worker (as webdataset's shuffle does): the buffers
count in the workers' memory, and the cap makes each worker's queue shallower
(docs/python.md, streams under the cap).

Prints, per configuration, the median throughput and the highest peak over the runs, then
the capped run's peak against the cap and its throughput against the uncapped one's. Exits 1
if the capped peak went over the cap.
"""

from __future__ import annotations

import os
import statistics
import threading
import time

import numpy as np

import bench_args
import stoker

MiB = 1 << 20


def reader_cpu() -> float:
    """Seconds on a CPU of this process's `stoker-pss` threads (the loader's memory reader)."""
    total = 0
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/comm") as f:
                if f.read().strip() != "stoker-pss":
                    continue
            with open(f"/proc/self/task/{tid}/schedstat") as f:
                total += int(f.read().split()[0])
        except OSError:
            pass
    return total / 1e9


def pss(pid: int) -> int:
    """Bytes of Pss of process `pid`, 0 if it is gone."""
    try:
        with open(f"/proc/{pid}/smaps_rollup") as f:
            for line in f:
                if line.startswith("Pss:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


class CachedSamples:
    """Samples of `sample_bytes` uint8 made with some Python work per sample (so worker
    processes pay), kept in a per-process RAM cache of at most `cache_bytes`."""

    def __init__(self, n: int, sample_bytes: int, cache_bytes: int):
        self.n, self.sample_bytes, self.cache_bytes = n, sample_bytes, cache_bytes
        self.cache: dict = {}
        self.cached = 0

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        hit = self.cache.get(i)
        if hit is not None:
            return hit
        x = np.empty(self.sample_bytes, np.uint8)
        x[:] = sum(range(i % 2000)) & 255  # a little Python work, holding the GIL
        if self.cached + x.nbytes <= self.cache_bytes:
            self.cache[i] = x
            self.cached += x.nbytes
        return x


def shuffled_stream(n: int, sample_bytes: int, buffer_bytes: int):
    """An IterableDataset: each worker its share of `n` samples made as CachedSamples makes
    them, through a shuffle buffer of `buffer_bytes`."""
    import random

    from torch.utils.data import IterableDataset, get_worker_info

    class ShuffledStream(IterableDataset):
        def __iter__(self):
            info = get_worker_info()
            w, workers = (info.id, info.num_workers) if info is not None else (0, 1)
            rng = random.Random(w)
            buffer: list = []
            for i in range(w, n, workers):
                x = np.empty(sample_bytes, np.uint8)
                x[:] = sum(range(i % 2000)) & 255
                if len(buffer) * sample_bytes < buffer_bytes:
                    buffer.append(x)
                    continue
                k = rng.randrange(len(buffer))
                buffer[k], x = x, buffer[k]
                yield x
            rng.shuffle(buffer)
            yield from buffer

    return ShuffledStream()


def run(args, limit: int) -> tuple:
    """(batches/s, the loader's peak Pss in bytes, report(), the seconds the loader's memory
    reader spent on a CPU, the run's seconds) for one loader."""
    baseline = pss(os.getpid())
    if args.stream:
        data = shuffled_stream(args.samples, args.sample_kb * 1024, args.cache_mb * MiB)
        order = {}
    else:
        data = CachedSamples(args.samples, args.sample_kb * 1024, args.cache_mb * MiB)
        order = {"shuffle": True, "seed": 1}
    loader = stoker.DataLoader(data, batch_size=args.batch, num_workers=args.workers,
                               worker_type="process", prefetch_factor=args.prefetch,
                               persistent_workers=True, memory_limit=limit, **order)
    peak = 0
    stop = threading.Event()
    pids: list = []

    def sample():
        nonlocal peak
        while not stop.is_set():
            total = pss(os.getpid()) + sum(pss(p) for p in pids if p > 0)
            peak = max(peak, total - baseline)
            stop.wait(0.02)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    taken = 0
    start = time.perf_counter()
    while taken < args.batches:
        for x in loader:
            if not pids:
                pids[:] = loader.stats()["worker_pids"]
            int(x[0, 0])  # touch the batch
            taken += 1
            # Bursty: a run of batches taken as fast as they come, then a long step (an
            # evaluation, a checkpoint) while the loader reads ahead.
            if taken % args.burst == 0:
                time.sleep(args.pause)
            if taken == args.batches:
                break
    elapsed = time.perf_counter() - start
    report = loader.report()
    reader = reader_cpu()  # before the loader closes, which ends the thread
    stop.set()
    sampler.join()
    del loader
    return args.batches / elapsed, peak, report, reader, elapsed


def main() -> int:
    p = bench_args.parser(__doc__, limit_gb=1.5, batches=2000, batch=64, sample_kb=256,
                          samples=4096, workers=4, burst=50, pause=0.25, runs=3)
    p.add_argument("--cache-mb", type=int, default=192, help="per worker process")
    p.add_argument("--prefetch", type=int, default=16, help="prefetch_factor")
    p.add_argument("--stream", action="store_true",
                   help="a stream with a shuffle buffer of --cache-mb per worker")
    args = bench_args.parse(p, dict(batches=60, runs=1, samples=512, burst=20, pause=0.05),
                            "a short run: checks it works only")
    limit = int(args.limit_gb * (1 << 30))
    kept = "stream, shuffle buffer" if args.stream else "RAM cache"
    print(f"memory_cap: {args.batches} batches of {args.batch} x {args.sample_kb} KiB, "
          f"{args.workers} worker processes, prefetch_factor {args.prefetch}, {kept} "
          f"{args.cache_mb} MiB per worker; bursts of {args.burst} then {args.pause} s; "
          f"{args.runs} runs, alternating")
    rates: dict = {"uncapped": [], "capped": []}
    peaks: dict = {"uncapped": [], "capped": []}
    last = {}
    for _ in range(args.runs):
        for name, cap in (("uncapped", 0), ("capped", limit)):
            rate, peak, report, reader, elapsed = run(args, cap)
            rates[name].append(rate)
            peaks[name].append(peak)
            last[name] = report
            print(f"  {name:8s} {rate:7.1f} batches/s, loader's peak Pss {peak / MiB:6.0f} MiB; "
                  f"{report['memory']}; memory reader {reader:.2f} s CPU in {elapsed:.1f} s")
    for name in rates:
        print(f"{name:8s}: median {statistics.median(rates[name]):.1f} batches/s, highest peak "
              f"{max(peaks[name]) / MiB:.0f} MiB (default cap {last[name]['memory_limit'] / MiB:.0f}"
              f" MiB)" if name == "uncapped" else
              f"{name:8s}: median {statistics.median(rates[name]):.1f} batches/s, highest peak "
              f"{max(peaks[name]) / MiB:.0f} MiB of the {limit / MiB:.0f} MiB cap")
    ratio = statistics.median(rates["capped"]) / statistics.median(rates["uncapped"])
    held = max(peaks["capped"]) <= limit
    print(f"capped peak {max(peaks['capped']) / MiB:.0f} MiB {'<=' if held else '>'} cap "
          f"{limit / MiB:.0f} MiB; throughput capped / uncapped {ratio:.2f}x")
    return 0 if held else 1


if __name__ == "__main__":
    raise SystemExit(main())
