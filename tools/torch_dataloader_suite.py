"""PyTorch's own DataLoader tests with stoker.DataLoader in place of torch's: the compatibility
measure of issue 15.

PyTorch's test file (test/test_dataloader.py of the pytorch/pytorch repository) is not part of
this repository: pass its path. The file runs twice, each time in a fresh interpreter: once as
it is, once with ``torch.utils.data.DataLoader`` replaced by ``stoker.DataLoader``, and the
report counts, of the tests that pass with torch's loader, those that also pass with stoker's
(and, among them, those that build a loader at all).

    .venv-test/bin/python tools/torch_dataloader_suite.py /path/to/test_dataloader.py
    .venv-test/bin/python tools/torch_dataloader_suite.py FILE -k TestDataLoader.test_len -v

With ``--min-share 95`` it exits with status 1 when fewer than 95% of them pass (what
scripts/test.sh runs when given the file).

The replacement reaches every place the tests make a loader: the module's own
``from torch.utils.data import DataLoader``, ``torch.utils.data.DataLoader(...)``, the
processes the tests start with the spawn method (they import this file first, as their
``__main__``), and the ``python -c`` programs some tests run (the replacement is prepended).
Each test has a time limit (SIGALRM): a test that hangs counts as failed, with the reason.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time

_MODE = os.environ.get("STOKER_SUITE_LOADER", "")

# What a `python -c` program of a test runs first in stoker mode.
_PRELUDE = ("import torch.utils.data, stoker\n"
            "torch.utils.data.DataLoader = stoker.DataLoader\n")


def _use_stoker() -> None:
    """Puts stoker.DataLoader where torch's tests look for torch's, and counts loaders."""
    import torch.utils.data
    import torch.utils.data.dataloader

    import stoker
    from stoker.loader import dataloader as _loader

    torch.utils.data.DataLoader = stoker.DataLoader
    torch.utils.data.dataloader.DataLoader = stoker.DataLoader

    init = _loader.DataLoader.__init__

    def counting_init(self, *args, **kwargs):
        _loader_count[0] += 1
        init(self, *args, **kwargs)

    _loader.DataLoader.__init__ = counting_init

    check_output = subprocess.check_output

    def check_output_with_stoker(args, *rest, **kwargs):
        if (isinstance(args, list) and len(args) == 3 and args[0] == sys.executable
                and args[1] == "-c"):
            args = [args[0], "-c", _PRELUDE + args[2]]
        return check_output(args, *rest, **kwargs)

    subprocess.check_output = check_output_with_stoker


_loader_count = [0]
if _MODE == "stoker":
    # At import, so that spawned test processes (which import this file as __mp_main__) use
    # stoker too.
    _use_stoker()


class _TimeLimit(Exception):
    pass


def _run(test_file: str, select: list[str], limit: float, verbose: bool) -> dict:
    """Runs the tests of `test_file` in this process; returns {test id: outcome}."""
    import signal
    import unittest

    sys.path.insert(0, os.path.dirname(os.path.abspath(test_file)))
    # torch's TestCase runs only the tests of the running script (sys.argv[0]).
    sys.argv[0] = os.path.abspath(test_file)
    name = os.path.splitext(os.path.basename(test_file))[0]
    module = __import__(name)
    suite = unittest.defaultTestLoader.loadTestsFromModule(module)

    def flatten(s):
        for t in s:
            if isinstance(t, unittest.TestSuite):
                yield from flatten(t)
            else:
                yield t

    def on_alarm(signum, frame):
        raise _TimeLimit(f"over the {limit:.0f} s time limit")

    signal.signal(signal.SIGALRM, on_alarm)
    outcomes = {}
    for test in flatten(suite):
        test_id = test.id().removeprefix(name + ".")
        if select and not any(re.search(s, test_id) for s in select):
            continue
        result = unittest.TestResult()
        before = _loader_count[0]
        start = time.monotonic()
        signal.setitimer(signal.ITIMER_REAL, limit)
        try:
            test.run(result)
        except _TimeLimit as e:  # raised outside the test body (setUp/tearDown machinery)
            result.errors.append((test, str(e)))
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
        if result.skipped:
            outcome, detail = "skip", result.skipped[0][1]
        elif result.expectedFailures:
            outcome, detail = "xfail", ""
        elif result.errors or result.failures or result.unexpectedSuccesses:
            problems = result.errors + result.failures
            outcome = "fail"
            detail = problems[0][1] if problems else "unexpected success"
        else:
            outcome, detail = "pass", ""
        # The exception's line: the last of the traceback, before torch's repro hint.
        detail = detail.split("\n\nTo execute this test")[0].strip()
        outcomes[test_id] = {
            "outcome": outcome,
            "detail": detail.splitlines()[-1][:300] if detail else "",
            "loaders": _loader_count[0] - before,
            "seconds": round(time.monotonic() - start, 2),
        }
        if verbose:
            line = f"{outcome:5} {test_id}"
            if outcome == "fail":
                line += f"\n      {detail.strip()[-2000:]}"
            print(line, file=sys.stderr, flush=True)
    return outcomes


def _child(mode: str, args) -> dict:
    with tempfile.NamedTemporaryFile("r", suffix=".json") as out:
        env = dict(os.environ, STOKER_SUITE_LOADER=mode)
        command = [sys.executable, os.path.abspath(__file__), args.test_file, "--child-json",
                   out.name, "--limit", str(args.limit)]
        for s in args.k:
            command += ["-k", s]
        if args.verbose:
            command.append("-v")
        subprocess.run(command, env=env, check=False,
                       stdout=None if args.verbose else subprocess.DEVNULL,
                       stderr=None if args.verbose else subprocess.DEVNULL)
        text = out.read()
    if not text:
        raise SystemExit(f"the {mode} run died before it reported (run with -v to see why)")
    return json.loads(text)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("test_file", help="PyTorch's test/test_dataloader.py")
    parser.add_argument("-k", action="append", default=[],
                        help="only tests whose 'Class.test' id matches this regex (repeatable)")
    parser.add_argument("--limit", type=float, default=60.0, help="seconds per test")
    parser.add_argument("--json", help="write both runs' outcomes here")
    parser.add_argument("--torch-from", metavar="JSON",
                        help="take torch's outcomes from an earlier --json instead of running "
                             "the file with torch's loader again (it does not change)")
    parser.add_argument("--min-share", type=float, metavar="PERCENT",
                        help="exit with status 1 if fewer pass with stoker's loader")
    parser.add_argument("-v", "--verbose", action="store_true")
    parser.add_argument("--child-json", help=argparse.SUPPRESS)
    args = parser.parse_args()

    if args.child_json:
        outcomes = _run(args.test_file, args.k, args.limit, args.verbose)
        with open(args.child_json, "w") as f:
            json.dump(outcomes, f)
        sys.stdout.flush()
        # Loaders or workers a failed test left behind must not keep this process alive.
        os._exit(0)

    if args.torch_from:
        with open(args.torch_from) as f:
            theirs = {t: o for t, o in json.load(f)["torch"].items()
                      if not args.k or any(re.search(k, t) for k in args.k)}
    else:
        theirs = _child("torch", args)
    ours = _child("stoker", args)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"torch": theirs, "stoker": ours}, f, indent=1)

    passing = sorted(t for t, o in theirs.items() if o["outcome"] == "pass")
    ok = [t for t in passing if ours.get(t, {}).get("outcome") == "pass"]
    builds = [t for t in passing if ours.get(t, {}).get("loaders", 0) > 0]
    builds_ok = [t for t in builds if t in set(ok)]
    print("Failing with stoker's loader (passing with torch's):")
    for t in passing:
        o = ours.get(t, {"outcome": "missing", "detail": ""})
        if o["outcome"] != "pass":
            print(f"  {t}: {o['outcome']}: {o['detail']}")
    share = 100.0 * len(ok) / max(1, len(passing))
    print(f"\n{len(ok)} of {len(passing)} tests that pass with torch's DataLoader pass with "
          f"stoker's ({share:.0f}%); of the {len(builds)} that build a loader, {len(builds_ok)}.")
    if args.min_share is not None and share < args.min_share:
        raise SystemExit(f"fewer than {args.min_share:g}% pass")


if __name__ == "__main__":
    main()
