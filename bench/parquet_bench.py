"""stoker.ParquetDataset against a pyarrow map-style data set in torch's DataLoader, on the
same Parquet file, in the same run.

    python bench/parquet_bench.py [--images 2000] [--row-group 200] [--runs 2] [--json]
    python bench/parquet_bench.py --smoke          # checks the harness (seconds); measures nothing
    python bench/parquet_bench.py --stoker-bin build/stoker   # and the C++ reader, alternated

The file: --images generated 500x375 JPEGs (quality 90) in a binary column "image" with an
int64 "label", --row-group rows per row group (made once in the temporary directory, then
reused). The pipeline: the training one, RandomResizedCrop(224), RandomHorizontalFlip,
ToTensor, Normalize (ImageNet's), batch 64, shuffled.

- stoker: stoker.ParquetDataset(file, ("image", "label"), transform=stoker.transforms.train())
  in stoker.DataLoader with --workers threads (default: the machine's cores).
- torch: a map-style data set that reads the row group of the row asked for with pyarrow
  (each worker keeps the row groups it read: the whole file fits), decodes the JPEG with PIL
  and runs torchvision's train transforms as torchvision runs them on a PIL image (written
  out here with PIL and torch: torchvision is not a dependency; RandomResizedCrop's box as
  torchvision.transforms.RandomResizedCrop.get_params draws it, resized with PIL's bilinear
  filter, as torchvision's resized_crop does for PIL images), in torch.utils.data.DataLoader
  with num_workers 0, 1, 2 and 4 (persistent workers); its best is the baseline.
- with --stoker-bin (a `stoker` built with Arrow C++): also `stoker bench --parquet FILE
  --no-baseline`, stoker::ParquetDataset (Arrow's C++ reader in the engine's threads, no
  Python) with the same pipeline, workers and epochs, in each round; printed: its ratio to
  stoker.ParquetDataset (pyarrow reads), the question of whether the Python data set should
  use the C++ reader.
- --file FILE: that file (an "image" binary column and an int64 "label") instead of generated
  ones; --torch-only: torch's side only (what `stoker bench --parquet` runs as its baseline).
Both keep every row group in memory after the warm-up epoch (stoker: cache_bytes of 1 GiB),
so the timed epochs measure decoding and transforms, not the disk. Images/s is --runs epochs
timed as one span after a warm-up epoch. torch's best and stoker are then measured --rounds - 1
more times, alternately, and the ratio is that of their medians (a shared machine's load
moves both). Also printed: the CPU time per image of stoker (its threads) and of torch with
num_workers=0 (in-process), which a shared machine's load moves much less than images/s.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import pathlib
import statistics
import subprocess
import sys
import tempfile
import time
from collections import OrderedDict

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import torch
import torch.utils.data as tud
from PIL import Image

import stoker
from pil_transforms import TrainTransform

TORCH_WORKERS = (0, 1, 2, 4)


def parquet_file(images: int, row_group: int) -> pathlib.Path:
    """`images` generated 500x375 JPEGs and labels in one Parquet file (made once)."""
    name = f"stoker-bench-parquet-{images}-{row_group}.parquet"
    path = pathlib.Path(tempfile.gettempdir()) / name
    if path.exists():
        return path
    rng = np.random.default_rng(0)
    yy, xx = np.mgrid[0:375, 0:500]
    encoded = []
    for _ in range(images):
        phase = rng.uniform(0, 6.28, 3)
        freq = rng.uniform(0.005, 0.05, 3)
        rgb = np.stack([127 + 100 * np.sin(freq[c] * (xx + 0.7 * yy) + phase[c])
                        for c in range(3)], axis=-1)
        rgb += rng.normal(0, 12, rgb.shape)
        out = io.BytesIO()
        Image.fromarray(np.clip(rgb, 0, 255).astype(np.uint8)).save(out, format="JPEG",
                                                                     quality=90)
        encoded.append(out.getvalue())
    table = pa.table({"image": pa.array(encoded, type=pa.binary()),
                      "label": pa.array(np.arange(images, dtype=np.int64) % 10)})
    partial = path.with_suffix(".partial")
    pq.write_table(table, partial, row_group_size=row_group)
    partial.rename(path)
    return path


# --- the torch side: pyarrow + PIL + torchvision's train transforms -----------------------


train_transform = TrainTransform()


class PyarrowImages(tud.Dataset):
    """Map-style: row i's row group read with pyarrow (kept per worker), its JPEG decoded by
    PIL, torchvision's train transforms."""

    def __init__(self, path, max_cached: int = 1024) -> None:
        self.path = str(path)
        meta = pq.ParquetFile(self.path).metadata
        self.starts = [0]
        for g in range(meta.num_row_groups):
            self.starts.append(self.starts[-1] + meta.row_group(g).num_rows)
        self.max_cached = max_cached
        self._file = None
        self._cache: OrderedDict = OrderedDict()

    def __len__(self) -> int:
        return self.starts[-1]

    def _row_group(self, g: int):
        columns = self._cache.get(g)
        if columns is None:
            if self._file is None:  # opened in the worker
                self._file = pq.ParquetFile(self.path)
            table = self._file.read_row_group(g, columns=["image", "label"])
            columns = self._cache[g] = (table.column(0).combine_chunks(),
                                        table.column(1).to_numpy())
            while len(self._cache) > self.max_cached:
                self._cache.popitem(last=False)
        return columns

    def __getitem__(self, index: int):
        import bisect

        g = bisect.bisect_right(self.starts, index) - 1
        images, labels = self._row_group(g)
        row = index - self.starts[g]
        image = Image.open(io.BytesIO(images[row].as_py())).convert("RGB")
        return train_transform(image), int(labels[row])


