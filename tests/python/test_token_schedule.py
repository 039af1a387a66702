"""stoker.TokenMix's weight schedules: weights that change at given steps, each global batch
holding its step's shares, and a run resumed with a schedule changed from its cut on that
continues from the rows it has read (a changed past refused, named by its step)."""

import math
import pickle

import numpy as np
import pytest
import torch  # noqa: F401  (the loader gives tensors where torch is imported, as in training)

import stoker

EOD = 0
W1, W2, W3 = [0.6, 0.3, 0.1], [0.1, 0.2, 0.7], [0.2, 0.6, 0.2]


def documents(n, seed, vocab=1000, median=40, sigma=1.0):
    rng = np.random.default_rng(seed)
    lengths = np.maximum(2, rng.lognormal(np.log(median), sigma, n).astype(np.int64))
    return [np.append(rng.integers(1, vocab, n - 1), EOD) for n in lengths]


def sources(tmp_path, seq_len=16):
    """Three flat token files of different sizes: 0 the largest, 2 small enough to wrap."""
    paths = []
    for i, n in enumerate([120, 60, 12]):
        path = tmp_path / f"s{i}.bin"
        np.concatenate(documents(n, 20 + i)).astype(np.uint16).tofile(path)
        paths.append(path)
    return [stoker.TokenDataset(p, seq_len, eod=EOD, seed=i) for i, p in enumerate(paths)]


def keys(batches):
    """Each row of the batches as (source, tokens), in order."""
    return [(int(s), ids.numpy().tobytes()) for b in batches
            for s, ids in zip(b["source"], b["input_ids"])]


def test_each_global_batch_holds_its_steps_weights_within_one_row(tmp_path):
    schedule = {0: W1, 20: W2, 35: W3}
    ds = stoker.TokenMix(sources(tmp_path), schedule, global_batch=12, samples=600, seed=3)
    assert ds.schedule == [(0, W1), (20, W2), (35, W3)] and ds.weights == W1
    loader = stoker.DataLoader(ds, batch_size=12, num_workers=2, worker_type="thread")
    for step, batch in enumerate(loader):
        weights = W1 if step < 20 else W2 if step < 35 else W3
        counts = np.bincount(batch["source"].numpy(), minlength=3)
        assert np.all(np.abs(counts - np.array(weights) * 12) <= 1), (step, counts)


def test_plain_weights_and_a_schedule_that_changes_nothing_are_one_mix(tmp_path):
    srcs = sources(tmp_path)
    plain = stoker.TokenMix(srcs, W1, global_batch=12, samples=600, seed=3)
    for same in ({0: W1}, [(0, W1)], [(0, W1), (30, W1)]):
        mix = stoker.TokenMix(srcs, same, global_batch=12, samples=600, seed=3)
        for a, b in zip(plain.index(), mix.index()):
            np.testing.assert_array_equal(a, b)
    changed = stoker.TokenMix(srcs, {0: W1, 30: W2}, global_batch=12, samples=600, seed=3)
    src, row = changed.index()
    np.testing.assert_array_equal(src[:360], plain.index()[0][:360])
    np.testing.assert_array_equal(row[:360], plain.index()[1][:360])
    assert not np.array_equal(src, plain.index()[0])
    back = pickle.loads(pickle.dumps(changed))
    assert back.schedule == changed.schedule
    np.testing.assert_array_equal(back.index()[0], src)


def test_iid_samples_draw_by_their_steps_weights_a_step_a_sample_without_a_global_batch():
    src, _, _ = stoker.token_mix_index([100, 100, 100], {0: [1, 0, 0], 100: [0, 1, 1]}, "iid",
                                       samples=1000, seed=5)
    assert np.all(src[:100] == 0) and not np.any(src[100:] == 0)
    later, _, _ = stoker.token_mix_index([100, 100, 100], [0, 1, 1], "iid", samples=1000,
                                         seed=5)
    np.testing.assert_array_equal(src[100:], later[100:])  # the same draws, other weights


def run(ds, state=None, steps=None, world=1, rank=0, batch_size=6):
    """A train-like loop over the mix in order: the batches of `steps` steps (None: to the
    end) and the loader's state then."""
    sampler = stoker.DistributedSampler(ds, num_replicas=world, rank=rank, shuffle=False)
    loader = stoker.DataLoader(ds, batch_size=batch_size, sampler=sampler, num_workers=2,
                               worker_type="thread")
    if state is not None:
        loader.load_state_dict(state)
    out, it = [], iter(loader)
    for batch in it:
        out.append(batch)
        if steps is not None and len(out) == steps:
            break
    saved = loader.state_dict()
    loader.close()
    return out, saved


