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


# ---- Mixing (stoker.TokenMix) --------------------------------------------------------------

WEIGHTS = [0.5, 0.3, 0.2]


def mix_sources(tmp_path, seq_len=16):
    """Three flat token files of different sizes: 0 the largest, 2 small enough to wrap."""
    paths = [write_flat(tmp_path / f"s{i}.bin", documents(n, 20 + i))
             for i, n in enumerate([120, 60, 12])]
    return [stoker.TokenDataset(p, seq_len, eod=EOD, seed=i) for i, p in enumerate(paths)]


def keys(rows):
    """Each row as a hashable key: its source and tokens."""
    return [(int(s), ids.tobytes()) for s, ids in zip(rows["source"], rows["input_ids"])]


def rank_steps(ds, world, batch_size, num_workers=0, **kw):
    """Each rank's batches of the mix read in order: steps[r][k] is rank r's k-th batch."""
    steps = []
    for r in range(world):
        sampler = stoker.DistributedSampler(ds, num_replicas=world, rank=r, shuffle=False)
        loader = stoker.DataLoader(ds, batch_size=batch_size, sampler=sampler,
                                   num_workers=num_workers, **kw)
        steps.append([{k: v.numpy() for k, v in b.items()} for b in loader])
        loader.close()
    return steps


def test_a_stratified_mix_holds_each_sources_share_in_every_global_batch(tmp_path):
    sources = mix_sources(tmp_path)
    world, batch = 2, 6
    ds = stoker.TokenMix(sources, WEIGHTS, global_batch=world * batch, samples=600, seed=3)
    assert len(ds) == 600 and ds.seq_len == 16
    steps = rank_steps(ds, world, batch, num_workers=2, worker_type="thread")
    assert len(steps[0]) == 600 // 12
    for k in range(len(steps[0])):
        counts = np.bincount(np.concatenate([steps[r][k]["source"] for r in range(world)]),
                             minlength=3)
        assert counts.sum() == 12
        assert np.all(np.abs(counts - np.array(WEIGHTS) * 12) <= 1), (k, counts)
    # Source 2 has fewer rows than its share of 600: it wraps around to more epochs.
    assert ds.epochs()[2] > 1
    assert ds.epochs()[0] == 1


def test_an_iid_mix_stays_within_the_binomial_spread(tmp_path):
    sources = mix_sources(tmp_path)
    ds = stoker.TokenMix(sources, WEIGHTS, mixing="iid", samples=3000, seed=4)
    src = loader_rows(stoker.DataLoader(ds, batch_size=100, num_workers=2))["source"]
    p = np.array(WEIGHTS)
    counts = np.bincount(src, minlength=3)
    assert np.all(np.abs(counts - p * 3000) <= 4 * np.sqrt(3000 * p * (1 - p))), counts
    per_batch = np.stack([np.bincount(b, minlength=3) for b in src.reshape(30, 100)])
    assert np.all(np.abs(per_batch - p * 100) <= 5 * np.sqrt(100 * p * (1 - p)))
    # and not stratified: some batch is off its share by more than a row
    assert np.any(np.abs(per_batch - p * 100) > 1)


def test_each_sample_is_its_sources_row_and_the_seed_decides_the_mix(tmp_path):
    sources = mix_sources(tmp_path)
    ds = stoker.TokenMix(sources, WEIGHTS, global_batch=8, samples=256, seed=5)
    rows = loader_rows(stoker.DataLoader(ds, batch_size=8, num_workers=2))
    src, row = ds.index()
    np.testing.assert_array_equal(rows["source"], src)
    for i in range(0, 256, 7):
        want = ds.sources[src[i]][int(row[i])]
        for f in ("input_ids", "labels", "position_ids", "document_ids", "cu_seqlens"):
            np.testing.assert_array_equal(rows[f][i], np.asarray(want[f]))
    same = loader_rows(stoker.DataLoader(
        stoker.TokenMix(sources, WEIGHTS, global_batch=8, samples=256, seed=5), batch_size=8))
    assert keys(same) == keys(rows)
    other = loader_rows(stoker.DataLoader(
        stoker.TokenMix(sources, WEIGHTS, global_batch=8, samples=256, seed=6), batch_size=8))
    assert keys(other) != keys(rows)
    s2, r2, _ = stoker.token_mix_index([len(d) for d in ds.sources], WEIGHTS, "stratified", 8,
                                       256, 5)
    np.testing.assert_array_equal(s2, src)
    np.testing.assert_array_equal(r2, row)


