"""stoker.WebDataset: WebDataset tar shards read natively (made here with tarfile and Pillow)."""

import io
import logging
import os
import pickle
import tarfile

import numpy as np
import pytest
import torch
from PIL import Image

import stoker
from stoker import transforms as T
from stoker.datasets.shards import expand_shards

MEAN = np.array(T.IMAGENET_MEAN, np.float32)[:, None, None]
STD = np.array(T.IMAGENET_STD, np.float32)[:, None, None]
SIZE = 32


def jpeg(uid, w=None, h=None):
    w, h = w or 40 + uid % 17, h or 36 + uid % 13
    y, x = np.mgrid[0:h, 0:w]
    img = np.stack([(x * 7 + uid * 31) % 256, (y * 5 + uid) % 256, (x + y + uid * 3) % 256], -1)
    buf = io.BytesIO()
    Image.fromarray(img.astype(np.uint8)).save(buf, "JPEG", quality=90)
    return buf.getvalue()


def npy(array):
    buf = io.BytesIO()
    np.save(buf, array)
    return buf.getvalue()


def write_tar(path, members, fmt=tarfile.PAX_FORMAT, dirs=()):
    """`members`: (name, bytes) in order; `dirs`: directory entries written first."""
    with tarfile.open(path, "w", format=fmt) as tar:
        for d in dirs:
            info = tarfile.TarInfo(d)
            info.type = tarfile.DIRTYPE
            tar.addfile(info)
        for name, data in members:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))


def sample_members(key, uid, fields=("jpg", "cls", "uid.txt", "feat.npy")):
    values = {"jpg": jpeg(uid), "cls": str(uid % 5).encode(), "uid.txt": f"{uid}\n".encode(),
              "feat.npy": npy(np.array([uid, uid * 2, -uid], np.float32))}
    return [(f"{key}.{f}", values[f]) for f in fields]


N_SHARDS, PER_SHARD = 4, 9  # 36 samples


@pytest.fixture(scope="module")
def shards(tmp_path_factory):
    """4 shards of 9 samples: keys in dotted directories, long names (pax and GNU), a README
    with no key, directory entries."""
    root = tmp_path_factory.mktemp("wds")
    uid = 0
    for s in range(N_SHARDS):
        members = []
        for i in range(PER_SHARD):
            if s == 1:
                key = "long/" + "d" * 120 + f"/sample{i:03d}"  # > 100 bytes: long names
            else:
                key = f"v1.{s}/part.x/{s:02d}{i:04d}"
            members += sample_members(key, uid)
            uid += 1
        fmt = tarfile.GNU_FORMAT if s == 1 else tarfile.PAX_FORMAT
        if s == 2:
            members.insert(3, ("README", b"no key: left out, as webdataset leaves it out"))
        write_tar(root / f"train-{s:06d}.tar", members, fmt=fmt,
                  dirs=(f"v1.{s}", f"v1.{s}/part.x") if s != 1 else ())
    return root


def cache_dir(tmp_path):
    return tmp_path / "index-cache"


def uids_of(loader):
    return [int(u) for batch in loader for u in batch[-1]]


def test_fields_by_extension_dotted_keys_and_long_names(shards, tmp_path, caplog):
    with caplog.at_level(logging.WARNING, logger="stoker"):
        ds = stoker.WebDataset(shards, fields=("jpg", "cls", "feat.npy", "uid.txt"),
                               transform=T.val(SIZE, SIZE), index_cache=cache_dir(tmp_path))
        stoker.logs.drain()  # the engine's line, queued (logs.py): now, not at a later bytecode
    assert "no key" in caplog.text  # the README, named
    assert len(ds) == N_SHARDS * PER_SHARD
    assert ds.key(0) == "v1.0/part.x/000000"
    assert ds.key(PER_SHARD) == "long/" + "d" * 120 + "/sample000"
    assert [f[2] for f in ds._handle.fields()] == [(3, SIZE, SIZE), (), (3,), ()]
    loader = stoker.DataLoader(ds, batch_size=8, num_workers=2)
    images, labels, feats, uids = (torch.cat(x) for x in zip(*loader))
    assert uids.tolist() == list(range(len(ds)))  # shards in name order, members in tar order
    assert labels.dtype == torch.int64 and labels.tolist() == [u % 5 for u in range(len(ds))]
    assert feats.dtype == torch.float32
    assert feats.tolist() == [[u, 2 * u, -u] for u in range(len(ds))]
    assert images.shape == (len(ds), 3, SIZE, SIZE)
    # The image is the sample's own: Pillow's val pipeline on the same JPEG.
    for u in (0, 13, 35):
        assert np.abs(denormalize(images[u]) - val_reference(jpeg(u))).mean() < 2.0


