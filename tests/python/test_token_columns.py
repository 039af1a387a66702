"""stoker.TokenDataset over token columns: Parquet files and Hugging Face data sets whose rows
are documents, checked against the same documents in a flat token file (the native source)."""

import pickle

import numpy as np
import pytest

import stoker

from test_tokens import EOD, documents, loader_rows, write_flat

pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")


def write_parquet(path, docs, value_type=None, row_group_size=37, **columns):
    value_type = value_type or pa.int32()
    table = pa.table({"input_ids": pa.array([d.tolist() for d in docs],
                                            pa.list_(value_type)), **columns})
    pq.write_table(table, path, row_group_size=row_group_size)
    return str(path)


def assert_same_rows(a, b):
    assert len(a) == len(b) > 0
    for k in a:
        np.testing.assert_array_equal(a[k], b[k], err_msg=k)


@pytest.mark.parametrize("pack", ["concat", "best_fit"])
def test_a_parquet_token_column_packs_as_the_same_documents_in_a_flat_file(tmp_path, pack):
    docs = documents(300, 11)
    flat = write_flat(tmp_path / "t.bin", docs)
    write_parquet(tmp_path / "a.parquet", docs[:120])
    write_parquet(tmp_path / "b.parquet", docs[120:], value_type=pa.uint16())
    col = stoker.TokenDataset(tmp_path, 64, pack=pack, seed=4, vocab_size=1000)  # a directory
    assert col.format == "parquet" and len(col.paths) == 2
    ref = stoker.TokenDataset(flat, 64, eod=EOD, pack=pack, seed=4, vocab_size=1000)
    np.testing.assert_array_equal(col.lengths(), ref.lengths())
    assert col.max_segments == ref.max_segments
    assert col.document_name(130) == f"{tmp_path / 'b.parquet'} column input_ids row 10"
    assert_same_rows(loader_rows(stoker.DataLoader(col, batch_size=5, num_workers=2)),
                     loader_rows(stoker.DataLoader(ref, batch_size=5)))


def test_a_hugging_face_data_set_reads_its_input_ids_in_place_in_its_own_order(tmp_path):
    datasets = pytest.importorskip("datasets")
    docs = documents(250, 12)
    hf = datasets.Dataset.from_dict({"input_ids": [d.tolist() for d in docs],
                                     "text": [str(len(d)) for d in docs]})
    hf.save_to_disk(str(tmp_path / "hf"))
    hf = datasets.load_from_disk(str(tmp_path / "hf"))  # memory-mapped from its cache file
    ds = stoker.TokenDataset(hf, 48, pack="best_fit", seed=1)
    assert ds.format == "arrow"
    ref = stoker.TokenDataset(write_flat(tmp_path / "t.bin", docs), 48, eod=EOD,
                              pack="best_fit", seed=1)
    assert_same_rows(loader_rows(stoker.DataLoader(ds, batch_size=4, num_workers=2)),
                     loader_rows(stoker.DataLoader(ref, batch_size=4)))
    # select/shuffle (an indices mapping): the data set's order, not its files'
    order = np.random.default_rng(3).permutation(len(docs))[:200]
    picked = stoker.TokenDataset(hf.select(order), 48, shuffle_documents=False)
    ref2 = stoker.TokenDataset(write_flat(tmp_path / "p.bin", [docs[i] for i in order]), 48,
                               eod=EOD, shuffle_documents=False)
    assert_same_rows(loader_rows(stoker.DataLoader(picked, batch_size=8)),
                     loader_rows(stoker.DataLoader(ref2, batch_size=8)))
    with pytest.raises(TypeError, match=r"a DatasetDict is not read: pass one split"):
        stoker.TokenDataset(datasets.DatasetDict({"train": hf}), 48)
    # made again where unpickled (a remote worker), and mixed with a native source
    again = pickle.loads(pickle.dumps(ds))
    for k, v in ds.plan().items():
        np.testing.assert_array_equal(again.plan()[k], v)
    mix = stoker.TokenMix([ds, ref], [0.5, 0.5], global_batch=4, seed=2)
    src, row = mix.index()
    for i in (0, 1, 2, 3, len(mix) - 1):
        got, want = mix[i], (ds, ref)[src[i]][int(row[i])]
        for k in want:
            np.testing.assert_array_equal(got[k], want[k])


