"""Accelerate under torchrun for test_framework_runs.py: accelerate_job.py LOADER OUT trains
two epochs on a prepared loader (torch's or stoker's) and writes, per rank, the batches each
epoch saw, the trained weights and which loader iterated inside Accelerate's."""

import json
import os
import sys

import torch
import torch.utils.data as tud
from accelerate import Accelerator

import stoker
from framework_datasets import Indices, exit_before_finalizing


def main(name: str, out: str) -> None:
    accelerator = Accelerator(cpu=True)
    torch.manual_seed(0)
    model = torch.nn.Linear(1, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    loader_type = {"torch": tud.DataLoader, "stoker": stoker.DataLoader}[name]
    loader = loader_type(Indices(32), batch_size=4, shuffle=True)
    model, optimizer, prepared = accelerator.prepare(model, optimizer, loader)
    samples = []
    for _ in range(2):
        samples.append([])
        for batch in prepared:
            samples[-1].append(batch.flatten().long().tolist())
            x = batch / 32
            accelerator.backward(((model(x) - 3 * x) ** 2).mean())
            optimizer.step()
            optimizer.zero_grad()
    weights = [p.detach().flatten().tolist() for p in model.parameters()]
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, f"{accelerator.process_index}.json"), "w") as f:
        json.dump({"samples": samples, "weights": sum(weights, []),
                   "inner": type(prepared.base_dataloader).__module__}, f)
    accelerator.end_training()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
    exit_before_finalizing()
