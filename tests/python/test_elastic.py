"""Resuming an epoch on another topology (docs/python.md, "Resuming on a different topology"):
the ranks' states merged into one restore on other ranks, workers, worker kinds or batch
sizes with every sample of the epoch read once in total, and without reading again what was
consumed."""
import json
import os
import pathlib
import subprocess
import sys
import threading
from collections import Counter

import pytest

torch = pytest.importorskip("torch")

import stoker  # noqa: E402

ROOT = pathlib.Path(__file__).resolve().parents[2]
N = 403


class Indices(torch.utils.data.Dataset):
    """Sample i is i; remembers which samples were read (threads share it)."""

    def __init__(self, n=N):
        self.n = n
        self.reads = []
        self.lock = threading.Lock()

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        with self.lock:
            self.reads.append(i)
        return torch.tensor(i)


def loader_for(ds, rank, world, batch_size, **kw):
    sampler = stoker.DistributedSampler(ds, num_replicas=world, rank=rank, shuffle=True,
                                        seed=5)
    if kw.get("num_workers", 1):
        kw.setdefault("worker_type", "thread")  # reads recorded in this process
    return stoker.DataLoader(ds, batch_size=batch_size, sampler=sampler, **kw), sampler


def checkpoint(world, batch_size, stops, epoch=1, **kw):
    """Each rank reads stops[r] batches of `epoch`; returns (samples seen, states)."""
    seen, states = [], []
    for r in range(world):
        loader, sampler = loader_for(Indices(), r, world, batch_size, **kw)
        sampler.set_epoch(epoch)
        it = iter(loader)
        for _ in range(stops[r]):
            seen += next(it).tolist()
        states.append(loader.state_dict())
        loader.close()
    return seen, states


def finish(state, world, batch_size, **kw):
    """The rest of the epoch on `world` ranks restored from `state`: (samples, next epoch's
    samples per rank, samples read again that were consumed)."""
    rest, nxt = [], []
    for r in range(world):
        ds = Indices()
        loader, sampler = loader_for(ds, r, world, batch_size, **kw)
        loader.load_state_dict(state)
        rank_rest = [x for b in loader for x in b.tolist()]
        rest += rank_rest
        reads_in_rest = list(ds.reads)
        sampler.set_epoch(state["epoch"] + 1)
        nxt.append([x for b in loader for x in b.tolist()])
        loader.close()
        if kw.get("worker_type") != "process":
            # Nothing consumed read again: every read is of the rest, or the next epoch's
            # prefetch.
            extra = Counter(reads_in_rest) - Counter(rank_rest)
            assert not Counter(rank_rest) - Counter(reads_in_rest)
            assert not extra - Counter(nxt[-1])
    return rest, nxt


def exactly_once(seen, rest, repeats):
    every = seen + rest
    assert set(every) == set(range(N))
    assert len(every) - N <= repeats  # the padding's repeats, as in any epoch


@pytest.mark.parametrize("world2, batch2, kw2", [
    (3, 6, dict(num_workers=2)),
    (2, 8, dict(num_workers=2, worker_type="process")),
    (1, 32, dict(num_workers=0)),
])
def test_four_ranks_resume_on_fewer_every_sample_once(world2, batch2, kw2):
    seen, states = checkpoint(4, 8, [3, 4, 3, 2], num_workers=3)
    merged = stoker.merge_states(reversed(states))  # any order
    assert merged["merged"] and len(merged["consumed"]) < 20  # small: ranges, not samples
    assert len(json.dumps(merged)) < 2000
    rest, nxt = finish(merged, world2, batch2, **kw2)
    exactly_once(seen, rest, repeats=1 + world2 - 1)
    # The next epoch is a fresh one on the new topology.
    fresh = []
    for r in range(world2):
        ds = Indices()
        loader, sampler = loader_for(ds, r, world2, batch2, num_workers=0)
        sampler.set_epoch(2)
        fresh.append([x for b in loader for x in b.tolist()])
    assert nxt == fresh


