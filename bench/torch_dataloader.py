#!/usr/bin/env python3
"""PyTorch DataLoader baseline for `stoker bench`.

Measures how fast a stock ``torch.utils.data.DataLoader`` (shuffle=True,
default collate, persistent workers when num_workers > 0) delivers batches of
an in-memory synthetic dataset, for each num_workers in a list.  Per
configuration it reports steady-state throughput (samples/s and GB/s of batch
tensors), time to the first batch (worker start-up included) and the share of
epoch time the training loop spent blocked in ``next()``.

Workloads:
  tensor  uint8 image [3,224,224] + int64 label
  tiny    float32 x [784] + int64 label
  heavy   float32 x [3,224,224] + int64 label, __getitem__ sleeps 5 ms and the
          training loop busy-spins 50 ms per batch (a blog's HeavyDataset)

The data formula mirrors the C++ bench exactly, so both sides move
bit-identical bytes.  For sample i and flat element j (row-major):
  uint8   (i*131 + j*7) & 255
  float32 float32((i*131 + j*7) % 1000) / float32(1000)
  label   int64 i % 10

Exactly one JSON object is printed to stdout; progress goes to stderr.
Exit status is 0 on success and 1 on failure.
"""

import argparse
import gc
import json
import statistics
import sys
import time

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset

# name -> (samples, field name, dtype, shape, batch size, epochs, latency ms, consumer ms)
WORKLOADS = {
    "tensor": (4096, "image", np.uint8, (3, 224, 224), 64, 3, 0.0, 0.0),
    "tiny": (60000, "x", np.float32, (784,), 256, 3, 0.0, 0.0),
    "heavy": (1024, "x", np.float32, (3, 224, 224), 64, 2, 5.0, 50.0),
}

CHUNK_ELEMENTS = 1 << 24  # bound on the int64 intermediate while generating


