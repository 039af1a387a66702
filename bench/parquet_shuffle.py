"""Parquet row groups larger than the row-group cache: stoker.ParquetDataset shuffled through a
cache of a tenth and a hundredth of the data set (the loader chooses a window of row groups),
against reading it in order through the same cache and the global shuffle it had before (a
row's row group read whenever it is not cached); row groups read, throughput, each row once,
and the shuffle's quality.

    python bench/parquet_shuffle.py [--images 2000] [--rows 50000] [--ratios 10 100]
    python bench/parquet_shuffle.py --smoke

Two data sets on local disk, sorted by label (100 classes, so that a batch's distinct labels
say how well the order mixes), each row with its id, made once under the temporary directory:
- jpeg: `--images` generated 256x256 JPEGs (about 48 kB) in a binary column, row groups of
  `--jpeg-group` rows, read with T.train(224);
- rows: `--rows` rows of 2 kB (a fixed-size list of uint8), row groups of `--rows-group` rows.
Each configuration reads one epoch (batch 32, 2 worker threads) through a fresh data set whose
`cache_bytes` is the selected columns' bytes / ratio: auto (shuffle=True: stats()["shuffle"]
says what and why), in order (shuffle=False) and global (shuffle="global", once: it is the
slow one). auto and in order alternate for `--rounds` rounds; rows/s are medians. Figures: row
groups read / row groups, rows/s, auto / in order and global / in order; each row once (ids);
the shuffle's entropy (stoker.shuffle_quality: steps in row and file ids) as a share of a full
shuffle's, and a batch's distinct labels against i.i.d. draws.
"""

from __future__ import annotations

import io
import json
import logging
import pathlib
import statistics
import sys
import time

import numpy as np

import bench_args
import stoker
from s3_shuffle import made_once, show_heading
from stoker import transforms as T

CLASSES, FILES, BATCH = 100, 4, 32