def test_the_same_global_batch_gives_the_uninterrupted_runs_batches():
    # 4 ranks x 8 (global batch 32) stopped after 3 steps; 2 ranks x 16 go on.
    seen, states = checkpoint(4, 8, [3, 3, 3, 3])
    merged = stoker.merge_states(states)
    full = []
    for r in range(4):
        loader, sampler = loader_for(Indices(), r, 4, 8, num_workers=0)
        sampler.set_epoch(1)
        full.append([b.tolist() for b in loader])
    resumed = []
    for r in range(2):
        loader, _ = loader_for(Indices(), r, 2, 16, num_workers=1)
        loader.load_state_dict(merged)
        resumed.append([b.tolist() for b in loader])
    full_steps = len(full[0])
    for step in range(3, full_steps - 1):  # the last step holds the padding
        want = {x for r in range(4) for x in full[r][step]}
        got = {x for r in range(2) for x in resumed[r][step - 3]}
        assert got == want, step


def test_resumed_twice_and_saved_mid_resumed_epoch_on_the_same_topology():
    seen, states = checkpoint(4, 8, [2, 2, 2, 2], num_workers=2)
    merged = stoker.merge_states(states)
    # 3 ranks read a bit of the rest and are checkpointed again.
    states2 = []
    for r in range(3):
        loader, _ = loader_for(Indices(), r, 3, 8, num_workers=2)
        loader.load_state_dict(merged)
        it = iter(loader)
        for _ in range(r + 1):
            seen += next(it).tolist()
        states2.append(loader.state_dict())
        loader.close()
    # Rank 1 of 3 restores its own state (same topology) before the merge: same batches.
    loader, _ = loader_for(Indices(), 1, 3, 8, num_workers=1)
    loader.load_state_dict(states2[1])
    own = [x for b in loader for x in b.tolist()]
    rest, _ = finish(stoker.merge_states(states2), 2, 8, num_workers=2)
    exactly_once(seen, rest, repeats=3)
    assert set(own) <= set(rest) | set(seen)


def test_one_ranks_state_restores_with_another_batch_size_and_workers():
    seen, states = checkpoint(1, 10, [7], num_workers=2)
    rest, _ = finish(states[0], 1, 7, num_workers=2, worker_type="process")
    exactly_once(seen, rest, repeats=0)


def test_a_finished_epoch_merges_to_the_next_one():
    seen, states = checkpoint(2, 8, [26, 26])  # 202 samples per rank: 26 batches, all
    merged = stoker.merge_states(states)
    assert merged["epoch"] == 2 and merged["consumed"] == []


def test_what_cannot_resume_elsewhere_says_why():
    _, states = checkpoint(4, 8, [1, 1, 1, 1])
    loader, _ = loader_for(Indices(), 0, 3, 8)
    with pytest.raises(ValueError, match="merge_states"):
        loader.load_state_dict(states[0])  # one rank's state of 4, on 3 ranks
    with pytest.raises(ValueError, match="ranks \\[2\\] are missing"):
        stoker.merge_states([states[0], states[1], states[3]])
    with pytest.raises(ValueError, match="two states of rank 1"):
        stoker.merge_states([states[0], states[1], states[1], states[3]])
    _, later = checkpoint(4, 8, [2, 2, 2, 2], epoch=3)
    with pytest.raises(ValueError, match="epoch"):
        stoker.merge_states(states[:2] + later[2:])
    merged = stoker.merge_states(states)
    other = stoker.DataLoader(Indices(), batch_size=8, shuffle=True, seed=6)
    with pytest.raises(ValueError, match="seed"):
        other.load_state_dict(merged)
    with pytest.raises(ValueError, match="403 samples"):
        stoker.DataLoader(Indices(400), batch_size=8, shuffle=True, seed=5).load_state_dict(
            merged)
    custom = stoker.DataLoader(Indices(), batch_size=8, sampler=list(range(N)))
    with pytest.raises(ValueError, match="custom sampler"):
        custom.load_state_dict(merged)

    class Stream(torch.utils.data.IterableDataset):  # Stateful, but its state is its own
        def __init__(self):
            self.at = 0

        def __iter__(self):
            while self.at < 10:
                self.at += 1
                yield self.at

        def state_dict(self):
            return {"at": self.at}

        def load_state_dict(self, state):
            self.at = state["at"]

    stream = stoker.DataLoader(Stream(), batch_size=2, num_workers=2, worker_type="thread")
    it = iter(stream)
    next(it)
    state = stream.state_dict()
    with pytest.raises(ValueError, match="workers' own"):
        stoker.merge_states([state])
    with pytest.raises(ValueError, match="map-style"):
        stoker.merge_states([state, states[0]])
    stream.close()


