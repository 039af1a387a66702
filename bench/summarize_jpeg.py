#!/usr/bin/env python3
"""Medians over several `stoker bench -w jpeg --json` runs, as docs/BENCHMARKS.md quotes them.

    for r in 1 2 3 4; do bash scripts/bench_jpeg.sh --json > jpeg$r.json; done
    python3 bench/summarize_jpeg.py jpeg*.json
"""

import json
import statistics
import sys

SOURCES = ["folder", "records", "ram_cache"]


def med(values):
    return statistics.median(values)


def main(paths):
    runs = [json.load(open(p)) for p in paths]
    print(f"{len(runs)} runs; {runs[0]['images']} images, mean {runs[0]['mean_jpeg_bytes'] / 1e3:.0f} KB,"
          f" batch {runs[0]['batch_size']}, stoker workers {runs[0]['workers']}")
    bare1 = med([r["bare_decode_images_per_s"]["1"] for r in runs])
    bare2 = med([r["bare_decode_images_per_s"]["2"] for r in runs])
    print(f"bare libjpeg-turbo full decode: {bare1:.0f} images/s on 1 thread, {bare2:.0f} on 2")
    for p in ["train", "val"]:
        print(f"\n{p}:")
        for s in SOURCES:
            ips = [r[p]["stoker"][s]["images_per_s"] for r in runs]
            frac = [r[p]["fraction_of_bare_decode_2t"][s] for r in runs]
            line = f"  stoker {s:<10} {med(ips):7.0f} images/s  / bare 2t {med(frac):.2f}"
            if all("ratio_vs_torch" in r[p] for r in runs):
                ratio = [r[p]["ratio_vs_torch"][s] for r in runs]
                line += f"  / torch {med(ratio):.2f}x ({', '.join(f'{x:.2f}' for x in ratio)})"
            print(line)
        if all("torch" in r[p] for r in runs):
            best = [r[p]["torch"]["images_per_s"] for r in runs]
            nw = [r[p]["torch"]["num_workers"] for r in runs]
            per_nw = {}
            for r in runs:
                for x in r[p]["torch_runs"]:
                    per_nw.setdefault(x["num_workers"], []).append(x["images_per_s"])
            print(f"  torchvision best {med(best):7.0f} images/s (num_workers {nw}); by num_workers: "
                  + ", ".join(f"{k}: {med(v):.0f}" for k, v in sorted(per_nw.items())))
        reads = [r[p]["stoker"]["ram_cache"]["storage_reads_after_epoch"] for r in runs]
        rchar = [r[p]["stoker"]["ram_cache"]["read_syscall_bytes_per_epoch"] for r in runs]
        print(f"  RAM cache: storage reads after each epoch {reads[0]}; read() bytes per epoch {rchar[0]}")


if __name__ == "__main__":
    main(sys.argv[1:])
