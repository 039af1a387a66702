"""The batch path: collate_fn in the workers (threads and processes), batches of worker
processes in shared memory, streams (iterable data sets): resuming, worker death, shutdown,
and the helpers that split a stream by rank and by worker. Side-by-side checks against torch's
loader are in test_compat.py."""

import collections
import errno
import gc
import multiprocessing
import os
import threading
import time
from pathlib import Path
from unittest import mock

import numpy as np
import pytest
import torch
import torch.utils.data as tud

import stoker
import worker_datasets as wd
from test_workers import alive, memfds

HERE = Path(__file__).resolve().parent


class Pairs(tud.Dataset):
    def __init__(self, n=40):
        self.n = n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        return torch.full((2048,), float(i)), i


def where(samples):
    """A collate_fn that also says which process and thread ran it."""
    x, y = tud.default_collate(samples)
    return x, y, os.getpid(), threading.current_thread().name


def test_collate_fn_runs_in_worker_threads():
    loader = stoker.DataLoader(Pairs(), batch_size=4, num_workers=2, collate_fn=where,
                               worker_type="thread")
    batches = list(loader)
    assert [int(i) for b in batches for i in b[1]] == list(range(40))
    assert {b[2] for b in batches} == {os.getpid()}
    assert threading.current_thread().name not in {b[3] for b in batches}


def test_collate_fn_runs_in_worker_processes_and_its_tensors_come_in_shared_memory():
    gc.collect()
    before = memfds()
    loader = stoker.DataLoader(Pairs(), batch_size=4, num_workers=2, collate_fn=where,
                               worker_type="process")
    it = iter(loader)  # worker processes start with the first epoch, as torch's
    pids = set(loader.stats()["worker_pids"])
    batches = list(it)
    assert [int(i) for b in batches for i in b[1]] == list(range(40))
    assert {b[2] for b in batches} <= pids and os.getpid() not in {b[2] for b in batches}
    assert all(torch.equal(b[0], b[1].float()[:, None].expand(-1, 2048)) for b in batches)
    # The held batches view the workers' arenas (memfds mapped here), not pickled copies.
    assert memfds() > before
    del batches

    def arenas():
        n = 0
        for p in pids:
            for fd in os.listdir(f"/proc/{p}/fd"):
                try:
                    n += os.readlink(f"/proc/{p}/fd/{fd}").startswith("/memfd:stoker-batch")
                except FileNotFoundError:  # closed meanwhile (a message's fds)
                    pass
        return n

    made = arenas()  # as many as batches were alive at once so far, in each worker
    for _ in range(5):  # 50 batches more, freed as they go: their arenas are reused
        assert [int(i) for b in loader for i in b[1]] == list(range(40))
    # A few more at most, not one a batch: a worker whose share of the batches in flight
    # grows makes one (6 more were seen under load, none on a quiet machine).
    assert arenas() - made < 50 // 2
    loader.close()
    gc.collect()
    assert memfds() == before
    assert not any(alive(p) for p in pids)


def test_an_arena_is_mapped_once_and_found_by_the_inode_its_reply_carries():
    from stoker.workers import arena as _arena
    pid = os.getpid()  # this process plays the worker: its arenas are open under /proc/<pid>
    arenas = _arena.Arenas()
    t = torch.arange(4096, dtype=torch.float32)
    got = _arena.loads(arenas.dumps({"x": t}), pid)
    assert torch.equal(got["x"], t)
    del got  # the arena is free again, and the next reply reuses it
    gc.collect()
    # The mapping made for the first reply serves the next: no path lookup per reply.
    with mock.patch("os.open", side_effect=AssertionError("mapped again")), \
            mock.patch("os.stat", side_effect=AssertionError("looked up again")):
        again = _arena.loads(arenas.dumps({"x": t + 1}), pid)
    assert torch.equal(again["x"], t + 1)
    del again
    gc.collect()
    blob = arenas.dumps({"x": t + 2})
    assert len(arenas._arenas) == 1  # one arena served every reply
    # The worker is gone and another process has a different memfd at the same fd number:
    # the reply's inode tells them apart, and nothing of the stranger's is mapped.
    fd = arenas._arenas[0][0]
    _arena.forget(pid)
    stranger = os.memfd_create("other", 0)
    try:
        os.dup2(stranger, fd)
        with pytest.raises(OSError, match="no longer holds"):
            _arena.loads(blob, pid)
    finally:
        os.close(stranger)
        os.close(fd)
    with pytest.raises(OSError, match="no longer holds") as info:  # the fd is gone, too
        _arena.loads(blob, pid)
    assert info.value.errno == errno.ESRCH


