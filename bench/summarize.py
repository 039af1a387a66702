#!/usr/bin/env python3
"""Medians of several `stoker bench --json` runs, as the Markdown rows of docs/BENCHMARKS.md.

    for r in 1 2 3; do ./build/stoker bench --python .venv/bin/python --json > run$r.json; done
    python3 bench/summarize.py run*.json
"""

import json
import statistics
import sys


def med(values):
    return statistics.median(values)


def each(values, spec):
    """The individual runs, e.g. '2.29, 2.65, 2.29'."""
    return ", ".join(format(v, spec) for v in values)


def main(paths):
    runs = [json.load(open(p)) for p in paths]
    names = [w["workload"] for w in runs[0]["workloads"]]
    print(f"Medians of {len(runs)} runs.\n")
    print("| workload | stoker samples/s | stoker GB/s | torch best samples/s (workers) "
          "| stoker / torch | first batch ms (stoker / torch) | consumer wait % (stoker / torch) |")
    print("|---|---|---|---|---|---|---|")
    extras = []
    for name in names:
        ws = [next(w for w in r["workloads"] if w["workload"] == name) for r in runs]
        s = [w["stoker"] for w in ws]
        row = [name, f"{med([x['samples_per_s'] for x in s]):,.0f}",
               f"{med([x['gb_per_s'] for x in s]):.2f}"]
        if all("torch" in w for w in ws):
            t = [w["torch"] for w in ws]
            workers = sorted({x["num_workers"] for x in t})
            row += [f"{med([x['samples_per_s'] for x in t]):,.0f} ({', '.join(map(str, workers))})",
                    f"**{med([w['ratio'] for w in ws]):.2f}x** "
                    f"({each([w['ratio'] for w in ws], '.2f')})",
                    f"{med([x['first_batch_ms'] for x in s]):.1f} / "
                    f"{med([x['first_batch_ms'] for x in t]):.1f}",
                    f"{med([x['wait_pct'] for x in s]):.1f} / {med([x['wait_pct'] for x in t]):.1f}"]
        else:
            row += ["-", "-", f"{med([x['first_batch_ms'] for x in s]):.1f}",
                    f"{med([x['wait_pct'] for x in s]):.1f}"]
        print("| " + " | ".join(row) + " |")
        w0 = ws[0]
        if "memcpy_gb_per_s" in w0:
            two = med([w["memcpy_gb_per_s"]["2"] for w in ws])
            one = med([w["memcpy_gb_per_s"]["1"] for w in ws])
            frac = med([w["fraction_of_memcpy_2t"] for w in ws])
            extras.append(f"- `{name}`: memcpy {one:.1f} GB/s on one thread, {two:.1f} GB/s on two; "
                          f"stoker at **{100 * frac:.0f}%** of two-thread memcpy "
                          f"({each([w['fraction_of_memcpy_2t'] for w in ws], '.0%')}).")
        if "epoch_over_bound" in w0:
            extras.append(f"- `{name}`: epoch {med([w['stoker']['epoch_s'] for w in ws]):.3f} s against "
                          f"a bound of {w0['bound_s']:.3f} s (compute {w0['compute_s']:.3f} s, "
                          f"latency / workers {w0['latency_per_worker_s']:.3f} s): epoch / bound = "
                          f"**{med([w['epoch_over_bound'] for w in ws]):.3f}**.")
        if "us_per_batch" in w0:
            extras.append(f"- `{name}`: **{med([w['us_per_batch'] for w in ws]):.2f} us** per batch "
                          f"({each([w['us_per_batch'] for w in ws], '.2f')}).")
    print()
    print("\n".join(extras))


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    main(sys.argv[1:])
