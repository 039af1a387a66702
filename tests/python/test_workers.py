"""The two kinds of worker: processes (worker_type='process') against threads, worker death,
errors, shutdown, PyTorch's worker semantics, __getitems__, and the auto choice."""

import collections
import gc
import logging
import math
import multiprocessing
import os
import pickle
import platform
import random
import re
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from torch.utils.data import get_worker_info
from torch.utils.data._utils.worker import _generate_state

import stoker
import worker_datasets as wd

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "support"))
from worker_harness import alive  # noqa: E402

HERE = Path(__file__).resolve().parent
CORES = len(os.sched_getaffinity(0))


def same(a, b):
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.dtype == b.dtype and torch.equal(a, b)
    if isinstance(a, dict):
        return type(a) is type(b) and a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return type(a) is type(b) and len(a) == len(b) and all(map(same, a, b))
    return a == b


def memfds():
    n = 0
    for fd in os.listdir("/proc/self/fd"):
        try:
            n += os.readlink(f"/proc/self/fd/{fd}").startswith("/memfd:stoker")
        except OSError:
            pass
    return n


def epochs(loader, n=2):
    return [list(loader) for _ in range(n)]


def _schedstat(pid):
    with open(f"/proc/{pid}/schedstat") as f:
        on_cpu, waited = f.read().split()[:2]
    return int(on_cpu) / 1e9, int(waited) / 1e9


def test_worker_processes_time_counts_with_the_workers():
    # The engine's threads only wait on the processes: without their time, a machine too busy
    # to run them would look idle to the tuner and report().
    loader = stoker.DataLoader(wd.CpuBound(64, 20000), batch_size=8, num_workers=2,
                               worker_type="process")
    list(loader)
    # Read before stats(): the workers may still be reading the next epoch's first batches,
    # so their counters only grow, and stats() reads them afresh.
    times = [_schedstat(pid) for pid in loader.stats()["worker_pids"]]
    stats = loader.stats()
    assert sum(cpu for cpu, _ in times) > 0
    assert stats["worker_cpu_s"] >= 0.99 * sum(cpu for cpu, _ in times)
    assert stats["worker_run_delay_s"] >= 0.99 * sum(delay for _, delay in times)
    loader.close()


def test_processes_and_threads_give_identical_batches():
    kw = dict(batch_size=6, shuffle=True, seed=7, num_workers=2)
    threads = stoker.DataLoader(wd.Mixed(), worker_type="thread", **kw)
    processes = stoker.DataLoader(wd.Mixed(), worker_type="process", **kw)
    a, b = epochs(threads), epochs(processes)
    assert processes.stats()["worker_type"] == "process"
    assert len(processes.stats()["worker_pids"]) == 2
    assert threads.stats()["worker_type"] == "thread"
    assert len(a[0]) == len(b[0]) == 11
    for x, y in zip(a[0] + a[1], b[0] + b[1]):
        assert same(x, y)
    first = b[0][0]
    assert first["meta"]["name"][0].startswith("sample-") and first["image"].shape == (6, 3, 4)
    threads.close()
    processes.close()


def test_a_custom_sampler_order_is_followed_by_processes():
    order = list(range(0, 40, 2)) + list(range(1, 40, 2))
    loader = stoker.DataLoader(wd.Batched(40), batch_size=4, num_workers=2,
                               worker_type="process", sampler=order)
    batches = list(loader)
    assert [int(i) for b in batches for i in b["i"]] == order
    # still one job per chunk, but for the first chunk, whose first samples tell the layout
    assert [int(g) for g in batches[0]["group"]] == [1, 1, 2, 2]
    assert all(int(g) == 2 for b in batches[1:] for g in b["group"])
    loader.close()


def test_collate_fn_gets_the_samples_read_by_processes():
    def collate(samples):
        return [s["meta"]["name"] for s in samples]

    loader = stoker.DataLoader(wd.Mixed(12), batch_size=4, num_workers=2,
                               worker_type="process", collate_fn=collate)
    assert list(loader) == [[f"sample-{i}" for i in range(j, j + 4)] for j in (0, 4, 8)]
    loader.close()


def test_processes_deliver_to_a_device_from_registered_shared_slabs():
    kw = dict(batch_size=4, num_workers=2, device="sim")
    processes = stoker.DataLoader(wd.Mixed(16), worker_type="process", **kw)
    threads = stoker.DataLoader(wd.Mixed(16), worker_type="thread", **kw)
    for x, y in zip(processes, threads):
        assert same(x, y)
    stats = processes.stats()
    assert stats["copies"] > 0 and stats["locked_slabs"] == stats["slabs"] > 0
    processes.close()
    threads.close()


def test_exception_from_a_process_keeps_type_message_traceback_and_index():
    loader = stoker.DataLoader(wd.FailsAt({13}), batch_size=4, num_workers=2,
                               worker_type="process")
    it = iter(loader)
    for _ in range(3):
        next(it)
    with pytest.raises(ValueError, match="bad sample 13") as info:
        next(it)
    notes = "\n".join(getattr(info.value, "__notes__", []))
    assert "sample 13" in notes and "worker process" in notes
    assert "Traceback (most recent call last)" in notes and "worker_datasets.py" in notes
    assert "raise ValueError" in notes
    rest = list(it)  # the loader goes on
    assert [int(x) for b in rest for x in b[:, 0]] == list(range(16, 40))
    loader.close()


def test_a_failing_worker_init_fn_fails_the_samples_of_its_process():
    def init(worker_id):
        raise KeyError(f"no init for {worker_id}")

    loader = stoker.DataLoader(wd.FailsAt(set()), batch_size=4, num_workers=2,
                               worker_type="process", worker_init_fn=init)
    with pytest.raises(KeyError, match="no init for") as info:
        next(iter(loader))
    assert "in init" in "\n".join(info.value.__notes__)  # the worker's traceback
    loader.close()


def test_an_exception_that_cannot_be_rebuilt_arrives_as_runtime_error():
    loader = stoker.DataLoader(wd.OddFails(), batch_size=8, num_workers=2,
                               worker_type="process")
    with pytest.raises(RuntimeError, match="OddError: left and right"):
        list(loader)
    loader.close()


@pytest.mark.parametrize("worker_type", ["thread", "process"])
def test_skip_policy_replaces_failing_first_samples(worker_type):
    # the first samples a worker reads also tell the layout: failing, they are skipped too
    loader = stoker.DataLoader(wd.FailsAt({0, 1}, n=16), batch_size=8, num_workers=2,
                               worker_type=worker_type, on_error="skip")
    values = [int(v) for b in loader for v in b[:, 0]]
    assert len(values) == 16 and 0 not in values and 1 not in values
    assert loader.stats()["skipped"] >= 2
    loader.close()


def test_skip_policy_with_processes():
    loader = stoker.DataLoader(wd.FailsAt({3, 17, 30}), batch_size=8, num_workers=2,
                               worker_type="process", on_error="skip", seed=1)
    batches = list(loader)
    assert [len(b) for b in batches] == [8] * 5
    assert loader.stats()["skipped"] == 3
    values = {int(x) for b in batches for x in b[:, 0]}
    assert not values & {3, 17, 30}
    loader.close()


