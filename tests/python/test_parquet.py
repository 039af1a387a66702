"""stoker.ParquetDataset: Parquet files written here with pyarrow, read through stoker's
DataLoader: numeric columns, encoded images (binary and Hugging Face's {bytes, path} struct)
against stoker.ImageFolder on the same bytes, strings, files and row groups, each row once
per epoch (shuffled, over ranks, after a resume), and bad input named by file, row and
column."""

import io
import os
import sys

import numpy as np
import pytest

import stoker
from stoker import transforms as T

torch = pytest.importorskip("torch")  # batches as tensors
pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")
Image = pytest.importorskip("PIL.Image")


def encoded(i: int, fmt: str = "JPEG") -> bytes:
    rng = np.random.default_rng(i)
    h, w = 40 + (i * 7) % 30, 50 + (i * 11) % 40
    y, x = np.mgrid[0:h, 0:w]
    pixels = np.stack([(x * 5 + i * 3) % 256, (y * 7) % 256, (x + y + i) % 256], axis=-1)
    pixels = (pixels + rng.integers(0, 20, pixels.shape)).clip(0, 255).astype(np.uint8)
    out = io.BytesIO()
    Image.fromarray(pixels).save(out, format=fmt)
    return out.getvalue()


def extension(data: bytes) -> str:
    return "png" if data[:4] == b"\x89PNG" else "jpg"


def numeric_table(start: int, rows: int):
    ids = np.arange(start, start + rows, dtype=np.int64)
    return pa.table({
        "id": pa.array(ids),
        "x": pa.array((ids * 0.5).astype(np.float32)),
        "flag": pa.array(ids % 3 == 0),
        "small": pa.array((ids % 60000).astype(np.uint16)),
        "vec": pa.FixedSizeListArray.from_arrays(
            pa.array(np.repeat(ids, 3).astype(np.float64) + np.tile([0.25, 0.5, 0.75], rows)),
            3),
        "grid": pa.FixedSizeListArray.from_arrays(pa.FixedSizeListArray.from_arrays(
            pa.array((np.repeat(ids, 4) * 4 + np.tile(np.arange(4), rows)).astype(np.int16)),
            2), 2),
        "caption": pa.array([f"row {i}" for i in ids]),
    })


def image_table(start: int, rows: int, hf: bool = False):
    ids = np.arange(start, start + rows, dtype=np.int64)
    images = [encoded(int(i), "PNG" if i % 4 == 1 else "JPEG") for i in ids]
    if hf:
        column = pa.array([{"bytes": b, "path": f"img{i}.jpg"} for b, i in zip(images, ids)],
                          type=pa.struct([("bytes", pa.binary()), ("path", pa.string())]))
    else:
        column = pa.array(images, type=pa.binary())
    return pa.table({"image": column, "label": pa.array(ids % 5)}), images


def collect(loader, field=0):
    out = []
    for batch in loader:
        out += np.asarray(batch[field]).tolist()
    return out


def test_numeric_columns_become_batch_fields(tmp_path):
    path = tmp_path / "n.parquet"
    pq.write_table(numeric_table(0, 50), path, row_group_size=8)
    ds = stoker.ParquetDataset(path, columns=("id", "x", "flag", "small", "vec", "grid"))
    assert len(ds) == 50
    ids, x, flag, small, vec, grid = [], [], [], [], [], []
    loader = stoker.DataLoader(ds, batch_size=7, num_workers=2)
    for batch in loader:
        assert batch[2].dtype == torch.bool and batch[3].dtype == torch.uint16
        assert tuple(batch[4].shape[1:]) == (3,) and tuple(batch[5].shape[1:]) == (2, 2)
        for out, b in zip((ids, x, flag, small, vec, grid), batch):
            out.append(b.numpy())
    ids = np.concatenate(ids)
    assert ids.tolist() == list(range(50))
    np.testing.assert_array_equal(np.concatenate(x), (ids * 0.5).astype(np.float32))
    np.testing.assert_array_equal(np.concatenate(flag), ids % 3 == 0)
    np.testing.assert_array_equal(np.concatenate(small), ids % 60000)
    np.testing.assert_array_equal(np.concatenate(vec),
                                  ids[:, None] + np.array([0.25, 0.5, 0.75])[None])
    np.testing.assert_array_equal(np.concatenate(grid).reshape(50, 4),
                                  ids[:, None] * 4 + np.arange(4)[None])
    # indexing gives the same sample
    sample = ds[13]
    assert int(sample[0]) == 13 and sample[5].tolist() == [[52, 53], [54, 55]]