# --- measuring -----------------------------------------------------------------------------


CPU_MS: dict = {}  # this process's CPU time per image, by loader: one per measurement


def rate(loader, images: int, runs: int, name: str = "") -> float:
    for _ in loader:  # warm-up: workers started, row groups read, page cache warm
        pass
    cpu = time.process_time()  # this process's threads (not worker processes')
    start = time.perf_counter()
    for _ in range(runs):
        for batch in loader:
            assert batch[0].shape[1:] == (3, 224, 224)
    seconds = time.perf_counter() - start
    if name:
        CPU_MS.setdefault(name, []).append(1e3 * (time.process_time() - cpu) / (runs * images))
    return runs * images / seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--images", type=int, default=2000)
    parser.add_argument("--row-group", type=int, default=200)
    parser.add_argument("--runs", type=int, default=2, help="timed epochs after the warm-up")
    parser.add_argument("--workers", type=int, default=os.cpu_count() or 1,
                        help="stoker's worker threads")
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=3,
                        help="torch's best and stoker measured alternately this many times")
    parser.add_argument("--smoke", action="store_true")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--file", help="this Parquet file instead of generated images")
    parser.add_argument("--torch-only", action="store_true",
                        help="torch's side only, at each num_workers (with --json: the best)")
    parser.add_argument("--stoker-bin", help="a stoker built with Arrow C++: also its reader")
    args = parser.parse_args()
    if args.smoke:
        args.images, args.row_group, args.runs, args.batch_size, args.rounds = 48, 16, 1, 16, 1
    torch.set_num_threads(1)  # as in a DataLoader worker; the loaders bring the parallelism
    path = pathlib.Path(args.file) if args.file else parquet_file(args.images, args.row_group)
    args.images = pq.ParquetFile(path).metadata.num_rows

    def torch_loader(w):
        return tud.DataLoader(PyarrowImages(path), batch_size=args.batch_size, shuffle=True,
                              num_workers=w, persistent_workers=w > 0)

    def stoker_rate():
        ds = stoker.ParquetDataset(path, columns=("image", "label"),
                                   transform=stoker.transforms.train(224), cache_bytes=1 << 30)
        loader = stoker.DataLoader(ds, batch_size=args.batch_size, shuffle=True,
                                   num_workers=args.workers)
        r = rate(loader, args.images, args.runs, "stoker")
        loader.close()
        print(f"stoker workers={args.workers}: {r:7.1f} images/s", file=sys.stderr)
        return r, ds.counters()

    torch_rates = {}
    for w in (0, 1) if args.smoke else TORCH_WORKERS:
        loader = torch_loader(w)
        torch_rates[w] = rate(loader, args.images, args.runs, "torch0" if w == 0 else "")
        del loader
        print(f"torch  num_workers={w}: {torch_rates[w]:7.1f} images/s", file=sys.stderr)
    best = max(torch_rates, key=torch_rates.get)
    if args.torch_only:
        print(json.dumps({"torch_images_per_s": torch_rates, "torch_best_workers": best,
                          "torch_best_images_per_s": torch_rates[best]}))
        return

    def cpp_rate():
        out = subprocess.run(
            [args.stoker_bin, "bench", "--parquet", str(path), "--no-baseline", "--json",
             "--workers", str(args.workers), "--epochs", str(args.runs)]
            + (["--smoke"] if args.smoke else []),
            check=True, capture_output=True, text=True).stdout
        result = json.loads(out)
        r = result["stoker_images_per_s"]
        if "stoker_cpu_ms_per_image" in result:
            CPU_MS.setdefault("cpp", []).append(result["stoker_cpu_ms_per_image"])
        print(f"stoker C++ reader workers={args.workers}: {r:7.1f} images/s", file=sys.stderr)
        return r

    cpp_rates = []
    first, counters = stoker_rate()
    if args.stoker_bin:
        cpp_rates.append(cpp_rate())
    # Then torch's best and stoker alternately: a shared machine's load moves both.
    best_rates, stoker_rates = [torch_rates[best]], [first]
    for _ in range(args.rounds - 1):
        loader = torch_loader(best)
        best_rates.append(rate(loader, args.images, args.runs, "torch0" if best == 0 else ""))
        del loader
        print(f"torch  num_workers={best}: {best_rates[-1]:7.1f} images/s", file=sys.stderr)
        stoker_rates.append(stoker_rate()[0])
        if args.stoker_bin:
            cpp_rates.append(cpp_rate())
    torch_best = statistics.median(best_rates)
    stoker_median = statistics.median(stoker_rates)

    result = {
        "images": args.images,
        "row_group": args.row_group,
        "file_bytes": path.stat().st_size,
        "runs": args.runs,
        "torch_images_per_s": torch_rates,
        "torch_best_workers": best,
        "rounds": {"torch_best": best_rates, "stoker": stoker_rates},
        "torch_best_images_per_s": torch_best,
        "stoker_images_per_s": stoker_median,
        "stoker_workers": args.workers,
        "stoker_row_group_reads": counters["row_group_reads"],
        "speedup": stoker_median / torch_best,
        # CPU time per image of the whole pipeline, robust to a shared machine's load: stoker
        # (its worker threads, all in this process) and torch with num_workers=0 (in-process)
        "cpu_ms_per_image": {"stoker": statistics.median(CPU_MS["stoker"]),
                             "torch_num_workers_0": statistics.median(CPU_MS["torch0"])},
    }
    if cpp_rates:
        result["rounds"]["stoker_cpp_reader"] = cpp_rates
        result["stoker_cpp_reader_images_per_s"] = statistics.median(cpp_rates)
        result["cpp_reader_over_pyarrow_reader"] = statistics.median(cpp_rates) / stoker_median
        if "cpp" in CPU_MS:
            result["cpu_ms_per_image"]["stoker_cpp_reader"] = statistics.median(CPU_MS["cpp"])
    if args.json:
        print(json.dumps(result))
    else:
        print(f"stoker.ParquetDataset {stoker_median:.1f} images/s, pyarrow+PIL+torch best "
              f"{torch_best:.1f} images/s (num_workers={best}): {result['speedup']:.2f}x "
              f"(medians of {args.rounds} alternated rounds); CPU per image: stoker "
              f"{result['cpu_ms_per_image']['stoker']:.2f} ms, torch num_workers=0 "
              f"{result['cpu_ms_per_image']['torch_num_workers_0']:.2f} ms")
        if cpp_rates:
            print(f"stoker::ParquetDataset (Arrow C++ reader, `stoker bench --parquet`) "
                  f"{result['stoker_cpp_reader_images_per_s']:.1f} images/s: "
                  f"{result['cpp_reader_over_pyarrow_reader']:.2f}x stoker.ParquetDataset "
                  f"(pyarrow reader); CPU per image "
                  f"{result['cpu_ms_per_image'].get('stoker_cpp_reader', float('nan')):.2f} ms")


if __name__ == "__main__":
    main()