def test_every_dtype_and_shape_comes_back_from_an_arena_as_it_went_in():
    from stoker.workers import arena as _arena
    pid = os.getpid()
    arenas = _arena.Arenas()
    base = torch.arange(-60, 60).reshape(2, 3, 20)
    # Those numpy has (one torch call builds the view) and those it lacks (bfloat16, ...).
    leaves = {str(d): base.to(d) for d in (
        torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int8, torch.uint8,
        torch.int16, torch.int32, torch.int64, torch.bool, torch.complex64)}
    leaves["uint16"] = base.abs().to(torch.uint16)
    leaves["empty"] = torch.zeros(0, 5)
    leaves["scalar"] = torch.tensor(3.5)
    leaves["strided"] = base.float().transpose(0, 2)
    leaves["numpy"] = base.numpy().astype(np.float32).repeat(50, axis=2)
    got = _arena.loads(arenas.dumps(leaves), pid)
    for name, want in leaves.items():
        if isinstance(want, np.ndarray):
            assert got[name].dtype == want.dtype and np.array_equal(got[name], want), name
        else:
            assert got[name].dtype == want.dtype and got[name].shape == want.shape, name
            assert torch.equal(got[name], want), name
    del got
    _arena.forget(pid)


@pytest.mark.parametrize("workers,worker_type", [(0, "thread"), (2, "thread"), (2, "process")])
def test_a_stream_saved_after_its_short_last_batch_resumes_at_the_epochs_end(workers,
                                                                              worker_type):
    # The short last batch ends the data set's pass, and Counting resets its state then: the
    # saved position must say the stream ended, or the restored loader would read it again.
    def loader():
        return stoker.DataLoader(wd.Counting(9), batch_size=2, num_workers=workers,
                                 worker_type=worker_type)

    whole = [b[:, 0].tolist() for b in loader()]
    assert sorted(x for b in whole for x in b) == list(range(9)) and len(whole[-1]) == 1
    first = loader()
    it = iter(first)
    assert [next(it)[:, 0].tolist() for _ in whole] == whole  # every batch, not StopIteration
    state = first.state_dict()
    first.close()
    second = loader()
    second.load_state_dict(state)
    assert [b[:, 0].tolist() for b in second] == []  # the epoch had ended
    assert [b[:, 0].tolist() for b in second] == whole  # then the next one, whole
    second.close()


@pytest.mark.parametrize("workers,worker_type", [(0, "thread"), (2, "thread"), (2, "process")])
def test_a_stateful_stream_resumes_mid_epoch(workers, worker_type):
    def loader():
        return stoker.DataLoader(wd.Counting(), batch_size=3, num_workers=workers,
                                 worker_type=worker_type)

    whole = [b[:, 0].tolist() for b in loader()]
    first = loader()
    it = iter(first)
    head = [next(it)[:, 0].tolist() for _ in range(4)]
    state = first.state_dict()
    first.close()
    second = loader()
    second.load_state_dict(state)
    rest = [b[:, 0].tolist() for b in second]
    assert head + rest == whole
    assert [b[:, 0].tolist() for b in second] == whole  # then the next epoch from its start
    second.close()