def denormalize(image):
    return (image.numpy() * STD + MEAN) * 255


def val_reference(data):
    img = Image.open(io.BytesIO(data)).convert("RGB")
    w, h = img.size
    nw, nh = (SIZE, int(SIZE * h / w)) if w <= h else (int(SIZE * w / h), SIZE)
    img = img.resize((nw, nh), Image.BILINEAR)
    top, left = int(round((nh - SIZE) / 2.0)), int(round((nw - SIZE) / 2.0))
    return np.asarray(img.crop((left, top, left + SIZE, top + SIZE)),
                      np.float32).transpose(2, 0, 1)


def test_shards_as_list_brace_pattern_or_directory(shards, tmp_path):
    kw = dict(fields=("uid.txt",), index_cache=cache_dir(tmp_path))
    by_dir = stoker.WebDataset(shards, **kw)
    pattern = str(shards / "train-{000000..000003}.tar")
    by_pattern = stoker.WebDataset(pattern, **kw)
    by_list = stoker.WebDataset(sorted(shards.glob("*.tar")), **kw)
    two = stoker.WebDataset(str(shards / "train-{000000,000002}.tar"), **kw)
    assert len(by_dir) == len(by_pattern) == len(by_list) == N_SHARDS * PER_SHARD
    assert len(two) == 2 * PER_SHARD
    assert by_pattern.shards == [str(shards / f"train-{s:06d}.tar") for s in range(4)]
    assert uids_of(stoker.DataLoader(by_pattern, batch_size=10)) == list(range(36))


def test_shard_patterns_expand_as_webdatasets_do():
    assert expand_shards("a-{000..003}.tar") == [f"a-{i:03d}.tar" for i in range(4)]
    assert expand_shards("{a,b}{1..2}.tar::c.tar") == ["a1.tar", "a2.tar", "b1.tar", "b2.tar",
                                                      "c.tar"]
    assert expand_shards(["x{1..7..3}", "lit\\{1,2\\}"]) == ["x1", "x4", "x7", "lit{1,2}"]
    with pytest.raises(ValueError, match="no shards"):
        expand_shards([])


def test_each_sample_once_per_epoch_shuffled_and_over_two_ranks(shards, tmp_path):
    ds = stoker.WebDataset(shards, fields=("cls", "uid.txt"), index_cache=cache_dir(tmp_path))
    loader = stoker.DataLoader(ds, batch_size=5, shuffle=True, seed=1, num_workers=2)
    for _ in range(2):
        epoch = uids_of(loader)
        assert sorted(epoch) == list(range(36)) and epoch != list(range(36))
    for shuffle in (True, False):
        ranks = []
        for rank in range(2):
            sampler = stoker.DistributedSampler(ds, num_replicas=2, rank=rank, shuffle=shuffle,
                                                seed=4)
            ranks.append(uids_of(stoker.DataLoader(ds, batch_size=4, sampler=sampler,
                                                   num_workers=2)))
        assert len(ranks[0]) == len(ranks[1]) == 18
        assert sorted(ranks[0] + ranks[1]) == list(range(36))


def test_mid_epoch_resume_yields_exactly_the_rest(shards, tmp_path):
    ds = stoker.WebDataset(shards, fields=("jpg", "uid.txt"), transform=T.train(SIZE),
                           index_cache=cache_dir(tmp_path))
    loader = stoker.DataLoader(ds, batch_size=4, shuffle=True, seed=9, num_workers=2)
    list(loader)
    it = iter(loader)
    head = [next(it) for _ in range(3)]
    state = pickle.loads(pickle.dumps(loader.state_dict()))
    tail = list(it)
    fresh = stoker.DataLoader(ds, batch_size=4, shuffle=True, seed=9, num_workers=3)
    fresh.load_state_dict(state)
    resumed = list(fresh)
    assert [b[1].tolist() for b in resumed] == [b[1].tolist() for b in tail]
    assert all(torch.equal(a[0], b[0]) for a, b in zip(resumed, tail))  # same crops too
    assert sorted(uids_of(head + tail)) == list(range(36))


