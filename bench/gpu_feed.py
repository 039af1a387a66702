"""Feeding a GPU: stoker's device="cuda" against torch's DataLoader with pin_memory=True and the
seeds' `.to("cuda", non_blocking=True)`, against the physical limit (the pinned host-to-device
copy rate of the same bytes), in one run.

The data set is image-sized uint8 samples (3x224x224, 147 KB) and an int64 label, held in host
memory, so the loop measures what the loader adds on the way to the device: the gather into a
batch, pinning and the host-to-device copy. The training step is a small GPU kernel (a float
conversion and a reduction), so the loop is bound by the feed, not the model.

    python bench/gpu_feed.py                   # on a machine with a CUDA GPU and a CUDA torch
    python bench/gpu_feed.py --device cpu --smoke   # the same code paths on the CPU (a check)
"""
import argparse
import json
import statistics
import sys
import time

import numpy as np
import torch

import stoker


class HostImages(torch.utils.data.Dataset):
    """What a user hands torch's DataLoader: samples indexed out of host arrays."""

    def __init__(self, images, labels):
        self.images = torch.from_numpy(images)
        self.labels = torch.from_numpy(labels)

    def __len__(self):
        return len(self.labels)

    def __getitem__(self, i):
        return self.images[i], self.labels[i]


def sync(device):
    if device == "cuda":
        torch.cuda.synchronize()


def step(x, y):
    # A small GPU step: the feed, not the model, bounds the loop.
    return x.float().mean() + y.float().mean()


def run_epochs(make_iter, device, epochs, to_device):
    """Samples per second over epochs 2.. (the first epoch starts workers and warms up)."""
    rates = []
    for epoch in range(epochs):
        n = 0
        sync(device)
        t0 = time.perf_counter()
        acc = None
        for x, y in make_iter():
            if to_device:
                x = x.to(device, non_blocking=True)
                y = y.to(device, non_blocking=True)
            out = step(x, y)
            acc = out if acc is None else acc + out
            n += x.shape[0]
        float(acc)  # waits for the last step
        sync(device)
        if epoch > 0:
            rates.append(n / (time.perf_counter() - t0))
    return statistics.median(rates)


def h2d_limit(device, batch_bytes, repeats):
    """Bytes per second of a pinned host-to-device copy of one batch's bytes, back to back."""
    if device != "cuda":
        return None
    src = torch.empty(batch_bytes, dtype=torch.uint8).pin_memory()
    dst = torch.empty(batch_bytes, dtype=torch.uint8, device="cuda")
    for _ in range(3):
        dst.copy_(src, non_blocking=True)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(repeats):
        dst.copy_(src, non_blocking=True)
    torch.cuda.synchronize()
    return batch_bytes * repeats / (time.perf_counter() - t0)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--samples", type=int, default=4096)
    parser.add_argument("--batch-size", type=int, default=128)
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument("--torch-workers", type=int, nargs="+", default=[0, 2, 4, 8])
    parser.add_argument("--smoke", action="store_true", help="a few small epochs")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    if args.smoke:
        args.samples, args.epochs, args.torch_workers = 512, 2, [0, 2]
    if args.device == "cuda" and not torch.cuda.is_available():
        sys.exit("gpu_feed: torch sees no CUDA device (use --device cpu for a check run)")

    rng = np.random.default_rng(0)
    images = rng.integers(0, 256, size=(args.samples, 3, 224, 224), dtype=np.uint8)
    labels = rng.integers(0, 1000, size=args.samples, dtype=np.int64)
    sample_bytes = images[0].nbytes + labels[0].nbytes
    pin = args.device == "cuda"
    results = {}

    # torch: pin_memory=True and non_blocking copies (the seeds' recipe), at its best num_workers.
    host = HostImages(images, labels)
    for w in args.torch_workers:
        loader = torch.utils.data.DataLoader(host, batch_size=args.batch_size, shuffle=True,
                                             num_workers=w, pin_memory=pin,
                                             persistent_workers=w > 0)
        results[f"torch w={w}"] = run_epochs(lambda: loader, args.device, args.epochs, True)
        del loader
    torch_best = max((k for k in results), key=results.get)

    # stoker: batches arrive on the device (its side stream copies pinned slabs), auto workers.
    ds = stoker.ArrayDataset(images, labels)
    loader = stoker.DataLoader(ds, batch_size=args.batch_size, shuffle=True, device=args.device)
    results["stoker device"] = run_epochs(lambda: loader, args.device, args.epochs, False)
    device_desc = loader.stats().get("device", args.device)
    # The rate follows the workers (the gather of 151 KB rows): say what auto chose.
    workers = {"stoker device": loader.stats().get("workers")}
    loader.close()
    # stoker's pinned host batches, copied by the loop itself (the seeds' idiom, stoker's pool).
    loader = stoker.DataLoader(ds, batch_size=args.batch_size, shuffle=True, pin_memory=pin)
    results["stoker pinned"] = run_epochs(lambda: loader, args.device, args.epochs, True)
    workers["stoker pinned"] = loader.stats().get("workers")
    loader.close()

    limit = h2d_limit(args.device, args.batch_size * sample_bytes, 200)
    limit_rate = limit / sample_bytes if limit else None

    out = {"device": device_desc, "sample_bytes": sample_bytes, "samples_per_s": results,
           "stoker_workers": workers,
           "torch_best": torch_best, "h2d_limit_samples_per_s": limit_rate}
    if args.json:
        print(json.dumps(out, indent=1))
        return
    print(f"gpu_feed: {args.samples} samples of {sample_bytes / 1e3:.0f} KB, batch {args.batch_size},"
          f" device {device_desc}; samples/s, median of epochs 2-{args.epochs}")
    for name, rate in results.items():
        line = f"  {name:<16} {rate:10.0f}   {rate / results[torch_best]:5.2f}x torch best"
        if limit_rate:
            line += f"   {rate / limit_rate:5.2f} of the H2D limit"
        if name in workers:
            line += f"   ({workers[name]} workers)"
        print(line)
    if limit_rate:
        print(f"  H2D limit        {limit_rate:10.0f}   (pinned copy of one batch, "
              f"{limit / 1e9:.1f} GB/s)")


if __name__ == "__main__":
    main()
