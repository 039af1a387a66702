"""DataLoader.trace / tracing: the Chrome trace-event JSON file, when it is written (trace(None),
the with block, close, garbage collection), its cap, and worker processes on their own tracks;
and the progress bars of stoker's long-running helpers."""

import collections
import gc
import io
import json
import sys
import time

import numpy as np
import pytest

import stoker
from stoker.progress import progress
from worker_datasets import Batched, Mixed


class _Slow:
    """Samples that take 20 us or more (a Python data set is read a chunk per call on threads,
    so its threads show chunks; worker processes time each read)."""

    def __init__(self, n):
        self.n = n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        time.sleep(20e-6)
        return np.full(4, i, dtype=np.float32)


def _loader(n=64):
    return stoker.DataLoader(_Slow(n), batch_size=8, num_workers=2, worker_type="thread")


def _events(path):
    with open(path) as f:
        trace = json.load(f)
    threads = {(e["pid"], e["tid"]): e["args"]["name"] for e in trace["traceEvents"]
               if e["ph"] == "M" and e["name"] == "thread_name"}
    by_name = collections.defaultdict(list)
    for e in trace["traceEvents"]:
        if e["ph"] != "M":
            by_name[e["name"]].append(e)
    return trace, threads, by_name


def test_trace_none_writes_a_timeline_of_the_run(tmp_path):
    path = tmp_path / "run.json"
    loader = _loader()
    loader.trace(path)
    for _ in range(2):
        for _batch in loader:
            pass
    loader.trace(None)
    trace, threads, events = _events(path)
    assert trace["otherData"]["dropped_events"] == 0
    for name in ("chunk", "wait for batch", "step", "queue", "pinned bytes"):
        assert events[name], name
    # Which of the two workers claims which chunk is up to timing.
    assert {threads[(e["pid"], e["tid"])] for e in events["chunk"]} <= {"worker 1", "worker 2"}
    assert {threads[(e["pid"], e["tid"])] for e in events["step"]} == {"consumer"}
    assert {e["ph"] for e in events["ready"]} == {"b", "e"}
    loader.close()


def test_tracing_block_close_and_garbage_collection_write_the_file(tmp_path):
    loader = _loader()
    with loader.tracing(tmp_path / "with.json"):
        next(iter(loader))
    assert _events(tmp_path / "with.json")[2]["wait for batch"]

    loader.trace(tmp_path / "close.json")
    next(iter(loader))
    loader.close()
    assert _events(tmp_path / "close.json")[2]["wait for batch"]

    loader = _loader()
    loader.trace(str(tmp_path / "gc.json"))
    next(iter(loader))
    del loader
    gc.collect()
    assert _events(tmp_path / "gc.json")[2]["wait for batch"]


def test_a_streams_trace_left_open_is_written_as_the_interpreter_exits(tmp_path):
    # A stream loader still recording, never closed, mid-epoch at exit: the file is written
    # (not left empty), and nothing is printed about it.
    import subprocess

    path = tmp_path / "stream.json"
    script = (
        "import stoker\n"
        "from torch.utils.data import IterableDataset\n"
        "class S(IterableDataset):\n"
        "    def __iter__(self):\n"
        "        return iter(range(100))\n"
        "loader = stoker.DataLoader(S(), batch_size=10, num_workers=1, worker_type='thread')\n"
        f"loader.trace({str(path)!r})\n"
        "it = iter(loader)\n"
        "next(it), next(it)\n")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0 and done.stderr == "", done.stderr
    names = [e["name"] for e in json.loads(path.read_text())["traceEvents"]]
    assert names.count("wait for batch") == 2 and "step" in names


def test_cap_keeps_the_newest_events(tmp_path):
    path = tmp_path / "cap.json"
    loader = _loader(n=512)
    with loader.tracing(path, max_events=100):
        for _ in range(2):
            for _batch in loader:
                pass
    trace, _, events = _events(path)
    meta = trace["otherData"]
    assert meta["max_events"] == 100 and meta["dropped_events"] > 0
    assert "kept the newest" in meta["note"]
    # The newest are kept: the second epoch's last batch (63) is there, its first is not.
    batches = {e["args"]["batch"] for e in events["chunk"] if e["args"]["epoch"] == 1}
    assert 63 in batches and 0 not in batches
    loader.close()


def test_a_path_that_cannot_be_created_raises_oserror(tmp_path):
    loader = _loader()
    with pytest.raises(FileNotFoundError, match="missing"):
        loader.trace(tmp_path / "missing" / "run.json")
    next(iter(loader))  # untraced, and still working
    loader.close()


@pytest.mark.parametrize("dataset", [Mixed, Batched], ids=["getitem", "getitems"])
def test_worker_process_jobs_are_on_their_own_tracks(tmp_path, dataset):
    path = tmp_path / "processes.json"
    loader = stoker.DataLoader(dataset(64), batch_size=8, num_workers=2, worker_type="process")
    with loader.tracing(path):
        for _batch in loader:
            pass
    pids = set(loader.stats()["worker_pids"])
    loader.close()
    trace, threads, events = _events(path)
    jobs = events["job"]
    assert jobs and {e["pid"] for e in jobs} <= pids
    assert all(threads[(e["pid"], e["tid"])] == "jobs and reads" for e in jobs)
    processes = {e["pid"]: e["args"]["name"] for e in trace["traceEvents"]
                 if e["ph"] == "M" and e["name"] == "process_name"}
    assert all(processes[e["pid"]] == f"worker process {e['pid']}" for e in jobs)
    # The processes time their rows (the replies carry the times), on their own tracks: the
    # last batch's at least (the first ones may have been read before the trace began).
    reads = events["read"]
    assert set(range(56, 64)) <= {e["args"]["sample"] for e in reads} <= set(range(64))
    assert {e["pid"] for e in reads} <= pids
    # The engine threads that sent the jobs show them as chunks of their own.
    assert events["chunk"]



class _Terminal(io.StringIO):
    def isatty(self):
        return True


def test_progress_draws_a_tqdm_bar_on_a_terminal(monkeypatch):
    pytest.importorskip("tqdm")
    terminal = _Terminal()
    monkeypatch.setattr(sys, "stderr", terminal)
    assert list(progress(range(3), desc="runs")) == [0, 1, 2]
    assert "runs" in terminal.getvalue()


def test_progress_is_silent_off_a_terminal_when_quiet_and_without_tqdm(monkeypatch, capsys):
    assert list(progress(range(5), desc="runs")) == list(range(5))
    assert capsys.readouterr().err == ""  # stderr is not a terminal here
    terminal = _Terminal()
    monkeypatch.setattr(sys, "stderr", terminal)
    assert list(progress(range(2), desc="runs", quiet=True)) == [0, 1]
    monkeypatch.setitem(sys.modules, "tqdm.auto", None)  # as if tqdm were not installed
    assert list(progress(iter("abc"), total=3)) == ["a", "b", "c"]
    assert terminal.getvalue() == ""


def test_pack_draws_a_tqdm_bar_on_a_terminal(tmp_path, monkeypatch):
    pytest.importorskip("tqdm")
    Image = pytest.importorskip("PIL.Image")
    for i in range(3):
        folder = tmp_path / "src" / f"c{i}"
        folder.mkdir(parents=True)
        Image.fromarray(np.full((8, 8, 3), i * 40, np.uint8)).save(folder / "a.jpg")
    terminal = _Terminal()
    monkeypatch.setattr(sys, "stderr", terminal)
    assert stoker.pack(tmp_path / "src", tmp_path / "packed")["records"] == 3
    assert "pack" in terminal.getvalue() and "3/3" in terminal.getvalue()
