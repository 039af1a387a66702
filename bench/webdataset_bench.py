"""stoker.WebDataset against the `webdataset` package in torch's DataLoader, and against
stoker's own ImageFolder on the same images; and the time to index a large shard.

    python bench/webdataset_bench.py [--images 2000] [--shards 8] [--epochs 3] [--json]
    python bench/webdataset_bench.py --smoke

The data: `--images` generated 500x375 JPEGs (the same generator as python_bench.py's
tvfolder), written once both as an image folder (10 class folders) and as `--shards` WebDataset
shards (`<key>.jpg` + `<key>.cls`), under $TMPDIR. The pipeline: ImageNet training
(RandomResizedCrop 224 + horizontal flip + ToTensor + Normalize), batch 64, shuffled.

- stoker.WebDataset in stoker.DataLoader (num_workers = the cores).
- stoker.ImageFolder on the same images, the same way.
- webdataset.WebDataset(...).shuffle(1000).decode("pil").to_tuple("jpg", "cls") with the
  training transforms, in torch.utils.data.DataLoader at num_workers 0, 1, 2, 4 (persistent
  workers; webdataset splits the shards over them); the best is the baseline. The transforms
  are torchvision's PIL path written out (torchvision is not needed): RandomResizedCrop's
  parameters by torchvision's rule, PIL crop + resize (bilinear), flip, then ToTensor and
  Normalize as torch ops.

Figures: images/s, the median of the epochs after the first. Then `--paired` rounds of one
epoch each of stoker.WebDataset, stoker.ImageFolder and webdataset + torch at its best
num_workers, in turn: each round's ratios come from epochs seconds apart, which a shared
machine's load moves less. Then
indexing: a shard of
`--index-gb` GB (the images repeated under new keys), read once into the page cache, indexed
with no index cache (median of 3), and opened again with its index cached (median of 3).
"""

from __future__ import annotations

import argparse
import io
import json
import math
import os
import pathlib
import statistics
import sys
import tarfile
import tempfile
import time

import numpy as np
import torch

import stoker
from stoker import transforms as T
from pil_transforms import TrainTransform



def make_data(images: int, shards: int) -> tuple[pathlib.Path, pathlib.Path]:
    """(image folder, shard directory) of `images` generated JPEGs, made once."""
    from PIL import Image

    root = pathlib.Path(tempfile.gettempdir()) / f"stoker-bench-wds-{images}-{shards}"
    folder, wds = root / "folder", root / "shards"
    if (root / "done").exists():
        return folder, wds
    rng = np.random.default_rng(0)
    yy, xx = np.mgrid[0:375, 0:500]
    wds.mkdir(parents=True, exist_ok=True)
    per = math.ceil(images / shards)
    tar = None
    for i in range(images):
        if i % per == 0:
            if tar is not None:
                tar.close()
            tar = tarfile.open(wds / f"train-{i // per:06d}.tar", "w", format=tarfile.PAX_FORMAT)
        phase = rng.uniform(0, 6.28, 3)
        freq = rng.uniform(0.005, 0.05, 3)
        rgb = np.stack([127 + 100 * np.sin(freq[c] * (xx + 0.7 * yy) + phase[c]) for c in range(3)],
                       axis=-1)
        rgb += rng.normal(0, 12, rgb.shape)
        buf = io.BytesIO()
        Image.fromarray(np.clip(rgb, 0, 255).astype(np.uint8)).save(buf, "JPEG", quality=90)
        data = buf.getvalue()
        label = i % 10
        (folder / f"class{label}").mkdir(parents=True, exist_ok=True)
        (folder / f"class{label}" / f"{i:06d}.jpg").write_bytes(data)
        for name, payload in ((f"{i:06d}.jpg", data), (f"{i:06d}.cls", str(label).encode())):
            info = tarfile.TarInfo(name)
            info.size = len(payload)
            tar.addfile(info, io.BytesIO(payload))
    tar.close()
    (root / "done").touch()
    return folder, wds


def epochs_rate(loader, epochs: int) -> tuple[float, float]:
    """(images/s: median of the epochs after the first, first epoch's images/s)."""
    rates = []
    for _ in range(epochs):
        start, n = time.perf_counter(), 0
        for images, labels in loader:
            n += len(labels)
        rates.append(n / (time.perf_counter() - start))
    return statistics.median(rates[1:] if len(rates) > 1 else rates), rates[0]


def stoker_loader(dataset):
    """stoker's loader as the WebDataset benchmarks read: batches of 64, shuffled, a worker
    thread per core."""
    return stoker.DataLoader(dataset, batch_size=64, shuffle=True, num_workers=os.cpu_count())