def test_a_killed_worker_is_replaced_and_its_samples_read_again(tmp_path, caplog):
    # The OOM killer takes a worker mid-epoch: a new worker reads its chunk again, and the
    # epoch completes with every sample once, in order; the death is logged and counted.
    caplog.set_level(logging.WARNING, logger="stoker")
    loader = stoker.DataLoader(wd.KillsItself(20, str(tmp_path / "killed")), batch_size=8,
                               num_workers=2, worker_type="process")
    it = iter(loader)  # worker processes start with the first epoch, as torch's
    pids = set(loader.stats()["worker_pids"])
    got = [int(x) for b in it for x in b[:, 0]]
    assert got == list(range(48))
    assert (tmp_path / "killed").exists()  # it did die
    stats = loader.stats()
    assert stats["worker_deaths"] == 1
    report = loader.report()
    assert report["worker_deaths"] == 1
    assert "1 worker process died reading and was replaced, its samples read again" in str(
        report), str(report)
    now = set(stats["worker_pids"])
    assert len(now) == 2 and len(now - pids) == 1
    dead = (pids - now).pop()
    stoker.logs.drain()  # the engine's line, queued (logs.py): now, not at a later bytecode
    logged = caplog.text
    assert re.search(rf"stoker: DataLoader worker \(pid {dead}\) is killed by signal: Killed "
                     r"reading samples [0-9, ]*\b20\b[0-9, ]*; a new worker reads them again",
                     logged), logged
    assert [int(x) for b in loader for x in b[:, 0]] == list(range(48))  # the loader goes on
    loader.close()
    assert not alive(dead)


def test_a_sample_that_kills_every_worker_is_named_like_torch(tmp_path):
    loader = stoker.DataLoader(wd.AlwaysKills([20]), batch_size=8, num_workers=2,
                               worker_type="process")
    it = iter(loader)  # worker processes start with the first epoch, as torch's
    pids = set(loader.stats()["worker_pids"])
    got = []
    with pytest.raises(stoker.WorkerError) as info:
        for batch in it:
            got.append(batch)
    message = str(info.value)
    # Read again after the first death, then row by row after the second: the one sample
    # that kills its worker by itself is named, not its whole chunk.
    assert "is killed by signal: Killed" in message and "samples lost: 20" in message, message
    assert isinstance(info.value, RuntimeError) and isinstance(info.value, stoker.SampleError)
    # The worker that died last, already gone (a replacement, or the other first worker:
    # which one reads the sample alone is the scheduler's choice; under load it was the latter).
    assert info.value.pid > 0 and not alive(info.value.pid)
    assert [int(x) for b in got for x in b[:, 0]] == list(range(16))
    assert loader.stats()["worker_deaths"] == 3  # twice the chunk, once the sample alone
    loader.close()
    assert not any(alive(p) for p in pids | {info.value.pid})


def test_a_sample_that_kills_every_worker_under_skip_loses_only_itself():
    loader = stoker.DataLoader(wd.AlwaysKills([9, 30]), batch_size=8, num_workers=2,
                               worker_type="process", on_error="skip")
    batches = list(loader)
    assert [len(b) for b in batches] == [8] * 6
    values = [int(x) for b in batches for x in b[:, 0]]
    assert not {9, 30} & set(values) and len(set(values)) == 46
    assert loader.skipped_samples() and {s.index for s in loader.skipped_samples()} == {9, 30}
    assert loader.stats()["skipped"] == 2
    loader.close()


def test_each_worker_death_is_said_once_by_the_training_process():
    # A worker is started again while the engine's line about the one that died waits to be
    # handed to logging: the new worker (a fork) must neither print the parent's lines again
    # nor hang on the log's lock, which another engine thread may hold at that moment.
    script = textwrap.dedent(f"""
        import sys
        sys.path.insert(0, {str(HERE)!r})
        import stoker, worker_datasets as wd
        for _ in range(3):
            loader = stoker.DataLoader(wd.AlwaysKills([9, 30]), batch_size=8, num_workers=2,
                                       worker_type="process", on_error="skip")
            assert len(list(loader)) == 6
            loader.close()
    """)
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                            timeout=120)
    assert result.returncode == 0, result.stderr
    lines = re.findall(r"^stoker: DataLoader worker \(pid \d+\) .*$", result.stderr, re.M)
    assert lines and len(lines) == len(set(lines)), result.stderr


def test_a_worker_multiprocessing_reaped_first_is_still_named_by_the_signal_that_killed_it():
    # A Process that starts reaps its finished siblings (multiprocessing's _cleanup), so a
    # dead worker's status may be gone before the pool reads it: then its Process says.
    from stoker.workers.processes import ProcessWorkers, mp_context

    workers = ProcessWorkers(wd.Slow(10, 0.0), 1, mp_context(None), 0, None)
    pool = workers.make_pool()
    pool.start()
    process = workers.processes()[0]
    os.kill(process.pid, signal.SIGKILL)
    process.join()  # reaped here: the kernel keeps no status for the pool to read
    assert tuple(pool.call(0, 0, b"")) == (
        False, f"DataLoader worker (pid {process.pid}) is killed by signal: Killed")
    pool.finish()


@pytest.mark.parametrize("how", ["close", "gc"])
def test_close_and_gc_mid_epoch_leave_no_process_and_no_memfd(how):
    gc.collect()  # loaders of earlier tests
    memfds_before = memfds()
    loader = stoker.DataLoader(wd.Slow(200, 0.002), batch_size=4, num_workers=2,
                               worker_type="process")
    it = iter(loader)
    next(it)
    pids = loader.stats()["worker_pids"]
    assert all(alive(p) for p in pids) and memfds() > memfds_before
    if how == "close":
        loader.close()
    else:
        del it, loader
        gc.collect()
    assert not any(alive(p) for p in pids)
    assert not multiprocessing.active_children()
    assert memfds() == memfds_before
    for pid in pids:  # reaped: no zombie left for anyone to wait for
        with pytest.raises(ChildProcessError):
            os.waitpid(pid, os.WNOHANG)


def test_a_stuck_worker_is_the_timeouts_business_and_close_still_stops_it():
    loader = stoker.DataLoader(wd.Stuck(), batch_size=4, num_workers=2, worker_type="process",
                               timeout=0.3)
    it = iter(loader)  # worker processes start with the first epoch, as torch's
    pids = loader.stats()["worker_pids"]
    assert len(pids) == 2
    with pytest.raises(RuntimeError, match="DataLoader timed out after 0.3 seconds"):
        next(it)
    loader.close()  # SIGTERM is ignored: SIGKILL after the grace period
    assert not any(alive(p) for p in pids)


def run_trainer(ending, returncode):
    """Runs a training process that starts two worker processes, reads a batch, then does
    `ending`; returns the workers' pids once it has ended with `returncode`."""
    script = textwrap.dedent(f"""
        import os, sys
        sys.path.insert(0, {str(HERE)!r})
        import stoker, worker_datasets as wd
        loader = stoker.DataLoader(wd.Slow(1000, 0.01), batch_size=4, num_workers=2,
                                   worker_type="process")
        it = iter(loader)
        next(it)
        print(*loader.stats()["worker_pids"], flush=True)
    """) + ending
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                            timeout=60)
    assert result.returncode == returncode, result.stderr
    pids = [int(p) for p in result.stdout.split()]
    assert len(pids) == 2
    return pids, result.stderr


@pytest.mark.parametrize("context", ["fork", "spawn"])
def test_worker_processes_freeze_what_they_inherit_from_the_collector(context):
    # Their collections never walk (and so never copy) the training process's objects.
    loader = stoker.DataLoader(wd.Frozen(), batch_size=4, num_workers=2, worker_type="process",
                               multiprocessing_context=context)
    assert all(int(n) > 1000 for batch in loader for n in batch)
    loader.close()
    gc.collect()
    assert gc.get_freeze_count() == 0  # this process's own objects are left to collect


