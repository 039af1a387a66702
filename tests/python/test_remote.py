"""Remote workers on Ray (python/stoker/remote/pool.py), on a real local cluster: a head node with
no CPUs (the driver's) and two worker nodes of one CPU each, all on this machine (Ray's
Cluster binds them to its own address), started once for the module and torn down at its end,
leaving no Ray process behind. Skipped without ray."""

import json
import logging
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

ray = pytest.importorskip("ray")
from ray.cluster_utils import Cluster  # noqa: E402

import stoker  # noqa: E402
from stoker.remote import pool as _remote  # noqa: E402
import worker_datasets as wd  # noqa: E402
from test_workers import alive  # noqa: E402

_STORE = 100 << 20  # each node's object store: small, the machine is shared


def _node(**extra):
    return dict(num_cpus=1, object_store_memory=_STORE, **extra)


def _ray_processes(session: str) -> list[int]:
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if session.encode() in (entry / "cmdline").read_bytes():
                pids.append(int(entry.name))
        except OSError:
            pass
    return pids


@pytest.fixture(scope="module")
def cluster():
    # The actors unpickle the test data sets: their nodes (started from here) import this
    # folder's modules.
    here = str(Path(__file__).parent)
    old_path = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (here, old_path) if p)
    c = Cluster(initialize_head=True, head_node_args=dict(
        _node(include_dashboard=False), num_cpus=0))
    c.add_node(**_node())
    c.add_node(**_node())
    ray.init(address=c.address, log_to_driver=False)
    session = ray._private.worker._global_node.get_session_dir_path()
    try:
        yield c
    finally:
        ray.shutdown()
        c.shutdown()
        if old_path is None:
            del os.environ["PYTHONPATH"]
        else:
            os.environ["PYTHONPATH"] = old_path
        for _ in range(100):  # processes exit a little after shutdown returns
            if not _ray_processes(session):
                break
            time.sleep(0.1)
        assert _ray_processes(session) == []


def _crash(cluster, node, loader):
    """`node` crashes: its Ray processes and the remote workers' processes on it are killed
    (calls go straight from the driver to an actor, so an actor whose raylet alone was killed
    could still answer for a while)."""
    pids = ray.get([actor.pid.remote() for actor in loader._pipeline.remote.actors])
    cluster.remove_node(node, allow_graceful=False)
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    # Until Ray's health check has found the node dead, it could place later tests' actors
    # there.
    for _ in range(1200):
        if not any(n["NodeID"] == node.node_id and n["Alive"] for n in ray.nodes()):
            break
        time.sleep(0.1)


def _batches(loader, epochs=1):
    out = []
    for epoch in range(epochs):
        if isinstance(loader.sampler, stoker.DistributedSampler):
            loader.sampler.set_epoch(epoch)
        out.extend(list(loader))
    return out


def _same(a, b):
    assert len(a) == len(b)
    for x, y in zip(a, b):
        assert x["name"] == y["name"]
        assert np.array_equal(np.asarray(x["label"]), np.asarray(y["label"]))
        assert np.array_equal(np.asarray(x["image"]), np.asarray(y["image"]))


def _loader(dataset, remote=None, workers=1, **kwargs):
    kwargs.setdefault("batch_size", 8)
    return stoker.DataLoader(dataset, num_workers=workers, remote=remote, seed=7, **kwargs)


@pytest.mark.parametrize("rank, workers, worker_type",
                         [(0, 0, "auto"), (1, 1, "auto"), (1, 1, "process")])
