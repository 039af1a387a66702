"""A stoker.DataLoader as frameworks hand it to the training loop, against the loader the user
made, in the same run: re-made by Lightning with a DistributedSampler (what its DDP strategies
do: lightning's own _update_dataloader, world size 1 so that one process reads the whole data
set) and prepared by Accelerate (Accelerator(cpu=True).prepare), over reads that wait.

    python bench/frameworks_bench.py [--samples 8192] [--wait-ms 5] [--rounds 3] [--smoke]

Each sample's read sleeps --wait-ms (a file or object-store read) and returns a 4 KB tensor;
batch 32, shuffled. For each loader: samples/s over one epoch after two warm-up epochs (workers
started and tuned: num_workers='auto' tunes the count online), the kind and count of workers
it ended with; --rounds alternated, medians; then each one's ratio to the user's loader. torch's
DataLoader (num_workers=8, re-made by Lightning) is shown for scale. Needs lightning and
accelerate (pip install lightning accelerate)."""

from __future__ import annotations

import statistics
import time

import torch
import torch.utils.data as tud
from accelerate import Accelerator  # before the loader is made, as in a training script

import bench_args
import stoker


class Waits(tud.Dataset):
    def __init__(self, samples: int, wait_s: float) -> None:
        self.samples, self.wait_s = samples, wait_s

    def __len__(self) -> int:
        return self.samples

    def __getitem__(self, i: int):
        time.sleep(self.wait_s)
        return torch.full((1024,), float(i))


def lightning_remade(loader):
    """What Lightning's DDP strategies iterate: the loader re-made with a DistributedSampler."""
    from lightning.pytorch.trainer.states import RunningStage
    from lightning.pytorch.utilities.data import _update_dataloader

    sampler = tud.DistributedSampler(loader.dataset, num_replicas=1, rank=0, shuffle=True)
    return _update_dataloader(loader, sampler, mode=RunningStage.TRAINING)


def accelerate_prepared(loader):
    return Accelerator(cpu=True).prepare(loader)


def epoch_rate(loader) -> float:
    start = time.perf_counter()
    samples = sum(len(batch) for batch in loader)
    return samples / (time.perf_counter() - start)


def workers_of(loader) -> str:
    inner = loader.__dict__.get("base_dataloader", loader)
    if issubclass(type(inner), stoker.DataLoader):
        return f"stoker, {inner.stats()['workers']} {inner.worker_type} workers at the end"
    return f"torch, {inner.num_workers} worker processes"


def main() -> None:
    args = bench_args.parse(bench_args.parser(__doc__, samples=8192, wait_ms=5.0, rounds=3),
                            dict(samples=128, rounds=1), "tiny, to check the harness")
    data = Waits(args.samples, args.wait_ms / 1000)
    user = stoker.DataLoader(data, batch_size=32, shuffle=True)
    loaders = {
        "stoker, as the user made it": user,
        "stoker, re-made by Lightning (DDP)": lightning_remade(user),
        "stoker, prepared by Accelerate": accelerate_prepared(user),
        "torch num_workers=8, re-made by Lightning": lightning_remade(
            tud.DataLoader(data, batch_size=32, shuffle=True, num_workers=8)),
    }
    for loader in loaders.values():
        for _ in range(1 if args.smoke else 2):
            epoch_rate(loader)  # warm-up: workers start, the tuner settles
    rates: dict[str, list[float]] = {name: [] for name in loaders}
    for _ in range(args.rounds):
        for name, loader in loaders.items():
            rates[name].append(epoch_rate(loader))
    base = statistics.median(rates["stoker, as the user made it"])
    print(f"{args.samples} samples, reads wait {args.wait_ms:g} ms, batch 32, "
          f"{args.rounds} rounds (medians)")
    for name, loader in loaders.items():
        rate = statistics.median(rates[name])
        print(f"  {name:44s} {rate:9.0f} samples/s  {rate / base:5.2f}x the user's loader  "
              f"({workers_of(loader)})")


if __name__ == "__main__":
    main()
