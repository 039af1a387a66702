"""stoker.DataLoader where frameworks handle loaders: pickled (ddp_spawn, multiprocessing spawn),
re-made from its attributes (Lightning, Accelerate, type(loader)(**kwargs)), given a
worker_init_fn after it was made, and drawing random numbers where torch's loader draws them.
The frameworks themselves run in test_framework_runs.py."""

import copy as copy_module
import multiprocessing
import pickle
import time

import numpy as np
import pytest
import torch
import torch.utils.data as tud

import stoker
from framework_datasets import Indices


class Labelled(stoker.DataLoader):
    """A user's subclass with an attribute of its own."""

    def __init__(self, dataset, label, **kwargs):
        self.label = label
        super().__init__(dataset, **kwargs)


def batches(loader):
    return [b.flatten().long().tolist() for b in loader]


def _iterate_in_child(loader, queue):
    queue.put((batches(loader), type(loader).__module__))


def test_a_loader_pickles_its_arguments_and_comes_back_working():
    loader = Labelled(Indices(), "train", batch_size=4, num_workers=2, worker_type="thread")
    expected = batches(loader)  # running: its engine is not pickled
    copy = pickle.loads(pickle.dumps(loader))
    assert type(copy) is Labelled and copy.label == "train"
    assert copy._pipeline is not loader._pipeline
    assert (copy.batch_size, vars(copy)["num_workers"], copy.worker_type) == (4, 2, "thread")
    assert batches(copy) == expected
    deep = copy_module.deepcopy(loader)  # copy.deepcopy goes the same way
    assert type(deep) is Labelled and batches(deep) == expected
    for each in (loader, copy, deep):
        each.close()


def test_a_native_data_set_s_shuffle_draws_nothing_when_made_and_repeats_for_a_seed():
    data = stoker.ArrayDataset(np.arange(40, dtype=np.float32)[:, None])
    torch.manual_seed(5)
    expected = torch.rand(2)
    orders = []
    for _ in range(2):
        torch.manual_seed(5)
        loader = stoker.DataLoader(data, batch_size=8, shuffle=True)
        assert torch.equal(torch.rand(2), expected)  # peeked at, not drawn
        orders.append([b[0].flatten().long().tolist() for b in loader])  # (array,) samples
        loader.close()
    assert orders[0] == orders[1] and sorted(sum(orders[0], [])) == list(range(40))


def test_a_loader_iterates_in_a_spawned_process():
    loader = stoker.DataLoader(Indices(), batch_size=8, num_workers=2)
    context = multiprocessing.get_context("spawn")
    queue = context.Queue()
    child = context.Process(target=_iterate_in_child, args=(loader, queue))
    child.start()
    got, module = queue.get(timeout=120)
    child.join(60)
    assert child.exitcode == 0
    assert got == [list(range(i, i + 8)) for i in range(0, 40, 8)]
    assert module == "stoker.loader.dataloader"


def test_attributes_report_the_requested_settings_and_a_re_made_loader_keeps_them():
    loader = stoker.DataLoader(Indices(), batch_size=4)  # num_workers, worker_type: 'auto'
    assert isinstance(loader.num_workers, int) and loader.num_workers >= 1
    assert vars(loader)["num_workers"] == "auto" and vars(loader)["seed"] is None
    # Accelerate's way: getattr of torch's arguments; torch's idiom: type(loader)(**kwargs).
    sampler = tud.DistributedSampler(loader.dataset, num_replicas=2, rank=1, shuffle=False)
    again = type(loader)(loader.dataset, batch_size=loader.batch_size, sampler=sampler,
                         num_workers=loader.num_workers, worker_type=loader.worker_type,
                         pin_memory=loader.pin_memory, prefetch_factor=loader.prefetch_factor)
    assert (again._plan.tune_workers, again._plan.measure_worker_type) == (True, True)
    assert vars(again)["num_workers"] == "auto" and vars(again)["worker_type"] == "auto"
    assert batches(again) == [[1, 3, 5, 7], [9, 11, 13, 15], [17, 19, 21, 23],
                              [25, 27, 29, 31], [33, 35, 37, 39]]  # the new sampler's
    fixed = stoker.DataLoader(Indices(), num_workers=3, worker_type="thread")
    remade = type(fixed)(fixed.dataset, num_workers=fixed.num_workers)
    assert (remade._plan.num_workers, remade._plan.tune_workers) == (3, False)
    for each in (loader, again, fixed, remade):
        each.close()


