"""The command line's progress bars (tools/progress.h: on a terminal only, quiet in pipes and
with --json) and `stoker bench --trace FILE`.

Calls the built binary: STOKER_BIN (default build/stoker in the repository)."""

import json
import os
import pty
import subprocess
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[2]
STOKER = os.environ.get("STOKER_BIN", str(ROOT / "build" / "stoker"))


def run_on_terminal(args):
    """Runs the command with stderr on a pseudo-terminal; returns (stdout, what the terminal
    got)."""
    main, child = pty.openpty()
    try:
        proc = subprocess.run(args, stdout=subprocess.PIPE, stderr=child, timeout=300, check=True)
    finally:
        os.close(child)
    screen = b""
    while True:
        try:
            data = os.read(main, 65536)
        except OSError:  # EIO: the terminal's other end is closed and everything was read
            break
        if not data:
            break
        screen += data
    os.close(main)
    return proc.stdout.decode(), screen.decode(errors="replace")


@pytest.fixture
def images(tmp_path):
    Image = pytest.importorskip("PIL.Image")
    for i in range(3):
        (tmp_path / "src" / f"c{i}").mkdir(parents=True)
        Image.fromarray(np.full((8, 8, 3), 40 * i, np.uint8)).save(
            tmp_path / "src" / f"c{i}" / "a.jpg")
    return tmp_path / "src"


def test_pack_draws_a_bar_on_a_terminal_only(images, tmp_path):
    out, screen = run_on_terminal([STOKER, "pack", str(images), str(tmp_path / "a")])
    assert "packed 3 records" in out
    assert "pack [" in screen and "/3" in screen and "\x1b[K" in screen  # drawn, then erased

    piped = subprocess.run([STOKER, "pack", str(images), str(tmp_path / "b")],
                           capture_output=True, text=True, timeout=300, check=True)
    assert "packed 3 records" in piped.stdout and piped.stderr == ""


def test_bench_draws_a_bar_on_a_terminal_but_not_with_json():
    bench = [STOKER, "bench", "-w", "tiny", "--smoke", "--no-baseline"]
    _, screen = run_on_terminal(bench)
    assert "tiny: stoker, batches" in screen
    out, screen = run_on_terminal(bench + ["--json"])
    assert json.loads(out)["workloads"][0]["workload"] == "tiny"
    assert screen == ""


def test_bench_trace_writes_a_timeline_per_workload(tmp_path):
    subprocess.run([STOKER, "bench", "-w", "tiny", "overhead", "--smoke", "--no-baseline",
                    "--trace", str(tmp_path / "run.json")], capture_output=True, timeout=300,
                   check=True)
    for workload in ("tiny", "overhead"):
        with open(tmp_path / f"run-{workload}.json") as f:
            events = json.load(f)["traceEvents"]
        names = {e["name"] for e in events}
        assert {"chunk", "wait for batch", "step", "queue"} <= names, workload