def test_interpreter_exit_without_close_leaves_no_worker():
    pids, stderr = run_trainer("", 0)
    assert not any(alive(p) for p in pids)
    # The loader closed before multiprocessing's own exit handler terminates daemonic
    # processes (stoker imported first, torch after): no worker was seen to die mid-read.
    assert "stoker:" not in stderr, stderr


def test_workers_exit_when_the_training_process_is_killed():
    pids, _ = run_trainer("os.kill(os.getpid(), 9)\n", -9)
    # Orphans are reaped by init once they exit; wait (boundedly) for that to happen.
    for _ in range(500):
        if not any(alive(p) for p in pids):
            break
        threading.Event().wait(0.02)
    assert not any(alive(p) for p in pids)


@pytest.mark.parametrize("method", ["spawn", "forkserver"])
def test_spawn_and_forkserver_contexts_work(method):
    context = multiprocessing.get_context(method) if method == "forkserver" else method
    loader = stoker.DataLoader(wd.Mixed(12), batch_size=4, num_workers=2,
                               worker_type="process", multiprocessing_context=context)
    threads = stoker.DataLoader(wd.Mixed(12), batch_size=4, num_workers=2, worker_type="thread")
    for x, y in zip(loader, threads):
        assert same(x, y)
    loader.close()


def test_get_worker_info_and_seeds_in_processes_as_torch():
    torch.manual_seed(3)
    loader = stoker.DataLoader(wd.WorkerInfo(), batch_size=4, num_workers=2,
                               worker_type="process", worker_init_fn=wd.record_seeds)
    rows = [{k: b[k][r] for k in b} for b in loader for r in range(len(b["i"]))]
    base = loader._setup.base_seed  # drawn as the epoch started, as torch draws it
    assert {int(r["id"]) for r in rows} <= {0, 1}
    for r in rows:
        worker, seed = int(r["id"]), int(r["seed"])
        assert seed == base + worker and int(r["num_workers"]) == 2
        assert bool(r["same_dataset"]) and int(r["init_worker"]) == worker
        random.seed(seed)
        assert float(r["random"]) == random.random()
        torch.manual_seed(seed)
        assert float(r["torch"]) == pytest.approx(torch.rand(1).item())
        np.random.seed(_generate_state(base, worker))
        assert float(r["numpy"]) == np.random.rand()
    assert len({int(r["pid"]) for r in rows}) <= 2
    loader.close()


def test_get_worker_info_and_worker_init_fn_on_threads():
    started = []
    lock = threading.Lock()

    def init(worker_id):
        with lock:
            started.append((worker_id, threading.get_ident()))

    dataset = wd.WorkerInfo()
    loader = stoker.DataLoader(dataset, batch_size=4, num_workers=2, worker_type="thread",
                               worker_init_fn=init)
    rows = [{k: b[k][r] for k in b} for b in loader for r in range(len(b["i"]))]
    assert get_worker_info() is None  # on this thread, as before
    base = loader._setup.base_seed
    ids = {int(r["id"]) for r in rows}
    assert ids <= {0, 1}
    assert all(int(r["seed"]) == base + int(r["id"]) and bool(r["same_dataset"]) for r in rows)
    # once per worker thread, each with its own id
    assert sorted(w for w, _ in started) == list(range(len(started)))
    assert len({t for _, t in started}) == len(started)
    loader.close()


@pytest.mark.parametrize("worker_type", ["thread", "process"])
def test_getitems_is_called_once_per_chunk(worker_type):
    dataset = wd.Batched(64)
    loader = stoker.DataLoader(dataset, batch_size=8, num_workers=2, worker_type=worker_type)
    batches = list(loader)
    assert [int(i) for b in batches for i in b["i"]] == list(range(64))
    # two workers: each batch is two chunks of four rows, each one __getitems__ call, except
    # the first samples read (one per worker at most, by a __getitems__ call of their own),
    # which tell the layout
    first = [int(g) for g in batches[0]["group"]]
    probed = first.count(1)
    assert 1 <= probed <= 2
    assert first == [1] * probed + [4 - probed] * (4 - probed) + [4] * 4
    assert all(int(g) == 4 for b in batches[1:] for g in b["group"])
    assert dataset.single_calls == 0  # as torch's loader, never __getitem__
    loader.close()


@pytest.mark.skipif(CORES < 2, reason="processes pay only with two cores or more")
def test_auto_picks_processes_for_pure_python_work():
    loader = stoker.DataLoader(wd.CpuBound(400, 20000), batch_size=8)
    values = [int(x) for b in loader for x in b[:, 0]]
    assert values == list(range(400))
    stats = loader.stats()
    assert stats["worker_type"] == "process", stats["worker_type_reason"]
    assert "GIL" in stats["worker_type_reason"] and len(stats["worker_pids"]) == CORES
    loader.close()


class _SmallTensors(torch.utils.data.IterableDataset):
    """A short cheap stream: 4096 small tensors (~2 us each), each worker reading its share."""

    def __iter__(self):
        info = get_worker_info()
        first, step = (info.id, info.num_workers) if info is not None else (0, 1)
        base = torch.arange(32, dtype=torch.float32)
        for i in range(first, 4096, step):
            yield base * i, i


@pytest.mark.skipif(CORES < 2, reason="processes pay only with two cores or more")
def test_a_short_cheap_stream_is_not_spent_on_processes_it_cannot_win_back(monkeypatch):
    # 128 batches of 32 an epoch: whatever the model predicts 2 processes save an epoch, the
    # first epoch has not lost the processes' start by it (kProcessStartSeconds), so the
    # second runs in-line and the reason says what is waited for; nor, on a quiet machine,
    # their forks (kBackgroundStartSeconds: reads of ~0.1 ms a batch), so none started
    # during it (a busy machine's slower reads may have lost that: then they start). A
    # thread's trial, which a busy machine's preempted loop may earn, is left out.
    from stoker.loader import stream_pipeline

    monkeypatch.setattr(stream_pipeline._stoker, "stream_thread_trial",
                        lambda *a: (0, "no thread tried (forced)"))
    loader = stoker.DataLoader(_SmallTensors(), batch_size=32)
    for _ in range(2):
        assert [int(i) for _, b in loader for i in b] == list(range(4096))
    reason = loader.stats()["worker_type_reason"]
    if reason.startswith("auto: in-line"):
        assert loader.num_workers == 0 and loader.stats()["worker_pids"] == []
    else:
        assert "so they start in the background during the 1st epoch read in-line" in reason
    if reason.startswith("auto: in-line for now"):
        assert "they start once the epochs read in-line have lost that much" in reason
    loader.close()