def test_lightning_s_re_make_keeps_auto_and_honours_its_sampler():
    pytest.importorskip("lightning")
    from lightning.pytorch.trainer.states import RunningStage
    from lightning.pytorch.utilities.data import _update_dataloader

    loader = stoker.DataLoader(Indices(), batch_size=4, shuffle=True)
    sampler = tud.DistributedSampler(loader.dataset, num_replicas=2, rank=0, seed=7)
    for mode in (RunningStage.TRAINING, RunningStage.PREDICTING):
        remade = _update_dataloader(loader, sampler, mode=mode)
        assert type(remade) is stoker.DataLoader
        assert (remade._plan.tune_workers, remade._plan.measure_worker_type) == (True, True)
        sampler.set_epoch(0)
        torch_loader = tud.DataLoader(loader.dataset, batch_size=4, sampler=sampler)
        assert batches(remade) == batches(torch_loader)
        remade.close()
    loader.close()


@pytest.mark.parametrize("worker_type", ["thread", "process"])
def test_a_worker_init_fn_set_after_the_loader_was_made_runs_once_per_worker(
        worker_type, tmp_path):
    from framework_datasets import RecordInit, WorkerIds

    loader = stoker.DataLoader(WorkerIds(12), batch_size=3, num_workers=2,
                               worker_type=worker_type)
    loader.worker_init_fn = RecordInit(tmp_path)  # as Lightning's seed_everything(workers=True)
    for _ in range(2):  # workers persist: once per worker, not per epoch
        seen = [int(w) for batch in loader for w in batch["id"]]

    def calls():
        return sorted(text for text in (p.read_text() for p in tmp_path.iterdir()) if text)

    assert set(seen) <= {0, 1}
    if worker_type == "thread":
        # A worker thread starts (and runs worker_init_fn) as it reads its first chunk; chunks
        # go to whichever thread is free, so on a busy machine one thread may read them all
        # and the other none (seen once beside two busy loops).
        assert {f"{w} of 2" for w in seen} <= set(calls()) <= {"0 of 2", "1 of 2"}
        assert len(calls()) == len(set(calls()))  # once per thread, not per epoch
        loader.close()
        return
    # A worker process that started late may have read nothing yet; it runs worker_init_fn as
    # it starts all the same. Wait for it (up to a minute: this is about what ran, not when).
    deadline = time.monotonic() + 60
    while len(calls()) < 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert calls() == ["0 of 2", "1 of 2"]  # get_worker_info() answered inside it
    loader.close()


def test_a_stream_s_worker_init_fn_set_afterwards_runs_in_each_worker(tmp_path):
    from framework_datasets import RecordInit, ShardedRange

    loader = stoker.DataLoader(ShardedRange(8), batch_size=2, num_workers=2)
    loader.worker_init_fn = RecordInit(tmp_path)
    assert sorted(sum(batches(loader), [])) == list(range(8))
    assert sorted(p.read_text() for p in tmp_path.iterdir()) == ["0 of 2", "1 of 2"]
    loader.close()


@pytest.mark.parametrize("arguments", [
    dict(), dict(shuffle=True), dict(shuffle=True, num_workers=2),
    dict(batch_size=None, num_workers=1), dict(collate_fn=lambda b: torch.cat(b)),
])
def test_making_a_loader_draws_nothing_and_an_epoch_draws_what_torch_s_draws(arguments):
    kwargs = dict(dict(batch_size=4, num_workers=2), **arguments)
    results = []
    for loader_type in (tud.DataLoader, stoker.DataLoader):
        torch.manual_seed(5)
        loader = loader_type(Indices(), **kwargs)
        after_making = torch.rand(2)
        epochs = [batches(loader) for _ in range(2)]
        results.append((after_making, epochs, torch.rand(2)))
        if loader_type is stoker.DataLoader:
            loader.close()
    (theirs_made, theirs, theirs_after), (ours_made, ours, ours_after) = results
    assert torch.equal(theirs_made, ours_made)  # the model's initial weights, say
    assert ours == theirs  # the same order, epoch after epoch
    assert torch.equal(theirs_after, ours_after)  # the same draws per epoch


