"""One row reader (python/src/row_reader.h) for every kind of worker: threads, processes and,
where Ray is installed, Ray actors read a Python data set's rows by the same rules, so each
case here has one outcome whatever reads it. The rules: a data set with __getitems__ is read
only through it; a chunk's call that raises or returns the wrong number of samples is
followed by one __getitems__([i]) per row, so a bad row fails alone; stoker.sample_seed() is
the row's seed inside __getitem__ and the call's first row's inside __getitems__."""

import numpy as np
import pytest
import torch

import row_reader_datasets as rd
import stoker

KINDS = ["inline", "thread", "process", "ray"]


@pytest.fixture(scope="module")
def ray_cluster():
    ray = pytest.importorskip("ray")
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, runtime_env={
        "env_vars": {"PYTHONPATH": str(__import__("pathlib").Path(__file__).parent)}})
    yield
    ray.shutdown()


@pytest.fixture
def workers(request, kind):
    """The DataLoader arguments that make `kind` read the rows."""
    if kind == "ray":
        request.getfixturevalue("ray_cluster")
        return dict(num_workers=0, remote=stoker.ray_workers(2))
    if kind == "inline":
        return dict(num_workers=0)
    return dict(num_workers=2, worker_type=kind)


def plain(value):
    """A batch as plain Python values, to compare."""
    if isinstance(value, torch.Tensor):
        return value.tolist()
    if isinstance(value, dict):
        return {k: plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    return value


def outcome(dataset, workers, **kwargs):
    """("batches", [batch...], [skipped index...]) or ("error", batches before it, type,
    message, notes)."""
    loader = stoker.DataLoader(dataset, batch_size=4, seed=7, **workers, **kwargs)
    got = []
    try:
        for batch in loader:
            got.append(plain(batch))
        return "batches", got, [s.index for s in loader.skipped_samples()]
    except Exception as e:
        return "error", len(got), type(e).__name__, str(e), getattr(e, "__notes__", [])
    finally:
        loader.close()


def batch_of(indices):
    return {"x": [[i] * 3 for i in indices], "half": [i / 2 for i in indices],
            "name": [f"s{i}" for i in indices], "tag": [f"t{i}".encode() for i in indices]}


ALL = [batch_of(range(b, b + 4)) for b in range(0, 24, 4)]


@pytest.mark.parametrize("kind", KINDS)
def test_a_data_set_with_only_getitems_is_read_through_it_with_its_object_values(kind, workers):
    assert outcome(rd.OnlyGetitems(), workers) == ("batches", ALL, [])


@pytest.mark.parametrize("kind", KINDS)
def test_a_getitems_returning_too_few_samples_is_read_again_row_by_row(kind, workers):
    assert outcome(rd.DropsLast(), workers) == ("batches", ALL, [])


@pytest.mark.parametrize("kind", KINDS)
def test_a_getitems_returning_too_many_samples_fails_each_row_alone(kind, workers):
    got = outcome(rd.OneTooMany(), workers)
    assert got[:4] == ("error", 0, "ValueError",
                       "stoker: __getitems__ returned 2 samples for 1 index")
    assert any("sample 0" in note for note in got[4]), got[4]


@pytest.mark.parametrize("kind", KINDS)
def test_a_raising_getitems_fails_only_its_bad_row(kind, workers):
    got = outcome(rd.RaisesAt(bad=5), workers)
    assert got[:4] == ("error", 1, "ValueError", "row 5 is bad")
    assert any("sample 5" in note for note in got[4]), got[4]


@pytest.mark.parametrize("kind", KINDS)
def test_the_skip_policy_replaces_only_the_bad_row_of_a_raising_getitems(kind, workers):
    kind_, batches, skipped = outcome(rd.RaisesAt(bad=5), workers, on_error="skip")
    assert kind_ == "batches" and skipped == [5]
    names = [n for b in batches for n in b["name"]]
    # Every row but 5 is read where it belongs; row 5's place holds another row.
    assert len(names) == 24 and names[5] != "s5"
    assert names[:5] + names[6:] == [f"s{i}" for i in range(24) if i != 5]
    assert batches == outcome(rd.RaisesAt(bad=5), dict(num_workers=0), on_error="skip")[1]


def seeds_by_index(dataset, workers):
    _, batches, _ = outcome(dataset, workers)
    return {i: s for b in batches for i, s in zip(b["i"], b["seed"])}


@pytest.mark.parametrize("kind", KINDS)
def test_sample_seed_inside_getitems_is_the_seed_of_the_calls_first_row(kind, workers):
    _, batches, _ = outcome(rd.SeedInGetitems(), workers)
    rows = [(i, s, f) for b in batches for i, s, f in zip(b["i"], b["seed"], b["first"])]
    assert [i for i, _, _ in rows] == list(range(24))
    # The seed each row has inside __getitem__, for the same loader seed and epoch.
    own = seeds_by_index(rd.SeedInGetitem(), dict(num_workers=0))
    assert all(s == own[f] for _, s, f in rows)
    assert len({f for _, _, f in rows}) > 1  # several calls, each with its own seed


@pytest.mark.parametrize("kind", KINDS)
def test_sample_seed_is_the_rows_own_inside_getitem(kind, workers):
    seeds = seeds_by_index(rd.SeedInGetitem(), workers)
    assert sorted(seeds) == list(range(24))
    assert -1 not in seeds.values() and len(set(seeds.values())) == 24
    assert seeds == seeds_by_index(rd.SeedInGetitem(), dict(num_workers=0))


def test_a_worker_processs_lone_row_is_read_by_the_same_rules():
    # SampleWriter.read_sample (the first row a worker process reads, alone) by the same rules.
    assert stoker._stoker.SampleWriter.read_sample(rd.OnlyGetitems(), 3, 0, True)["name"] == "s3"
    with pytest.raises(ValueError, match="returned 2 samples for 1 index"):
        stoker._stoker.SampleWriter.read_sample(rd.OneTooMany(), 3, 0, True)
    assert np.array_equal(
        stoker._stoker.SampleWriter.read_sample([np.arange(2)] * 4, 1, 0, False), [0, 1])
