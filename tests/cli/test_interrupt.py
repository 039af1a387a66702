"""Ctrl-C on the command line (tools/interrupt.h): `stoker bench` and `stoker pack` stop
promptly on SIGINT, exit with status 130, pass the signal on to the baseline script they wait
for, and leave no partial output (no half-written pack, no temporary files, no processes).

Calls the built binary: STOKER_BIN (default build/stoker in the repository)."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
STOKER = os.environ.get("STOKER_BIN", str(ROOT / "build" / "stoker"))
# Generous: a clean stop takes well under a second; this only tells a stop from a hang.
STOP_LIMIT_S = 20


def children(pid):
    """The pids of `pid`'s child processes, and of theirs."""
    out = []
    for task in Path(f"/proc/{pid}/task").glob("*"):
        try:
            kids = (task / "children").read_text().split()
        except OSError:
            continue
        for kid in map(int, kids):
            out += [kid] + children(kid)
    return out


def wait_until(condition, what, limit=60):
    start = time.monotonic()
    while not condition():
        if time.monotonic() - start > limit:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.02)


def interrupt(proc):
    """SIGINT to `proc`; returns (exit status, seconds it took to end)."""
    sent = time.monotonic()
    proc.send_signal(signal.SIGINT)
    try:
        proc.wait(timeout=STOP_LIMIT_S)
    except subprocess.TimeoutExpired:
        proc.kill()
        raise AssertionError(f"still running {STOP_LIMIT_S} s after SIGINT")
    return proc.returncode, time.monotonic() - sent


def test_pack_interrupted_leaves_nothing(tmp_path):
    # pack copies bytes without decoding them: large random files named .jpg make it slow
    # enough (one shard per file, each synced) to be caught mid-way.
    src = tmp_path / "images" / "a"
    src.mkdir(parents=True)
    rng = os.urandom
    for i in range(24):
        (src / f"{i:03}.jpg").write_bytes(rng(4 << 20))
    out = tmp_path / "out"
    out.mkdir()
    dest = out / "packed"
    proc = subprocess.Popen([STOKER, "pack", str(tmp_path / "images"), str(dest), "--shard-mb",
                             "1"], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    wait_until(lambda: any(out.iterdir()) or proc.poll() is not None, "pack to start writing")
    rc, took = interrupt(proc)
    print(f"pack ended {took:.3f} s after SIGINT")
    assert rc == 130, proc.stderr.read().decode()
    assert b"interrupted" in proc.stderr.read()
    assert list(out.iterdir()) == []  # neither dest nor the temporary directory beside it


def test_python_pack_interrupted_raises_keyboard_interrupt_and_leaves_nothing(tmp_path):
    src = tmp_path / "images" / "a"
    src.mkdir(parents=True)
    for i in range(400):
        (src / f"{i:03}.jpg").write_bytes(os.urandom(256 << 10))
    out = tmp_path / "out"
    out.mkdir()
    code = ("import sys, stoker\n"
            "try:\n"
            f"    stoker.pack({str(tmp_path / 'images')!r}, {str(out / 'packed')!r}, 1 << 20)\n"
            "except KeyboardInterrupt:\n"
            "    sys.exit(42)\n")
    proc = subprocess.Popen([sys.executable, "-c", code], stderr=subprocess.PIPE)
    wait_until(lambda: any(out.iterdir()) or proc.poll() is not None, "pack to start writing")
    rc, took = interrupt(proc)
    print(f"stoker.pack ended {took:.3f} s after SIGINT")
    assert rc == 42, proc.stderr.read().decode()
    assert list(out.iterdir()) == []


def test_pack_refuses_a_destination_that_holds_the_images(tmp_path):
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "x.jpg").write_bytes(b"not decoded by pack")
    for dest in (tmp_path, tmp_path / "a" / ".."):
        r = subprocess.run([STOKER, "pack", str(tmp_path), str(dest), "--force"],
                           capture_output=True, text=True)
        assert r.returncode == 1
        assert "is or contains the image folder being packed" in r.stderr, r.stderr
    assert (tmp_path / "a" / "x.jpg").exists()


def test_bench_interrupted_stops_itself_and_its_baseline(tmp_path):
    try:
        import torch  # noqa: F401  (the baseline script needs it)
    except ImportError:
        pytest.skip("the PyTorch baseline needs torch")
    env = dict(os.environ, TMPDIR=str(tmp_path))
    # heavy: long epochs on the stoker side first, then the PyTorch baseline as a child.
    proc = subprocess.Popen([STOKER, "bench", "-w", "heavy", "--epochs", "200", "--python",
                             sys.executable], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            env=env)
    time.sleep(1.0)  # mid-run on the stoker side
    rc, took = interrupt(proc)
    print(f"bench (stoker side) ended {took:.3f} s after SIGINT")
    assert rc == 130, proc.stderr.read().decode()

    proc = subprocess.Popen([STOKER, "bench", "-w", "tiny", "--epochs", "100", "--python",
                             sys.executable], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            env=env)
    wait_until(lambda: any("torch_dataloader" in Path(f"/proc/{k}/cmdline").read_text()
                           for k in children(proc.pid) if Path(f"/proc/{k}").exists())
               or proc.poll() is not None, "the baseline script to start")
    baseline = children(proc.pid)
    time.sleep(0.5)  # torch imported, its loop running
    rc, took = interrupt(proc)
    print(f"bench (baseline running) ended {took:.3f} s after SIGINT")
    assert rc == 130, proc.stderr.read().decode()
    for pid in baseline:
        assert not Path(f"/proc/{pid}").exists() or "zombie" in Path(
            f"/proc/{pid}/status").read_text(), f"baseline process {pid} left running"
    assert not list(tmp_path.glob("stoker-baseline-*"))  # its log file removed