def stoker_webdataset(shards, **kw):
    """stoker.WebDataset of (train-augmented 224 image, label) samples."""
    return stoker.WebDataset(shards, fields=("jpg", "cls"), transform=T.train(224), **kw)


def webdataset_loader(shards: list[str], workers: int):
    """The webdataset package in torch's DataLoader, as its README reads a shuffled epoch:
    the shards shuffled, a buffer of 1,000, PIL decoding and the same augmentation."""
    import webdataset as wds

    ds = (wds.WebDataset(shards, shardshuffle=len(shards), empty_check=False)
          .shuffle(1000).decode("pil").to_tuple("jpg", "cls").map_tuple(TrainTransform(), int))
    return torch.utils.data.DataLoader(ds, batch_size=64, num_workers=workers,
                                       persistent_workers=workers > 0)


def run_webdataset_package(shards: list[str], workers: int, epochs: int) -> dict:
    rate, first = epochs_rate(webdataset_loader(shards, workers), epochs)
    return {"num_workers": workers, "images_per_s": rate, "first_epoch_images_per_s": first}


def alternate(loaders: dict, rounds: int) -> list[dict]:
    """One epoch of each loader in turn, `rounds` times after a warm-up round: each round's
    images/s by name. The ratios of a round, whose epochs ran seconds apart, are less moved by
    a shared machine's changing load than separate runs."""
    out = []
    for r in range(rounds + 1):
        rates = {name: epochs_rate(loader, 1)[0] for name, loader in loaders.items()}
        if r > 0:
            out.append(rates)
    for loader in loaders.values():
        if isinstance(loader, stoker.DataLoader):
            loader.close()
    return out


def paired(shards: list[str], folder: pathlib.Path, workers: int, rounds: int) -> dict:
    """stoker.WebDataset, stoker.ImageFolder and webdataset + torch (at `workers`), alternated
    (alternate())."""
    pairs = alternate({"stoker": stoker_loader(stoker_webdataset(shards)),
                       "image_folder": stoker_loader(stoker.ImageFolder(
                           folder, transform=T.train(224))),
                       "webdataset_torch": webdataset_loader(shards, workers)}, rounds)
    for p in pairs:
        p["ratio"] = p["stoker"] / p["webdataset_torch"]
        p["ratio_vs_image_folder"] = p["stoker"] / p["image_folder"]
    return {"num_workers": workers, "pairs": pairs,
            "median_ratio": statistics.median(p["ratio"] for p in pairs),
            "median_ratio_vs_image_folder":
                statistics.median(p["ratio_vs_image_folder"] for p in pairs)}


def run_stoker(dataset, epochs: int) -> dict:
    loader = stoker_loader(dataset)
    rate, first = epochs_rate(loader, epochs)
    loader.close()  # its worker threads stop: nothing of it runs beside the next measurement
    return {"images_per_s": rate, "first_epoch_images_per_s": first}


def make_big_shard(folder: pathlib.Path, gb: float) -> pathlib.Path:
    """One shard of about `gb` GB: the folder's JPEGs repeated under new keys (made once)."""
    path = folder.parent / f"big-{gb:g}gb.tar"
    if path.exists():
        return path
    files = sorted(folder.rglob("*.jpg"))
    payloads = [(f.read_bytes(), f.parent.name[5:]) for f in files]
    target, written, i = gb * 1e9, 0, 0
    tmp = path.with_suffix(".tmp")
    with tarfile.open(tmp, "w", format=tarfile.PAX_FORMAT) as tar:
        while written < target:
            data, label = payloads[i % len(payloads)]
            for name, payload in ((f"{i:08d}.jpg", data), (f"{i:08d}.cls", label.encode())):
                info = tarfile.TarInfo(name)
                info.size = len(payload)
                tar.addfile(info, io.BytesIO(payload))
            written += len(data) + 1536
            i += 1
    tmp.rename(path)
    return path


