"""stoker.TextTokens: raw text (JSONL, Parquet text columns) tokenized with Hugging Face
tokenizers in the loader's workers and packed per block, checked against the same texts
tokenized offline and packed by stoker.TokenDataset."""

import json

import numpy as np
import pytest

import stoker

tokenizers = pytest.importorskip("tokenizers")
pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")

WORDS = [f"w{i}" for i in range(300)]


def texts(n, seed):
    rng = np.random.default_rng(seed)
    lengths = np.maximum(1, rng.lognormal(np.log(20), 0.8, n).astype(int))
    return [" ".join(rng.choice(WORDS, k)) for k in lengths]


def word_tokenizer():
    from tokenizers import Tokenizer, models, pre_tokenizers

    vocab = {"[UNK]": 0, "[EOD]": 1, **{w: i + 2 for i, w in enumerate(WORDS)}}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    return tok


def write_jsonl(path, docs):
    with open(path, "w") as f:
        for t in docs:
            f.write(json.dumps({"text": t, "id": 0}) + "\n")
    return str(path)


def rows(loader):
    got = {}
    for batch in loader:
        for k, v in batch.items():
            got.setdefault(k, []).append(v.numpy())
    return {k: np.concatenate(v) for k, v in got.items()}


def reference(docs, block, tok, seq_len, pack, eod=1):
    """Every block tokenized offline and packed by TokenDataset (a pyarrow token column)."""
    out = {}
    for a in range(0, len(docs), block):
        ids = [e.ids + [eod] for e in tok.encode_batch(docs[a:a + block],
                                                       add_special_tokens=False)]
        ds = stoker.TokenDataset(pa.array(ids, pa.list_(pa.int64())), seq_len, pack=pack,
                                 shuffle_documents=False, max_segments=seq_len)
        for i in range(len(ds)):
            row = ds[i]
            for k, v in row.items():
                v = v.numpy()
                if k == "document_ids":
                    v = np.where(v < 0, -1, v + a)
                out.setdefault(k, []).append(v)
    return {k: np.stack(v) for k, v in out.items()}


def by_row(got):
    """Rows keyed by their bytes (the order depends on how blocks are dealt to workers)."""
    keys = [b"".join(got[k][i].tobytes() for k in sorted(got)) for i in range(len(got["labels"]))]
    return sorted(keys)


@pytest.mark.parametrize("pack", ["concat", "best_fit"])
def test_text_rows_equal_the_texts_tokenized_offline_and_packed_per_block(tmp_path, pack):
    docs = texts(400, 1)
    a = write_jsonl(tmp_path / "a.jsonl", docs[:250])
    b = write_jsonl(tmp_path / "b.jsonl", docs[250:])
    tok = word_tokenizer()
    ds = stoker.TextTokens([a, b], tok, 64, eod=1, pack=pack, block_documents=50, seed=3)
    got = rows(stoker.DataLoader(ds, batch_size=4, num_workers=2, worker_type="process"))
    ref = reference(docs[:250], 50, tok, 64, pack)
    ref_b = reference(docs[250:], 50, tok, 64, pack)
    ref = {k: np.concatenate([ref[k], np.where(ref_b[k] >= 0, ref_b[k] + 250, -1)
                              if k == "document_ids" else ref_b[k]]) for k in ref}
    assert by_row(got) == by_row(ref)
    # inline, the blocks in the seed's order: the same rows
    inline = rows(stoker.DataLoader(ds, batch_size=4, num_workers=0))
    assert by_row(inline) == by_row(ref)


def test_a_parquet_text_column_gives_the_rows_of_the_same_jsonl(tmp_path):
    docs = texts(300, 2)
    j = write_jsonl(tmp_path / "t.jsonl", docs)
    p = tmp_path / "t.parquet"
    pq.write_table(pa.table({"text": docs}), p, row_group_size=60)  # a block per row group
    tok = word_tokenizer()
    kw = dict(eod=1, pack="best_fit", seed=4)
    from_jsonl = rows(stoker.DataLoader(stoker.TextTokens(j, tok, 32, block_documents=60, **kw),
                                        batch_size=8, num_workers=0))
    from_parquet = rows(stoker.DataLoader(stoker.TextTokens(p, tok, 32, **kw), batch_size=8,
                                          num_workers=0))
    for k in from_jsonl:
        np.testing.assert_array_equal(from_jsonl[k], from_parquet[k], err_msg=k)