@pytest.mark.skipif(CORES < 2, reason="processes pay only with two cores or more")
def test_auto_ends_on_a_stream_setting_not_slower_than_the_one_it_left(monkeypatch):
    # The switch forced (2 processes, their start free), its check real: once a window of
    # batches was delivered on the processes, auto keeps them or goes back in-line, on the
    # two times a batch the reason names (check_switch, tests/worker_kind_test.cc), and a
    # setting it left is not tried again.
    from stoker.loader import stream_choice, stream_pipeline

    monkeypatch.setattr(stream_pipeline._stoker, "choose_stream_workers",
                        lambda *a: (2, "auto: 2 worker processes (forced)"))
    monkeypatch.setattr(stream_pipeline._stoker, "stream_thread_trial",
                        lambda *a: (0, "no thread tried (forced)"))
    monkeypatch.setattr(stream_pipeline._stoker, "PROCESS_START_SECONDS", 0.0)
    monkeypatch.setattr(stream_choice, "_EARLY_EVERY", 10**9)  # none mid-epoch
    loader = stoker.DataLoader(_SmallTensors(), batch_size=32)
    turns = [x for b in range(0, 4096, 64)
             for x in [*range(b, b + 64, 2), *range(b + 1, b + 64, 2)]]
    reason = ""
    for _ in range(30):
        values = [int(i) for _, b in loader for i in b]
        # The setting this epoch ran on: a switch happens as the next one starts.
        assert values == (turns if loader.num_workers == 2 else list(range(4096)))
        reason = loader.stats()["worker_type_reason"]
        if "kept 2 worker processes" in reason or "back to in-line" in reason:
            break
    measured = re.search(r"2 worker processes delivered a batch every \d+\.\d+ ms over (\d+) "
                         r"batches, in-line every \d+\.\d+ ms over (\d+) \((\d+\.\d+)x the "
                         r"time", reason)
    assert measured, reason
    assert int(measured[1]) >= stoker._stoker.CHECK_MIN_BATCHES and int(measured[2]) > 0
    # In-line read epoch 1 alone: compared over it (no warm epoch to compare with).
    assert re.search(r"; in-line measured over its first epoch too \(0 batches after it, "
                     r"under \d+\)", reason), reason
    ratio = float(measured[3])  # the processes' time a batch over in-line's
    stats = loader.stats()
    if reason.startswith("auto: back to in-line"):
        assert ratio >= 1.05
        assert "beyond the noise of" in reason or "after 4 windows" in reason, reason
        assert loader.num_workers == 0 and stats["worker_pids"] == []
        assert [d["setting"] for d in stats["worker_type_left"]] == ["2 worker processes"]
    else:
        assert reason.startswith("auto: kept 2 worker processes"), reason
        assert ratio <= 1.05 and "not slower by over 5%" in reason
        assert loader.num_workers == 2 and stats["worker_type_left"] == []
    assert re.search(r"; the switch: auto: 2 worker processes \(forced\); 2 worker processes "
                     r"would save \d+\.\d{3} ms an epoch of 128 batches and starting them costs "
                     r"about 0 ms: the 1 epoch read in-line lost", reason), reason
    # Decided once: more epochs neither switch again nor change the reason.
    workers = loader.num_workers
    for _ in range(3):
        assert sorted(int(i) for _, b in loader for i in b) == list(range(4096))
        assert (loader.num_workers, loader.stats()["worker_type_reason"]) == (workers, reason)
    loader.close()


@pytest.mark.skipif(CORES < 2, reason="processes pay only with two cores or more")
def test_processes_started_in_the_background_and_never_used_stop_with_the_loader(monkeypatch):
    # Forced to 2 processes whose forks are free: they start during epoch 1 (once its first
    # batches are measured), which goes on in-line, each sample once and in order; closed in
    # the middle of it, the loader stops them (they exit, and are reaped) and says nothing of
    # them as its workers.
    from stoker.loader import stream_pipeline

    monkeypatch.setattr(stream_pipeline._stoker, "choose_stream_workers",
                        lambda *a: (2, "auto: 2 worker processes (forced)"))
    monkeypatch.setattr(stream_pipeline._stoker, "stream_thread_trial",
                        lambda *a: (0, "no thread tried (forced)"))
    monkeypatch.setattr(stream_pipeline._stoker, "PROCESS_START_SECONDS", math.inf)
    monkeypatch.setattr(stream_pipeline._stoker, "BACKGROUND_START_SECONDS", 0.0)
    loader = stoker.DataLoader(_SmallTensors(), batch_size=32)
    it = iter(loader)
    values = [int(i) for _ in range(64) for i in next(it)[1]]
    assert values == list(range(64 * 32))
    assert loader._pipeline._streams.starting
    assert loader.num_workers == 0 and loader.stats()["worker_pids"] == []
    assert it._workers == []
    started = loader._pipeline._made[0].processes()
    assert len(started) == 2
    loader.close()
    assert [p.exitcode is not None for p in started] == [True, True]
    with pytest.raises(RuntimeError, match="closed"):
        next(iter(loader))


class _StatefulSmallTensors(_SmallTensors):
    """The same stream with a position it saves and loads (torchdata's Stateful)."""

    def state_dict(self):
        return {}

    def load_state_dict(self, state):
        pass


@pytest.mark.skipif(CORES < 2, reason="processes pay only with two cores or more")
@pytest.mark.parametrize("stateful", [False, True])
def test_a_stream_s_processes_start_during_epoch_1_and_read_epoch_2_once_up(monkeypatch,
                                                                             stateful):
    # Forced to 2 processes whose forks are free (the whole start not): once epoch 1's first
    # batches are measured they start mid-epoch, in the background, and read epoch 2 once up
    # (here, up before epoch 1 ends), each epoch each sample once in its setting's order. A
    # Stateful stream is not forked mid-pass (its copy would carry the pass's position): it
    # waits for the whole start's rule at an epoch's end (not met here: in-line).
    from stoker.loader import stream_pipeline

    monkeypatch.setattr(stream_pipeline._stoker, "choose_stream_workers",
                        lambda *a: (2, "auto: 2 worker processes (forced)"))
    monkeypatch.setattr(stream_pipeline._stoker, "stream_thread_trial",
                        lambda *a: (0, "no thread tried (forced)"))
    monkeypatch.setattr(stream_pipeline._stoker, "PROCESS_START_SECONDS", math.inf)
    monkeypatch.setattr(stream_pipeline._stoker, "BACKGROUND_START_SECONDS", 0.0)
    monkeypatch.setattr(stream_pipeline._stoker, "check_switch", lambda *a: ("measuring", ""))
    loader = stoker.DataLoader((_StatefulSmallTensors if stateful else _SmallTensors)(),
                               batch_size=32)
    streams = loader._pipeline._streams
    it = iter(loader)
    values = [int(i) for _ in range(32) for i in next(it)[1]]
    assert streams.starting != stateful
    if not stateful:
        reason = loader.stats()["worker_type_reason"]
        assert re.search(r"^auto: 2 worker processes \(forced\); the \d+ batches read in-line "
                         r"so far lost, by the model, more than their forks cost \(about 0 "
                         r"ms\), so they start in the background during the 1st epoch read "
                         r"in-line and read from the first epoch after it at which they are "
                         r"up$", reason), reason
        give_up = time.monotonic() + 120  # only against a hang: their start, on a busy machine
        while not streams._starting.ready() and time.monotonic() < give_up:
            time.sleep(0.01)
    values += [int(i) for _, b in it for i in b]
    assert values == list(range(4096)) and loader.num_workers == 0
    turns = [x for b in range(0, 4096, 64)
             for x in [*range(b, b + 64, 2), *range(b + 1, b + 64, 2)]]
    second = [int(i) for _, b in loader for i in b]
    assert loader.num_workers == (0 if stateful else 2)
    assert second == (list(range(4096)) if stateful else turns)
    assert len(loader.stats()["worker_pids"]) == loader.num_workers
    assert not streams.starting
    loader.close()