@pytest.mark.parametrize("workers", [0, 1, 2])
def test_a_stream_on_auto_reads_epoch_1_in_line_then_as_chosen(monkeypatch, tmp_path, workers):
    # The choice itself is choose_stream_workers' (tests/worker_kind_test.cc); here it is
    # forced (the processes' start paid for at once, their check never done), and each epoch
    # must still read the whole stream once, in order (with 2 workers taking turns, torch's
    # order: the stream takes its share by get_worker_info()).
    from stoker.loader import stream_pipeline

    asked = []

    def choose(read, step, pack, unpack, cores, shards):
        asked.append((read, step, pack, unpack, cores, shards))
        return workers, f"auto: chose {workers} (forced)"

    monkeypatch.setattr(stream_pipeline._stoker, "choose_stream_workers", choose)
    monkeypatch.setattr(stream_pipeline._stoker, "stream_thread_trial",
                        lambda *a: (0, "no thread tried (forced)"))
    monkeypatch.setattr(stream_pipeline._stoker, "PROCESS_START_SECONDS", 0.0)
    monkeypatch.setattr(stream_pipeline._stoker, "check_switch", lambda *a: ("measuring", ""))
    loader = stoker.DataLoader(wd.Counting(40), batch_size=2)
    loader.trace(str(tmp_path / "trace.json"))
    assert (loader.num_workers, loader.stats()["worker_type_reason"]) == (
        0, "auto: epoch 1 read in-line and measured, to choose in-line, threads or processes")
    whole = list(range(40))
    # Two workers: worker 0's batches [0, 2], [4, 6], ... in turn with worker 1's [1, 3], ...
    turns = [x for b in range(0, 40, 4) for x in (b, b + 2, b + 1, b + 3)]
    for epoch in range(3):
        assert [x for b in loader for x in b[:, 0].tolist()] == (
            turns if epoch and workers == 2 else whole)
        assert loader.num_workers == (0 if epoch == 0 else workers)
        assert len(loader.stats()["worker_pids"]) == (0 if epoch == 0 else workers)
    # Decided once, at epoch 2's start, on times measured over epoch 1's batches after its
    # first: read, step and the hand-over's two sides, none negative; Counting asks
    # get_worker_info() as it begins (it takes its worker's share).
    assert len(asked) == 1 and min(asked[0][:4]) >= 0 and asked[0][4] >= 1
    assert asked[0][5] is True
    # With processes, the reason goes on with the start's cost against the saving.
    reason = loader.stats()["worker_type_reason"]
    assert reason.startswith(f"auto: chose {workers} (forced)")
    assert ("threads would save under 10% of the in-line time" in reason) == (workers == 0)
    assert not workers or "and starting them costs about 0 ms" in reason
    report = loader.report()
    assert report["readers"] == (f"{workers} process worker(s)" if workers else "read in-line")
    assert f"{report['readers']}: {reason}; reproducible: " in str(report)
    loader.close()  # writes the trace: the decision is on it
    import json

    names = [e["name"] for e in json.loads((tmp_path / "trace.json").read_text())["traceEvents"]]
    assert f"workers: {reason}" in names


class _Fetching(torch.utils.data.IterableDataset):
    """A stream that takes its worker's share and waits 2 ms for each sample (a fetch)."""

    def __iter__(self):
        info = torch.utils.data.get_worker_info()
        w, k = (info.id, info.num_workers) if info is not None else (0, 1)
        for i in range(w, 40, k):
            time.sleep(0.002)
            yield np.full(2, i, dtype=np.int64)


def test_a_stream_whose_reads_wait_moves_to_worker_threads_on_auto_and_keeps_them():
    # choose_stream_threads (tests/worker_kind_test.cc) on real timings: epoch 1 in-line, its
    # reads almost all off the CPU; then threads, at once (nothing to start), each overlapping
    # its share's waits; checked like a move to processes, and kept.
    loader = stoker.DataLoader(_Fetching(), batch_size=2)
    assert sorted(x for b in loader for x in b[:, 0].tolist()) == list(range(40))
    assert loader.num_workers == 0
    for _ in range(6):
        assert sorted(x for b in loader for x in b[:, 0].tolist()) == list(range(40))
    reason = loader.stats()["worker_type_reason"]
    # 8 threads where the reads' CPU and the loop's step are under an eighth of the waits (a
    # quiet machine); fewer where they are more.
    n = loader.num_workers
    assert loader.worker_type == "thread" and 2 <= n <= 8, reason
    assert f"auto: kept {n} worker threads: {n} worker threads delivered a batch every" in reason
    assert f"auto: {n} worker threads from the next epoch (read in-line, a batch took" in reason
    assert loader.stats()["worker_pids"] == []
    loader.close()


class _NeverAsks(torch.utils.data.IterableDataset):
    """A stream that does not take a worker's share: every worker would read all of it."""

    def __iter__(self):
        return iter(np.full(2, i, dtype=np.int64) for i in range(40))


