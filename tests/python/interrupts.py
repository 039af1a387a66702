"""What the Ctrl-C tests (test_interrupts.py) run in the child processes they interrupt.

A signal test never signals the test process: it starts a child (`run_child`) that sets the
SIGINT disposition it needs itself, whatever it inherited (a script that starts the suite in the
background starts it with SIGINT ignored), and sends the signal inside that child only once
the child is where the test means it to land: a read blocked at a `Gate`, or the main thread
waiting inside the loader's `next()` (`NextWatch`). Nothing depends on a timer firing in time
or on work being slow enough to be caught. This module does not import torch, so that spawned
worker processes, which import it to unpickle the data sets, start quickly.
"""

from __future__ import annotations

import builtins
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
# Far longer than any step takes, even on a loaded machine: only tells a stop from a hang.
LIMIT_S = 60

PRELUDE = f"""\
import signal, sys
# Ctrl-C raises KeyboardInterrupt in this process, as in a terminal, even when the test run
# was started with SIGINT ignored (Python then leaves it ignored).
signal.signal(signal.SIGINT, signal.default_int_handler)
sys.path.insert(0, {str(HERE)!r})
"""


def run_child(script: str) -> subprocess.CompletedProcess:
    """Runs `script` (dedented) in a fresh Python after PRELUDE; its stdout and stderr are
    captured as text."""
    return subprocess.run([sys.executable, "-c", PRELUDE + textwrap.dedent(script)],
                          capture_output=True, text=True, timeout=4 * LIMIT_S)


def interrupt_main() -> None:
    """Ctrl-C as the main thread receives it: SIGINT to it alone, so that a wait of its own
    (a lock, a sleep) is interrupted whichever thread sends it."""
    signal.pthread_kill(threading.main_thread().ident, signal.SIGINT)


def _wait_for(path: Path, what: str) -> None:
    deadline = time.monotonic() + LIMIT_S
    while not path.exists():
        if time.monotonic() > deadline:
            raise TimeoutError(f"waited {LIMIT_S} s for {what}")
        time.sleep(0.002)


class Gate:
    """A point that reads arrive at and wait at until the test opens it; files in a directory,
    so that it works the same from worker threads and worker processes."""

    def __init__(self, directory) -> None:
        self.dir = Path(directory)

    def arrive(self, name: str) -> None:
        (self.dir / f"{name}.arrived").touch()
        _wait_for(self.dir / f"{name}.open", f"gate {name} to open")

    def wait_arrived(self, name: str) -> None:
        _wait_for(self.dir / f"{name}.arrived", f"a read to arrive at gate {name}")

    def open(self, name: str) -> None:
        (self.dir / f"{name}.open").touch()


class NextWatch:
    """Knows when the main thread is inside the loader's native next() (a C function named
    next other than the builtin), where it waits for a batch with the GIL released."""

    def __init__(self) -> None:
        self.inside = threading.Event()
        sys.setprofile(self._profile)  # the calling (main) thread only

    def _profile(self, frame, event, arg) -> None:
        if event in ("c_call", "c_return", "c_exception") and arg is not builtins.next \
                and getattr(arg, "__name__", None) == "next":
            if event == "c_call":
                self.inside.set()
            else:
                self.inside.clear()

    def wait_inside(self) -> None:
        if not self.inside.wait(LIMIT_S):
            raise TimeoutError(f"the main thread did not wait in next() within {LIMIT_S} s")


class Squares:
    """(array, i * i) samples; reading sample `stop_at` arrives at `gate` ('read') first."""

    def __init__(self, n, gate=None, stop_at=None) -> None:
        self.n, self.gate, self.stop_at = n, gate, stop_at
        self.reads = []

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        self.reads.append(i)
        if i == self.stop_at:
            self.gate.arrive("read")
        return np.full((2, 3), float(i), np.float32), i * i


class SquaresItems(Squares):
    """Squares read through __getitems__; the call that reads `stop_at` arrives at the gate."""

    def __getitems__(self, indices):
        self.reads.append(list(indices))
        if self.stop_at in indices:
            self.gate.arrive("read")
        return [(np.full((2, 3), float(i), np.float32), i * i) for i in indices]