@pytest.mark.skipif(CORES < 2, reason="a thread reads beside the step only with two cores")
@pytest.mark.parametrize("verdict", ["keep", "go back"])
def test_a_thread_tried_while_processes_are_not_worth_their_start_is_kept_or_left(monkeypatch,
                                                                                 caplog, verdict):
    # The models pick 2 processes, not yet worth their start; a thread that reads while the
    # step runs (forced) is tried from epoch 2 meanwhile. Kept, the stream stays on it. Left,
    # the stream is back in-line and the choice goes on without threads: the processes, once
    # their start is won back (made free here after epoch 2), read from the next epoch. Every
    # epoch each sample once in its setting's order (the thread left mid-epoch, in-line reads
    # on from where it stopped).
    from stoker.loader import stream_pipeline

    monkeypatch.setattr(stream_pipeline._stoker, "choose_stream_workers",
                        lambda *a: (2, "auto: 2 worker processes (forced)"))
    monkeypatch.setattr(stream_pipeline._stoker, "stream_thread_trial",
                        lambda *a: (1, "auto: 1 worker thread from the next epoch, on trial "
                                       "(forced)"))
    monkeypatch.setattr(stream_pipeline._stoker, "PROCESS_START_SECONDS", math.inf)
    monkeypatch.setattr(stream_pipeline._stoker, "BACKGROUND_START_SECONDS", math.inf)
    monkeypatch.setattr(stream_pipeline._stoker, "check_switch", _verdicts(verdict, "keep"))
    caplog.set_level(logging.INFO, logger="stoker")
    loader = stoker.DataLoader(_SmallTensors(), batch_size=32)
    assert [int(i) for _, b in loader for i in b] == list(range(4096))
    assert not loader._pipeline._streams.starting
    settings = []
    for epoch in range(3):
        if epoch == 1:
            monkeypatch.setattr(stream_pipeline._stoker, "PROCESS_START_SECONDS", 0.0)
        values = [int(i) for _, b in loader for i in b]
        settings.append((loader.worker_type, loader.num_workers))
        turns = [x for b in range(0, 4096, 64)
                 for x in [*range(b, b + 64, 2), *range(b + 1, b + 64, 2)]]
        assert values == (turns if settings[-1] == ("process", 2) else list(range(4096)))
    stats = loader.stats()
    if verdict == "keep":
        assert settings == [("thread", 1)] * 3 and stats["worker_type_left"] == []
        assert stats["worker_type_reason"].startswith("auto: kept 1 worker thread: forced; ")
        assert "on trial (forced)" in stats["worker_type_reason"]
    else:
        # Left after its window (8 batches), mid-epoch: the loop's thread read the rest of that
        # epoch from where the thread stopped (each sample once, in order, above).
        assert settings == [("thread", 0), ("process", 2), ("process", 2)]
        (left,) = stats["worker_type_left"]
        assert left["setting"] == "1 worker thread" and 5 <= left["batches"] < 16, left
        assert left["epochs"] == 0, left
        assert any("auto: back to in-line mid-epoch: forced" in rec.getMessage()
                   for rec in caplog.records)
        assert stats["worker_type_reason"].startswith("auto: kept 2 worker processes: forced; ")
        assert len(stats["worker_pids"]) == 2
    loader.close()


class _NativeWork(torch.utils.data.Dataset):
    """Samples made by torch ops that release the GIL (~0.5 ms each on one core)."""

    def __len__(self):
        return 192

    def __getitem__(self, i):
        return torch.randn(3, 128, 128).mul_(0.5).add_(i), i


@pytest.mark.skipif(CORES < 2, reason="processes pay only with two cores or more")
def test_auto_moves_whole_batches_made_by_native_work_to_processes():
    # on the batch path a process costs only a streamed copy of the batch, so work that
    # releases the GIL goes to processes too
    loader = stoker.DataLoader(_NativeWork(), batch_size=8, collate_fn=lambda s: (
        torch.stack([x for x, _ in s]), [i for _, i in s]))
    assert [i for _, ids in loader for i in ids] == list(range(192))
    stats = loader.stats()
    assert stats["worker_type"] == "process", stats["worker_type_reason"]
    loader.close()


class _LockedReads:
    """Reads that compute in Python holding a lock of the data set's: a worker forked while a
    thread held it would inherit it held, for good, and never read a sample."""

    lock = threading.Lock()

    def __len__(self):
        return 48

    def __getitem__(self, i):
        with self.lock:
            x = 0
            for k in range(300000):
                x += k
        return np.full(2, i, dtype=np.int64)


@pytest.mark.skipif(CORES < 2, reason="processes pay only with two cores or more")
def test_auto_forks_its_worker_processes_while_no_thread_is_inside_a_read():
    loader = stoker.DataLoader(_LockedReads(), batch_size=2, timeout=20)
    assert [int(x) for b in loader for x in b[:, 0]] == list(range(48))
    stats = loader.stats()
    assert stats["worker_type"] == "process", stats["worker_type_reason"]
    loader.close()


class _MoveAtOnce:
    """worker_type='auto' deciding for processes at its first batch (the rule itself is
    tests/worker_kind_test.cc's)."""

    def __init__(self, whole_batches):
        pass

    # Per batch: reads, the training loop's own time, a hand-over's two halves (seconds).
    costs = (0.0, 0.0, 0.0, 0.0)

    gil_bound = False  # True: in-line may be tried after (InlineTrial)

    def observe(self, loader, threads, cores, pack=0.0, unpack=0.0, measuring=0.0):
        return True, "auto: forced", 2, "2 forced", self.costs, self.gil_bound


def _never_decided(before, after, left, now):
    """check_switch still measuring: a forced move's check left out (test_auto_goes_back_...
    and tests/worker_kind_test.cc test it)."""
    return "measuring", ""


def _pairs_collate(samples):
    return torch.stack([x for x, _ in samples]), [i for _, i in samples]


def test_auto_moving_batch_jobs_to_processes_warms_them_and_loses_no_batch(monkeypatch):
    from stoker.loader import engine_pipeline

    monkeypatch.setattr(engine_pipeline._stoker, "WorkerKindChooser", _MoveAtOnce)
    monkeypatch.setattr(engine_pipeline._stoker, "check_switch", _never_decided)
    loader = stoker.DataLoader(_NativeWork(), batch_size=8, collate_fn=_pairs_collate)
    for _ in range(3):  # each epoch every batch once, in order, across the move
        assert [i for _, ids in loader for i in ids] == list(range(192))
    stats = loader.stats()
    # num_workers='auto': the chooser's count, and why.
    assert (stats["worker_type"], stats["worker_type_reason"]) == ("process",
                                                                    "auto: forced; 2 forced")
    assert len(stats["worker_pids"]) == loader.num_workers == 2
    report = loader.report()
    assert report["readers"] == "2 process worker(s)"
    assert report["readers_reason"] == "auto: forced; 2 forced"
    loader.close()