def test_ram_cache_stops_shard_reads(shards, tmp_path):
    ds = stoker.WebDataset(shards, fields=("jpg", "cls"), transform=T.val(SIZE, SIZE),
                           cache_bytes=1 << 24, index_cache=cache_dir(tmp_path))
    loader = stoker.DataLoader(ds, batch_size=8, num_workers=2)
    first = torch.cat([b[0] for b in loader])
    for _ in range(2):
        assert torch.equal(torch.cat([b[0] for b in loader]), first)
    c = ds.counters()
    assert c["storage_reads"] == 36 and c["cached"] == 36 and c["reads"] >= 3 * 36


def test_index_is_cached_per_shard_and_a_bad_cache_place_does_not_fail(shards, tmp_path):
    place = tmp_path / "idx"
    stoker.WebDataset(shards, fields=("cls",), index_cache=place)
    assert len(list(place.glob("*.idx"))) == N_SHARDS
    again = stoker.WebDataset(shards, fields=("cls",), index_cache=place)  # from the cache
    assert len(again) == 36
    stoker.WebDataset(shards, fields=("cls",), index_cache=False)
    blocked = tmp_path / "a-file"
    blocked.write_bytes(b"x")
    assert len(stoker.WebDataset(shards, fields=("cls",), index_cache=blocked / "sub")) == 36
    os.environ["STOKER_CACHE_DIR"] = str(tmp_path / "from-env")
    try:
        stoker.WebDataset(shards, fields=("cls",))
    finally:
        del os.environ["STOKER_CACHE_DIR"]
    assert len(list((tmp_path / "from-env" / "webdataset").glob("*.idx"))) == N_SHARDS


def test_missing_field_and_bad_image_are_named_and_skip_goes_on(tmp_path):
    members = sample_members("k0", 0) + sample_members("k1", 1, ("jpg", "uid.txt"))
    members += [("k2.jpg", b"not an image"), ("k2.cls", b"2"), ("k2.uid.txt", b"2")]
    members += sample_members("k3", 3)
    write_tar(tmp_path / "bad.tar", members)
    ds = stoker.WebDataset(tmp_path / "bad.tar", fields=("jpg", "cls", "uid.txt"),
                           transform=T.val(SIZE, SIZE), index_cache=False)
    assert len(ds) == 4
    with pytest.raises(stoker.SampleError, match=r"bad\.tar key 'k1': no field 'cls'") as info:
        list(stoker.DataLoader(ds, batch_size=4))
    assert info.value.index == 1
    loader = stoker.DataLoader(ds, batch_size=2, on_error="skip")
    batches = list(loader)
    assert sum(len(b[2]) for b in batches) == 4  # replaced, as for a corrupt image
    skipped = loader.skipped_samples()
    assert [s.index for s in skipped] == [1, 2]
    assert "key 'k1'" in skipped[0].name and "no field 'cls'" in skipped[0].reason
    assert "key 'k2'" in skipped[1].name and "field 'jpg'" in skipped[1].reason
    assert {0, 3} <= set(uids_of(batches))


def members_end(data):
    """Where the last member's data (padded to 512 bytes) ends: the end-of-archive follows."""
    last = len(data.rstrip(b"\0"))
    return (last + 511) // 512 * 512