class _AsksInIter(torch.utils.data.IterableDataset):
    """A stream whose __iter__ (not a generator) asks get_worker_info() before it returns."""

    def __iter__(self):
        info = torch.utils.data.get_worker_info()
        w, k = (info.id, info.num_workers) if info is not None else (0, 1)
        return iter(np.full(2, i, dtype=np.int64) for i in range(w, 40, k))


@pytest.mark.parametrize("dataset, shards", [(_NeverAsks(), False), (_AsksInIter(), True),
                                             (wd.Counting(40), True)])
def test_a_stream_on_auto_is_told_whether_it_asked_get_worker_info(monkeypatch, dataset,
                                                                   shards):
    # Asked in __iter__ or in a generator's first step, not by torch's default_collate (which
    # asks get_worker_info() for every batch); in-line the stream still gets None.
    from stoker.loader import stream_pipeline

    asked = []
    monkeypatch.setattr(stream_pipeline._stoker, "choose_stream_workers",
                        lambda *a: asked.append(a[5]) or (0, "auto: in-line (forced)"))
    monkeypatch.setattr(stream_pipeline._stoker, "stream_thread_trial",
                        lambda *a: (0, "no thread tried (forced)"))
    loader = stoker.DataLoader(dataset, batch_size=2)
    assert [x for b in loader for x in b[:, 0].tolist()] == list(range(40))
    list(loader)
    # Told the same at each ask: mid-epoch 1 (whether processes start early) and at its end.
    assert asked and set(asked) == {shards}, asked
    assert torch.utils.data.get_worker_info() is None
    loader.close()


def test_a_stream_whose_batches_do_not_pickle_stays_in_line_on_auto(monkeypatch):
    # A batch holding a lock cannot be handed over by a worker process: auto keeps the
    # stream in-line, and says why, rather than fail while timing a hand-over. (A thread,
    # which pickles nothing, may be tried where it would pay: not here, where the question is
    # the processes; on a busy machine the trial was taken once.)
    from stoker.loader import stream_pipeline

    monkeypatch.setattr(stream_pipeline._stoker, "stream_thread_trial",
                        lambda *a: (0, "no thread tried (forced)"))

    def with_lock(samples):
        return torch.as_tensor(np.stack(samples)), threading.Lock()

    loader = stoker.DataLoader(wd.Counting(40), batch_size=2, collate_fn=with_lock)
    for _ in range(2):
        assert [x for b, _ in loader for x in b[:, 0].tolist()] == list(range(40))
    assert loader.num_workers == 0
    assert "its batches do not pickle" in loader.stats()["worker_type_reason"]
    loader.close()


def test_a_short_stream_on_auto_measures_over_epochs_until_enough_batches(monkeypatch):
    from stoker.loader import stream_pipeline

    asked = []
    monkeypatch.setattr(stream_pipeline._stoker, "choose_stream_workers",
                        lambda *a: asked.append(a) or (0, "auto: in-line (forced)"))
    monkeypatch.setattr(stream_pipeline._stoker, "stream_thread_trial",
                        lambda *a: (0, "no thread tried (forced)"))
    loader = stoker.DataLoader(wd.Counting(12), batch_size=2)  # 6 batches: 5 measured each
    list(loader)
    list(loader)
    assert asked == []  # 5 batches measured, fewer than STREAM_MIN_BATCHES
    list(loader)
    assert len(asked) == 1 and stoker._stoker.STREAM_MIN_BATCHES <= 10
    loader.close()


def test_the_hand_over_probe_times_both_sides_and_leaves_no_memfd():
    from stoker.workers import arena

    before = memfds()
    batch = {"x": torch.arange(4096, dtype=torch.float32).reshape(64, 64),
             "n": np.arange(2048, dtype=np.int64), "name": "a"}
    pack, unpack = arena.handover_cost(batch)
    assert pack > 0 and unpack > 0
    assert memfds() == before
    assert batch["x"][63, 63] == 4095  # the batch itself untouched


def test_a_stream_without_state_dict_says_it_cannot_resume():
    class Plain(tud.IterableDataset):
        def __iter__(self):
            return iter(range(10))

    loader = stoker.DataLoader(Plain(), batch_size=2, num_workers=1)
    assert loader.state_dict()["stream"] is None  # between epochs: nothing to resume
    it = iter(loader)
    next(it)
    with pytest.raises(TypeError, match="Stateful"):
        loader.state_dict()
    loader.close()


