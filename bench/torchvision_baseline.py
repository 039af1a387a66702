#!/usr/bin/env python3
"""PyTorch DataLoader + torchvision baseline for `stoker bench -w jpeg`.

The PyTorch ImageNet example's input pipelines on an image folder:
  train: RandomResizedCrop(224), RandomHorizontalFlip(), ToTensor(), Normalize(mean, std)
  val:   Resize(256), CenterCrop(224), ToTensor(), Normalize(mean, std)
through torchvision.datasets.ImageFolder and a stock DataLoader (batch 64, shuffle=True,
persistent workers when num_workers > 0), for each num_workers in a list. Per configuration it
reports the steady-state images/s (median over the epochs after the first; the first, with
worker start-up, is reported apart).

Needs torch and torchvision (e.g. `pip install torch==2.14.1 torchvision==0.29.1` in
.venv-vision; scripts/bench_jpeg.sh sets that up). Prints one JSON object on stdout.
"""

import argparse
import json
import statistics
import sys
import time

import torch
import torchvision
from torch.utils.data import DataLoader
from torchvision import datasets, transforms

MEAN = [0.485, 0.456, 0.406]
STD = [0.229, 0.224, 0.225]


def pipeline(name):
    normalize = transforms.Normalize(mean=MEAN, std=STD)
    if name == "train":
        return transforms.Compose([transforms.RandomResizedCrop(224),
                                   transforms.RandomHorizontalFlip(),
                                   transforms.ToTensor(), normalize])
    return transforms.Compose([transforms.Resize(256), transforms.CenterCrop(224),
                               transforms.ToTensor(), normalize])


def measure(root, name, num_workers, batch_size, epochs):
    ds = datasets.ImageFolder(root, pipeline(name))
    loader = DataLoader(ds, batch_size=batch_size, shuffle=True, num_workers=num_workers,
                        persistent_workers=num_workers > 0)
    times = []
    for epoch in range(epochs):
        start = time.perf_counter()
        n = 0
        for images, labels in loader:
            n += images.shape[0]
        times.append(time.perf_counter() - start)
        print(f"  {name} num_workers={num_workers} epoch {epoch}: {n / times[-1]:.0f} images/s",
              file=sys.stderr)
    steady = statistics.median(times[1:]) if len(times) > 1 else times[0]
    del loader
    return {"num_workers": num_workers, "images_per_s": n / steady,
            "first_epoch_images_per_s": n / times[0], "epoch_times_s": times}


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--root", required=True)
    p.add_argument("--pipeline", choices=["train", "val"], required=True)
    p.add_argument("--workers", default="0,1,2,4")
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--epochs", type=int, default=2)
    a = p.parse_args()
    runs = [measure(a.root, a.pipeline, int(w), a.batch_size, a.epochs)
            for w in a.workers.split(",")]
    best = max(runs, key=lambda r: r["images_per_s"])
    print(json.dumps({"torch_version": torch.__version__,
                      "torchvision_version": torchvision.__version__,
                      "pipeline": a.pipeline, "best": best, "runs": runs}))


if __name__ == "__main__":
    main()