def test_a_batch_jobs_move_whose_warm_up_outlasts_the_wait_is_checked_from_its_hand_over(
        monkeypatch):
    # The training loop waits for no warm-up (_WARM_WAIT_S 0): the threads read on, the
    # processes take over when warm, and the check measures them from then on (before: such a
    # move was never checked).
    from stoker.loader import engine_pipeline, engine_workers

    monkeypatch.setattr(engine_workers, "_WARM_WAIT_S", 0.0)
    monkeypatch.setattr(engine_pipeline._stoker, "WorkerKindChooser", _MoveAtOnce)
    monkeypatch.setattr(engine_pipeline._stoker, "CHECK_START_SECONDS", 0.0)
    afters = []

    def keep_after_5(before, after, left, now):
        afters.append(after.batches)
        return ("measuring", "") if after.batches < 5 else ("keep", f"kept {now}: forced")

    monkeypatch.setattr(engine_pipeline._stoker, "check_switch", keep_after_5)
    loader = stoker.DataLoader(_NativeWork(), batch_size=8, collate_fn=_pairs_collate)
    # Epochs until the check kept the move: the processes' warm-up may take many epochs on a
    # busy machine (two spinning processes beside it took over four).
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        assert [i for _, ids in loader for i in ids] == list(range(192))
        if loader.stats()["worker_type_reason"].startswith("auto: kept"):
            break
    assert loader.stats()["worker_type_reason"].startswith(
        "auto: kept 2 worker processes: forced; the switch: auto: forced")
    # Measured from the hand-over: nothing the threads read before it. (1 where the hand-over
    # came with an epoch's last batch: the next epoch's first wait is then the processes'
    # first measured time, as any later epoch's first wait is: Delivered.batch.)
    assert afters and afters[0] <= 1, afters
    loader.close()


def _back_after(batches):
    """check_switch that goes back once the processes delivered `batches` (its rule is
    tests/worker_kind_test.cc's)."""
    def check(before, after, left, now):
        if after.batches < batches:
            return "measuring", ""
        return "go back", f"back to {left}: {now} forced slower"
    return check


@pytest.mark.skipif(CORES < 2, reason="processes pay only with two cores or more")
def test_auto_goes_back_to_the_threads_mid_epoch_and_loses_no_sample(monkeypatch):
    # The move to processes forced at the first batch, the check forced to go back after 5
    # batches delivered on them: the threads read on from there (between two batches: nothing
    # lost, repeated or reordered), the processes end, and the setting left is recorded.
    from stoker.loader import engine_pipeline

    monkeypatch.setattr(engine_pipeline._stoker, "WorkerKindChooser", _MoveAtOnce)
    monkeypatch.setattr(engine_pipeline._stoker, "check_switch", _back_after(5))
    monkeypatch.setattr(engine_pipeline._stoker, "CHECK_START_SECONDS", 0.0)  # none skipped
    loader = stoker.DataLoader(wd.CpuBound(400, 200), batch_size=8, num_workers=2)
    it = iter(loader)
    values = []
    for b in it:
        values += [int(x) for x in b[:, 0]]
        if len(values) == 8:
            assert loader.worker_type == "process" and len(loader.stats()["worker_pids"]) == 2
            processes = loader._pipeline.processes()
    assert values == list(range(400))
    stats = loader.stats()
    assert (stats["worker_type"], loader.num_workers, stats["worker_pids"]) == ("thread", 2, [])
    assert all(p.exitcode is not None for p in processes)  # ended and reaped
    assert stats["worker_type_reason"].startswith(
        "auto: back to 2 worker threads: 2 worker processes forced slower; the switch: auto: "
        "forced; 2 worker process(es)")
    (left,) = stats["worker_type_left"]
    assert left["setting"] == "2 worker processes" and left["epochs"] == 0
    assert left["batches"] >= 6 and left["windows"] >= 0
    for _ in range(2):  # decided once: the next epochs on the threads, every sample once
        assert [int(x) for b in loader for x in b[:, 0]] == list(range(400))
    assert loader.stats()["worker_type_left"] == [left]
    loader.close()


def test_values_a_data_set_keeps_in_threading_local_go_cleanly_when_the_threads_end(tmp_path):
    # A pyarrow file per worker thread in a threading.local (as a data set reading Parquet
    # over fsspec files keeps one): pyarrow lets go of it by taking the GIL itself, which
    # inside the thread state's teardown crashed the process (before: SIGSEGV on the first
    # loader). In a process of its own, so that a crash or a hang fails only this test.
    pytest.importorskip("pyarrow")
    script = tmp_path / "thread_local.py"
    script.write_text(textwrap.dedent("""
        import io, threading
        import pyarrow as pa
        import stoker

        class Files:
            def __init__(self):
                self.local = threading.local()
            def __len__(self):
                return 64
            def __getitem__(self, i):
                if getattr(self.local, "f", None) is None:
                    self.local.f = pa.PythonFile(io.BytesIO(b"x" * 100), mode="r")
                return i

        for _ in range(3):
            loader = stoker.DataLoader(Files(), batch_size=8, num_workers=2,
                                       worker_type="thread")
            assert sorted(int(i) for b in loader for i in b) == list(range(64))
            loader.close()
        print("ok")
    """))
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                          timeout=120)
    assert (done.returncode, done.stdout.strip()) == (0, "ok"), done.stderr[-2000:]


class _MoveAtOnceGilBound(_MoveAtOnce):
    gil_bound = True
    costs = (1e-4, 0.0, 0.0, 0.0)


def _verdicts(*verdicts):
    """check_switch answering `verdicts` in turn, each once the new setting delivered 5
    batches: the move to processes's, then the in-line trial's."""
    left = list(verdicts)

    def check(before, after, left_name, now):
        if after.batches < 5:
            return "measuring", ""
        verdict = left.pop(0)
        return verdict, f"{'kept ' + now if verdict == 'keep' else 'back to ' + left_name}: forced"
    return check


@pytest.mark.skipif(CORES < 2, reason="processes pay only with two cores or more")
@pytest.mark.parametrize("trial", ["keep", "go back"])
def test_auto_tries_in_line_after_settling_on_processes_and_loses_no_sample(monkeypatch, trial):
    # GIL-bound reads moved to processes and kept; the model puts in-line faster (forced), so
    # the training loop reads the batches itself from the next batch on (the processes idle),
    # checked as a switch is: in-line kept (the processes end) or back to the processes (the
    # same ones read on). Either way every sample once, in order, in every epoch.
    from stoker.loader import engine_pipeline

    monkeypatch.setattr(engine_pipeline._stoker, "WorkerKindChooser", _MoveAtOnceGilBound)
    monkeypatch.setattr(engine_pipeline._stoker, "check_switch", _verdicts("keep", trial))
    monkeypatch.setattr(engine_pipeline._stoker, "CHECK_START_SECONDS", 0.0)
    monkeypatch.setattr(engine_pipeline._stoker, "inline_trial",
                        lambda read_s, step_s, now, name: (True, "in-line tried: forced"))
    loader = stoker.DataLoader(wd.CpuBound(400, 200), batch_size=8, num_workers=2)
    values, settings = [], set()
    for b in loader:
        values += [int(x) for x in b[:, 0]]
        settings.add((loader.worker_type, loader.num_workers))
    assert values == list(range(400))
    assert {("process", 2), ("thread", 0)} <= settings  # moved, then in-line tried
    stats = loader.stats()
    (left,) = stats["worker_type_left"]
    if trial == "keep":
        assert (stats["worker_type"], loader.num_workers, stats["worker_pids"]) == ("thread", 0, [])
        assert stats["worker_type_reason"].startswith("auto: kept in-line: forced; before: ")
        assert left["setting"] == "2 worker processes"
    else:
        assert (stats["worker_type"], loader.num_workers) == ("process", 2)
        assert len(stats["worker_pids"]) == 2
        assert stats["worker_type_reason"].startswith(
            "auto: back to 2 worker processes: forced; before: ")
        assert left["setting"] == "in-line" and left["batches"] >= 5
    assert "in-line tried: forced" in stats["worker_type_reason"]
    for _ in range(2):  # settled: the next epochs on it, every sample once
        assert [int(x) for b in loader for x in b[:, 0]] == list(range(400))
    assert loader.stats()["worker_type_left"] == [left]
    loader.close()