@pytest.mark.parametrize("on_error", ["raise", "skip"])
def test_a_batch_job_that_kills_every_worker_fails_alone(tmp_path, on_error):
    # Batch jobs (a collate_fn): a worker killed once is replaced and its batches read again;
    # a batch that kills the new worker too fails by itself (skip: is replaced by another).
    once = stoker.DataLoader(wd.KillsItself(20, str(tmp_path / "k"), n=64), batch_size=8,
                             num_workers=2, worker_type="process", collate_fn=wd.stack)
    assert [int(x) for b in once for x in b[:, 0]] == list(range(64))
    assert once.stats()["worker_deaths"] == 1
    once.close()
    loader = stoker.DataLoader(wd.AlwaysKills([20], n=64), batch_size=8, num_workers=2,
                               worker_type="process", collate_fn=wd.stack, on_error=on_error)
    if on_error == "raise":
        got = []
        with pytest.raises(stoker.WorkerError, match="batches lost: 2$"):
            for batch in loader:
                got.append(batch)
        assert [int(x) for b in got for x in b[:, 0]] == list(range(16))
    else:
        firsts = [int(b[0, 0]) for b in loader]
        assert len(firsts) == 8 and 16 not in firsts
    loader.close()


def test_a_worker_killed_mid_stream_is_reported_and_the_others_go_on():
    loader = stoker.DataLoader(wd.StreamKillsItself(), batch_size=2, num_workers=2,
                               worker_type="process")
    for _ in range(2):  # the killed worker is started afresh for the next epoch
        got = []
        it = iter(loader)
        with pytest.raises(stoker.WorkerError, match="killed by signal: Killed") as info:
            for batch in it:
                got.append(batch[:, 0].tolist())
        assert "stream (worker 0) is lost" in str(info.value)
        got += [b[:, 0].tolist() for b in it]
        # Worker 0 dies making its second batch; its first may have been made but not sent.
        assert [b for b in got if b[0] < 100] in ([], [[0, 1]])
        assert [b for b in got if b[0] >= 100] == [[100, 101], [102, 103], [104, 105],
                                                   [106, 107]]
    loader.close()


@pytest.mark.parametrize("how", ["close", "gc"])
def test_close_and_gc_mid_stream_leave_no_process_no_thread_and_no_memfd(how):
    gc.collect()
    before, threads = memfds(), threading.active_count()

    class Endless(tud.IterableDataset):
        def __iter__(self):
            while True:
                yield torch.zeros(4096)

    loader = stoker.DataLoader(Endless(), batch_size=4, num_workers=2, worker_type="process")
    it = iter(loader)
    held = next(it)
    pids = loader.stats()["worker_pids"]
    assert all(alive(p) for p in pids)
    if how == "close":
        loader.close()
    else:
        del it, loader
        gc.collect()
    del held
    gc.collect()
    assert not any(alive(p) for p in pids) and not multiprocessing.active_children()
    assert memfds() == before and threading.active_count() == threads


def test_split_by_rank_and_by_worker():
    assert list(stoker.split_by_rank(range(10), rank=1, world_size=3)) == [1, 4, 7]
    assert list(stoker.split_by_worker(range(5))) == list(range(5))  # not in a worker

    class Sharded(tud.IterableDataset):
        def __init__(self, rank):
            self.rank = rank

        def __iter__(self):
            mine = stoker.split_by_rank(range(24), rank=self.rank, world_size=2)
            return (torch.tensor(i) for i in stoker.split_by_worker(mine))

    seen = []
    for rank in (0, 1):
        loader = stoker.DataLoader(Sharded(rank), batch_size=None, num_workers=2)
        seen.append(sorted(int(x) for x in loader))
    assert seen[0] == list(range(0, 24, 2)) and seen[1] == list(range(1, 24, 2))


def test_a_map_style_batch_path_resumes_with_state_dict():
    data = Pairs(30)
    first = stoker.DataLoader(data, batch_size=4, shuffle=True, collate_fn=tud.default_collate,
                              seed=7)
    whole = [y.tolist() for _, y in first]
    it = iter(first)
    head = [next(it)[1].tolist() for _ in range(3)]
    state = first.state_dict()
    second = stoker.DataLoader(data, batch_size=4, shuffle=True,
                               collate_fn=tud.default_collate, seed=7)
    second.load_state_dict(state)
    rest = [y.tolist() for _, y in second]
    assert sorted(i for b in head + rest for i in b) == list(range(30))
    assert [len(b) for b in head + rest] == [4] * 7 + [2]
    assert whole != head + rest  # the next epoch's order: shuffled again