def test_a_state_saved_before_the_epoch_began_resumes_at_its_start():
    loader, sampler = loader_for(Indices(), 0, 2, 8)
    sampler.set_epoch(4)
    state = loader.state_dict()
    merged = stoker.merge_states([state, dict(state, rank=1)])
    assert merged["epoch"] == 4 and merged["consumed"] == []
    single = stoker.DataLoader(Indices(), batch_size=8, shuffle=True, seed=5)
    single.load_state_dict(merged)
    assert sorted(x for b in single for x in b.tolist()) == list(range(N))


def test_torchrun_four_ranks_save_three_ranks_resume(tmp_path):
    env = dict(os.environ, OMP_NUM_THREADS="1")
    job = str(ROOT / "tests" / "python" / "elastic_job.py")

    def torchrun(n, *args):
        r = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone",
                            f"--nproc_per_node={n}", job, *args, str(tmp_path)],
                           capture_output=True, text=True, timeout=300, env=env)
        assert r.returncode == 0, r.stdout + r.stderr

    torchrun(4, "save", "--stop", "5")
    torchrun(3, "resume", "--worker-type", "process")
    seen = [x for r in range(4) for x in json.loads((tmp_path / f"save{r}.json").read_text())]
    resumed = [json.loads((tmp_path / f"resume{r}.json").read_text()) for r in range(3)]
    rest = [x for r in resumed for x in r["rest"]]
    every = seen + rest
    assert set(every) == set(range(1000)) and len(every) - 1000 <= 2
    assert all(r["workers"] == "process" for r in resumed)
    nxt = [x for r in resumed for x in r["next"]]
    assert set(nxt) == set(range(1000)) and len(nxt) == 1002  # epoch 2 on 3 ranks, padded


def test_a_native_data_set_resumes_on_another_topology():
    np = pytest.importorskip("numpy")
    ds = stoker.ArrayDataset(np.arange(N, dtype=np.int64))

    def make(r, w, b):
        s = stoker.DistributedSampler(ds, num_replicas=w, rank=r, shuffle=True, seed=5)
        return stoker.DataLoader(ds, batch_size=b, sampler=s), s

    seen, states = [], []
    for r in range(4):
        loader, sampler = make(r, 4, 8)
        sampler.set_epoch(1)
        it = iter(loader)
        for _ in range(3 + r % 2):
            seen += next(it)[0].tolist()  # a batch: one field
        states.append(loader.state_dict())
    merged = stoker.merge_states(states)
    rest = []
    for r in range(3):
        loader, _ = make(r, 3, 5)
        loader.load_state_dict(merged)
        rest += [x for b in loader for x in b[0].tolist()]
    exactly_once(seen, rest, repeats=3)


# --- shard streams (stoker.WebDatasetStream): positions per shard, dealt again -------------

def stream_shards(root, shards=11):
    """`shards` gzip-compressed shards of 4-9 samples (ids 0..), each sample a uid.txt."""
    import gzip
    import io
    import tarfile

    uid = 0
    root.mkdir()
    for s in range(shards):
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w") as tar:
            for i in range(4 + s % 6):
                data = f"{uid}\n".encode()
                info = tarfile.TarInfo(f"s{s}/k{i:03d}.uid.txt")
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
                uid += 1
        (root / f"part-{s:03d}.tar.gz").write_bytes(gzip.compress(buf.getvalue()))
    return uid