def time_index(shard: pathlib.Path, repeats: int) -> dict:
    with open(shard, "rb") as f:  # into the page cache
        while f.read(1 << 24):
            pass
    cache = pathlib.Path(tempfile.mkdtemp(prefix="stoker-wds-index-"))
    cold, warm = [], []
    samples = 0
    for _ in range(repeats):
        start = time.perf_counter()
        ds = stoker.WebDataset(shard, fields=("cls",), index_cache=False)
        cold.append(time.perf_counter() - start)
        samples = len(ds)
    stoker.WebDataset(shard, fields=("cls",), index_cache=cache)  # writes the cached index
    for _ in range(repeats):
        start = time.perf_counter()
        stoker.WebDataset(shard, fields=("cls",), index_cache=cache)
        warm.append(time.perf_counter() - start)
    return {"shard_bytes": shard.stat().st_size, "samples": samples,
            "index_s": statistics.median(cold), "reopen_cached_s": statistics.median(warm)}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--images", type=int, default=2000)
    p.add_argument("--shards", type=int, default=8)
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--workers", type=int, nargs="+", default=[0, 1, 2, 4],
                   help="torch DataLoader num_workers to try for the webdataset baseline")
    p.add_argument("--index-gb", type=float, default=1.0)
    p.add_argument("--paired", type=int, default=3,
                   help="rounds of one epoch each of stoker.WebDataset, ImageFolder and "
                        "webdataset + torch (at its best num_workers), in turn, for ratios "
                        "measured seconds apart (0: none)")
    p.add_argument("--json", action="store_true")
    p.add_argument("--smoke", action="store_true", help="tiny sizes: check that it runs")
    a = p.parse_args()
    if a.smoke:
        a.images, a.shards, a.epochs, a.workers, a.index_gb = 64, 2, 2, [0, 1], 0.002
        a.paired = 1
    folder, shard_dir = make_data(a.images, a.shards)
    shards = [str(s) for s in sorted(shard_dir.glob("*.tar"))]
    out = {"images": a.images, "shards": len(shards), "cores": os.cpu_count()}

    out["stoker_webdataset"] = run_stoker(stoker_webdataset(shards), a.epochs)
    out["stoker_image_folder"] = run_stoker(stoker.ImageFolder(folder, transform=T.train(224)),
                                            a.epochs)
    try:
        import webdataset  # noqa: F401
        runs = [run_webdataset_package(shards, w, a.epochs) for w in a.workers]
        out["webdataset_torch"] = runs
        out["webdataset_torch_best"] = max(runs, key=lambda r: r["images_per_s"])
        if a.paired:
            out["paired"] = paired(shards, folder, out["webdataset_torch_best"]["num_workers"],
                                   a.paired)
    except ImportError:
        out["webdataset_torch"] = None
    out["index"] = time_index(make_big_shard(folder, a.index_gb), 1 if a.smoke else 3)

    ours = out["stoker_webdataset"]["images_per_s"]
    out["ratio_vs_image_folder"] = ours / out["stoker_image_folder"]["images_per_s"]
    if out["webdataset_torch"]:
        out["ratio_vs_webdataset_torch_best"] = ours / out["webdataset_torch_best"]["images_per_s"]
    if a.json:
        print(json.dumps(out, indent=1))
        return 0
    print(f"{a.images} JPEGs 500x375 in {len(shards)} shards, train pipeline 224, batch 64, "
          f"{os.cpu_count()} cores")
    print(f"  stoker.WebDataset                 {ours:9.0f} images/s")
    print(f"  stoker.ImageFolder (same images)  "
          f"{out['stoker_image_folder']['images_per_s']:9.0f} images/s")
    for r in out["webdataset_torch"] or []:
        print(f"  webdataset + torch, {r['num_workers']} workers     "
              f"{r['images_per_s']:9.0f} images/s")
    print(f"  stoker.WebDataset / ImageFolder: {out['ratio_vs_image_folder']:.2f}x")
    if out["webdataset_torch"]:
        print(f"  stoker.WebDataset / webdataset + torch at its best: "
              f"{out['ratio_vs_webdataset_torch_best']:.2f}x")
    if out.get("paired"):
        pp = out["paired"]
        print(f"  rounds of epochs in turn: stoker.WebDataset / webdataset + torch at "
              f"{pp['num_workers']} workers: "
              + ", ".join(f"{q['ratio']:.2f}x" for q in pp["pairs"])
              + f"; median {pp['median_ratio']:.2f}x")
        print("  rounds of epochs in turn: stoker.WebDataset / ImageFolder: "
              + ", ".join(f"{q['ratio_vs_image_folder']:.2f}x" for q in pp["pairs"])
              + f"; median {pp['median_ratio_vs_image_folder']:.2f}x")
    ix = out["index"]
    print(f"  index of a {ix['shard_bytes'] / 1e9:.2f} GB shard ({ix['samples']} samples, page "
          f"cache): {ix['index_s'] * 1000:.1f} ms; reopened with its cached index: "
          f"{ix['reopen_cached_s'] * 1000:.1f} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