def test_remote_batches_are_those_of_a_local_loader(cluster, rank, workers, worker_type):
    # Shuffled, 2 epochs, one DDP rank of 2: remote workers alone (every unit but the probed
    # samples goes to an actor: there are as many threads as actor slots), or with a local
    # worker thread or process, deliver exactly the batches a local loader does, in order.
    data = wd.Seeded(n=96)

    def sampler():
        return stoker.DistributedSampler(data, num_replicas=2, rank=rank, shuffle=True, seed=3)

    expected = _batches(_loader(data, workers=2, sampler=sampler()), epochs=2)
    loader = _loader(data, stoker.ray_workers(2), workers=workers, sampler=sampler(),
                     worker_type=worker_type)
    got = _batches(loader, epochs=2)
    stats, report = loader.stats(), loader.report()
    loader.close()
    _same(got, expected)
    if worker_type == "process":  # the local one read its share in its process
        assert stats["worker_type"] == "process" and len(stats["worker_pids"]) == 1
        assert stats["remote"]["local_jobs"] > 0
        assert not alive(stats["worker_pids"][0])
    remote = stats["remote"]
    assert remote["lost_workers"] == 0 and remote["alive"] == 2
    # The network stage, in the engine's stats that the verdict reads.
    assert stats["network_units"] == remote["jobs"]
    assert stats["network_bytes"] == remote["rows_bytes"]
    if workers == 0:
        assert remote["jobs"] > 0 and remote["rows_bytes"] > 0
        assert stats["network_wait_s"] > 0 and stats["network_read_s"] > 0
        assert stats["network_bytes_per_second"] > 0
        assert report["network_wait"] > 0 and 0 < report["remote_busy"] <= 1


def test_auto_moves_gil_bound_local_reads_to_processes_beside_remote_workers(cluster):
    # worker_type='auto' with remote=: the GIL's share is measured on the local reads, and a
    # data set that holds it gets local worker processes, as without remote workers.
    loader = stoker.DataLoader(wd.CpuBound(400, 20000), batch_size=8,
                               remote=stoker.ray_workers(1))
    values = [int(x) for b in loader for x in b[:, 0]]
    stats = loader.stats()
    loader.close()
    assert values == list(range(400))
    assert stats["worker_type"] == "process", stats["worker_type_reason"]
    assert "GIL-bound" in stats["worker_type_reason"] and stats["worker_pids"]
    assert not any(alive(p) for p in stats["worker_pids"])


def _until(condition, what):
    # Ray starts a replacement actor in seconds; the limit only keeps a broken test finite.
    for _ in range(1200):
        if condition():
            return
        time.sleep(0.1)
    raise AssertionError(f"not reached: {what}")


def _dead(actor) -> bool:
    # ray.kill() goes through Ray's control store and returns at once: a call sent right after
    # it may still reach the actor and answer, so the end is awaited, not expected at once.
    try:
        ray.get(actor.pid.remote(), timeout=60)
    except ray.exceptions.RayActorError:
        return True
    return False


def test_an_actor_killed_mid_epoch_is_replaced_and_nothing_is_lost_or_repeated(cluster):
    data = wd.Seeded(n=128, delay=0.004)
    expected = _batches(_loader(data, shuffle=True), epochs=2)
    loader = _loader(data, stoker.ray_workers(2), shuffle=True)
    got = []
    for k, batch in enumerate(loader):
        got.append(batch)
        if k == 2:
            killed = loader.stats()["remote"]["pids"][0]
            ray.kill(loader._pipeline.remote.actors[0])
    _until(lambda: loader.stats()["remote"]["alive"] == 2, "two actors alive")
    before = loader.stats()["remote"]
    got.extend(loader)  # the second epoch, with the new actor
    remote = loader.stats()["remote"]
    loader.close()
    _same(got, expected)
    assert remote["lost_workers"] == 1 and remote["reissued"] >= 1 and remote["replaced"] == 1
    assert remote["alive"] == 2 and remote["pids"][0] not in (None, killed)
    assert remote["jobs"] > before["jobs"]


def test_a_node_removed_mid_epoch_falls_back_to_local_with_one_log_line(cluster, caplog):
    # A node of its own for both actors (a custom resource pins them there), removed
    # mid-epoch: the loader's whole cluster is gone, nothing is lost or repeated, and with no
    # room left for replacements it reads on its local workers.
    node = cluster.add_node(**dict(_node(resources={"victim": 2}), num_cpus=2))
    data = wd.Seeded(n=128, delay=0.004)
    expected = _batches(_loader(data, shuffle=True))
    loader = _loader(data, stoker.ray_workers(2, resources={"victim": 1}), shuffle=True)
    got = []
    with caplog.at_level(logging.INFO, logger="stoker"):
        for k, batch in enumerate(loader):
            got.append(batch)
            if k == 2:
                _crash(cluster, node, loader)
    remote = loader.stats()["remote"]
    loader.close()
    _same(got, expected)
    assert remote["lost_workers"] == 2 and remote["alive"] == 0, remote
    assert remote["local_jobs"] > 0 and remote["replaced"] == 0
    warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(warnings) == 1 and "no remote worker left" in warnings[0]


