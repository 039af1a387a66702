"""stoker.TokenDataset: token files (Megatron's .bin/.idx, flat uint16/uint32) packed into rows,
checked against numpy references built from the same files, through stoker's DataLoader."""

import pickle
import struct

import numpy as np
import pytest
import torch

import stoker

EOD = 0


def documents(n, seed, vocab=1000, median=40, sigma=1.0):
    """n documents of log-normal lengths, tokens in 1..vocab-1, each ending in EOD."""
    rng = np.random.default_rng(seed)
    lengths = np.maximum(2, rng.lognormal(np.log(median), sigma, n).astype(np.int64))
    return [np.append(rng.integers(1, vocab, n - 1), EOD) for n in lengths]


def write_flat(path, docs, dtype=np.uint16):
    np.concatenate(docs).astype(dtype).tofile(path)
    return path


def write_megatron(prefix, docs, dtype=np.uint16, code=8):
    """Megatron's indexed data set, as megatron-core's _IndexWriter writes it."""
    lengths = np.array([len(d) for d in docs], dtype=np.int32)
    pointers = np.concatenate([[0], np.cumsum(lengths[:-1].astype(np.int64))]) * np.dtype(
        dtype).itemsize
    with open(f"{prefix}.idx", "wb") as f:
        f.write(b"MMIDIDX\x00\x00" + struct.pack("<Q", 1) + struct.pack("<B", code))
        f.write(struct.pack("<Q", len(docs)) + struct.pack("<Q", len(docs) + 1))
        f.write(lengths.tobytes() + pointers.astype(np.int64).tobytes())
        f.write(np.arange(len(docs) + 1, dtype=np.int64).tobytes())
    np.concatenate(docs).astype(dtype).tofile(f"{prefix}.bin")
    return str(prefix)


def reference_row(docs, pieces, seq_len, max_segments, labels="next", pad_id=0):
    """A row from its pieces (doc, offset, length), built plainly."""
    ids = np.full(seq_len, pad_id, np.int64)
    lab = np.full(seq_len, -100, np.int64)
    pos = np.zeros(seq_len, np.int64)
    did = np.full(seq_len, -1, np.int64)
    cu = [0]
    at = 0
    for doc, off, n in pieces:
        d = docs[doc]
        ids[at:at + n] = d[off:off + n]
        pos[at:at + n] = np.arange(n)
        did[at:at + n] = doc
        if labels == "next":
            nxt = d[off + 1:off + n + 1]
            lab[at:at + len(nxt)] = nxt  # -100 stays after the document's last token
        else:
            lab[at + 1:at + n] = d[off + 1:off + n]
        at += n
        cu.append(at)
    if at < seq_len:
        cu.append(seq_len)
    cu += [seq_len] * (max_segments + 1 - len(cu))
    return dict(input_ids=ids, labels=lab, position_ids=pos, document_ids=did,
                cu_seqlens=np.array(cu, np.int32))


def rows_of(plan):
    out = []
    for r in range(len(plan["row_starts"]) - 1):
        s, e = plan["row_starts"][r], plan["row_starts"][r + 1]
        out.append(list(zip(plan["doc"][s:e].tolist(), plan["offset"][s:e].tolist(),
                            plan["length"][s:e].tolist())))
    return out


def loader_rows(loader):
    """Every row the loader gives, by field, as numpy, in order."""
    got = {}
    for batch in loader:
        for k, v in batch.items():
            got.setdefault(k, []).append(v.numpy())
    return {k: np.concatenate(v) for k, v in got.items()}


def test_concatenated_rows_equal_the_file_cut_into_rows(tmp_path):
    docs = documents(300, 1)
    path = write_flat(tmp_path / "train.bin", docs)
    seq_len = 64
    ds = stoker.TokenDataset(path, seq_len, eod=EOD, shuffle_documents=False, vocab_size=1000)
    stream = np.concatenate(docs)
    doc_of = np.repeat(np.arange(len(docs)), [len(d) for d in docs])
    assert len(ds) == len(stream) // seq_len
    got = loader_rows(stoker.DataLoader(ds, batch_size=7, num_workers=2))
    assert got["input_ids"].dtype == np.int64 and got["cu_seqlens"].dtype == np.int32
    rows = len(ds)
    ids = stream[:rows * seq_len].reshape(rows, seq_len)
    np.testing.assert_array_equal(got["input_ids"], ids)
    np.testing.assert_array_equal(got["document_ids"], doc_of[:rows * seq_len].reshape(rows, -1))
    # labels: the next token of the stream where it is the same document's, else -100
    nxt = np.append(stream[1:], -100)
    same_doc = np.append(doc_of[1:] == doc_of[:-1], False)
    labels = np.where(same_doc, nxt, -100)[:rows * seq_len].reshape(rows, seq_len)
    np.testing.assert_array_equal(got["labels"], labels)
    # positions restart at each document and at each row
    for r in range(rows):
        d = doc_of[r * seq_len:(r + 1) * seq_len]
        starts = np.flatnonzero(np.append(True, d[1:] != d[:-1]))
        pos = np.arange(seq_len) - np.repeat(starts, np.diff(np.append(starts, seq_len)))
        np.testing.assert_array_equal(got["position_ids"][r], pos)
        cu = np.append(starts, seq_len)
        np.testing.assert_array_equal(got["cu_seqlens"][r][:len(cu)], cu)
        assert (got["cu_seqlens"][r][len(cu):] == seq_len).all()


