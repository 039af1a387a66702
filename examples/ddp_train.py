"""Trains a small model with DistributedDataParallel, fed by stoker.

    torchrun --standalone --nproc_per_node=2 examples/ddp_train.py            # CPU, gloo
    torchrun --nproc_per_node=8 --nnodes=2 ... examples/ddp_train.py          # GPUs, NCCL

Each rank reads its own shard (stoker.DistributedSampler: torch's partition rules, rank and
world size from torch.distributed), every rank takes the same number of steps, and with GPUs
the batches arrive on the rank's device, copied on a side stream.
"""

import argparse
import json
import os

import torch
import torch.distributed as dist
import torch.nn as nn

import stoker


class Blobs:
    """A map-style Python data set: noisy points around one centre per class."""

    def __init__(self, n: int, dim: int = 32, classes: int = 4) -> None:
        g = torch.Generator().manual_seed(0)
        self.centres = torch.randn(classes, dim, generator=g) * 3
        self.labels = torch.randint(0, classes, (n,), generator=g)
        self.noise = torch.randn(n, dim, generator=g)

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, i: int):
        label = self.labels[i]
        return self.centres[label] + self.noise[i], label, i


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--samples", type=int, default=1000)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--record", help="write each rank's sample indices and steps here")
    args = parser.parse_args()

    use_cuda = torch.cuda.is_available()
    dist.init_process_group("nccl" if use_cuda else "gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    device = torch.device(f"cuda:{int(os.environ.get('LOCAL_RANK', 0))}" if use_cuda else "cpu")
    if use_cuda:
        torch.cuda.set_device(device)

    dataset = Blobs(args.samples)
    sampler = stoker.DistributedSampler(dataset, shuffle=True, seed=0)
    loader = stoker.DataLoader(dataset, batch_size=args.batch_size, sampler=sampler,
                               num_workers=2, device=device if use_cuda else None)

    model = nn.parallel.DistributedDataParallel(
        nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 4)).to(device))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    seen, steps = [], []
    for epoch in range(args.epochs):
        sampler.set_epoch(epoch)
        epoch_seen, total, correct = [], 0.0, 0
        for step, (x, y, index) in enumerate(loader):
            x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
            optimizer.zero_grad()
            out = model(x)
            loss = nn.functional.cross_entropy(out, y)
            loss.backward()  # DDP all-reduces here: a rank with fewer steps would hang
            optimizer.step()
            total += loss.item()
            correct += (out.argmax(1) == y).sum().item()
            epoch_seen += index.tolist()
        seen.append(epoch_seen)
        steps.append(step + 1)
        if rank == 0:
            print(f"epoch {epoch}: loss {total / (step + 1):.3f}, "
                  f"accuracy {correct / len(epoch_seen):.3f} on rank 0", flush=True)
    if args.record:
        with open(os.path.join(args.record, f"rank{rank}.json"), "w") as f:
            json.dump({"rank": rank, "world": world, "seen": seen, "steps": steps}, f)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