def test_a_unit_later_than_reissue_after_is_issued_again(cluster):
    # Sample 9 takes a minute in an actor: its unit is issued again after 5 s (locally, the
    # only actor being given up), and the batches are a local loader's.
    data = wd.SlowInActors(index=9, seconds=60)
    expected = _batches(_loader(data))
    loader = _loader(data, stoker.ray_workers(1, reissue_after=5), workers=0)
    got = _batches(loader)
    remote = loader.stats()["remote"]
    loader.close()
    _same(got, expected)
    assert remote["reissued"] >= 1 and remote["lost_workers"] == 1


def test_an_actor_that_never_comes_up_is_given_up_not_waited_for(cluster, monkeypatch):
    # An actor asking for a resource no node has is never placed: its first chunk waits
    # READY_S for it (shortened here), then it is lost and every unit is read locally.
    monkeypatch.setattr(_remote, "READY_S", 2.0)
    data = wd.Seeded(n=48)
    expected = _batches(_loader(data))
    loader = _loader(data, stoker.ray_workers(1, resources={"nowhere": 1}, replace=False),
                     workers=0)
    got = _batches(loader)
    remote = loader.stats()["remote"]
    loader.close()
    _same(got, expected)
    assert remote["lost_workers"] == 1 and remote["alive"] == 0, remote


def test_state_dict_resumes_mid_epoch_with_remote_workers(cluster):
    data = wd.Seeded(n=96)
    expected = _batches(_loader(data, shuffle=True))
    first = _loader(data, stoker.ray_workers(2), shuffle=True)
    it = iter(first)
    head = [next(it) for _ in range(5)]
    state = first.state_dict()
    first.close()
    second = _loader(data, stoker.ray_workers(2), workers=0, shuffle=True)
    second.load_state_dict(state)
    rest = list(second)
    jobs = second.stats()["remote"]["jobs"]
    second.close()
    _same(head + rest, expected)
    assert jobs > 0


def test_a_sample_failing_remotely_raises_its_error_naming_the_sample(cluster):
    loader = _loader(wd.FailsAt({21}, n=40), stoker.ray_workers(2), workers=0)
    with pytest.raises(ValueError, match="bad sample 21") as info:
        list(loader)
    loader.close()
    notes = "\n".join(getattr(info.value, "__notes__", []))
    assert "sample 21" in notes


def test_close_kills_the_actors(cluster):
    loader = _loader(wd.Seeded(n=32), stoker.ray_workers(2))
    list(loader)
    actors = list(loader._pipeline.remote.actors)
    loader.close()
    for actor in actors:
        _until(lambda: _dead(actor), "the actor's end")


def test_loaders_on_one_pool_name_share_its_actors_until_the_last_lets_go(cluster):
    data = wd.Seeded(n=64)
    expected = _batches(_loader(data, shuffle=True), epochs=2)
    first = _loader(data, stoker.ray_workers(2, pool="shared-test"), workers=0, shuffle=True)
    second = _loader(data, stoker.ray_workers(2, pool="shared-test"), workers=0, shuffle=True)
    _same(_batches(first), expected[:8])
    got = _batches(second)
    pids = first.stats()["remote"]["pids"]
    assert second.stats()["remote"]["pids"] == pids and None not in pids
    first.close()  # the actors stay up for the second loader
    got.extend(second)
    _same(got, expected)
    actors = list(second._pipeline.remote.actors)
    second.close()
    for actor in actors:
        _until(lambda: _dead(actor), "the actor's end")


