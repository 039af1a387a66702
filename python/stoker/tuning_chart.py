"""The chart of a tuning run (``stoker tune --grid --plot FILE``, ``stoker.tune(..., plot=)``):
samples/s against workers, one line per pinning x depth, the tuner's choice marked.

Also a script, which the C++ command runs: ``python3 tuning_chart.py RESULT.json OUT.png``.
"""

from __future__ import annotations

import json
import sys


def plot(result: dict, path: str) -> None:
    """Draws `result` (the JSON of ``stoker tune --json`` or the dict of ``stoker.tune``) into
    `path`; the format follows its suffix (.png, .svg, .pdf)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    lines: dict[tuple[str, int], list[tuple[int, float]]] = {}
    for p in result["grid"]:
        lines.setdefault((str(p["pin"]), int(p["depth"])), []).append(
            (int(p["workers"]), float(p["samples_per_s"])))
    fig, ax = plt.subplots(figsize=(7.5, 4.5))
    for (pin, depth), points in sorted(lines.items()):
        points.sort()
        ax.plot([w for w, _ in points], [s for _, s in points], marker="o",
                linestyle="-" if pin == "off" else "--", label=f"pin {pin}, depth {depth}")
    tuned = result["tuned"]
    ax.plot([tuned["workers"]], [tuned["samples_per_s"]], marker="*", markersize=18,
            color="crimson", linestyle="none",
            label=f"tuner: {tuned['workers']} workers, depth {tuned['depth']}")
    ax.set_xscale("log", base=2)
    ax.set_xticks(sorted({int(p["workers"]) for p in result["grid"]} | {int(tuned["workers"])}))
    ax.get_xaxis().set_major_formatter(matplotlib.ticker.ScalarFormatter())
    ax.set_xlabel("workers")
    ax.set_ylabel("samples/s")
    ax.set_ylim(bottom=0)
    ax.set_title(str(result.get("target", "")), fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit("usage: tuning_chart.py RESULT.json OUT.png|OUT.svg")
    with open(sys.argv[1]) as f:
        plot(json.load(f), sys.argv[2])