def test_a_fixed_shape_tensor_column(tmp_path):
    tensor_type = pa.fixed_shape_tensor(pa.float32(), (2, 3))
    values = np.arange(10 * 6, dtype=np.float32).reshape(10, 2, 3)
    table = pa.table({"t": pa.ExtensionArray.from_storage(
        tensor_type, pa.FixedSizeListArray.from_arrays(pa.array(values.ravel()), 6))})
    pq.write_table(table, tmp_path / "t.parquet", row_group_size=4)
    ds = stoker.ParquetDataset(tmp_path / "t.parquet", columns=["t"])
    batches = [b[0].numpy() for b in stoker.DataLoader(ds, batch_size=3, num_workers=1)]
    np.testing.assert_array_equal(np.concatenate(batches), values)


def test_string_columns_become_lists_of_str(tmp_path):
    pq.write_table(numeric_table(0, 30), tmp_path / "s.parquet", row_group_size=7)
    ds = stoker.ParquetDataset(tmp_path / "s.parquet", columns=("caption", "id"))
    seen = 0
    for captions, ids in stoker.DataLoader(ds, batch_size=4, shuffle=True, num_workers=2):
        # a tuple of str inside a tuple sample, as torch's default_collate makes it
        assert isinstance(captions, tuple) and all(isinstance(c, str) for c in captions)
        assert list(captions) == [f"row {i}" for i in ids.tolist()]
        seen += len(captions)
    assert seen == 30
    as_dict = stoker.ParquetDataset(tmp_path / "s.parquet", columns=("id", "caption"),
                                    as_dict=True)
    batch = next(iter(stoker.DataLoader(as_dict, batch_size=3)))
    assert batch["caption"] == ["row 0", "row 1", "row 2"] and batch["id"].tolist() == [0, 1, 2]
    assert as_dict[5]["caption"] == "row 5"


def reference_images(tmp_path, images, transform):
    """The same encoded bytes as files of an image folder, read by stoker.ImageFolder."""
    root = tmp_path / "folder" / "c"
    root.mkdir(parents=True)
    for i, data in enumerate(images):
        (root / f"{i:05d}.{extension(data)}").write_bytes(data)
    folder = stoker.ImageFolder(tmp_path / "folder", transform=transform)
    return np.concatenate([b[0].numpy() for b in
                           stoker.DataLoader(folder, batch_size=8, num_workers=1)])


@pytest.mark.parametrize("hf", [False, True], ids=["binary", "hf-struct"])
def test_images_decode_as_image_folder_decodes_the_same_bytes(tmp_path, hf):
    table, images = image_table(0, 21, hf=hf)
    pq.write_table(table, tmp_path / "i.parquet", row_group_size=5)
    transform = T.val(48, 32)
    ds = stoker.ParquetDataset(tmp_path / "i.parquet", columns=("image", "label"),
                               transform=transform)
    got, labels = [], []
    for image, label in stoker.DataLoader(ds, batch_size=4, num_workers=2):
        assert tuple(image.shape[1:]) == (3, 32, 32)
        got.append(image.numpy())
        labels += label.tolist()
    assert labels == [i % 5 for i in range(21)]
    np.testing.assert_array_equal(np.concatenate(got), reference_images(tmp_path, images,
                                                                        transform))


def test_random_augmentations_follow_the_seed_like_image_folder(tmp_path):
    # The same seed and order: ParquetDataset's random crops and flips are ImageFolder's.
    table, images = image_table(0, 12)
    pq.write_table(table, tmp_path / "i.parquet", row_group_size=5)
    transform = T.train(24)
    ds = stoker.ParquetDataset(tmp_path / "i.parquet", transform=transform)
    got = np.concatenate([b[0].numpy() for b in
                          stoker.DataLoader(ds, batch_size=4, num_workers=2, seed=3)])
    root = tmp_path / "folder" / "c"
    root.mkdir(parents=True)
    for i, data in enumerate(images):
        (root / f"{i:05d}.{extension(data)}").write_bytes(data)
    folder = stoker.ImageFolder(tmp_path / "folder", transform=transform)
    want = np.concatenate([b[0].numpy() for b in
                           stoker.DataLoader(folder, batch_size=4, num_workers=1, seed=3)])
    np.testing.assert_array_equal(got, want)