def make_files(kind: str, n: int, group: int) -> pathlib.Path:
    """`n` rows sorted by label in FILES Parquet files of row groups of `group` rows."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    def write(root: pathlib.Path) -> None:
        rng = np.random.default_rng(0)
        per = -(-n // FILES)
        for f in range(FILES):
            ids = np.arange(f * per, min(n, (f + 1) * per), dtype=np.int64)
            if kind == "jpeg":
                from PIL import Image

                images = []
                for _ in ids:
                    pixels = rng.integers(0, 255, (64, 64, 3), dtype=np.uint8).repeat(4, 0)
                    buf = io.BytesIO()
                    Image.fromarray(pixels.repeat(4, 1)).save(buf, "JPEG", quality=90)
                    images.append(buf.getvalue())
                payload = pa.array(images, type=pa.binary())
            else:
                payload = pa.FixedSizeListArray.from_arrays(
                    pa.array(rng.integers(0, 255, len(ids) * 2000, dtype=np.uint8)), 2000)
            table = pa.table({"x": payload, "label": pa.array(ids * CLASSES // n), "id": ids})
            pq.write_table(table, root / f"part-{f:03d}.parquet", row_group_size=group,
                           compression="none")

    return made_once(f"stoker-bench-pq-shuffle-{kind}-{n}-{group}", write)


def dataset(kind: str, root: pathlib.Path, cache_bytes: int):
    return stoker.ParquetDataset(root, columns=["x", "label", "id"], cache_bytes=cache_bytes,
                                 transform=T.train(224) if kind == "jpeg" else None)


def measure(kind: str, root: pathlib.Path, cache: int, **loader_kw) -> dict:
    """One epoch of one configuration through a fresh row-group cache of `cache` bytes."""
    ds = dataset(kind, root, cache)
    loader = stoker.DataLoader(ds, batch_size=BATCH, num_workers=2, seed=7, **loader_kw)
    ids, start = [], time.perf_counter()
    for batch in loader:
        ids.extend(batch[2].tolist())
    rate = len(ids) / (time.perf_counter() - start)
    stats = loader.stats()
    loader.close()
    return {"samples_per_s": rate, "row_group_reads": ds.counters()["row_group_reads"],
            "shuffle": stats["shuffle"], "window": stats["shuffle_window"], "ids": ids}


def run(kind: str, n: int, group: int, ratios, rounds: int) -> dict:
    root = make_files(kind, n, group)
    layout = dataset(kind, root, 1 << 40).storage_layout()
    data_bytes, groups = sum(layout["block_bytes"]), len(layout["block_ends"])
    labels = [i * CLASSES // n for i in range(n)]

    def quality(order):
        return stoker.shuffle_quality(order, layout["shard_ends"], labels=labels,
                                      batch_size=BATCH)

    out = {"samples": n, "data_bytes": data_bytes, "row_groups": groups, "ratios": {},
           "full": quality(np.random.default_rng(7).permutation(n).tolist())}
    for ratio in ratios:
        cache = data_bytes // ratio
        row = {"cache_bytes": cache}
        configs = [("auto", {"shuffle": True}), ("in_order", {"shuffle": False})]
        for k in range(rounds):
            for name, kw in configs + ([("global", {"shuffle": "global"})] if k == 0 else []):
                r = measure(kind, root, cache, **kw)
                ids = r.pop("ids")
                if k > 0:
                    row[name]["rates"].append(r["samples_per_s"])
                    continue
                r["each_once"] = sorted(ids) == list(range(n))
                r["reads_over_groups"] = r["row_group_reads"] / groups
                r["rates"] = [r["samples_per_s"]]
                if name != "in_order":
                    r["quality"] = quality(ids)
                row[name] = r
        for name in ("auto", "in_order", "global"):
            row[name]["samples_per_s"] = statistics.median(row[name]["rates"])
        for name in ("auto", "global"):
            row[f"{name}_over_in_order"] = (row[name]["samples_per_s"] /
                                            row["in_order"]["samples_per_s"])
        out["ratios"][ratio] = row
    return out


def show(kind: str, r: dict) -> None:
    q = show_heading(f"\n{kind}: {r['samples']} rows, {r['data_bytes'] / 1e6:.1f} MB in "
                     f"{r['row_groups']} row groups", r["full"])
    for ratio, row in r["ratios"].items():
        print(f"  cache_bytes = data / {ratio} ({row['cache_bytes'] / 1e6:.2f} MB)")
        for name in ("auto", "in_order", "global"):
            x = row[name]
            print(f"    {name:9s} {x['samples_per_s']:8.0f} rows/s (of {len(x['rates'])})  "
                  f"row groups read "
                  f"{x['reads_over_groups']:6.2f}x  each once: {x['each_once']}")
            if "quality" in x:
                print(f"              {q(x['quality'])}")
        print(f"    auto / in order: {row['auto_over_in_order']:.2f}, global / in order: "
              f"{row['global_over_in_order']:.2f}; shuffle: {row['auto']['shuffle']}")


def main() -> int:
    p = bench_args.parser(__doc__, images=2000, rows=50000, jpeg_group=10, rows_group=50,
                          rounds=3)
    p.add_argument("--ratios", type=int, nargs="+", default=[10, 100])
    p.add_argument("--sets", nargs="+", default=["jpeg", "rows"], choices=["jpeg", "rows"])
    p.add_argument("--json", action="store_true")
    args = bench_args.parse(p, dict(images=200, rows=2000, ratios=[10], rounds=1),
                            "tiny sizes: check that it runs")
    # The loaders' advice at fixed settings ("... would change ..."): not in the table.
    logging.getLogger("stoker").setLevel(logging.WARNING)
    groups = {"jpeg": args.jpeg_group, "rows": args.rows_group}
    sizes = {"jpeg": args.images, "rows": args.rows}
    result = {kind: run(kind, sizes[kind], groups[kind], args.ratios, args.rounds)
              for kind in args.sets}
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        for kind, r in result.items():
            show(kind, r)
    return 0


if __name__ == "__main__":
    sys.exit(main())