@pytest.mark.parametrize("labels", ["next", "same"])
def test_best_fit_rows_of_megatron_files_equal_a_reference_built_from_the_plan(tmp_path,
                                                                               labels):
    a, b = documents(200, 2), documents(150, 3, median=200)
    pa = write_megatron(tmp_path / "a", a)
    pb = write_megatron(tmp_path / "b", b, dtype=np.int32, code=4)
    ds = stoker.TokenDataset([pa, pb + ".idx"], 256, pack="best_fit", seed=5, labels=labels,
                             pad_id=3)
    docs = a + b
    np.testing.assert_array_equal(ds.lengths(), [len(d) for d in docs])
    plan = ds.plan()
    rows = rows_of(plan)
    # every document once, whole unless longer than a row (then split into row-sized pieces)
    placed = sorted(p for row in rows for p in row)
    assert [p[0] for p in placed if p[1] == 0] == list(range(len(docs)))
    assert sum(p[2] for p in placed) == sum(len(d) for d in docs)
    assert all(sum(p[2] for p in row) <= 256 for row in rows)
    assert plan["fill"] > 0.9
    got = loader_rows(stoker.DataLoader(ds, batch_size=5, num_workers=2))
    assert len(got["input_ids"]) == len(rows)
    for r, pieces in enumerate(rows):
        ref = reference_row(docs, pieces, 256, ds.max_segments, labels=labels, pad_id=3)
        for k, v in ref.items():
            np.testing.assert_array_equal(got[k][r], v, err_msg=f"row {r} {k}")


def test_the_plan_is_a_pure_function_and_replans_for_a_new_seq_len_without_files():
    rng = np.random.default_rng(0)
    lengths = np.maximum(1, rng.lognormal(np.log(300), 1.2, 100_000)).astype(np.uint32)
    a = stoker.plan_token_rows(lengths, 4096, pack="best_fit", seed=1)
    b = stoker.plan_token_rows(lengths, 4096, pack="best_fit", seed=1)
    for k in ("doc", "offset", "length", "row_starts"):
        np.testing.assert_array_equal(a[k], b[k])
    assert a["fill"] > 0.99
    c = stoker.plan_token_rows(lengths, 2048, pack="concat", seed=1)
    assert c["fill"] == 1.0 and len(c["row_starts"]) - 1 == int(lengths.sum()) // 2048


def test_two_ranks_are_disjoint_and_cover_every_row(tmp_path):
    path = write_flat(tmp_path / "t.bin", documents(400, 4), dtype=np.uint32)
    ds = stoker.TokenDataset(path, 32, eod=EOD, dtype="uint32")
    whole = loader_rows(stoker.DataLoader(ds, batch_size=8))["input_ids"]
    seen = []
    for rank in range(2):
        sampler = stoker.DistributedSampler(ds, num_replicas=2, rank=rank, shuffle=True, seed=4)
        rows = loader_rows(stoker.DataLoader(ds, batch_size=4, sampler=sampler,
                                             num_workers=2))["input_ids"]
        seen.append({r.tobytes() for r in rows})
        assert len(seen[-1]) == len(rows)
    # DistributedSampler pads the epoch to a multiple of the ranks by repeating its start
    assert len(seen[0] & seen[1]) == len(ds) % 2
    assert seen[0] | seen[1] == {r.tobytes() for r in whole}


def test_a_mid_epoch_resume_gives_the_uninterrupted_runs_rows(tmp_path):
    path = write_flat(tmp_path / "t.bin", documents(300, 6))
    make = lambda: stoker.TokenDataset(path, 48, eod=EOD, pack="best_fit", seed=2)
    loader = stoker.DataLoader(make(), batch_size=4, shuffle=True, seed=9, num_workers=2)
    it = iter(loader)
    head = [next(it)["input_ids"].numpy() for _ in range(5)]
    state = loader.state_dict()
    tail = [b["input_ids"].numpy() for b in it]
    fresh = stoker.DataLoader(make(), batch_size=4, shuffle=True, seed=9, num_workers=1)
    fresh.load_state_dict(state)
    resumed = [b["input_ids"].numpy() for b in fresh]
    assert len(resumed) == len(tail) > 0
    for x, y in zip(resumed, tail):
        np.testing.assert_array_equal(x, y)
    everything = np.concatenate(head + tail)
    assert len({r.tobytes() for r in everything}) == len(make())


