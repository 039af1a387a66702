"""What a worker process adds to a sample, against the physical limit of __getitem__ alone.

A stoker worker process reads a chunk of rows with ``SampleWriter.run_job`` (python/src/
py_workers.h): per row, ``__getitem__``, the check of the sample against the batch layout, the
writes of its arrays and numbers into the row of the (shared) slab and its object values
(strings) collected; then the chunk's object values are pickled for the reply
(``_run_job`` of stoker/workers/main.py). This benchmark runs exactly that in one process,
with no socket and no other process, over the same rows as a bare ``for i in rows:
dataset[i]`` loop, alternated, and prints microseconds per sample and the ratio: the cost that
stoker's worker processes add to a cheap sample, before any inter-process cost (which
``python_bench.py`` measures whole).

    python bench/worker_overhead.py [--rows 128] [--rounds 15] [--smoke]
"""

from __future__ import annotations

import argparse
import os
import pathlib
import sys
import time

import numpy as np

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "tests" / "support"))

from stoker.workers import main as _worker  # noqa: E402

from python_bench import CheapDataset  # noqa: E402
from worker_harness import writer_with_layout  # noqa: E402

_REGION = 1


def writer_for(dataset, rows: int):
    """A SampleWriter with `dataset`'s layout (learned by a loader, as in a real run) and one
    shared-memory region for `rows` rows; returns (writer, bytes per row of each field)."""
    writer, row_bytes = writer_with_layout(dataset, rows)
    size = sum(rows * b for b in row_bytes) + 4096 * len(row_bytes)
    fd = os.memfd_create("stoker-worker-overhead")
    os.ftruncate(fd, size)
    writer.map(_REGION, fd, size)  # takes the fd
    return writer, row_bytes


def encode_job(indices, row_bytes) -> bytes:
    """A kJob payload (python/src/py_workers.h) for `indices`, fields one after the other."""
    job = bytearray(_worker._JOB.pack(1, _REGION, len(row_bytes), len(indices), 0))
    offset = 0
    for b in row_bytes:
        job += _worker._FIELD.pack(offset, b)
        offset += len(indices) * b + 4096
    for i in indices:
        job += _worker._ROW.pack(int(i), 0)
    return bytes(job)


def per_sample(fn, repeat: int, rows: int) -> float:
    start = time.perf_counter()
    for _ in range(repeat):
        fn()
    return (time.perf_counter() - start) / repeat / rows * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=128, help="rows a job (a chunk)")
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--smoke", action="store_true", help="a few rounds: checks the harness")
    args = parser.parse_args()
    rounds, repeat = (2, 5) if args.smoke else (args.rounds, 300)

    dataset = CheapDataset(50000)
    writer, row_bytes = writer_for(dataset, args.rows)
    indices = np.random.default_rng(0).permutation(len(dataset))[:args.rows].tolist()
    job = encode_job(indices, row_bytes)

    def bare():
        for i in indices:
            dataset[i]

    def rows_only():
        writer.run_job(job, dataset, False)

    def with_reply():
        _worker._run_job(job, dataset, writer, None, False, None)

    times = {"bare": [], "rows": [], "reply": []}
    for _ in range(rounds):  # alternated, the best of each kept: the machine's noise only adds
        times["bare"].append(per_sample(bare, repeat, args.rows))
        times["rows"].append(per_sample(rows_only, repeat, args.rows))
        times["reply"].append(per_sample(with_reply, repeat, args.rows))
    bare_us, rows_us, reply_us = (min(times[k]) for k in ("bare", "rows", "reply"))
    print(f"cheap samples, {args.rows} rows a job, best of {rounds} rounds: __getitem__ alone "
          f"{bare_us:.3f} us a sample; a worker's job {rows_us:.3f} us (+{rows_us - bare_us:.3f}), "
          f"with its reply {reply_us:.3f} us (+{reply_us - bare_us:.3f})")
    print(f"  __getitem__ / worker job: {bare_us / reply_us:.2f} of the physical limit")


if __name__ == "__main__":
    main()