@pytest.mark.skipif(CORES < 2, reason="processes pay only with two cores or more")
def test_auto_checks_its_move_to_processes_and_ends_on_a_setting_it_measured():
    # GIL-bound reads: auto moves them to processes, then compares what the processes
    # delivered with what the threads did before (check_switch) and keeps them or goes back,
    # then may try in-line (InlineTrial); every sample once throughout, and the reason names
    # the measured times of each verdict.
    loader = stoker.DataLoader(wd.CpuBound(4000, 2000), batch_size=8)
    reason = ""
    for _ in range(8):
        assert [int(x) for b in loader for x in b[:, 0]] == list(range(4000))
        reason = loader.stats()["worker_type_reason"]
        if reason.startswith(("auto: kept", "auto: back to")) and loader._pipeline._check is None:
            break  # settled: the check's verdict, and the trial's if there was one
    stats = loader.stats()
    if stats["worker_type"] == "thread" and not stats["worker_type_left"] and \
            "worker processes delivered" not in reason:
        pytest.skip(f"auto stayed on threads on this machine: {reason}")
    if not reason.startswith(("auto: kept", "auto: back to")):
        pytest.skip(f"the move was not checked in 8 epochs on this run: {reason}")
    measured = re.search(r"(kept|back to) \d+ worker \w+: (\d+) worker process(?:es)? delivered "
                         r"a batch every \d+\.\d+ ms over (\d+) batches, (\d+) worker threads? "
                         r"every \d+\.\d+ ms over (\d+) \((\d+\.\d+)x the time", reason)
    assert measured, reason
    assert int(measured[3]) >= stoker._stoker.CHECK_MIN_BATCHES and int(measured[5]) >= 3
    processes = f"{measured[2]} worker process{'es' if int(measured[2]) > 1 else ''}"
    left = [d["setting"] for d in stats["worker_type_left"]]
    if measured[1] == "back to":
        assert float(measured[6]) > 1.05
        assert stats["worker_type"] == "thread" and stats["worker_pids"] == []
        assert left[:1] == [processes]
    else:
        assert stats["worker_type"] == "process" or left == [processes], (stats, reason)
    if "in-line tried" in reason:  # its verdict, on top
        assert reason.startswith(("auto: kept in-line: in-line delivered",
                                  "auto: back to ")), reason
        assert (loader.num_workers == 0) == reason.startswith("auto: kept in-line"), reason
        assert ("in-line" in left) != reason.startswith("auto: kept in-line"), (left, reason)
    loader.close()


class _MoveBesideASlowStep(_MoveAtOnce):
    """Two processes forced beside a training loop of a second a batch: the warm processes'
    reads show one is enough (processes_to_keep; its rule is tests/worker_kind_test.cc's)."""

    costs = (0.01, 1.0, 0.0, 0.0)


def test_auto_lets_go_of_the_processes_their_warm_reads_show_are_not_needed(monkeypatch):
    from stoker.loader import engine_pipeline, engine_workers
    from stoker.workers.processes import ProcessWorkers

    monkeypatch.setattr(engine_pipeline._stoker, "check_switch", _never_decided)
    monkeypatch.setattr(engine_pipeline._stoker, "WorkerKindChooser", _MoveBesideASlowStep)
    monkeypatch.setattr(engine_workers, "_WARM_WAIT_S", 120.0)  # a busy machine's warm-up
    retired = []
    retire = ProcessWorkers.retire

    def spy(self, pool, keep):
        retired.extend(p.pid for p in self.processes()[keep:])
        retire(self, pool, keep)

    monkeypatch.setattr(ProcessWorkers, "retire", spy)
    loader = stoker.DataLoader(_NativeWork(), batch_size=8, collate_fn=_pairs_collate)
    for _ in range(3):  # each epoch every batch once, in order, across the move
        assert [i for _, ids in loader for i in ids] == list(range(192))
    stats = loader.stats()
    assert len(retired) == 1 and retired[0] not in stats["worker_pids"]
    assert len(stats["worker_pids"]) == loader.num_workers == 1
    assert re.fullmatch(r"auto: forced; 2 forced; warm, a process's reads took \d+\.\d{3} ms "
                        r"of CPU a batch, so 1 of the 2 kept", stats["worker_type_reason"])
    assert loader.report()["readers"] == "1 process worker(s)"
    loader.close()
    assert not alive(retired[0])
    with pytest.raises(ChildProcessError):  # reaped with the others
        os.waitpid(retired[0], os.WNOHANG)


def test_auto_starts_as_many_processes_as_num_workers_asks_when_given(monkeypatch):
    from stoker.loader import engine_pipeline

    monkeypatch.setattr(engine_pipeline._stoker, "WorkerKindChooser", _MoveAtOnce)
    loader = stoker.DataLoader(_NativeWork(), batch_size=8, collate_fn=_pairs_collate,
                               num_workers=3)
    assert [i for _, ids in loader for i in ids] == list(range(192))
    stats = loader.stats()
    assert len(stats["worker_pids"]) == loader.num_workers == 3
    assert stats["worker_type_reason"] == ("auto: forced; 3 worker process(es), as num_workers "
                                           "asks")
    loader.close()


def test_auto_keeps_threads_for_batches_a_worker_process_could_not_send_back(monkeypatch):
    from stoker.loader import engine_pipeline

    monkeypatch.setattr(engine_pipeline._stoker, "WorkerKindChooser", _MoveAtOnce)

    def with_lock(samples):
        return _pairs_collate(samples), threading.Lock()

    loader = stoker.DataLoader(_NativeWork(), batch_size=8, collate_fn=with_lock)
    for _ in range(2):
        assert [i for (_, ids), _ in loader for i in ids] == list(range(192))
    stats = loader.stats()
    assert stats["worker_type"] == "thread" and not stats["worker_pids"]
    assert "but its batches do not pickle (TypeError" in stats["worker_type_reason"]
    loader.close()


class _WarmPool:
    """A pool of one worker, in this process, whose warm-up call is a real BatchJobs.call."""

    size = 1

    def __init__(self, jobs):
        from stoker.workers.arena import Arenas

        self.arenas, self.jobs = Arenas(), jobs

    def call(self, w, index, args):
        ready = self.jobs.call(index, args, False, self.arenas)
        blob = pickle.dumps(([pickle.dumps(ready)], []))
        return True, False, blob, os.getpid()

    def finish(self):
        pass

    def release(self):
        """The arenas made and mapped here, let go."""
        from stoker.workers import arena

        arena.forget(os.getpid())
        for fd, mm, _ in self.arenas._arenas:
            os.close(fd)
            mm.close()


def test_the_warm_up_makes_batches_until_one_is_steady_and_readies_the_arenas_in_flight():
    from stoker.workers import arena, jobs, warming

    class Loader:
        pool = None

        def use_processes(self, pool):
            self.pool = pool

    made = []
    took = [0.5, 0.4, 0.0, 0.0]  # margins a loaded machine keeps, around steady=0.2
    batch = torch.full((256, 256), 1.0)  # made once: no batch touches new memory but the first

    def collate(samples):
        time.sleep(took[len(made)])
        made.append(samples)
        return batch

    pool = _WarmPool(jobs.BatchJobs(list(range(8)), collate, True, 4))
    loader = Loader()
    w = warming.Warming(loader, pool, [[0], [1], [2], [3]], steady=0.2, hold=3)
    try:
        assert w.wait(30) and loader.pool is pool
        # The third took no longer than a batch job on the threads, and faulted in no memory.
        assert made == [[0], [1], [2]]
        assert list(w.cpu) == [0] and 0 <= w.cpu[0] < 0.4  # its least CPU a batch (it sleeps)
        # Three free arenas of a batch's size, made in the worker and mapped here.
        assert [mm[0] for _, mm, _ in pool.arenas._arenas] == [0, 0, 0]
        assert all(len(mm) >= 256 * 256 * 4 for _, mm, _ in pool.arenas._arenas)
        assert len(arena._mapped[os.getpid()]) == 3
    finally:
        pool.release()