def write_files(tmp_path, sizes, row_group_size=6):
    start = 0
    for k, n in enumerate(sizes):
        pq.write_table(numeric_table(start, n), tmp_path / f"part-{k:03d}.parquet",
                       row_group_size=row_group_size)
        start += n
    return start


def test_files_as_a_directory_a_glob_and_a_list(tmp_path):
    total = write_files(tmp_path, [10, 1, 17])
    (tmp_path / "notes.txt").write_text("not parquet")
    by_dir = stoker.ParquetDataset(tmp_path, columns=["id"])
    by_glob = stoker.ParquetDataset(str(tmp_path / "part-*.parquet"), columns=["id"])
    by_list = stoker.ParquetDataset([tmp_path / "part-002.parquet", tmp_path / "part-000.parquet"],
                                    columns=["id"])
    assert by_dir.files == by_glob.files and len(by_dir) == len(by_glob) == total
    assert collect(stoker.DataLoader(by_dir, batch_size=5)) == list(range(total))
    assert collect(stoker.DataLoader(by_list, batch_size=5)) == (list(range(11, 28))
                                                                 + list(range(10)))
    with pytest.raises(FileNotFoundError, match="nothing"):
        stoker.ParquetDataset(tmp_path / "nothing.parquet", columns=["id"])


def test_each_row_once_per_epoch_shuffled_and_over_two_ranks(tmp_path):
    total = write_files(tmp_path, [23, 40, 9], row_group_size=5)
    ds = stoker.ParquetDataset(tmp_path, columns=["id", "caption"])
    loader = stoker.DataLoader(ds, batch_size=6, shuffle=True, seed=1, num_workers=3)
    orders = []
    for _ in range(2):
        rows = collect(loader, field=0)
        assert sorted(rows) == list(range(total))
        orders.append(rows)
    assert orders[0] != orders[1] and orders[0] != list(range(total))
    ranks = []
    for rank in range(2):
        sampler = stoker.DistributedSampler(ds, num_replicas=2, rank=rank, shuffle=True, seed=4)
        sampler.set_epoch(1)
        rows = []
        for ids, captions in ((b[0], b[1]) for b in
                              stoker.DataLoader(ds, batch_size=5, sampler=sampler,
                                                num_workers=2)):
            assert list(captions) == [f"row {i}" for i in ids.tolist()]
            rows += ids.tolist()
        ranks.append(rows)
    assert not set(ranks[0]) & set(ranks[1])
    assert sorted(ranks[0] + ranks[1]) == list(range(total))


def test_a_mid_epoch_resume_gives_exactly_the_remaining_rows(tmp_path):
    total = write_files(tmp_path, [31, 20])
    ds = stoker.ParquetDataset(tmp_path, columns=["id"])
    loader = stoker.DataLoader(ds, batch_size=4, shuffle=True, seed=9, num_workers=2)
    it = iter(loader)
    head = [next(it)[0].tolist() for _ in range(5)]
    state = loader.state_dict()
    tail = [b[0].tolist() for b in it]
    fresh = stoker.DataLoader(stoker.ParquetDataset(tmp_path, columns=["id"]), batch_size=4,
                              shuffle=True, seed=9, num_workers=1)
    fresh.load_state_dict(state)
    assert [b[0].tolist() for b in fresh] == tail
    assert sorted(sum(head + tail, [])) == list(range(total))


def test_row_groups_are_read_once_while_they_fit_the_cache(tmp_path):
    total = write_files(tmp_path, [40], row_group_size=8)  # 5 row groups
    ds = stoker.ParquetDataset(tmp_path, columns=["id", "vec"])
    loader = stoker.DataLoader(ds, batch_size=3, shuffle=True, num_workers=2)
    for _ in range(3):
        assert sorted(collect(loader)) == list(range(total))
    c = ds.counters()
    assert c["row_group_reads"] == 5 and c["cached_row_groups"] == 5
    assert c["reads"] >= 3 * total
    # a budget of one byte keeps the last row group only: sequential reads still read each
    # row group once per epoch
    small = stoker.ParquetDataset(tmp_path, columns=["id"], cache_bytes=1)
    assert collect(stoker.DataLoader(small, batch_size=4, num_workers=0)) == list(range(total))
    assert small.counters()["row_group_reads"] == 5
    assert small.counters()["cached_row_groups"] == 1