def test_bad_inputs_are_named_by_file_and_document(tmp_path):
    docs = documents(5, 7)
    p = write_megatron(tmp_path / "m", docs)
    ok = stoker.TokenDataset(p, 16)
    assert ok.document_name(3) == f"{p}.bin document 3"
    bin_path = tmp_path / "m.bin"
    data = bin_path.read_bytes()
    bin_path.write_bytes(data[:-4])
    with pytest.raises(RuntimeError, match=r"m\.bin is truncated: .*m\.bin document 4 ends"):
        stoker.TokenDataset(p, 16)
    bin_path.write_bytes(data + b"\0\0")
    with pytest.raises(RuntimeError, match=r"m\.idx does not match .*m\.bin"):
        stoker.TokenDataset(p, 16)
    bin_path.write_bytes(data)
    idx = (tmp_path / "m.idx").read_bytes()
    (tmp_path / "m.idx").write_bytes(b"NOTANIDX" + idx[8:])
    with pytest.raises(RuntimeError, match=r"m\.idx: not a Megatron index"):
        stoker.TokenDataset(p, 16)
    (tmp_path / "m.idx").write_bytes(idx[:17] + bytes([7]) + idx[18:])
    with pytest.raises(RuntimeError, match=r"m\.idx: dtype code 7"):
        stoker.TokenDataset(p, 16)
    empty = write_flat(tmp_path / "e.bin", [np.array([5, EOD]), np.array([EOD]),
                                             np.array([6, EOD])])
    with pytest.raises(RuntimeError, match=r"e\.bin document 1 is empty"):
        stoker.TokenDataset(empty, 4, eod=EOD)
    # A token past the vocabulary fails its row's read, named; on_error='skip' goes on.
    bad = [np.array([1, 2, EOD]), np.array([3, 999, 4, EOD]), np.array([5, 6, EOD])]
    path = write_flat(tmp_path / "v.bin", bad)
    ds = stoker.TokenDataset(path, 4, eod=EOD, pack="best_fit", vocab_size=100,
                             shuffle_documents=False)
    with pytest.raises(stoker.SampleError, match=r"v\.bin document 1: token 1 is 999"):
        list(stoker.DataLoader(ds, batch_size=1, num_workers=1))
    rows = loader_rows(stoker.DataLoader(ds, batch_size=1, num_workers=1, on_error="skip"))
    assert 999 not in rows["input_ids"]
    with pytest.raises(ValueError, match="pack must be"):
        stoker.TokenDataset(path, 4, eod=EOD, pack="first_fit")



def test_a_pickled_data_set_plans_the_same_rows(tmp_path):
    # How a remote worker (stoker.RayWorkers) gets it: made again from its arguments.
    path = write_flat(tmp_path / "t.bin", documents(200, 8))
    ds = stoker.TokenDataset(path, 40, eod=EOD, pack="best_fit", seed=3, labels="same")
    again = pickle.loads(pickle.dumps(ds))
    for k, v in ds.plan().items():
        np.testing.assert_array_equal(again.plan()[k], v)
    for i in (0, len(ds) // 2, len(ds) - 1):
        for x, y in zip(ds[i].values(), again[i].values()):
            np.testing.assert_array_equal(x, y)


def test_a_stratified_blend_holds_each_sources_share_in_every_batch():
    weights = [0.55, 0.3, 0.1, 0.05]
    batch, batches = 64, 200
    source, draw = stoker.stratified_blend(weights, batch, batches, seed=3)
    assert len(source) == len(draw) == batch * batches
    per_batch = np.stack([np.bincount(source[b * batch:(b + 1) * batch], minlength=4)
                          for b in range(batches)])
    share = np.array(weights) / sum(weights) * batch
    assert (np.abs(per_batch - share) <= 1).all()
    for s in range(4):  # each source's samples numbered in stream order
        np.testing.assert_array_equal(draw[source == s], np.arange((source == s).sum()))
    again, _ = stoker.stratified_blend(weights, batch, batches, seed=3)
    np.testing.assert_array_equal(source, again)
    with pytest.raises(ValueError, match="weight"):
        stoker.stratified_blend([1, -1], 4, 1)