def test_a_mid_epoch_resume_gives_the_rest_of_the_rows_on_any_topology(tmp_path, monkeypatch):
    docs = texts(500, 5)
    path = write_jsonl(tmp_path / "t.jsonl", docs)
    tok = word_tokenizer()
    make = lambda: stoker.TextTokens(path, tok, 48, eod=1, block_documents=40, seed=6)
    whole = by_row(rows(stoker.DataLoader(make(), batch_size=4, num_workers=0)))
    loader = stoker.DataLoader(make(), batch_size=4, num_workers=2, worker_type="thread")
    it = iter(loader)
    head = [next(it) for _ in range(7)]
    state = loader.state_dict()
    tail = [b for b in it]
    loader.close()
    # the same topology: exactly the uninterrupted run's batches
    again = stoker.DataLoader(make(), batch_size=4, num_workers=2, worker_type="thread")
    again.load_state_dict(state)
    resumed = list(again)
    assert len(resumed) == len(tail) > 0
    for x, y in zip(resumed, tail):
        for k in x:
            np.testing.assert_array_equal(x[k].numpy(), y[k].numpy())
    # another topology (merged: 1 worker process): the rows not yet consumed, each once
    merged = stoker.merge_states([state])
    other = stoker.DataLoader(make(), batch_size=4, num_workers=1, worker_type="process")
    other.load_state_dict(merged)
    cat = lambda bs: {k: np.concatenate([b[k].numpy() for b in bs]) for k in bs[0]}
    assert sorted(by_row(cat(head)) + by_row(rows(other))) == whole


def test_bad_text_is_named_by_file_and_line(tmp_path):
    tok = word_tokenizer()
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"text": "w1 w2"}\n{"body": "w3"}\n')
    with pytest.raises(ValueError, match=r"bad\.jsonl line 2: no string 'text'"):
        list(stoker.TextTokens(bad, tok, 4, shuffle=False))
    broken = tmp_path / "broken.jsonl"
    broken.write_text('{"text": "w1 w2"}\n{"text": \n')
    with pytest.raises(ValueError, match=r"broken\.jsonl line 2: not JSON"):
        list(stoker.TextTokens(broken, tok, 4, shuffle=False))
    p = tmp_path / "n.parquet"
    pq.write_table(pa.table({"text": ["w1", None], "n": [1, 2]}), p)
    with pytest.raises(ValueError, match=r"n\.parquet column text row 1 is null"):
        list(stoker.TextTokens(p, tok, 4))
    with pytest.raises(TypeError, match=r"n\.parquet column n is int64, not text"):
        list(stoker.TextTokens(p, tok, 4, text_key="n"))
    with pytest.raises(KeyError, match=r"n\.parquet has no column 'body'"):
        list(stoker.TextTokens(p, tok, 4, text_key="body"))
    with pytest.raises(ValueError, match=r"max_segments 2 is fewer than a row needs"):
        list(stoker.TextTokens(write_jsonl(tmp_path / "s.jsonl", ["w1", "w2", "w3", "w4"]),
                               tok, 8, eod=1, max_segments=2))


def test_two_ranks_saved_mid_epoch_resume_on_three_each_row_once(tmp_path, monkeypatch):
    docs = texts(600, 7)
    path = write_jsonl(tmp_path / "t.jsonl", docs)
    tok = word_tokenizer()
    make = lambda: stoker.TextTokens(path, tok, 32, eod=1, block_documents=30, seed=8,
                                     pack="best_fit")
    whole = by_row(rows(stoker.DataLoader(make(), batch_size=4, num_workers=0)))
    seen, states = [], []
    for rank, stop in ((0, 5), (1, 9)):
        monkeypatch.setenv("RANK", str(rank))
        monkeypatch.setenv("WORLD_SIZE", "2")
        loader = stoker.DataLoader(make(), batch_size=4, num_workers=2, worker_type="thread")
        it = iter(loader)
        seen += [next(it) for _ in range(stop)]
        states.append(loader.state_dict())
        loader.close()
    merged = stoker.merge_states(states)
    rest = []
    for rank in range(3):
        monkeypatch.setenv("RANK", str(rank))
        monkeypatch.setenv("WORLD_SIZE", "3")
        loader = stoker.DataLoader(make(), batch_size=4, num_workers=1, worker_type="thread")
        loader.load_state_dict(merged)
        rest += list(loader)
        loader.close()
    cat = lambda bs: {k: np.concatenate([b[k].numpy() for b in bs]) for k in bs[0]}
    assert sorted(by_row(cat(seen)) + by_row(cat(rest))) == whole


def test_a_text_with_no_tokens_is_no_document_and_ids_stay_the_corpus_lines(tmp_path):
    path = write_jsonl(tmp_path / "e.jsonl", ["w1 w2", "", "w3"])
    ds = stoker.TextTokens(path, word_tokenizer(), 8, eod=1, pack="best_fit", shuffle=False)
    got = rows(stoker.DataLoader(ds, batch_size=1))
    assert len(got["input_ids"]) == 1
    assert got["input_ids"][0][:5].tolist() == [3, 4, 1, 5, 1]  # w1 w2 [EOD] w3 [EOD]
    assert got["document_ids"][0].tolist() == [0, 0, 0, 2, 2, -1, -1, -1]