@pytest.mark.parametrize("worker_type", ["thread", "process"])
def test_a_failing_worker_init_fn_ends_that_workers_stream_with_its_error(worker_type):
    def init(worker_id):
        if worker_id == 1:
            raise OSError("no shard for worker 1")

    loader = stoker.DataLoader(wd.Counting(12), batch_size=2, num_workers=2, worker_init_fn=init,
                               worker_type=worker_type)
    got = []
    it = iter(loader)
    with pytest.raises(OSError, match="no shard for worker 1"):
        for batch in it:
            got.append(batch[:, 0].tolist())
    got += [b[:, 0].tolist() for b in it]  # worker 0's stream goes on to its end
    assert got == [[0, 2], [4, 6], [8, 10]]
    loader.close()


def test_a_stream_that_stalls_raises_timeout():
    class Stalls(tud.IterableDataset):
        def __iter__(self):
            yield torch.tensor(0)
            threading.Event().wait(2)
            yield torch.tensor(1)

    loader = stoker.DataLoader(Stalls(), batch_size=None, num_workers=1, worker_type="thread",
                               timeout=0.2)
    it = iter(loader)
    assert int(next(it)) == 0
    with pytest.raises(RuntimeError, match="timed out after 0.2 seconds"):
        next(it)
    loader.close()


def test_gc_mid_epoch_of_a_collate_fn_loader_over_processes():
    gc.collect()
    before = memfds()
    loader = stoker.DataLoader(Pairs(400), batch_size=8, num_workers=2,
                               collate_fn=tud.default_collate, worker_type="process")
    it = iter(loader)
    held = next(it)
    pids = loader.stats()["worker_pids"]
    del it, loader
    gc.collect()
    assert not any(alive(p) for p in pids) and not multiprocessing.active_children()
    # A batch handed out stays valid: its mapping outlives the worker that wrote it.
    assert torch.equal(held[1], torch.arange(8)) and float(held[0][7, 5]) == 7.0
    del held
    gc.collect()
    assert memfds() == before


@pytest.mark.parametrize("worker_type", ["thread", "process"])
def test_shuffled_batch_jobs_visit_every_sample_once_per_epoch(worker_type):
    loader = stoker.DataLoader(Pairs(30), batch_size=4, shuffle=True, num_workers=2,
                               collate_fn=tud.default_collate, worker_type=worker_type)
    epochs = [[int(i) for _, y in loader for i in y] for _ in range(2)]
    assert all(sorted(e) == list(range(30)) for e in epochs)
    assert epochs[0] != epochs[1] and len(loader) == 8
    loader.close()


class _Counted:
    """A collate_fn counting its batches in a counter worker processes share (fork)."""

    def __init__(self):
        self.count = multiprocessing.get_context("fork").Value("i", 0)

    def __call__(self, samples):
        with self.count.get_lock():
            self.count.value += 1
        return list(samples)


def _epochs(loader, epochs, draw_between=False):
    """Each epoch's batches, the training loop slower than the reads (so that the next
    epoch's first batches are read before it starts), drawing from torch's default generator
    between epochs if asked (as a training step's dropout does)."""
    out = []
    for _ in range(epochs):
        batches = []
        for batch in loader:
            batches.append(batch)
            time.sleep(0.004)
        out.append(batches)
        if draw_between:
            torch.rand(1)
    return out