@pytest.mark.parametrize("world", [1, 2])
def test_a_run_resumed_with_its_schedule_changed_from_the_cut_continues_from_the_rows_read(
        tmp_path, world):
    """Schedule A to step 25, saved (on `world` ranks, merged), resumed on one rank with
    schedule B, equal to A before step 25 and changed from it: the rows after the cut are B's
    uninterrupted run's from the cut on, and the rows before it A's (and B's)."""
    srcs = sources(tmp_path)
    a = {0: W1, 10: W2}
    b = {0: W1, 10: W2, 25: W3, 40: [1, 1, 1]}
    make = lambda w: stoker.TokenMix(srcs, w, global_batch=12, samples=600, seed=7)
    cut = 25
    states, before = [], []
    for r in range(world):
        head, state = run(make(a), steps=cut, world=world, rank=r, batch_size=12 // world)
        before.append(keys(head))
        states.append(state)
    assert states[0]["data"]["schedule"] == [[0, W1], [10, W2]]
    state = stoker.merge_states(states) if world > 1 else states[0]
    rest, _ = run(make(b), state=state, batch_size=12)
    whole_b = keys(run(make(b), batch_size=12)[0])
    whole_a = keys(run(make(a), batch_size=12)[0])
    assert keys(rest) == whole_b[cut * 12:]
    assert whole_a[:cut * 12] == whole_b[:cut * 12]
    assert sorted(x for part in before for x in part) == sorted(whole_a[:cut * 12])
    # No source restarts its rows: source 0 (not wrapping) reads each of its rows once.
    src, row = make(b).index()
    assert len(set(row[src == 0].tolist())) == int(np.sum(src == 0)) <= len(srcs[0])
    first = {int(row[i]) for i in range(cut * 12) if src[i] == 0}
    assert min(int(row[i]) for i in range(cut * 12, 600) if src[i] == 0) == len(first)


def test_a_resume_that_changes_the_schedule_before_the_cut_is_refused_naming_the_step(
        tmp_path):
    srcs = sources(tmp_path)
    make = lambda w, seed=7: stoker.TokenMix(srcs, w, global_batch=12, samples=600, seed=seed)
    _, state = run(make({0: W1, 10: W2}), steps=20, batch_size=12)
    with pytest.raises(ValueError, match="differ from step 15"):
        run(make({0: W1, 10: W2, 15: W3}), state=state, steps=1, batch_size=12)
    with pytest.raises(ValueError, match="differ from step 10"):
        run(make({0: W1}), state=state, steps=1, batch_size=12)
    with pytest.raises(ValueError, match="seed"):
        run(make({0: W1, 10: W2}, seed=8), state=state, steps=1, batch_size=12)
    run(make({0: W1, 10: W2, 20: W3}), state=state, steps=1, batch_size=12)  # from the cut


@pytest.mark.parametrize("schedule, message", [
    ({5: W1}, "starts at step 0"),
    ([(0, W1), (9, W2), (4, W3)], "step 4 follows step 9"),
    ({0: W1, 7: [1, 2]}, "2 weights for 3 sources in the weight schedule's segment at step 7"),
    ({0: W1, 7: [1, -1, 0]}, "source 1's weight .* segment at step 7"),
    ({0: W1, 6: [1, math.nan, 0]}, "segment at step 6"),
    ({0: W1, 6: [1, math.inf, 0]}, "segment at step 6"),
    ({0: W1, 4: [0, 0, 0]}, "every source's weight is 0 in the weight schedule's segment at "
                            "step 4"),
    ({0: W1, -3: W2}, "integer >= 0"),
    ({0: W1, 2.5: W2}, "integer >= 0"),
    ([(0, W1), 0.5, 0.5], "not both"),
])
def test_a_bad_schedule_is_named_by_its_step(tmp_path, schedule, message):
    with pytest.raises(ValueError, match=message):
        stoker.TokenMix(sources(tmp_path), schedule, global_batch=12, samples=600)


def test_a_schedule_with_a_budget_is_refused(tmp_path):
    with pytest.raises(ValueError, match="give one of weights, epochs or tokens"):
        stoker.TokenMix(sources(tmp_path), {0: W1}, epochs=[1, 1, 1], global_batch=12)
