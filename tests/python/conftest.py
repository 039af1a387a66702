"""A test that hangs ends the run with what every thread and process was doing, not silence.

CI gives the whole run a wall-clock limit: a test stuck on a lock would spend it all and say
nothing. After STOKER_TEST_TIMEOUT seconds (default 300; the slowest test takes about 60) in
one test, this prints the Python stack of each of this process's threads, then the native
stacks of this process and of each process below it (gdb, where installed; else the kernel's
wait channel), kills those processes and exits with status 3."""

import faulthandler
import os
import shutil
import signal
import subprocess
import sys
import threading

import pytest

_LIMIT_S = float(os.environ.get("STOKER_TEST_TIMEOUT", "300"))


def _descendants(pid: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        children.setdefault(ppid, []).append(int(entry))
    out, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            out.append(child)
            todo.append(child)
    return out


def _describe(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            cmd = f.read().replace(b"\0", b" ").decode(errors="replace").strip()
        with open(f"/proc/{pid}/wchan") as f:
            wchan = f.read().strip()
    except OSError as e:
        return f"pid {pid}: {e}"
    return f"pid {pid} ({cmd[:160]}), waiting in {wchan or 'nothing (running)'}"


def _report_and_exit(item) -> None:
    nodeid = item.nodeid
    capture = item.config.pluginmanager.getplugin("capturemanager")
    if capture is not None:  # to the real stderr, not the test's captured output
        capture.suspend_global_capture(in_=True)
    err = sys.stderr
    print(f"\n\nstoker tests: {nodeid} still running after {_LIMIT_S:.0f} s: stacks follow",
          file=err, flush=True)
    faulthandler.dump_traceback(file=err, all_threads=True)
    gdb = shutil.which("gdb")
    pids = [os.getpid()] + _descendants(os.getpid())
    for pid in pids:
        print(f"\n-- {_describe(pid)}", file=err, flush=True)
        if gdb:
            try:
                out = subprocess.run([gdb, "-p", str(pid), "-batch", "-nx", "-ex",
                                      "thread apply all bt 30"], capture_output=True, text=True,
                                     timeout=60).stdout
                print("\n".join(line for line in out.splitlines()
                                if line.startswith(("#", "Thread"))), file=err, flush=True)
            except (OSError, subprocess.TimeoutExpired) as e:
                print(f"gdb: {e}", file=err, flush=True)
    for pid in pids[1:]:
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass
    os._exit(3)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    done = threading.Event()

    def watch():
        if not done.wait(_LIMIT_S):
            _report_and_exit(item)

    watcher = threading.Thread(target=watch, name="stoker test watchdog", daemon=True)
    watcher.start()
    try:
        yield
    finally:
        done.set()
        watcher.join()  # gone before the next test counts its threads