def wide_files(tmp_path, files=4, groups=60, rows=20):
    """Rows of 1 kB (an id and 252 float32), in `files` files of `groups` row groups each."""
    start = 0
    for k in range(files):
        ids = np.arange(start, start + groups * rows, dtype=np.int64)
        vec = pa.FixedSizeListArray.from_arrays(
            pa.array(np.repeat(ids, 252).astype(np.float32)), 252)
        pq.write_table(pa.table({"id": pa.array(ids), "vec": vec}),
                       tmp_path / f"part-{k:03d}.parquet", row_group_size=rows)
        start += groups * rows
    return start


def test_row_groups_larger_than_the_cache_are_shuffled_over_a_window_read_once_each(tmp_path):
    total = wide_files(tmp_path)  # 4.9 MB in 240 row groups of about 20 kB
    layout = stoker.ParquetDataset(tmp_path, columns=["id", "vec"]).storage_layout()
    assert layout["block_ends"] == list(range(20, total + 1, 20))
    assert layout["shard_ends"] == [1200, 2400, 3600, 4800]
    assert all(20 * 1012 <= b <= 20 * 1200 for b in layout["block_bytes"])  # 8 + 1008 a row
    cache = sum(layout["block_bytes"]) // 4
    ds = stoker.ParquetDataset(tmp_path, columns=["id", "vec"], cache_bytes=cache)
    loader = stoker.DataLoader(ds, batch_size=16, shuffle=True, seed=3, num_workers=2)
    orders = []
    for epoch in range(2):
        rows = collect(loader)
        assert sorted(rows) == list(range(total))
        orders.append(rows)
        # Each read once an epoch: a few the last epoch left in the cache are not read again,
        # and the next epoch's first window may be read ahead before this one's last batch.
        window = loader.stats()["shuffle_window"]
        assert 240 * epoch < ds.counters()["row_group_reads"] <= 240 * (epoch + 1) + window
    assert orders[0] != orders[1]
    stats = loader.stats()
    assert stats["shuffle"].startswith("window of ") and "row-group cache" in stats["shuffle"]
    assert 16 <= window < 240
    # Mixed across the window: a batch's rows come from many row groups, not one or two.
    groups_per_batch = [len({r // 20 for r in orders[0][i:i + 16]})
                        for i in range(0, total, 16)]
    assert np.mean(groups_per_batch) > 8
    # Over two ranks: disjoint, every row once.
    ranks = []
    for rank in range(2):
        sampler = stoker.DistributedSampler(ds, num_replicas=2, rank=rank, shuffle=True, seed=4)
        ranks.append(collect(stoker.DataLoader(ds, batch_size=8, sampler=sampler,
                                               num_workers=2)))
    assert not set(ranks[0]) & set(ranks[1]) and sorted(ranks[0] + ranks[1]) == list(range(total))
    # The global permutation, asked for, reads a row group for nearly every batch of rows.
    before = ds.counters()["row_group_reads"]
    loader = stoker.DataLoader(ds, batch_size=16, shuffle="global", seed=3, num_workers=2)
    assert sorted(collect(loader)) == list(range(total))
    assert ds.counters()["row_group_reads"] - before > 5 * 240
    assert loader.stats()["shuffle"] == "global: asked for (shuffle='global')"


def test_each_rank_reads_its_own_row_groups_through_its_own_cache_and_resumes_elsewhere(
        tmp_path, monkeypatch):
    total = wide_files(tmp_path)  # 240 row groups of 20 rows
    layout = stoker.ParquetDataset(tmp_path, columns=["id", "vec"]).storage_layout()
    cache = sum(layout["block_bytes"]) // 16

    def loader_for(rank, world):
        ds = stoker.ParquetDataset(tmp_path, columns=["id", "vec"], cache_bytes=cache)
        sampler = stoker.DistributedSampler(ds, num_replicas=world, rank=rank, shuffle=True,
                                            seed=4)
        return stoker.DataLoader(ds, batch_size=8, sampler=sampler, num_workers=1), ds

    # Four ranks, two a node: the row-group cache is each process's own, so each rank gets a
    # run of row groups of its own whatever the node's ranks.
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    rows, reads, states = [], [], []
    for rank in range(4):
        loader, ds = loader_for(rank, 4)
        assert "each of the 4 ranks reads its own blocks" in loader.stats()["shuffle"]
        rows.append(collect(loader))
        reads.append(ds.counters()["row_group_reads"])
        loader.close()
        loader, _ = loader_for(rank, 4)  # the same epoch, stopped after 5 batches
        it = iter(loader)
        assert np.asarray(next(it)[0]).tolist() == rows[-1][:8]
        for _ in range(4):
            next(it)
        states.append(loader.state_dict())
        assert states[-1]["shuffle_nodes"] == [4, 1]
        loader.close()
    assert sorted(sum(rows, [])) == list(range(total))
    groups = [{r // 20 for r in mine} for mine in rows]
    for a in range(4):
        for b in range(a + 1, 4):
            assert len(groups[a] & groups[b]) <= 1  # where two ranks' runs meet
    # Each rank decodes its quarter once (and a row group where runs meet), not all 240.
    assert all(r <= 62 for r in reads), reads
    # Resumed on three ranks: the rest of the epoch in the order laid out for four, each
    # remaining row once.
    merged = stoker.merge_states(states)
    assert merged["shuffle_nodes"] == [4, 1]
    rest = []
    for rank in range(3):
        loader, _ = loader_for(rank, 3)
        loader.load_state_dict(merged)
        rest += collect(loader)
        assert "each of the 3 ranks" in loader.stats()["shuffle"]
        loader.close()
    taken = {r for k in range(4) for r in rows[k][:5 * 8]}
    assert not taken & set(rest) and sorted(taken | set(rest)) == list(range(total))
    assert len(rest) - len(set(rest)) <= 2  # the padding's repeats
    # A state of an older stoker, whose windowed order placed the samples otherwise, is refused
    # rather than resumed into another order.
    old = {k: v for k, v in states[2].items() if k != "shuffle_nodes"}
    loader, _ = loader_for(2, 4)
    with pytest.raises(ValueError, match="older stoker"):
        loader.load_state_dict(old)
    loader.close()


def test_a_cache_that_holds_the_row_groups_keeps_the_global_shuffle(tmp_path):
    wide_files(tmp_path, files=1, groups=10)
    ds = stoker.ParquetDataset(tmp_path, columns=["id", "vec"])
    loader = stoker.DataLoader(ds, batch_size=16, shuffle=True, num_workers=2)
    collect(loader)
    assert loader.stats()["shuffle"].startswith("global: ")
    assert "holds it all" in loader.stats()["shuffle"]
    assert ds.counters()["row_group_reads"] == 10


# --- bad input ----------------------------------------------------------------------------


def test_a_missing_column_names_file_and_column(tmp_path):
    write_files(tmp_path, [5, 5])
    pq.write_table(pa.table({"id": pa.array([1, 2])}), tmp_path / "part-009.parquet")
    with pytest.raises(KeyError, match=r"part-009\.parquet has no column 'x'"):
        stoker.ParquetDataset(tmp_path, columns=["id", "x"])


def test_an_unsupported_column_type_is_a_clear_error(tmp_path):
    pq.write_table(pa.table({"l": pa.array([[1], [2, 3]])}), tmp_path / "l.parquet")
    with pytest.raises(TypeError, match=r"l\.parquet: column 'l' has the type list<"):
        stoker.ParquetDataset(tmp_path / "l.parquet", columns=["l"])


def test_an_image_column_needs_a_transform(tmp_path):
    table, _ = image_table(0, 3)
    pq.write_table(table, tmp_path / "i.parquet")
    with pytest.raises(ValueError, match="column 'image' holds encoded images"):
        stoker.ParquetDataset(tmp_path / "i.parquet")


def test_a_truncated_file_is_named(tmp_path):
    write_files(tmp_path, [20])
    path = tmp_path / "part-000.parquet"
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(ValueError, match=r"part-000\.parquet: not a readable Parquet file"):
        stoker.ParquetDataset(tmp_path, columns=["id"])
    path.write_bytes(b"")
    with pytest.raises(ValueError, match=r"part-000\.parquet: not a readable Parquet file"):
        stoker.ParquetDataset(path, columns=["id"])


def corrupt_row_group(path, row_group: int, column: int = 0):
    """Overwrites the first data page header of a column chunk with garbage (the footer stays
    intact: the file opens, that row group's reads fail)."""
    meta = pq.ParquetFile(path).metadata.row_group(row_group).column(column)
    offset = meta.dictionary_page_offset or meta.data_page_offset
    with open(path, "r+b") as f:
        f.seek(offset)
        f.write(b"\xff" * 16)


def test_a_corrupt_page_fails_its_rows_named_and_skip_keeps_the_rest(tmp_path):
    table, _ = image_table(0, 20)
    path = tmp_path / "i.parquet"
    pq.write_table(table, path, row_group_size=5, compression="NONE")
    corrupt_row_group(path, 2)  # rows 10..14
    ds = stoker.ParquetDataset(path, transform=T.val(40, 32))
    with pytest.raises(stoker.SampleError, match=r"i\.parquet row 1[0-4]: its row group \(2\) "
                                                 r"could not be read"):
        for _ in stoker.DataLoader(ds, batch_size=4, num_workers=2):
            pass
    loader = stoker.DataLoader(ds, batch_size=4, num_workers=2, on_error="skip")
    for _ in range(2):
        labels = collect(loader, field=1)
        assert len(labels) == 20
    report = loader.skipped_samples()
    assert sorted(s.index for s in report) == list(range(10, 15))
    for s in report:
        assert s.name == f"{path} row {s.index}", s
        assert "could not be read" in s.reason
    # the others' rows are all there
    assert ds.counters()["row_group_reads"] == 4  # the bad one once too: its failure is kept


def test_a_page_whose_checksum_fails_is_named(tmp_path):
    table, _ = image_table(0, 12)
    path = tmp_path / "crc.parquet"
    pq.write_table(table, path, row_group_size=4, compression="NONE", write_page_checksum=True)
    meta = pq.ParquetFile(path).metadata.row_group(1).column(0)
    with open(path, "r+b") as f:  # a byte in the middle of the page's encoded images
        start = meta.dictionary_page_offset if meta.has_dictionary_page else meta.data_page_offset
        f.seek(start + meta.total_compressed_size // 2)
        byte = f.read(1)
        f.seek(-1, os.SEEK_CUR)
        f.write(bytes([byte[0] ^ 0x5A]))
    ds = stoker.ParquetDataset(path, transform=T.val(40, 32))
    loader = stoker.DataLoader(ds, batch_size=4, num_workers=2, on_error="skip")
    assert len(collect(loader, field=1)) == 12
    report = loader.skipped_samples()
    assert sorted(s.index for s in report) == [4, 5, 6, 7]
    assert all("row group (1) could not be read" in s.reason and "CRC" in s.reason
               for s in report), report


def test_nulls_and_undecodable_images_are_named_and_skipped(tmp_path):
    images = [encoded(i) for i in range(12)]
    images[3] = None  # a null image
    images[7] = b"\xff\xd8\xff\xe0 this is not a jpeg"
    labels = list(range(12))
    labels[9] = None  # a null label
    path = tmp_path / "bad.parquet"
    pq.write_table(pa.table({"image": pa.array(images, type=pa.binary()),
                             "label": pa.array(labels, type=pa.int64())}),
                   path, row_group_size=4)
    ds = stoker.ParquetDataset(path, transform=T.val(40, 32))
    with pytest.raises(stoker.SampleError, match=r"bad\.parquet row 3, column 'image': null"):
        list(stoker.DataLoader(ds, batch_size=4, num_workers=0))
    loader = stoker.DataLoader(ds, batch_size=4, num_workers=2, on_error="skip")
    for _ in range(2):
        assert len(collect(loader, field=1)) == 12
    report = {s.index: s for s in loader.skipped_samples()}
    assert sorted(report) == [3, 7, 9]
    assert "column 'image': null" in report[3].reason
    assert f"{path} row 7, column 'image'" in report[7].reason
    assert "column 'label': null" in report[9].reason
    for i in (3, 7, 9):
        assert report[i].name == f"{path} row {i}"


@pytest.mark.parametrize("seed", range(12))
def test_corrupted_files_never_crash_or_hang(tmp_path, seed):
    # Random bytes flipped anywhere (footer included): either the file does not open (an
    # error naming it) or every row is delivered or skipped with a reason naming its file.
    table, _ = image_table(0, 16, hf=seed % 2 == 1)
    path = tmp_path / "f.parquet"
    pq.write_table(table, path, row_group_size=4, write_page_checksum=seed % 3 == 0,
                   compression=["NONE", "snappy", "zstd", "gzip"][seed % 4])
    data = bytearray(path.read_bytes())
    rng = np.random.default_rng(seed)
    for pos in rng.integers(4, len(data) - 8, size=20):
        data[pos] ^= int(rng.integers(1, 256))
    path.write_bytes(bytes(data))
    try:
        ds = stoker.ParquetDataset(path, transform=T.val(40, 32))
    except (ValueError, KeyError, TypeError) as e:
        assert str(path) in str(e)
        return
    loader = stoker.DataLoader(ds, batch_size=4, num_workers=2, on_error="skip",
                               max_skipped=100, timeout=60)
    try:
        assert len(collect(loader, field=1)) == len(ds)
    except stoker.SampleError as e:
        # most rows bad: their replacements failed too, or the skip budget ran out
        assert f"{path} row " in str(e)
        assert "replacements failed too" in str(e) or "skip budget" in str(e)
    for s in loader.skipped_samples():
        assert s.name.startswith(f"{path} row ")


def test_without_pyarrow_the_error_says_how_to_install_it(tmp_path, monkeypatch):
    pq.write_table(numeric_table(0, 3), tmp_path / "n.parquet")
    monkeypatch.setitem(sys.modules, "pyarrow", None)
    monkeypatch.setitem(sys.modules, "pyarrow.parquet", None)
    with pytest.raises(ImportError, match="pip install pyarrow"):
        stoker.ParquetDataset(tmp_path / "n.parquet", columns=["id"])


def test_import_stoker_does_not_import_pyarrow():
    import subprocess

    code = "import sys, stoker; assert 'pyarrow' not in sys.modules; stoker.ParquetDataset"
    subprocess.run([sys.executable, "-c", code], check=True, env=dict(os.environ))


def test_a_data_set_no_longer_used_is_freed(tmp_path):
    # Its C++ half holds the row group reader, which must not hold the data set (a reference
    # cycle through C++ is never collected, and would keep the row group cache).
    import gc
    import weakref

    write_files(tmp_path, [20])
    ds = stoker.ParquetDataset(tmp_path, columns=["id", "caption"])
    loader = stoker.DataLoader(ds, batch_size=4, num_workers=2)
    assert len(collect(loader)) == 20
    gone = weakref.ref(ds)
    loader.close()
    del ds, loader
    gc.collect()
    assert gone() is None


def test_a_hugging_face_image_without_bytes_is_a_null(tmp_path):
    rows = [{"bytes": encoded(i), "path": f"{i}.jpg"} for i in range(6)]
    rows[2] = {"bytes": None, "path": "elsewhere/2.jpg"}
    rows[4] = None  # the struct itself null
    image = pa.array(rows, type=pa.struct([("bytes", pa.binary()), ("path", pa.string())]))
    path = tmp_path / "hf.parquet"
    pq.write_table(pa.table({"image": image, "label": pa.array(range(6))}), path,
                   row_group_size=3)
    ds = stoker.ParquetDataset(path, transform=T.val(40, 32))
    loader = stoker.DataLoader(ds, batch_size=3, num_workers=2, on_error="skip")
    assert len(collect(loader, field=1)) == 6
    report = {s.index: s.reason for s in loader.skipped_samples()}
    assert sorted(report) == [2, 4]
    assert all("column 'image': null" in r for r in report.values()), report


def test_a_string_column_that_cannot_be_read_is_named(tmp_path):
    path = tmp_path / "s.parquet"
    pq.write_table(numeric_table(0, 12), path, row_group_size=4, compression="NONE",
                   use_dictionary=False)
    caption = [n for n in pq.ParquetFile(path).schema_arrow.names].index("caption")
    corrupt_row_group(path, 1, column=caption)
    ds = stoker.ParquetDataset(path, columns=("id", "caption"))
    with pytest.raises(ValueError, match=r"s\.parquet row [4-7]: its row group \(1\)'s string "
                                         r"columns \['caption'\] could not be read"):
        list(stoker.DataLoader(ds, batch_size=4, num_workers=1))