def test_a_pyarrow_table_or_array_is_a_token_source():
    docs = [np.array([1, 2, 3]), np.array([4, 5]), np.array([6, 7, 8, 9])]
    arr = pa.chunked_array([pa.array([d.tolist() for d in docs[:2]], pa.large_list(pa.int64())),
                            pa.array([docs[2].tolist()], pa.large_list(pa.int64()))])
    for source in (arr, pa.table({"ids": arr})):
        ds = stoker.TokenDataset(source, 3, column="ids", shuffle_documents=False)
        assert ds[0]["input_ids"].tolist() == [1, 2, 3]
        assert ds[1]["input_ids"].tolist() == [4, 5, 6]
        assert ds[2]["input_ids"].tolist() == [7, 8, 9]
    sliced = pa.array([d.tolist() for d in docs], pa.list_(pa.int32())).slice(1)
    ds = stoker.TokenDataset(sliced, 2, shuffle_documents=False)
    assert ds.lengths().tolist() == [2, 4]
    assert [ds[i]["input_ids"].tolist() for i in range(len(ds))] == [[4, 5], [6, 7], [8, 9]]


def test_bad_token_columns_are_named_by_file_column_and_row(tmp_path):
    docs = documents(20, 13)
    path = write_parquet(tmp_path / "t.parquet", docs, text=pa.array(["x"] * len(docs)))
    with pytest.raises(KeyError, match=r"t\.parquet has no column 'ids' \(its columns: "
                                       r"input_ids, text\)"):
        stoker.TokenDataset(path, 16, column="ids")
    with pytest.raises(TypeError, match=r"t\.parquet column text is string, not a list of "
                                        r"integer token ids"):
        stoker.TokenDataset(path, 16, column="text")
    floats = tmp_path / "f.parquet"
    pq.write_table(pa.table({"input_ids": pa.array([[1.0, 2.0]], pa.list_(pa.float32()))}),
                   floats)
    with pytest.raises(TypeError,
                       match=r"f\.parquet column input_ids is list<\w+: float>, not a list"):
        stoker.TokenDataset(floats, 16)
    nulls = tmp_path / "n.parquet"
    pq.write_table(pa.table({"input_ids": pa.array([[1, 2], None, [3]], pa.list_(pa.int32()))}),
                   nulls)
    with pytest.raises(ValueError, match=r"n\.parquet column input_ids row 1 is null"):
        stoker.TokenDataset(nulls, 16)
    null_id = tmp_path / "ni.parquet"
    pq.write_table(pa.table({"input_ids": pa.array([[1, 2], [3, None]], pa.list_(pa.int32()))}),
                   null_id)
    with pytest.raises(ValueError, match=r"ni\.parquet column input_ids row 1 holds a null"):
        stoker.TokenDataset(null_id, 16)
    empty = tmp_path / "e.parquet"
    pq.write_table(pa.table({"input_ids": pa.array([[1, 2], [], [3]], pa.list_(pa.int32()))}),
                   empty)
    with pytest.raises(RuntimeError, match=r"e\.parquet column input_ids row 1 is empty"):
        stoker.TokenDataset(empty, 16)
    not_parquet = tmp_path / "x.parquet"
    not_parquet.write_bytes(b"not parquet at all")
    with pytest.raises(ValueError, match=r"x\.parquet: cannot read its footer"):
        stoker.TokenDataset(not_parquet, 16)
    # A token past the vocabulary fails its row's read, named by file, column and row.
    vocab = tmp_path / "v.parquet"
    pq.write_table(pa.table({"input_ids": pa.array([[1, 2], [3, 999, 4], [5]],
                                                   pa.list_(pa.int32()))}), vocab)
    ds = stoker.TokenDataset(vocab, 8, pack="best_fit", vocab_size=100, shuffle_documents=False)
    with pytest.raises(stoker.SampleError,
                       match=r"v\.parquet column input_ids row 1: token 1 is 999, outside the "
                             r"vocabulary of 100"):
        list(stoker.DataLoader(ds, batch_size=1, num_workers=1))