def test_two_ranks_are_disjoint_and_cover_the_mix(tmp_path):
    ds = stoker.TokenMix(mix_sources(tmp_path), WEIGHTS, global_batch=10, samples=300, seed=1)
    whole = keys(loader_rows(stoker.DataLoader(ds, batch_size=10)))
    steps = rank_steps(ds, 2, 5, num_workers=2, worker_type="thread")
    got = []
    for k in range(len(steps[0])):
        # rank r holds the step's positions r, r + 2, ... (DistributedSampler's stride)
        step = [keys(steps[r][k]) for r in range(2)]
        got += [step[i % 2][i // 2] for i in range(10)]
    assert got == whole


def test_a_budget_of_epochs_or_tokens_gives_each_source_exactly_its_rows(tmp_path):
    sources = mix_sources(tmp_path)
    rows = [len(d) for d in sources]
    # Epochs: half of source 0, all of source 1, two and a half of source 2 (it wraps around).
    ds = stoker.TokenMix(sources, epochs=[0.5, 1, 2.5], global_batch=8, seed=2)
    want = [round(0.5 * rows[0]), rows[1], round(2.5 * rows[2])]
    assert len(ds) == sum(want)
    src, row = ds.index()
    assert np.bincount(src, minlength=3).tolist() == want
    assert sorted(row[src == 1].tolist()) == list(range(rows[1]))  # each of its rows once
    got = loader_rows(stoker.DataLoader(ds, batch_size=8, num_workers=2))
    assert np.bincount(got["source"], minlength=3).tolist() == want
    # Tokens: each source's budget in rows of seq_len (16), rounded up.
    ds = stoker.TokenMix(sources, tokens=[160, 0, 33], global_batch=4)
    assert np.bincount(ds.index()[0], minlength=3).tolist() == [10, 0, 3]
    # A pickled budgeted mix is the same mix.
    again = pickle.loads(pickle.dumps(ds))
    np.testing.assert_array_equal(again.index()[0], ds.index()[0])
    with pytest.raises(ValueError, match="one of weights, epochs or tokens, not weights and epochs"):
        stoker.TokenMix(sources, WEIGHTS, epochs=[1, 1, 1], global_batch=4)
    with pytest.raises(ValueError, match="2 epochs for 3 sources"):
        stoker.TokenMix(sources, epochs=[1, 1], global_batch=4)
    with pytest.raises(ValueError, match="samples follows from tokens"):
        stoker.TokenMix(sources, tokens=[1, 1, 1], samples=10, global_batch=4)
    with pytest.raises(ValueError, match="give no rows"):
        stoker.TokenMix(sources, epochs=[0, 0, 0], global_batch=4)


def test_a_mix_pickles_and_refuses_what_it_cannot_mix(tmp_path):
    sources = mix_sources(tmp_path)
    ds = stoker.TokenMix(sources, WEIGHTS, global_batch=4, samples=40, seed=2)
    back = pickle.loads(pickle.dumps(ds))
    assert keys(loader_rows(stoker.DataLoader(back, batch_size=4))) == keys(
        loader_rows(stoker.DataLoader(ds, batch_size=4)))
    with pytest.raises(ValueError, match="2 weights for 3 sources"):
        stoker.TokenMix(sources, WEIGHTS[:2], global_batch=4)
    with pytest.raises(ValueError, match="needs global_batch"):
        stoker.TokenMix(sources, WEIGHTS)
    with pytest.raises(ValueError, match="mixing must be"):
        stoker.TokenMix(sources, WEIGHTS, mixing="round_robin")
    with pytest.raises(ValueError, match="seq_len"):
        longer = stoker.TokenDataset(sources[0].paths, 32, eod=EOD)
        stoker.TokenMix([sources[0], longer], [1, 1], global_batch=4)
    with pytest.raises(ValueError, match="every source's weight is 0"):
        stoker.TokenMix(sources, [0, 0, 0], global_batch=4)


def test_a_second_mix_of_the_same_inputs_loads_its_index_from_the_cache(tmp_path):
    sources, cache = mix_sources(tmp_path), tmp_path / "cache"
    made = [stoker.TokenMix(sources, w, global_batch=64, samples=70_000, index_cache=cache)
            for w in (WEIGHTS, WEIGHTS, WEIGHTS[::-1])]
    assert [m.index_from_cache() for m in made] == [False, True, False]
    fresh = stoker.TokenMix(sources, WEIGHTS, global_batch=64, samples=70_000, index_cache=False)
    assert all((a == b).all() for a, b in zip(made[1].index(), fresh.index()))
    assert pickle.loads(pickle.dumps(made[0])).index_from_cache()
    assert len(list(cache.glob("*.mix"))) == 2


# A native data set reads on threads whatever worker_type says (stats()["worker_type"]), so
# there is no threads-to-processes case here.
@pytest.mark.parametrize("old_workers, new_workers, new_kind, cuts", [
    (2, 1, "thread", 100),
    (3, 2, "thread", 100),  # the 4 ranks x 3 workers to 3 ranks x 2
])
def test_resume_at_random_cut_points_on_another_topology_gives_the_uninterrupted_rows(
        tmp_path, old_workers, new_workers, new_kind, cuts):
    """Saved on 4 ranks x old_workers worker threads, merged, resumed on 3 ranks x
    new_workers: the rows after the cut are the uninterrupted run's from the cut on, in its
    order (every sample of the epoch once over the two runs), whether the ranks stopped at the
    same step or not."""
    ds = stoker.TokenMix(mix_sources(tmp_path), WEIGHTS, global_batch=16, samples=320, seed=7)
    whole = keys(loader_rows(stoker.DataLoader(ds, batch_size=16)))
    old_world, old_batch, new_world, new_batch = 4, 4, 3, 4
    steps_old = len(ds) // (old_world * old_batch)
    rng = np.random.default_rng(50 + new_workers)
    for cut in range(cuts):
        if cut % 2 == 0:
            stops = [int(rng.integers(1, steps_old))] * old_world  # one step on every rank
        else:
            stops = [int(x) for x in rng.integers(1, steps_old, old_world)]
        seen, states = [], []
        for r in range(old_world):
            sampler = stoker.DistributedSampler(ds, num_replicas=old_world, rank=r,
                                                shuffle=False)
            loader = stoker.DataLoader(ds, batch_size=old_batch, sampler=sampler,
                                       num_workers=old_workers, worker_type="thread")
            it = iter(loader)
            for _ in range(stops[r]):
                seen.append(keys({k: v.numpy() for k, v in next(it).items()}))
            states.append(loader.state_dict())
            loader.close()
        merged = stoker.merge_states(states)
        rest = []
        for r in range(new_world):
            sampler = stoker.DistributedSampler(ds, num_replicas=new_world, rank=r,
                                                shuffle=False)
            loader = stoker.DataLoader(ds, batch_size=new_batch, sampler=sampler,
                                       num_workers=new_workers, worker_type=new_kind)
            loader.load_state_dict(merged)
            rest.append([keys({k: v.numpy() for k, v in b.items()}) for b in loader])
            loader.close()
        # What the old ranks read: rank r's step k holds positions 16 k + r + 4 j.
        consumed = {k * 16 + r + old_world * j for r in range(old_world)
                    for k in range(stops[r]) for j in range(old_batch)}
        assert sorted(x for b in seen for x in b) == sorted(whole[p] for p in consumed)
        # The new ranks' rows in the order of the rest of the epoch: rank r holds the rest's
        # positions r, r + 3, ... (DistributedSampler's stride), the rest padded to a multiple
        # of the ranks by repeating its first rows.
        stream = [rest[r][k][j] for k in range(len(rest[0])) for j in range(len(rest[0][k]))
                  for r in range(new_world)]
        remaining = [whole[p] for p in range(len(whole)) if p not in consumed]
        assert stream[:len(remaining)] == remaining, (cut, stops)
        assert len(stream) - len(remaining) < new_world
        assert stream[len(remaining):] == remaining[:len(stream) - len(remaining)]