def stream_loader(root, rank, world, workers, monkeypatch, kind="thread", seed=5):
    monkeypatch.setenv("RANK", str(rank))
    monkeypatch.setenv("WORLD_SIZE", str(world))
    ds = stoker.WebDataset(root, fields=("uid.txt",), shuffle=5, seed=seed)
    assert isinstance(ds, stoker.WebDatasetStream)
    return stoker.DataLoader(ds, batch_size=3, num_workers=workers, worker_type=kind)


def stream_checkpoint(root, world, workers, stops, monkeypatch, merged=None, kind="thread"):
    """Each rank (resuming `merged` if given) reads stops[r] batches; (seen, states)."""
    seen, states = [], []
    for r in range(world):
        loader = stream_loader(root, r, world, workers, monkeypatch, kind)
        if merged is not None:
            loader.load_state_dict(merged)
        it = iter(loader)
        for _ in range(stops[r]):
            batch = next(it, None)
            if batch is None:
                break
            seen += batch[0].tolist()
        states.append(loader.state_dict())
        loader.close()
    return seen, states


def stream_rest(root, world, workers, merged, monkeypatch, kind="thread"):
    seen = []
    for r in range(world):
        loader = stream_loader(root, r, world, workers, monkeypatch,
                               "process" if kind == "mixed" and r == 1 else
                               ("thread" if kind == "mixed" else kind))
        loader.load_state_dict(merged)
        seen += [u for b in loader for u in b[0].tolist()]
        loader.close()
    return seen


@pytest.mark.parametrize("stops", [[1, 0, 2, 1], [2, 2, 2, 2], [3, 1, 0, 4]])
def test_shard_stream_saved_on_four_ranks_resumes_on_three_and_two(tmp_path, monkeypatch,
                                                                    stops):
    n = stream_shards(tmp_path / "shards")
    before, states = stream_checkpoint(tmp_path / "shards", 4, 3, stops, monkeypatch)
    merged = stoker.merge_states(states)
    assert merged["merged"] and len(json.dumps(merged)) < 2000  # per shard, not per sample
    for world, workers, kind in ((3, 2, "mixed"), (2, 2, "process"), (1, 0, "thread")):
        rest = stream_rest(tmp_path / "shards", world, workers, merged, monkeypatch, kind)
        assert sorted(before + rest) == list(range(n)), (world, workers, kind)


def test_shard_stream_resumed_twice_and_the_next_epoch_is_a_fresh_one(tmp_path, monkeypatch):
    root = tmp_path / "shards"
    n = stream_shards(root)
    first, states = stream_checkpoint(root, 4, 3, [2, 1, 1, 2], monkeypatch)
    second, states = stream_checkpoint(root, 3, 2, [1, 2, 1], monkeypatch,
                                       merged=stoker.merge_states(states))
    merged = stoker.merge_states(states)
    rest = stream_rest(root, 2, 1, merged, monkeypatch)
    assert sorted(first + second + rest) == list(range(n))
    assert not set(first) & set(second)  # the resumed epoch read none of what was consumed
    # The epoch after: a fresh 2-rank epoch, the same as a loader that never stopped gives.
    loaders = [stream_loader(root, r, 2, 1, monkeypatch) for r in range(2)]
    fresh = []
    for r, loader in enumerate(loaders):
        monkeypatch.setenv("RANK", str(r))
        loader.set_epoch(merged["epoch"] + 1)
        fresh.append([u for b in loader for u in b[0].tolist()])
    after = []
    for r in range(2):
        loader = stream_loader(root, r, 2, 1, monkeypatch)
        loader.load_state_dict(merged)
        list(loader)
        after.append([u for b in loader for u in b[0].tolist()])
        loader.close()
    assert after == fresh and sorted(after[0] + after[1]) == list(range(n))