def test_loaders_sharing_a_pool_converge_on_one_replacement_of_a_lost_actor(cluster):
    # Actor 0 is killed while the second loader reads: it replaces it by the pool's name, and
    # the first loader, finding its handle dead, attaches to that same replacement.
    data = wd.Seeded(n=64, delay=0.004)
    expected = _batches(_loader(data, shuffle=True), epochs=2)
    first = _loader(data, stoker.ray_workers(2, pool="converge"), workers=0, shuffle=True)
    second = _loader(data, stoker.ray_workers(2, pool="converge"), workers=0, shuffle=True)
    _same(_batches(first), expected[:8])
    got = []
    for k, batch in enumerate(second):
        got.append(batch)
        if k == 2:
            ray.kill(second._pipeline.remote.actors[0])
    _until(lambda: second.stats()["remote"]["alive"] == 2, "the second loader's replacement")
    got.extend(second)
    _same(got, expected)
    _same(_batches(first), expected[8:])
    _until(lambda: first.stats()["remote"]["alive"] == 2, "the first loader's replacement")
    one, two = first.stats()["remote"], second.stats()["remote"]
    first.close()
    second.close()
    assert one["pids"] == two["pids"] and None not in one["pids"]
    assert one["lost_workers"] == two["lost_workers"] == 1


def test_a_pool_name_refuses_a_loader_of_another_data_set(cluster):
    first = _loader(wd.Seeded(n=32), stoker.ray_workers(1, pool="taken"), workers=0)
    list(first)
    second = _loader(wd.Seeded(n=40), stoker.ray_workers(1, pool="taken"), workers=0)
    with pytest.raises(ValueError, match="give each loader its own pool= name"):
        list(second)
    second.close()
    first.close()


def test_ddp_ranks_share_one_pool_of_remote_workers(cluster, tmp_path):
    # Two ranks under torchrun: each gets its own partition's batches, exactly those of local
    # loaders, from the same two actors; the last rank to close kills them.
    script = Path(__file__).parent / "ddp_remote_job.py"
    result = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
         str(script), cluster.address, str(tmp_path)],
        capture_output=True, text=True, timeout=300, env=dict(os.environ, OMP_NUM_THREADS="1"))
    assert result.returncode == 0, result.stdout + result.stderr
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    for r in ranks:
        assert r["same"] and r["batches"] == 12 and r["jobs"] > 0, r
    assert ranks[0]["pool"] == ranks[1]["pool"] is not None
    assert ranks[0]["actors"] == ranks[1]["actors"] and ranks[0]["pids"] == ranks[1]["pids"]
    _until(lambda: not [a for a in ray.util.list_named_actors(all_namespaces=True)
                        if a["namespace"] == "stoker"], "the pool's actors gone")


@pytest.mark.parametrize("batching", [
    # A shuffle of the batch path draws from torch's generator once torch is imported (as
    # torch's RandomSampler): a fixed permutation instead.
    dict(batch_size=8, sampler=[int(i) for i in np.random.default_rng(0).permutation(48)],
         collate_fn=wd.collate_names),
    dict(batch_sampler=[[0, 5, 2], [7], [9, 1, 3, 4], [11, 10]], collate_fn=wd.collate_names),
], ids=["collate_fn", "batch_sampler"])
def test_the_batch_path_runs_on_remote_workers(cluster, batching):
    # Whole batches (fetched and collated in the actor, their batches sent with the job) are
    # those of a local loader.
    data = wd.Seeded(n=48)
    expected = _batches(stoker.DataLoader(data, num_workers=1, seed=7, **batching))
    loader = stoker.DataLoader(data, num_workers=0, seed=7, remote=stoker.ray_workers(2),
                               **batching)
    got = _batches(loader)
    jobs = loader.stats()["remote"]["jobs"]
    loader.close()
    _same(got, expected)
    assert jobs > 0


def test_the_ranks_of_a_torchrun_job_name_one_pool():
    job = dict(WORLD_SIZE="2", MASTER_ADDR="10.0.0.1", MASTER_PORT="29500")
    assert _remote.job_pool(job) == "@10.0.0.1:29500"
    assert _remote.job_pool(dict(job, TORCHELASTIC_RUN_ID="r7")) == "r7@10.0.0.1:29500"
    assert _remote.job_pool(dict(job, WORLD_SIZE="1")) is None
    assert _remote.job_pool({}) is None