def test_damaged_shards_are_refused_naming_the_file(tmp_path):
    write_tar(tmp_path / "good.tar", sample_members("k0", 0) + sample_members("k1", 1))
    data = (tmp_path / "good.tar").read_bytes()
    cases = {
        "partial.tar": (data[:len(data) // 2], "truncated"),
        "boundary.tar": (data[:members_end(data)], "end-of-archive"),  # at a member's end
        "checksum.tar": (data[:1536] + bytes([data[1536] ^ 1]) + data[1537:], "checksum"),
        "empty.tar": (b"", "empty"),
    }
    for name, (content, why) in cases.items():
        (tmp_path / name).write_bytes(content)
        with pytest.raises(RuntimeError, match=why) as info:
            stoker.WebDataset(tmp_path / name, fields=("cls",), index_cache=False)
        assert name in str(info.value)
    import gzip
    (tmp_path / "z.tar.gz").write_bytes(gzip.compress(data))
    with pytest.raises(RuntimeError, match="compressed.*random access"):  # indexed: refused
        stoker.WebDataset(tmp_path / "z.tar.gz", fields=("cls",), index_cache=False,
                          stream=False)
    (tmp_path / "renamed.tar").write_bytes(gzip.compress(data))
    with pytest.raises(RuntimeError, match="gzip"):
        stoker.WebDataset(tmp_path / "renamed.tar", fields=("cls",), index_cache=False)
    with pytest.raises(ValueError, match="'json' is not supported"):
        stoker.WebDataset(tmp_path / "good.tar", fields=("json",), index_cache=False)
    with pytest.raises(ValueError, match="asked for twice"):
        stoker.WebDataset(tmp_path / "good.tar", fields=("cls", "cls"), index_cache=False)
    with pytest.raises(TypeError, match="transform"):
        stoker.WebDataset(tmp_path / "good.tar", fields=("jpg",), index_cache=False)


def test_shard_truncated_under_a_loader_is_an_error_not_a_crash(tmp_path):
    members = []
    for u in range(6):
        members += sample_members(f"k{u}", u)
    write_tar(tmp_path / "s.tar", members)
    ds = stoker.WebDataset(tmp_path / "s.tar", fields=("jpg", "uid.txt"),
                           transform=T.val(SIZE, SIZE), index_cache=False)
    os.truncate(tmp_path / "s.tar", os.path.getsize(tmp_path / "s.tar") // 2)
    with pytest.raises(stoker.SampleError, match=r"s\.tar key 'k\d': the shard ends"):
        list(stoker.DataLoader(ds, batch_size=6, num_workers=2))
    loader = stoker.DataLoader(ds, batch_size=6, on_error="skip")
    list(loader)
    assert any("truncated" in s.reason for s in loader.skipped_samples())


def test_same_samples_as_the_webdataset_package(shards, tmp_path):
    wds = pytest.importorskip("webdataset")
    urls = [str(p) for p in sorted(shards.glob("*.tar"))]
    theirs = list(wds.WebDataset(urls, shardshuffle=False, empty_check=False))
    ds = stoker.WebDataset(urls, fields=("jpg", "cls", "uid.txt", "feat.npy"),
                           transform=T.val(SIZE, SIZE), index_cache=cache_dir(tmp_path))
    assert len(theirs) == len(ds)
    ours = {}
    for i in range(len(ds)):
        image, label, uid, feat = ds[i]
        ours[ds.key(i)] = (int(label), int(uid), feat.tolist(), image)
    assert set(ours) == {s["__key__"] for s in theirs}
    for s in theirs:
        label, uid, feat, image = ours[s["__key__"]]
        assert label == int(s["cls"]) and uid == int(s["uid.txt"])
        assert feat == np.load(io.BytesIO(s["feat.npy"])).tolist()
        assert np.abs(denormalize(torch.as_tensor(image)) - val_reference(s["jpg"])).mean() < 2


def test_odd_names_group_into_the_samples_webdataset_makes(tmp_path):
    wds = pytest.importorskip("webdataset")
    names = ["a.b/c.d.e", "a.b/c.X", "dir/.hidden.cls", "dir.x/.hidden.cls", ".top.cls", "noext",
             "d/noext", "__meta__/y.cls", "__init__.cls", "__a__b/c.cls", "x..y", "x.cls",
             "e/f/g.h.i.j", "e/f/g.cls"]
    write_tar(tmp_path / "odd.tar", [(n, b"1") for n in names], fmt=tarfile.GNU_FORMAT)
    theirs = [s["__key__"] for s in wds.WebDataset(str(tmp_path / "odd.tar"), shardshuffle=False,
                                                   empty_check=False)]
    ds = stoker.WebDataset(tmp_path / "odd.tar", fields=("cls",), index_cache=False)
    assert [ds.key(i) for i in range(len(ds))] == theirs


def gzip_shards(shards, dest):
    """The fixture's shards, gzip-compressed (.tar.gz)."""
    import gzip

    dest.mkdir()
    for p in sorted(shards.glob("*.tar")):
        (dest / (p.name + ".gz")).write_bytes(gzip.compress(p.read_bytes()))
    return dest


@pytest.mark.parametrize("name", [
    "a.jpg", "dir/a.JPG", "dir/a.b.c", "dir.x/a.jpg", "a/b.c/d.jpg", "a.b/c", "a/.jpg",
    "a.x/.jpg", ".jpg", "noext", "dir/noext", "__key__", "__meta__.json", "__x__/a.jpg",
    "a/__x__.jpg", "__a.jpg", "_a_.jpg", "a..b"])
def test_a_stream_groups_members_as_webdataset_does(name):
    # The one rule (src/source/webdataset.cc) against webdataset's own regular expressions:
    # base_plus_ext for the key and field, tar_file_iterator's meta-file filter.
    import re
    meta = ("/" not in name and name.startswith("__") and name.endswith("__")) or \
        re.match(r"__[^/]*__($|/)", name)
    m = re.match(r"^((?:.*/|)[^.]+)[.]([^/]*)$", name)
    want = None if meta or m is None else (m.group(1), m.group(2).lower())
    assert stoker._stoker.webdataset_member(name) == want


def test_compressed_shards_stream_with_the_same_fields(shards, tmp_path):
    gz = gzip_shards(shards, tmp_path / "gz")
    ds = stoker.WebDataset(str(gz / "train-{000000..000003}.tar.gz"),
                           fields=("jpg", "cls", "feat.npy", "uid.txt"),
                           transform=T.val(SIZE, SIZE), shuffle=10, seed=3)
    assert isinstance(ds, stoker.WebDatasetStream)
    indexed = stoker.WebDataset(shards, fields=("jpg", "cls", "feat.npy", "uid.txt"),
                                transform=T.val(SIZE, SIZE), index_cache=cache_dir(tmp_path))
    expected = {int(s[3]): s for s in (indexed[i] for i in range(len(indexed)))}
    epochs = []
    for _ in range(2):
        loader = stoker.DataLoader(ds, batch_size=5, num_workers=2)
        images, labels, feats, uids = (torch.cat(x) for x in zip(*loader))
        assert sorted(uids.tolist()) == list(range(36))  # each sample once per epoch
        for image, label, feat, uid in zip(images, labels, feats, uids.tolist()):
            e = expected[uid]
            assert int(label) == int(e[1]) and feat.tolist() == e[2].tolist()
            assert torch.equal(image, torch.as_tensor(e[0]))  # val: no randomness
        epochs.append(uids.tolist())
    assert epochs[0] != list(range(36))  # shards and samples shuffled


def test_stream_splits_shards_over_ranks(shards, tmp_path, monkeypatch):
    gz = gzip_shards(shards, tmp_path / "gz")
    seen = []
    for rank in range(2):
        monkeypatch.setenv("RANK", str(rank))
        monkeypatch.setenv("WORLD_SIZE", "2")
        ds = stoker.WebDataset(gz, fields=("uid.txt",), seed=1)
        ds.set_epoch(4)
        seen.append([int(s[0]) for s in ds])
    assert len(seen[0]) == len(seen[1]) == 18  # 2 of the 4 shards each
    assert sorted(seen[0] + seen[1]) == list(range(36))


def test_stream_errors_name_shard_and_key(tmp_path):
    import gzip

    members = sample_members("k0", 0) + sample_members("k1", 1, ("jpg", "uid.txt"))
    write_tar(tmp_path / "bad.tar", members)
    data = gzip.compress((tmp_path / "bad.tar").read_bytes())
    (tmp_path / "bad.tar.gz").write_bytes(data)
    ds = stoker.WebDataset(tmp_path / "bad.tar.gz", fields=("jpg", "cls"),
                           transform=T.val(SIZE, SIZE), shuffle=0)
    with pytest.raises(RuntimeError, match=r"bad\.tar\.gz key 'k1': no field 'cls'"):
        list(ds)
    (tmp_path / "cut.tar.gz").write_bytes(data[:len(data) // 2])
    ds = stoker.WebDataset(tmp_path / "cut.tar.gz", fields=("uid.txt",), shuffle=0)
    with pytest.raises(RuntimeError, match=r"cut\.tar\.gz: .*truncated or corrupt"):
        list(ds)
    with pytest.raises(ValueError, match="no RAM cache"):
        stoker.WebDataset(tmp_path / "cut.tar.gz", fields=("uid.txt",), cache_bytes=1 << 20)
