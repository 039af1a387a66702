"""Ctrl-C on the command line (tools/interrupt.h): `stoker bench` and `stoker pack` stop
promptly on SIGINT, exit with status 130, pass the signal on to the baseline script they wait
for, and leave no partial output (no half-written pack, no temporary files, no processes).

Every command is started with SIGINT at its default disposition, whatever this process
inherited (a script starts background commands with SIGINT ignored, and a command started so
keeps ignoring it, as tested here too), and is signalled once it is known to be where the test
means: its handler installed, or stopped (SIGSTOP) mid-way through its work, so that nothing
depends on the work being slow enough to be caught.

Calls the built binary: STOKER_BIN (default build/stoker in the repository)."""

import os
import shutil
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


def default_sigint():
    """Popen's preexec_fn: the command starts with SIGINT at its default disposition."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def start(args, **kwargs):
    return subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            preexec_fn=default_sigint, **kwargs)


def read(path):
    """The text of a /proc file, or "" once the process is gone."""
    try:
        return Path(path).read_text()
    except OSError:
        return ""


def catches_sigint(pid):
    """Whether `pid` has a SIGINT handler installed (SigCgt in /proc/PID/status)."""
    status = read(f"/proc/{pid}/status")
    if not status:
        return False
    caught = int(status.split("SigCgt:")[1].split()[0], 16)
    return bool(caught & (1 << (signal.SIGINT - 1)))


def interrupt(proc, sig=signal.SIGINT):
    """`sig` to `proc`; returns (exit status, seconds it took to end)."""
    sent = time.monotonic()
    proc.send_signal(sig)
    wait_or_kill(proc, sig)
    return proc.returncode, time.monotonic() - sent


def wait_or_kill(proc, sig):
    try:
        proc.wait(timeout=STOP_LIMIT_S)
    except subprocess.TimeoutExpired:
        tree = "\n".join(f"  {k}: {read(f'/proc/{k}/cmdline')!r} "
                         f"{read(f'/proc/{k}/stat').split(') ')[-1][:1]!r}"
                         for k in [proc.pid] + children(proc.pid))
        proc.kill()
        raise AssertionError(f"still running {STOP_LIMIT_S} s after signal {sig}; "
                             f"processes:\n{tree}")


def stop_mid_way(proc, started):
    """Waits until `started()` (the command has begun its work), then stops the command
    (SIGSTOP). True if it is stopped mid-way; False if it finished first (too little work)."""
    wait_until(lambda: started() or proc.poll() is not None, "the command to start its work")
    proc.send_signal(signal.SIGSTOP)
    stat = Path(f"/proc/{proc.pid}/stat")
    wait_until(lambda: proc.poll() is not None or stat.read_text().split(") ")[1][0] == "T",
               "the command to stop")
    return proc.poll() is None


def interrupt_mid_way(make, sig=signal.SIGINT):
    """Runs `make(scale)` -> (proc, started), stops the command mid-way and sends it `sig`,
    with twice the work each time the command finished before it could be stopped. Returns
    (proc, exit status, seconds it took to end after the signal)."""
    for scale in (1, 2, 4, 8):
        proc, started = make(scale)
        if stop_mid_way(proc, started):
            proc.send_signal(sig)  # pending until the command runs again
            sent = time.monotonic()
            proc.send_signal(signal.SIGCONT)
            wait_or_kill(proc, sig)
            return proc, proc.returncode, time.monotonic() - sent
    raise AssertionError("the command always finished before it could be stopped")


def random_images(root, files, size):
    src = root / "a"
    shutil.rmtree(root, ignore_errors=True)
    src.mkdir(parents=True)
    for i in range(files):
        (src / f"{i:04}.jpg").write_bytes(os.urandom(size))


def packing(tmp_path, command, files, size, sigint=signal.SIG_DFL):
    """interrupt_mid_way's `make`: `files` * scale random images, then `command(images, out)`
    started with SIGINT at `sigint`; it has begun once `out` has an entry."""
    images, out = tmp_path / "images", tmp_path / "out"

    def make(scale):
        random_images(images, files * scale, size)
        shutil.rmtree(out, ignore_errors=True)
        out.mkdir()
        proc = subprocess.Popen(command(images, out), stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE,
                                preexec_fn=lambda: signal.signal(signal.SIGINT, sigint))
        return proc, lambda: any(out.iterdir())

    return make


def pack_command(images, out):
    # pack copies bytes without decoding them: random files named .jpg, one shard per file.
    return [STOKER, "pack", str(images), str(out / "packed"), "--shard-mb", "1"]


def test_pack_interrupted_leaves_nothing(tmp_path):
    proc, rc, took = interrupt_mid_way(packing(tmp_path, pack_command, 24, 1 << 20))
    print(f"pack ended {took:.3f} s after SIGINT")
    err = proc.stderr.read().decode()
    assert rc == 130, err
    assert "interrupted" in err
    # Neither dest nor the temporary directory beside it.
    assert list((tmp_path / "out").iterdir()) == []


def test_pack_started_with_sigint_ignored_keeps_ignoring_it(tmp_path):
    proc, rc, _ = interrupt_mid_way(packing(tmp_path, pack_command, 24, 1 << 20,
                                            sigint=signal.SIG_IGN))
    assert rc == 0, proc.stderr.read().decode()  # the pack completed
    assert [p.name for p in (tmp_path / "out").iterdir()] == ["packed"]


def test_python_pack_interrupted_raises_keyboard_interrupt_and_leaves_nothing(tmp_path):
    def command(images, out):
        return [sys.executable, "-c",
                "import signal, sys\n"
                "signal.signal(signal.SIGINT, signal.default_int_handler)\n"
                "import stoker\n"
                "try:\n"
                f"    stoker.pack({str(images)!r}, {str(out / 'packed')!r}, 1 << 20)\n"
                "except KeyboardInterrupt:\n"
                "    sys.exit(42)\n"]

    proc, rc, took = interrupt_mid_way(packing(tmp_path, command, 400, 256 << 10))
    print(f"stoker.pack ended {took:.3f} s after SIGINT")
    assert rc == 42, proc.stderr.read().decode()
    assert list((tmp_path / "out").iterdir()) == []


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
    proc = start([STOKER, "bench", "-w", "heavy", "--epochs", "200", "--python", sys.executable],
                 env=env)
    wait_until(lambda: catches_sigint(proc.pid) or proc.poll() is not None,
               "bench to install its handler")
    rc, took = interrupt(proc)
    print(f"bench (stoker side) ended {took:.3f} s after SIGINT")
    assert rc == 130, proc.stderr.read().decode()

    proc = start([STOKER, "bench", "-w", "tiny", "--epochs", "100", "--python", sys.executable],
                 env=env)

    def baseline_running():
        return [k for k in children(proc.pid) if catches_sigint(k) and "torch_dataloader" in
                read(f"/proc/{k}/cmdline")]

    # The baseline script's own Ctrl-C handler installed: it is a running Python.
    wait_until(lambda: baseline_running() or proc.poll() is not None,
               "the baseline script to start")
    baseline = children(proc.pid)
    rc, took = interrupt(proc)
    print(f"bench (baseline running) ended {took:.3f} s after SIGINT")
    assert rc == 130, proc.stderr.read().decode()
    # A baseline that did not end within the grace the bench gives it was SIGKILLed with its
    # process group; on a loaded machine a killed process (torch's address space to unmap) can
    # take a while to be gone, reparented to init once its shell is reaped. Not "left running"
    # unless still there well after: the baseline runs 100 epochs.
    def gone(pid):
        return "zombie" in read(f"/proc/{pid}/status") or not Path(f"/proc/{pid}").exists()
    try:
        wait_until(lambda: all(gone(pid) for pid in baseline), "the baseline to end", limit=30)
    finally:
        left = [pid for pid in baseline if not gone(pid)]
        for pid in left:
            os.kill(pid, signal.SIGKILL)
    assert not left, f"baseline processes {left} left running"
    assert not list(tmp_path.glob("stoker-baseline-*"))  # its log file removed