def test_remote_refuses_what_it_does_not_serve(cluster):
    with pytest.raises(ValueError, match="streams run on local workers only"):
        stoker.DataLoader(wd.SlowStream(), batch_size=2, remote=stoker.ray_workers(1))
    with pytest.raises(ValueError, match="at least one"):
        stoker.ray_workers(0)
    with pytest.raises(ValueError, match="pool must be a name"):
        stoker.ray_workers(1, pool=True)


def _cpus_free():
    return ray.available_resources().get("CPU", 0) == ray.cluster_resources().get("CPU", 0)


def test_auto_starts_local_only_and_asks_for_no_remote_worker_for_waits_that_use_no_cpu(
        cluster):
    # Samples that sleep: the loop waits, but the local workers use no CPU, so remote ones
    # would not help (the policy itself: test_tune.py).
    _until(_cpus_free, "earlier tests' actors gone")
    loader = stoker.DataLoader(wd.Seeded(n=256, delay=0.004), batch_size=8,
                               num_workers="auto", remote=stoker.ray_workers(2))
    assert loader.stats()["remote"]["active"] == 0
    assert len(list(loader)) == 32
    remote = loader.stats()["remote"]
    # No actor was asked for, so none was started: the cluster's CPUs stay free for others.
    free = _cpus_free()
    loader.close()
    assert remote["active"] == 0 and remote["jobs"] == 0
    assert remote["alive"] == 0 and remote["pids"] == [None, None]
    assert free


def test_an_actor_is_started_when_first_asked_for_and_stopped_when_given_back(cluster):
    data = wd.Seeded(n=128, delay=0.004)
    expected = _batches(_loader(data, shuffle=True), epochs=2)
    loader = stoker.DataLoader(data, batch_size=8, num_workers="auto", seed=7, shuffle=True,
                               remote=stoker.ray_workers(2))
    assert loader.stats()["remote"]["pids"] == [None, None]

    def set_active(n):  # what the loader's own policy does (RemoteWorkerTuner, src/tune/worker_kind.cc)
        loader._pipeline.set_remote_active(n)

    set_active(1)
    _until(lambda: loader.stats()["remote"]["alive"] == 1, "actor 0 up")
    got = _batches(loader)
    remote = loader.stats()["remote"]
    assert remote["jobs"] > 0 and remote["replaced"] == 0
    assert remote["pids"][0] is not None and remote["pids"][1] is None
    set_active(0)  # given back: stopped, its CPU free for the cluster's other work
    _until(lambda: loader.stats()["remote"]["alive"] == 0, "actor 0 stopped")
    _until(_cpus_free, "the cluster's CPUs free")
    stopped = loader.stats()["remote"]["jobs"]  # with units of the next epoch read ahead
    got.extend(_batches(loader))  # the rest read locally
    jobs = loader.stats()["remote"]["jobs"]
    loader.close()
    _same(got, expected)
    assert jobs == stopped


def test_a_native_image_pipeline_runs_on_remote_workers(cluster, tmp_path):
    # stoker.ImageFolder with its random crops and flips in C++: the actors make it again from
    # its arguments and read each sample with its seed, so the batches are the native ones.
    from PIL import Image

    from stoker import transforms as T

    rng = np.random.default_rng(0)
    for c in ("cat", "dog"):
        (tmp_path / c).mkdir()
        for k in range(12):
            Image.fromarray(rng.integers(0, 255, (40, 48, 3), dtype=np.uint8)).save(
                tmp_path / c / f"{k}.jpg")
    data = stoker.ImageFolder(tmp_path, transform=T.train(16))
    expected = _batches(_loader(data, shuffle=True))
    loader = _loader(data, stoker.ray_workers(2), workers=0, shuffle=True)
    got = _batches(loader)
    stats = loader.stats()
    loader.close()
    assert len(got) == len(expected) == 3
    for (x, y), (ex, ey) in zip(got, expected):
        assert np.array_equal(np.asarray(x), np.asarray(ex))
        assert np.array_equal(np.asarray(y), np.asarray(ey))
    assert stats["remote"]["jobs"] > 0 and "__getitem__" in stats["pipeline"]