def test_a_top_up_readies_the_arenas_a_kept_worker_now_has_in_flight():
    from stoker.workers import arena, jobs, warming

    # 2 processes at depth 4 need 5 arenas each; one left alone, 8.
    assert (warming.arenas_in_flight(4, 2), warming.arenas_in_flight(4, 1)) == (5, 8)
    pool = _WarmPool(jobs.BatchJobs(list(range(8)), lambda s: torch.full((64, 64), 1.0), True, 4))
    try:
        warming.top_up(pool, [[0], [1]], hold=8)
        assert len(arena._mapped[os.getpid()]) == 8
        assert all(len(mm) >= 64 * 64 * 4 for _, mm, _ in pool.arenas._arenas)
    finally:
        pool.release()


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="glibc's mallopt")
def test_a_worker_keeps_the_heap_its_warm_up_batches_needed():
    # glibc returned it as the warm-up ended (its last batch, freed, was at the heap's top):
    # the worker's first real batch faulted 1,000-1,470 pages in again (4-5.7 MiB; 0 kept).
    script = textwrap.dedent("""
        import pickle, resource, numpy as np, torch
        from stoker.workers import arena, jobs
        jobs.in_worker_process = True  # as main.py sets it: mallopt() in this process only
        lengths = np.random.default_rng(0).integers(16, 257, 512).tolist()
        class Frames:
            def __len__(self):
                return 512
            def __getitem__(self, i):
                return torch.full((lengths[i], 64), float(i)), lengths[i]
        def pad(samples):
            frames = torch.nn.utils.rnn.pad_sequence([x for x, _ in samples], batch_first=True)
            return frames, torch.tensor([n for _, n in samples])
        order = torch.randperm(512, generator=torch.Generator().manual_seed(0)).tolist()
        batches = [order[k:k + 64] for k in range(0, 512, 64)]
        most = 0
        for _ in range(3):  # whether glibc trims depends on the heap's layout: not every time
            work, arenas = jobs.BatchJobs(Frames(), pad, True, 8), arena.Arenas()
            work.call(0, pickle.dumps((batches, 10.0, 3)), False, arenas)
            faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
            arenas.discard(arenas.dumps(work.run(5, batches[5])))
            most = max(most, resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults)
        print(most)
    """)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    assert int(out.stdout) < 256, out.stdout


def test_auto_keeps_threads_for_samples_a_worker_process_could_not_send_back(monkeypatch):
    # A namedtuple made inside a function does not pickle: a worker process could not send
    # such samples back (worker_type='process' raises PicklingError for them), threads can.
    from stoker.loader import engine_pipeline

    monkeypatch.setattr(engine_pipeline._stoker, "WorkerKindChooser", _MoveAtOnce)
    Pair = collections.namedtuple("Pair", "left right")

    class Local(torch.utils.data.Dataset):
        def __len__(self):
            return 24

        def __getitem__(self, i):
            return Pair(np.full(2, i, np.int64), float(i))

    loader = stoker.DataLoader(Local(), batch_size=4, num_workers=2)
    for _ in range(2):
        batches = list(loader)
        assert all(isinstance(b, Pair) for b in batches)
        assert [int(x) for b in batches for x in b.left[:, 0]] == list(range(24))
    stats = loader.stats()
    assert stats["worker_type"] == "thread" and not stats["worker_pids"]
    assert stats["worker_type_reason"].startswith("auto: forced; but its samples do not pickle")
    assert loader.report()["readers_reason"] == stats["worker_type_reason"]
    loader.close()


class _StuckInProcesses(torch.utils.data.Dataset):
    def __len__(self):
        return 64

    def __getitem__(self, i):
        if stoker.workers.jobs.in_worker_process:
            threading.Event().wait()  # a worker process never makes its batch
        return np.full(2, i, dtype=np.int64)


def test_close_during_the_warm_up_stops_its_worker_processes(monkeypatch):
    from stoker.loader import engine_pipeline

    monkeypatch.setattr(engine_pipeline._stoker, "WorkerKindChooser", _MoveAtOnce)
    loader = stoker.DataLoader(_StuckInProcesses(), batch_size=8, collate_fn=lambda s: s)
    it = iter(loader)
    next(it)  # the move: processes started, their warm-up stuck
    pids = loader.stats()["worker_pids"]
    assert pids and loader._pipeline._warming is not None
    loader.close()  # stops the warm-up, then the processes
    assert not any(alive(p) for p in pids)


def test_auto_keeps_whole_batches_that_wait_on_threads():
    loader = stoker.DataLoader(wd.Slow(96, 0.005), batch_size=8, collate_fn=lambda s: s)
    assert [int(x[0]) for b in loader for x in b] == list(range(96))
    stats = loader.stats()
    assert stats["worker_type"] == "thread", stats["worker_type_reason"]
    loader.close()


def test_the_gil_share_counts_the_waits_for_a_core_of_its_holder():
    from stoker._stoker import gil_bound as _gil_bound
    # pure Python on two threads: alone, and with other sessions taking most of the cores
    # (measured: 12-17% of the wall time on a CPU, the rest runnable)
    assert _gil_bound(0.95, 0.95, 0.0) == (True, 1.0)
    assert _gil_bound(0.14, 0.14, 0.6)[0]
    # a 5 ms sleeper: a few percent, and each wake-up waits for a core (at most 6x counted)
    assert _gil_bound(0.05, 0.05, 0.5) == (False, 6.0)
    # work that also runs with the GIL released (torch ops in a cheap sample, ColorJitter):
    # more CPU time than wall time, its Python serialised all the same
    assert _gil_bound(1.24, 1.24, 0.0)[0]
    assert _gil_bound(1.54, 1.54, 0.0)[0]
    assert _gil_bound(0.02, 0.0, 0.0) == (False, 1.0)  # nothing measured: as it is


def test_auto_stays_on_threads_for_a_data_set_that_sleeps(caplog):
    caplog.set_level(logging.INFO, logger="stoker")
    loader = stoker.DataLoader(wd.Slow(96, 0.005), batch_size=8)
    assert [int(x) for b in loader for x in b[:, 0]] == list(range(96))
    stats = loader.stats()
    assert stats["worker_type"] == "thread", stats["worker_type_reason"]
    assert "not GIL-bound" in stats["worker_type_reason"]
    logged = [r.getMessage() for r in caplog.records if r.name == "stoker"]
    assert logged == [f"stoker: thread workers ({stats['worker_type_reason']})"]
    loader.close()


def test_the_tuner_adds_no_threads_that_would_wait_for_the_gil():
    loader = stoker.DataLoader(wd.CpuBound(600, 20000), batch_size=8, worker_type="thread")
    list(loader)
    stats = loader.stats()
    assert stats["worker_lock_held_s"] > 0
    # 2 threads at the start; without the cap it doubled them up to 32 (at most one doubling
    # when other processes on the machine slow the measured GIL use down)
    assert stats["workers"] <= 2 * max(2, CORES)
    loader.close()