def test_a_generator_gives_torch_s_order_and_moves_as_torch_s():
    orders = []
    for loader_type in (tud.DataLoader, stoker.DataLoader):
        generator = torch.Generator().manual_seed(11)
        loader = loader_type(Indices(), batch_size=5, shuffle=True, generator=generator)
        orders.append(([batches(loader) for _ in range(3)], generator.get_state()))
    assert orders[0][0] == orders[1][0]
    assert torch.equal(orders[0][1], orders[1][1])


@pytest.mark.parametrize("worker_type", ["thread", "process"])
def test_torch_s_order_holds_when_the_training_loop_draws_between_epochs(worker_type):
    # stoker draws the next epoch's permutation ahead and takes it at iter() only if no
    # generator moved since: a loop that draws (dropout on the CPU) gets torch's order still.
    results = []
    for loader_type in (tud.DataLoader, stoker.DataLoader):
        torch.manual_seed(7)
        kwargs = dict(batch_size=5, shuffle=True, num_workers=2)
        if loader_type is stoker.DataLoader:
            kwargs["worker_type"] = worker_type
        loader = loader_type(Indices(), **kwargs)
        epochs, draws = [], []
        for epoch in range(4):
            got = []
            for i, b in enumerate(loader):
                got.append(b.flatten().long().tolist())
                if epoch % 2 == 1 and i == 2:  # mid-epoch, every other epoch
                    draws.append(torch.rand(1).item())
            epochs.append(got)
            if epoch == 1:  # between epochs
                draws.append(torch.rand(1).item())
        results.append((epochs, draws, torch.rand(1).item()))
        if loader_type is stoker.DataLoader:
            loader.close()
    assert results[0] == results[1]


def test_a_resumed_epoch_of_torch_s_order_is_the_interrupted_one():
    torch.manual_seed(3)
    loader = stoker.DataLoader(Indices(), batch_size=4, shuffle=True, num_workers=2)
    it = iter(loader)
    first = [next(it).flatten().long().tolist() for _ in range(4)]
    state = loader.state_dict()
    rest = [b.flatten().long().tolist() for b in it]
    torch.manual_seed(99)  # another process, another global seed
    resumed = stoker.DataLoader(Indices(), batch_size=4, shuffle=True, num_workers=2)
    resumed.load_state_dict(pickle.loads(pickle.dumps(state)))
    assert batches(resumed) == rest
    assert sorted(sum(first + rest, [])) == list(range(40))
    loader.close()
    resumed.close()


def test_accelerate_s_prepare_leaves_stoker_iterating(monkeypatch):
    pytest.importorskip("accelerate")
    from accelerate import Accelerator

    torch.manual_seed(0)
    loader = stoker.DataLoader(Indices(), batch_size=4, shuffle=True)
    torch_loader = tud.DataLoader(Indices(), batch_size=4, shuffle=True)
    accelerator = Accelerator(cpu=True)
    prepared, torch_prepared = accelerator.prepare(loader, torch_loader)
    assert type(prepared.base_dataloader) is stoker.DataLoader
    assert type(torch_prepared.base_dataloader) is tud.DataLoader  # others untouched
    assert prepared.base_dataloader._plan.tune_workers  # num_workers='auto' kept
    torch.manual_seed(1)
    expected = batches(torch_prepared)

    def torch_iterates(self):
        raise AssertionError("torch's DataLoader iterates")

    monkeypatch.setattr(tud.DataLoader, "__iter__", torch_iterates)
    torch.manual_seed(1)
    assert batches(prepared) == expected
    assert prepared.base_dataloader.stats()["batches"] >= 10
    skipped = accelerator.skip_first_batches(prepared, num_batches=3)
    assert type(skipped.base_dataloader) is stoker.DataLoader
    assert len(batches(skipped)) == 10 - 3
    loader.close()
