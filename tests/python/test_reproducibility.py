"""Reproducible on any topology (docs/python.md, "Reproducibility"): a state taken anywhere
and restored in a new process gives every later batch of the uninterrupted run, and with
seed_per_sample=True a Python data set's random draws are the same on any workers and
ranks. The checks are bench/reproducibility.py's, which prints the counts."""
import importlib.util
import pathlib
import random
import warnings

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import stoker  # noqa: E402
from stoker.loader import sample_seeding  # noqa: E402

ROOT = pathlib.Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("reproducibility",
                                               ROOT / "bench" / "reproducibility.py")
check = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(check)


@pytest.mark.parametrize("case", ["shuffle", "generator", "seed", "distributed0",
                                  "distributed1", "batch_sampler", "batch_sampler_collate",
                                  "stateful_sampler", "seed_per_sample", *check.NATIVE_CASES])
def test_a_state_taken_anywhere_resumes_in_a_new_process_with_the_uninterrupted_batches(case):
    # Random cut points over 3 epochs (after iter(), mid-epoch, after the last batch, after
    # the loop ended), each state restored in another process; every later batch equal.
    # The native cases: ImageFolder and WebDataset with T.train(224), a WebDataset stream.
    results = check.check_resume([case], n=30, cut_count=6, torchdata=False,
                                 rng=random.Random(case))
    equal, total = results[case]
    assert total >= 6
    assert equal == total


def test_per_sample_seeding_gives_every_topology_the_same_samples():
    # 0, 1, 2, 4 workers, threads (read in processes) or processes, 1 or 2 ranks.
    reference = check.samples_on(0, "auto", 1, 48)
    assert len(set(reference.values())) == len(reference)  # the draws are random
    for topology, (equal, total) in check.check_topologies(48).items():
        assert (equal, total) == (len(reference), len(reference)), topology


def test_without_per_sample_seeding_worker_processes_draw_other_samples():
    # What seed_per_sample=True fixes: a worker's draws depend on the worker.
    def samples(workers):
        loader = stoker.DataLoader(check.Augmented(32), batch_size=4, num_workers=workers,
                                   worker_type="process")
        return {i: row.numpy().tobytes() for indices, noise in loader
                for i, row in zip(indices.tolist(), noise)}

    one, two = samples(1), samples(2)
    assert sum(one[i] == two[i] for i in one) < len(one)


def test_in_line_reads_leave_the_training_loops_generators_as_they_were():
    def generators_after(dataset, seeded):
        torch.manual_seed(3)
        random.seed(3)
        np.random.seed(3)
        loader = stoker.DataLoader(dataset, batch_size=4, num_workers=0,
                                   seed_per_sample=seeded)
        for _ in loader:
            pass
        return torch.get_rng_state(), random.getstate(), np.random.get_state()[1].tobytes()

    drawing = generators_after(check.Augmented(16), seeded=True)
    quiet = generators_after(check.Indices(16), seeded=False)  # iter()'s own draws only
    assert torch.equal(drawing[0], quiet[0])
    assert drawing[1:] == quiet[1:]


def test_report_says_which_reproducibility_the_loader_gives_and_why():
    def report(dataset, **kw):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            loader = stoker.DataLoader(dataset, batch_size=4, num_workers=0, **kw)
        for _ in loader:
            pass
        return loader.report()

    plain = report(check.Indices(8))
    assert plain["reproducibility"] == "order"
    assert "seed_per_sample=True" in plain["reproducibility_reason"]
    seeded = report(check.Augmented(8), seed_per_sample=True)
    assert seeded["reproducibility"] == "order and augmentation"
    assert "reproducible: order and augmentation" in str(seeded)

    class Reversed(torch.utils.data.Sampler):
        def __len__(self):
            return 8

        def __iter__(self):
            return iter(range(7, -1, -1))

    custom = report(check.Indices(8), sampler=Reversed())
    assert custom["reproducibility"] == "order, if the sampler repeats it"
    assert "Reversed" in custom["reproducibility_reason"]
    stateful = report(check.Indices(8), sampler=check.ShuffledStateful(8, 1))
    assert stateful["reproducibility"] == "order"


def test_per_sample_seeding_reads_in_processes_and_says_why():
    loader = stoker.DataLoader(check.Augmented(8), batch_size=4, num_workers=2,
                               seed_per_sample=True)
    assert loader.worker_type == "process"
    assert "seed_per_sample=True" in loader.worker_type_reason
    with pytest.warns(UserWarning, match="worker_type='thread' reads in worker processes"):
        threads = stoker.DataLoader(check.Augmented(8), batch_size=4, num_workers=2,
                                    worker_type="thread", seed_per_sample=True)
    assert threads.worker_type == "process"
    loader.close()
    threads.close()


def test_per_sample_seeding_refuses_what_it_cannot_seed_and_says_why():
    with pytest.raises(ValueError, match="batch_size=None"):
        stoker.DataLoader(check.Augmented(8), batch_size=4, collate_fn=check._collate,
                          seed_per_sample=True)

    class Stream(torch.utils.data.IterableDataset):
        def __iter__(self):
            return iter(range(4))

    with pytest.raises(ValueError, match="iterable data set"):
        stoker.DataLoader(Stream(), batch_size=2, seed_per_sample=True)