def test_shard_stream_own_state_and_a_single_process_state(tmp_path, monkeypatch):
    root = tmp_path / "shards"
    n = stream_shards(root)
    # One process with 3 workers, saved; the same loader shape resumes its own state, and a
    # loader with 2 worker processes takes it too (one rank: merged on load).
    loader = stream_loader(root, 0, 1, 3, monkeypatch)
    it = iter(loader)
    seen = [u for _ in range(5) for u in next(it)[0].tolist()]
    state = loader.state_dict()
    loader.close()
    for workers, kind in ((3, "thread"), (2, "process"), (0, "thread")):
        again = stream_loader(root, 0, 1, workers, monkeypatch, kind)
        again.load_state_dict(state)
        rest = [u for b in again for u in b[0].tolist()]
        again.close()
        assert sorted(seen + rest) == list(range(n)), (workers, kind)


def test_shard_stream_state_errors(tmp_path, monkeypatch):
    root = tmp_path / "shards"
    stream_shards(root)
    _, states = stream_checkpoint(root, 2, 2, [1, 1], monkeypatch)
    with pytest.raises(ValueError, match=r"ranks \[1\] are missing"):
        stoker.merge_states(states[:1])
    other = stream_loader(root, 0, 3, 1, monkeypatch)
    with pytest.raises(ValueError, match="merge every rank's state first"):
        other.load_state_dict(states[0])
    reseeded = stream_loader(root, 0, 1, 1, monkeypatch, seed=6)
    with pytest.raises(ValueError, match="seed is 5 in the state and 6 here"):
        reseeded.load_state_dict(stoker.merge_states(states))
        next(iter(reseeded))
    reseeded.close()
    other.close()


def test_shard_progress_union_and_deal():
    from stoker.datasets import shard_progress as sp

    a = [10, False, [3, 7]]  # 0-9 read, 3 and 7 still in a buffer
    b = [5, False, [1]]      # 0-4 read, 1 in a buffer
    u = sp.union(a, b)  # consumed in a or in b: 1 in a, 3 in b; 7 in neither
    assert u == [10, False, [7]]
    assert sp.union(a, a) == a and sp.union(None, b) == b
    assert [o for o in range(12) if not sp.consumed(u, o)] == [7, 10, 11]
    assert sp.merge([{"2": a}, {2: b, 4: [3, True, []]}]) == {2: u, 4: [3, True, []]}
    start = {0: [4, True, []], 1: [4, True, [2]], 3: [1, False, []]}
    assert sp.deal([3, 0, 1, 2, 4], start, 0, 1, 0, 1) == [3, 1, 2, 4]
    assert sp.deal([3, 0, 1, 2, 4], start, 1, 2, 1, 2) == [4]


def test_a_ranks_state_whose_windowed_order_was_laid_out_for_other_nodes_says_so():
    from types import SimpleNamespace

    from stoker.loader import elastic

    state = elastic.rank_state(
        (0, 3), seed=1, batches_per_epoch=10, samples=320, shuffle=True, shuffle_window=12,
        shuffle_nodes=(2, 2), batch_size=8, rank=1, world_size=4, shard_drop_last=False,
        epoch_samples=80, consumed=[])
    plan = SimpleNamespace(rank=1, world_size=4, batch_size=8, engine_shuffle=True,
                           engine_seed=1)
    with pytest.raises(ValueError, match=r"laid out for 2 node\(s\) of 2 rank\(s\); this "
                                         r"loader is rank 1 of 4 with batch size 8, laid out "
                                         r"for 1 of 1\. Resume .*merge_states"):
        elastic.merged_for(state, plan, 320, True, 12, (1, 1))
    # Merged, the rest of the epoch keeps the layout it began with.
    merged = elastic.merge_states([dict(state, rank=r) for r in range(4)])
    assert merged["shuffle_nodes"] == [2, 2] and merged["shuffle_window"] == 12