def make_data(samples, dtype, shape):
    """Return a (samples, *shape) array following the shared data formula."""
    per_sample = int(np.prod(shape))
    out = np.empty((samples, per_sample), dtype=dtype)
    j7 = np.arange(per_sample, dtype=np.int64) * 7
    rows = max(1, CHUNK_ELEMENTS // per_sample)
    for start in range(0, samples, rows):
        stop = min(samples, start + rows)
        v = np.arange(start, stop, dtype=np.int64)[:, None] * 131 + j7[None, :]
        if dtype == np.uint8:
            out[start:stop] = (v & 255).astype(np.uint8)
        else:
            out[start:stop] = (v % 1000).astype(np.float32) / np.float32(1000)
    return out.reshape((samples,) + tuple(shape))


class SyntheticDataset(Dataset):
    """Holds the data and label tensors; optionally sleeps per item."""

    def __init__(self, data, labels, latency_s):
        self.data, self.labels, self.latency_s = data, labels, latency_s

    def __len__(self):
        return len(self.labels)

    def __getitem__(self, i):
        if self.latency_s > 0:
            time.sleep(self.latency_s)
        return self.data[i], self.labels[i]


def spin(seconds):
    """Busy-wait (no sleeping) to simulate a training step."""
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


def measure(dataset, workers, batch_size, epochs, consumer_s):
    """Run `epochs` epochs with `workers` workers; return the run record."""
    loader = DataLoader(dataset, batch_size=batch_size, shuffle=True,
                        drop_last=False, num_workers=workers, pin_memory=False,
                        persistent_workers=workers > 0)
    epoch_times, wait_pcts = [], []
    first_batch_ms = None
    samples_per_epoch = bytes_per_epoch = 0
    for epoch in range(epochs):
        samples = nbytes = 0
        wait = 0.0
        batch = None
        t0 = time.perf_counter()
        it = iter(loader)
        while True:
            w0 = time.perf_counter()
            try:
                batch = next(it)
            except StopIteration:
                break
            now = time.perf_counter()
            wait += now - w0
            if first_batch_ms is None:
                first_batch_ms = (now - t0) * 1e3
            samples += len(batch[1])
            nbytes += sum(t.numel() * t.element_size() for t in batch)
            if consumer_s > 0:
                spin(consumer_s)
        elapsed = time.perf_counter() - t0
        del it, batch
        epoch_times.append(elapsed)
        wait_pcts.append(100.0 * wait / elapsed)
        samples_per_epoch, bytes_per_epoch = samples, nbytes
        print(f"  workers={workers} epoch={epoch} {elapsed:.3f}s "
              f"wait={wait_pcts[-1]:.1f}%", file=sys.stderr)
    # Shut the workers down before the next configuration starts.
    del loader
    gc.collect()

    steady = slice(1, None) if epochs > 1 else slice(None)
    epoch_s = statistics.median(epoch_times[steady])
    return {
        "num_workers": workers,
        "samples_per_s": samples_per_epoch / epoch_s,
        "gb_per_s": bytes_per_epoch / epoch_s / 1e9,
        "first_batch_ms": first_batch_ms,
        "wait_pct": statistics.median(wait_pcts[steady]),
        "epoch_s": epoch_s,
        "epoch_times_s": epoch_times,
    }


class _Parser(argparse.ArgumentParser):
    """ArgumentParser that exits with status 1 (not 2) on bad arguments."""

    def error(self, message):
        self.print_usage(sys.stderr)
        self.exit(1, f"{self.prog}: error: {message}\n")


def parse_args():
    p = _Parser(description=__doc__.split("\n")[0])
    p.add_argument("--workload", choices=sorted(WORKLOADS), required=True)
    p.add_argument("--samples", type=int)
    p.add_argument("--epochs", type=int)
    p.add_argument("--workers-list", default="0,1,2,4",
                   help="comma-separated num_workers values")
    p.add_argument("--consumer-ms", type=float)
    p.add_argument("--latency-ms", type=float)
    p.add_argument("--batch-size", type=int)
    args = p.parse_args()

    samples, field, dtype, shape, batch, epochs, latency, consumer = WORKLOADS[args.workload]
    fill = {"samples": samples, "batch_size": batch, "epochs": epochs,
            "latency_ms": latency, "consumer_ms": consumer}
    for name, default in fill.items():
        if getattr(args, name) is None:
            setattr(args, name, default)
    try:
        args.workers = [int(w) for w in args.workers_list.split(",") if w.strip()]
    except ValueError:
        p.error(f"bad --workers-list: {args.workers_list!r}")
    if not args.workers or min(args.workers) < 0:
        p.error("--workers-list needs non-negative integers")
    if args.samples < 1 or args.epochs < 1 or args.batch_size < 1:
        p.error("--samples, --epochs and --batch-size must be >= 1")
    if args.latency_ms < 0 or args.consumer_ms < 0:
        p.error("--latency-ms and --consumer-ms must be >= 0")
    args.field, args.dtype, args.shape = field, dtype, shape
    return args


def main():
    args = parse_args()
    try:
        t = time.perf_counter()
        data = torch.from_numpy(make_data(args.samples, args.dtype, args.shape))
        labels = torch.from_numpy(np.arange(args.samples, dtype=np.int64) % 10)
        print(f"{args.workload}: {args.samples} samples of {args.field} "
              f"{list(args.shape)} built in {time.perf_counter() - t:.2f}s",
              file=sys.stderr)
        dataset = SyntheticDataset(data, labels, args.latency_ms / 1e3)
        runs = [measure(dataset, w, args.batch_size, args.epochs,
                        args.consumer_ms / 1e3) for w in args.workers]
    except Exception as e:  # report any failure clearly, exit 1
        print(f"torch_dataloader.py: {args.workload} failed: "
              f"{type(e).__name__}: {e}", file=sys.stderr)
        return 1

    result = {
        "workload": args.workload,
        "torch_version": torch.__version__,
        "samples": args.samples,
        "batch_size": args.batch_size,
        "epochs": args.epochs,
        "runs": runs,
        "best": max(runs, key=lambda r: r["samples_per_s"]),
    }
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