def test_a_state_loaded_into_a_loader_that_draws_from_other_generators_is_refused():
    g = torch.Generator().manual_seed(1)
    sampler = torch.utils.data.RandomSampler(check.Indices(8), generator=g)
    saver = stoker.DataLoader(check.Indices(8), batch_size=4, sampler=sampler, num_workers=0)
    next(iter(saver))
    state = saver.state_dict()
    other = stoker.DataLoader(check.Indices(8), batch_size=4, shuffle=True, num_workers=0)
    with pytest.raises(ValueError, match="torch generators"):
        other.load_state_dict(state)


def test_per_sample_seeding_writes_random_s_and_numpy_s_generators_in_place_here():
    # The fast path is the one taken on this Python and numpy: their layouts were checked.
    assert sample_seeding._random_in_place() is not None
    assert sample_seeding._numpy_in_place() is not None


@pytest.mark.parametrize("in_place", [True, False])
def test_a_sample_seed_gives_the_same_draws_whatever_was_drawn_before(in_place, monkeypatch):
    # Normal deviates come in pairs, one cached for the next draw: seeding drops it, as each
    # generator's seed() does. in_place=False: the layouts' checks failing, the generators
    # are seeded through their seed().
    if not in_place:
        monkeypatch.setattr(sample_seeding, "_random_in_place", lambda: None)
        monkeypatch.setattr(sample_seeding, "_numpy_in_place", lambda: None)
    sample_seeding._Setup.pid = None  # set up again now, and after the test
    kept = (torch.get_rng_state(), random.getstate(), np.random.get_state())

    def draws(seed, before):
        for _ in range(before):
            torch.randn(1), random.gauss(0, 1), np.random.standard_normal()
        assert sample_seeding.seed_generators(seed) == seed
        return (torch.randn(3).tolist(), random.gauss(0, 1), random.random(),
                np.random.standard_normal(), np.random.rand(2).tolist())

    try:
        first = draws(2**64 - 5, 0)
        assert draws(2**64 - 5, 1) == first
        assert draws(2**64 - 5, 4) == first
        other = draws(17, 1)
        assert all(a != b for a, b in zip(first, other))
        assert sample_seeding.seed_generators() is None  # outside a read: nothing seeded
    finally:
        torch.set_rng_state(kept[0])
        random.setstate(kept[1])
        np.random.set_state(kept[2])
        sample_seeding._Setup.pid = None


def test_a_state_of_torch_s_order_resumes_the_saved_run_s_augmentations_after_another_seed():
    # The samples' seeds' base is drawn from torch's generator when the loader is made: the
    # state carries it, and a loader made after another torch.manual_seed takes it on load.
    def loader():
        return stoker.DataLoader(check.Augmented(16), batch_size=4, shuffle=True,
                                 num_workers=0, seed_per_sample=True)

    torch.manual_seed(1)
    saved = loader()
    batches = iter(saved)
    next(batches)
    state = saved.state_dict()
    rest = [noise for _, noise in batches]
    torch.manual_seed(2)
    resumed = loader()
    resumed.load_state_dict(state)
    again = [noise for _, noise in resumed]
    assert len(again) == len(rest) == 3
    assert all(torch.equal(a, b) for a, b in zip(again, rest))
    torch.manual_seed(2)
    read = loader()
    list(read)
    with pytest.raises(ValueError, match="pass seed="):
        read.load_state_dict(state)


def _indices(batches) -> list:
    return [b[0].flatten().tolist() for b in batches]


def test_set_epoch_between_iter_and_the_first_batch_names_that_iterators_epoch():
    # Lightning calls iter() and then sampler.set_epoch(epoch): on stoker's own order that
    # iterator gives `epoch` (as a sampler drawing at its first batch would), and the next
    # iter() the one after. torch's RandomSampler has no set_epoch: the loader gives it one.
    def loader():
        return stoker.DataLoader(check.Augmented(24), batch_size=4, shuffle=True, seed=7,
                                 num_workers=0)

    reference = loader()
    epochs = [_indices(reference) for _ in range(4)]
    late = loader()
    it = iter(late)
    late.sampler.set_epoch(2)
    assert _indices(it) == epochs[2]
    assert _indices(late) == epochs[3]


def test_a_state_after_an_epochs_last_batch_resumes_into_the_epoch_set_next():
    # The state says the epoch has nothing left (as torchdata's does): a loop resuming in
    # that epoch gets no batch; Lightning, which counts the epoch done, calls set_epoch(e+1)
    # after iter(), and that iterator gives epoch e+1, its order drawn from where the
    # state's draws left off (torch's order, from its generator).
    def loader():
        return stoker.DataLoader(check.Augmented(24), batch_size=4, shuffle=True,
                                 num_workers=0, seed_per_sample=True)

    torch.manual_seed(1)
    whole = loader()
    it = iter(whole)
    first = [next(it) for _ in range(len(whole))]
    state = whole.state_dict()
    following = [check._digest(b) for b in whole]
    assert len(first) == 6 and len(following) == 6
    torch.manual_seed(2)
    resumed = loader()
    resumed.load_state_dict(state)
    assert list(resumed) == []
    torch.manual_seed(2)
    resumed = loader()
    resumed.load_state_dict(state)
    it = iter(resumed)
    resumed.set_epoch(1)
    assert [check._digest(b) for b in it] == following