@pytest.mark.parametrize("worker_type", ["thread", "process"])
@pytest.mark.parametrize("draw_between", [False, True])
def test_batches_read_ahead_into_the_next_epoch_are_kept_if_its_iter_draws_them(
        worker_type, draw_between):
    # Each epoch's batches are drawn at its iter(), as torch draws them; the next epoch's are
    # also drawn ahead of it (the draws undone) and read before it starts: kept when iter()
    # draws the same, dropped when the generator moved in between.
    collate = _Counted()
    torch.manual_seed(0)
    theirs = _epochs(tud.DataLoader(list(range(40)), batch_size=4, shuffle=True,
                                    collate_fn=collate), 3, draw_between)
    collate.count.value = 0
    torch.manual_seed(0)
    loader = stoker.DataLoader(list(range(40)), batch_size=4, shuffle=True, num_workers=2,
                               prefetch_factor=2, collate_fn=collate, worker_type=worker_type)
    assert _epochs(loader, 3, draw_between) == theirs
    loader.close()
    if not draw_between:  # each batch read once, and up to 4 (2 x 2) of a fourth epoch
        assert 30 <= collate.count.value <= 34


def test_batches_read_before_their_epochs_batches_were_drawn_are_read_again():
    # Epochs of 2 batches and 16 read ahead: the engine reads batches of the epoch after the
    # next, whose batches are not drawn yet (reads of None), and drops them as it starts.
    torch.manual_seed(0)
    theirs = _epochs(tud.DataLoader(list(range(8)), batch_size=4, shuffle=True,
                                    collate_fn=list), 6)
    torch.manual_seed(0)
    loader = stoker.DataLoader(list(range(8)), batch_size=4, shuffle=True, num_workers=2,
                               prefetch_factor=8, collate_fn=list, worker_type="thread")
    assert _epochs(loader, 6) == theirs
    loader.close()


def test_the_device_step_reaches_tensors_in_any_nesting():
    # What device= does to a collate_fn's output (CUDA itself is not on this machine): every
    # tensor is mapped, containers keep their types, other leaves stay as they are.
    Pair = collections.namedtuple("Pair", "x name")
    batch = {"a": [torch.zeros(2), (torch.ones(1), "s")], "b": Pair(torch.ones(3), 7)}
    moved = stoker.loader.collate._tree_map(batch, lambda t: t + 1)
    assert type(moved) is dict and type(moved["a"][1]) is tuple and type(moved["b"]) is Pair
    assert torch.equal(moved["a"][0], torch.ones(2)) and moved["a"][1][1] == "s"
    assert torch.equal(moved["b"].x, torch.full((3,), 2.0)) and moved["b"].name == 7
    assert stoker.loader.collate.mover(stoker._stoker.Device("cpu"), False)(batch) is batch


@pytest.mark.parametrize("worker_type", ["thread", "process"])
def test_a_batch_job_fetches_with_one_getitems_call_as_torch(worker_type):
    data = wd.Batched(20)
    theirs = list(tud.DataLoader(data, batch_sampler=[[0, 1, 2], [3], [4, 5, 6, 7]],
                                 num_workers=2))
    ours = list(stoker.DataLoader(data, batch_sampler=[[0, 1, 2], [3], [4, 5, 6, 7]],
                                  num_workers=2, worker_type=worker_type))
    for a, b in zip(theirs, ours, strict=True):
        assert torch.equal(a["i"], b["i"]) and torch.equal(a["group"], b["group"])
    assert [b["group"].tolist() for b in ours] == [[3, 3, 3], [1], [4, 4, 4, 4]]


def test_streams_and_batch_jobs_under_spawn():
    # The jobs (data set, collate) are pickled into spawned workers.
    stream = stoker.DataLoader(wd.Counting(12), batch_size=2, num_workers=2,
                               worker_type="process", multiprocessing_context="spawn")
    assert [b[:, 0].tolist() for b in stream] == [[0, 2], [1, 3], [4, 6], [5, 7], [8, 10],
                                                  [9, 11]]
    stream.close()
    jobs = stoker.DataLoader(wd.Batched(8), batch_sampler=[[0, 1], [2, 3, 4]], num_workers=1,
                             worker_type="process", multiprocessing_context="spawn")
    assert [b["i"].tolist() for b in jobs] == [[0, 1], [2, 3, 4]]
    jobs.close()


def test_a_stream_reads_whole_after_set_epoch_goes_back():
    loader = stoker.DataLoader(wd.Counting(8), batch_size=2, num_workers=2,
                               worker_type="process")
    whole = [b[:, 0].tolist() for b in loader]
    loader.set_epoch(0)  # an earlier epoch number: still a new pass for the workers
    assert [b[:, 0].tolist() for b in loader] == whole == [[0, 2], [1, 3], [4, 6], [5, 7]]
    loader.close()
