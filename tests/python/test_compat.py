"""The same check on torch.utils.data.DataLoader and on stoker.DataLoader: what a PyTorch user
passes gives what PyTorch gives. Known, deliberate or not yet fixed differences are strict
xfails naming the reason, so a fix shows up here (and in docs/python.md's list)."""

import collections
import collections.abc
import gc
import multiprocessing
import random
import subprocess
import sys
import time
import warnings

import numpy as np
import pytest

torch = pytest.importorskip("torch")
import torch.utils.data as tud  # noqa: E402

import stoker  # noqa: E402

Point = collections.namedtuple("Point", "x y")


class Nested(tud.Dataset):
    """Every kind of leaf default_collate knows, nested."""

    def __init__(self, n=23):
        self.n = n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        return {
            "image": torch.full((2, 3), float(i)),
            "array": np.arange(4, dtype=np.int32) + i,
            "scalar": np.float32(i) / 2,
            "label": i % 5,
            "weight": i / 10,
            "flag": i % 2 == 0,
            "pair": (torch.tensor([i, -i]), i * 3),
            "point": Point(i, torch.tensor(float(i))),
        }


class Pairs(tud.Dataset):
    def __init__(self, n=50):
        self.n = n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        return torch.tensor([float(i), 2.0 * i]), i


def assert_same(a, b, path="batch"):
    """Same structure, container types, dtypes and values."""
    if isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor), f"{path}: {type(b)} is not a tensor"
        assert a.dtype == b.dtype and a.shape == b.shape, f"{path}: {b.dtype}{tuple(b.shape)}"
        assert torch.equal(a, b), path
    elif isinstance(a, collections.abc.Mapping):
        assert type(a) is type(b) and list(a) == list(b), f"{path}: {type(b)} {list(b)}"
        for k in a:
            assert_same(a[k], b[k], f"{path}[{k!r}]")
    elif isinstance(a, (list, tuple)):
        assert type(a) is type(b), f"{path}: {type(b).__name__} where torch has {type(a).__name__}"
        assert len(a) == len(b), path
        for k, (x, y) in enumerate(zip(a, b)):
            assert_same(x, y, f"{path}[{k}]")
    else:
        assert a == b, f"{path}: {b!r} != {a!r}"


def until_error(loader, error, convert=lambda batch: batch):
    """The batches `loader` gives before it raises `error`, and the error. torch's iterator
    is shut down here: a worker process forked later (by the next test) while its queue's
    feeder threads still run can inherit the import lock mid-import."""
    got = []
    it = iter(loader)
    with pytest.raises(error) as info:
        for batch in it:
            got.append(convert(batch))
    exception = info.value
    exception.__traceback__ = None  # its frames hold the iterator
    del it, info
    gc.collect()
    return got, exception


def both(dataset, **kwargs):
    return (list(tud.DataLoader(dataset, **kwargs)),
            list(stoker.DataLoader(dataset, **kwargs)))


@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.parametrize("drop_last", [False, True])
def test_nested_samples_batch_as_torch(workers, drop_last):
    ours_kwargs = dict(batch_size=5, num_workers=workers, drop_last=drop_last)
    theirs, ours = both(Nested(), **ours_kwargs)
    assert len(ours) == len(theirs) == len(stoker.DataLoader(Nested(), **ours_kwargs))
    for a, b in zip(theirs, ours):
        assert_same(a, b)


class Samples(tud.Dataset):
    """Sample i is make(i)."""

    def __init__(self, make, n=8):
        self.make, self.n = make, n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        return self.make(i)


class Names(list):
    pass


@pytest.mark.parametrize("make", [
    lambda i: (torch.tensor(i), f"s{i}"),  # default_collate zips a tuple: strings in a tuple
    lambda i: [torch.tensor(i), f"s{i}".encode()],  # ... and so in a list
    lambda i: {"x": torch.tensor(i), "name": f"s{i}"},  # a list under a key
    lambda i: f"s{i}",  # the batch itself: a list
    lambda i: Point(f"s{i}", i),  # a namedtuple: zipped, so a tuple
    lambda i: Names([i, f"s{i}"]),  # a list subclass keeps its type
    lambda i: collections.UserDict(x=torch.tensor(i), name=f"s{i}"),  # any Mapping
    lambda i: collections.OrderedDict(x=i, pair=(i, f"s{i}")),
], ids=["tuple", "list", "dict", "bare", "namedtuple", "list-subclass", "userdict", "nested"])
@pytest.mark.parametrize("workers", [
    dict(num_workers=0),
    dict(num_workers=1, worker_type="process", persistent_workers=True),
], ids=["inline", "process"])
def test_containers_and_strings_batch_as_torch(make, workers):
    data = Samples(make)
    theirs = list(tud.DataLoader(data, batch_size=4))
    ours = list(stoker.DataLoader(data, batch_size=4, **workers))
    for a, b in zip(theirs, ours):
        assert_same(a, b)


@pytest.mark.parametrize("leaf", [None, object(), "pil"], ids=["none", "object", "pil"])
def test_leaves_default_collate_refuses_raise_type_error(leaf):
    if leaf == "pil":
        from PIL import Image

        leaf = Image.new("RGB", (4, 4))
    data = Samples(lambda i: (torch.tensor(i), leaf))
    for loader_type in (tud.DataLoader, stoker.DataLoader):
        with pytest.raises(TypeError, match="batch must contain tensors"):
            list(loader_type(data, batch_size=2, num_workers=0))


def test_custom_collate_fn_sees_the_samples_as_torch_passes_them():
    def pad(samples):
        longest = max(len(s) for s, _ in samples)
        x = torch.zeros(len(samples), longest)
        for k, (s, _) in enumerate(samples):
            x[k, : len(s)] = s
        return x, torch.tensor([y for _, y in samples])

    class Ragged(Pairs):
        def __getitem__(self, i):
            return torch.arange(float(i % 7 + 1)), i

    theirs, ours = both(Ragged(30), batch_size=4, collate_fn=pad)
    for a, b in zip(theirs, ours):
        assert_same(a, b)



class _SeededOrder:
    """A sampler without __len__ drawing from its own seeded generator (a new order each
    epoch): reading it once more than torch does would shift every epoch."""

    def __init__(self, pairs: bool):
        self.g, self.pairs = torch.Generator().manual_seed(0), pairs

    def __iter__(self):
        perm = torch.randperm(6, generator=self.g).tolist()
        return iter([perm[k:k + 2] for k in range(0, 6, 2)] if self.pairs else perm)


@pytest.mark.parametrize("kind", ["sampler", "sampler_collate", "batch_sampler"])
def test_a_sampler_without_len_is_read_once_per_epoch_as_torch_reads_it(kind):
    data = list(range(6))
    make = {"sampler": lambda: dict(sampler=_SeededOrder(False), batch_size=3),
            "sampler_collate": lambda: dict(sampler=_SeededOrder(False), batch_size=3,
                                             collate_fn=lambda s: [int(x) for x in s]),
            "batch_sampler": lambda: dict(batch_sampler=_SeededOrder(True))}[kind]
    theirs, ours = tud.DataLoader(data, **make()), stoker.DataLoader(data, **make())
    for loader in (theirs, ours):
        with pytest.raises(TypeError, match="has no len"):
            len(loader)
    for _ in range(3):
        assert [list(map(int, b)) for b in ours] == [list(map(int, b)) for b in theirs]
    ours.close()


class _OnlyGetitems(tud.Dataset):
    """Samples through __getitems__ only: torch's loader never calls __getitem__ then."""

    def __len__(self):
        return 10

    def __getitem__(self, i):
        raise NotImplementedError("read through __getitems__")

    def __getitems__(self, indices):
        return [torch.tensor([10 * i], dtype=torch.uint32) for i in indices]


@pytest.mark.parametrize("workers,worker_type", [(0, "thread"), (2, "thread"), (2, "process")])
def test_getitems_is_the_only_read_and_any_dtype_crosses_processes(workers, worker_type):
    # The first sample (which teaches stoker the batch layout) is read as the others are, and
    # a worker process sends it back through shared memory: torch cannot unpickle uint32.
    loader = stoker.DataLoader(_OnlyGetitems(), batch_size=4, num_workers=workers,
                               worker_type=worker_type)
    got = [b for b in loader]
    assert [b.dtype for b in got] == [torch.uint32] * 3
    assert [b.flatten().tolist() for b in got] == [[0, 10, 20, 30], [40, 50, 60, 70], [80, 90]]
    loader.close()


@pytest.mark.parametrize("first", [np.int64, np.float32, torch.tensor],
                         ids=["np.int64", "np.float32", "tensor"])
def test_a_python_number_where_the_first_sample_had_an_array_is_a_layout_error(first):
    data = [first(0), first(1), 2, 3]
    with pytest.raises(TypeError,
                       match="sample 2 is a int where the first sample read has an array"):
        list(stoker.DataLoader(data, batch_size=2, num_workers=0))


class _DropsOdd(tud.IterableDataset):
    def __iter__(self):
        return iter(range(6))


@pytest.mark.parametrize("workers,worker_type", [(0, "thread"), (2, "thread"), (2, "process")])
def test_a_none_batch_is_yielded_not_taken_for_the_end(workers, worker_type):
    # A collate_fn that drops a bad batch returns None; torch yields it and goes on.
    def drop_odd(samples):
        return None if samples[0] % 4 == 2 else samples

    cases = [(list(range(6)), dict(batch_size=2, collate_fn=drop_odd)),
             ([0, 1, None, None, 4], dict(batch_size=None)),
             (_DropsOdd(), dict(batch_size=2, collate_fn=drop_odd))]
    for data, kwargs in cases:
        want = list(tud.DataLoader(data, num_workers=workers, **kwargs))
        loader = stoker.DataLoader(data, num_workers=workers, worker_type=worker_type, **kwargs)
        assert None in want and list(loader) == want == list(loader), kwargs
        loader.close()

def test_sequential_and_batch_samplers():
    data = Pairs()
    for kwargs in (dict(sampler=tud.SequentialSampler(data), batch_size=7),
                   dict(batch_sampler=tud.BatchSampler(tud.SequentialSampler(data), 6, True))):
        theirs, ours = both(data, **kwargs)
        assert len(theirs) == len(ours)
        for a, b in zip(theirs, ours):
            assert_same(a, b)


def test_shuffle_visits_every_sample_once_per_epoch():
    data = Pairs(61)
    loader = stoker.DataLoader(data, batch_size=8, shuffle=True)
    orders = []
    for _ in range(2):
        labels = torch.cat([y for _, y in loader]).tolist()
        assert sorted(labels) == list(range(61))
        orders.append(labels)
    assert orders[0] != orders[1]  # a new order each epoch, as torch's


def test_seeding_makes_shuffled_epochs_repeat_as_torchs():
    """The same torch.manual_seed (or generator seed) gives the same epochs, another seed
    others; the permutation itself is stoker's own (docs/python.md)."""
    def epochs(loader_type, **kwargs):
        loader = loader_type(Pairs(40), batch_size=8, shuffle=True, num_workers=0, **kwargs)
        return [torch.cat([y for _, y in loader]).tolist() for _ in range(2)]

    for loader_type in (tud.DataLoader, stoker.DataLoader):
        runs = []
        for seed in (3, 3, 4):
            torch.manual_seed(seed)
            runs.append(epochs(loader_type))
        assert runs[0] == runs[1] != runs[2]
        assert runs[0][0] != runs[0][1]  # a new order each epoch
        seeded = [epochs(loader_type, generator=torch.Generator().manual_seed(7))
                  for _ in range(2)]
        assert seeded[0] == seeded[1]


def test_subset_random_sampler_draws_from_its_subset():
    data = Pairs()
    subset = list(range(3, 40, 3))
    loader = stoker.DataLoader(data, batch_size=4, sampler=tud.SubsetRandomSampler(subset))
    labels = torch.cat([y for _, y in loader]).tolist()
    assert sorted(labels) == subset


def test_seeded_weighted_sampler_gives_torchs_epochs():
    data = Pairs()
    weights = [float(i % 4 + 1) for i in range(len(data))]

    def sampler():
        return tud.WeightedRandomSampler(weights, 40, generator=torch.Generator().manual_seed(5))

    t = tud.DataLoader(data, batch_size=8, sampler=sampler())
    s = stoker.DataLoader(data, batch_size=8, sampler=sampler())
    for _ in range(2):
        for a, b in zip(list(t), list(s)):
            assert_same(a, b)


@pytest.mark.parametrize("workers", [1, 2])
def test_worker_init_fn_runs_once_per_worker(workers):
    seen = []

    def init(worker_id):
        seen.append(worker_id)

    loader = stoker.DataLoader(Pairs(), batch_size=4, num_workers=workers, worker_init_fn=init)
    for _ in range(2):
        list(loader)
    # Against the count asked for: worker_type='auto' may have moved the reads in-line since
    # (its in-line trial, kept where the loop reads these cheap samples faster: num_workers 0).
    assert sorted(seen) == list(range(len(seen))) and 1 <= len(seen) <= workers


@pytest.mark.parametrize("error", [KeyError, ValueError, ZeroDivisionError])
def test_a_failing_sample_raises_its_type(error):
    class Broken(Pairs):
        def __getitem__(self, i):
            if i == 9:
                raise error("sample nine")
            return super().__getitem__(i)

    for loader_type in (tud.DataLoader, stoker.DataLoader):
        until_error(loader_type(Broken(), batch_size=4, num_workers=2), error)


@pytest.mark.parametrize("kwargs", [
    dict(timeout=-1),
    dict(num_workers=-1),
    dict(shuffle=True, sampler=[0, 1]),
    dict(batch_size=2, batch_sampler=[[0, 1]]),
])
def test_impossible_options_raise_value_error_as_torch(kwargs):
    with pytest.raises(ValueError):
        tud.DataLoader(Pairs(), **kwargs)
    with pytest.raises(ValueError):
        stoker.DataLoader(Pairs(), **kwargs)


class Shards(tud.IterableDataset):
    """torch's documented pattern: each worker reads its share of range(start, end); shares of
    unequal length, so that workers run out at different times."""

    def __init__(self, start=0, end=23):
        self.start, self.end = start, end

    def __iter__(self):
        info = tud.get_worker_info()
        if info is None:
            return iter(self._items(self.start, self.end))
        per = -(-(self.end - self.start) // info.num_workers)
        lo = self.start + info.id * per
        return iter(self._items(lo, min(lo + per, self.end)))

    def _items(self, lo, hi):
        return [{"x": torch.tensor([float(i), -i]), "i": i} for i in range(lo, hi)]


@pytest.mark.parametrize("workers,worker_type", [(0, "thread"), (1, "thread"), (2, "thread"),
                                                 (3, "thread"), (2, "process"),
                                                 (3, "process")])
@pytest.mark.parametrize("drop_last", [False, True])
def test_iterable_dataset_shards_and_order_as_torch(workers, worker_type, drop_last):
    kwargs = dict(batch_size=4, num_workers=workers, drop_last=drop_last)
    theirs = list(tud.DataLoader(Shards(), **kwargs))
    loader = stoker.DataLoader(Shards(), worker_type=worker_type, **kwargs)
    for _ in range(2):  # every epoch the same
        ours = list(loader)
        assert len(ours) == len(theirs)
        for a, b in zip(theirs, ours):
            assert_same(a, b)
    loader.close()


@pytest.mark.parametrize("workers,worker_type", [(0, "thread"), (2, "thread"), (1, "process"),
                                                 (2, "process")])
@pytest.mark.parametrize("shuffle", [None, False, True])
def test_an_iter_datapipe_is_shuffled_seeded_and_sharded_as_torchs(workers, worker_type,
                                                                   shuffle):
    # torch's loader turns the pipe's shuffle steps on or off (shuffle=), seeds them each
    # epoch from torch's generator (the same for every worker) and shards the pipe over the
    # workers (sharding_filter): the same batches, epoch after epoch, with stoker's
    from torch.utils.data.datapipes.iter import IterableWrapper

    def pipe():
        return IterableWrapper(range(60)).shuffle(buffer_size=16).sharding_filter()

    kwargs = dict(batch_size=4, num_workers=workers, shuffle=shuffle)
    theirs, ours = tud.DataLoader(pipe(), **kwargs), stoker.DataLoader(
        pipe(), worker_type=worker_type, **kwargs)
    for seed in (123, 123, 321):
        torch.manual_seed(seed)
        expected = [b.tolist() for b in theirs]
        torch.manual_seed(seed)
        got = [b.tolist() for b in ours]
        assert got == expected
        assert sorted(sum(got, [])) == list(range(60))
    ours.close()


def test_a_stream_that_does_not_shard_is_read_once_by_default():
    # Each worker iterates its own copy: by default (torch's num_workers=0, stoker's 'auto')
    # every item comes once.
    class Counting(tud.IterableDataset):
        def __iter__(self):
            return iter(range(10))

    theirs = list(tud.DataLoader(Counting(), batch_size=None))
    loader = stoker.DataLoader(Counting(), batch_size=None)
    assert theirs == list(loader) == list(range(10))
    loader.close()


def test_a_stream_longer_than_its_len_warns_once_len_was_asked():
    # Two workers that do not shard a stream of 6 yield 12 items: past the 6 len() reported,
    # each next() warns, as torch's does; not before len() was asked.
    class Six(tud.IterableDataset):
        def __iter__(self):
            return iter(range(6))

        def __len__(self):
            return 6

    for loader_type in (tud.DataLoader, stoker.DataLoader):
        loader = loader_type(Six(), batch_size=None, num_workers=2)
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            assert len(list(loader)) == 12
        assert len(loader) == 6
        it = iter(loader)
        for k in range(12):
            if k < 6:
                next(it)
            else:
                with pytest.warns(UserWarning, match=f"but {k + 1} samples have been fetched"):
                    next(it)
        del it, loader


def test_an_iterable_without_getitem_is_a_stream():
    # torch takes it for a map-style data set (and fails at len()); stoker reads it as a stream.
    class Plain:
        def __iter__(self):
            return iter(range(7))

    ours = list(stoker.DataLoader(Plain(), batch_size=3, num_workers=0))
    assert [o.tolist() for o in ours] == [[0, 1, 2], [3, 4, 5], [6]]


def test_len_of_a_stream_only_when_the_data_set_has_one():
    class Sized(Shards):
        def __len__(self):
            return self.end - self.start

    for drop_last in (False, True):
        t = tud.DataLoader(Sized(), batch_size=4, drop_last=drop_last)
        s = stoker.DataLoader(Sized(), batch_size=4, drop_last=drop_last)
        assert len(s) == len(t)
    assert len(stoker.DataLoader(Sized(), batch_size=None)) == 23
    for loader_type in (tud.DataLoader, stoker.DataLoader):
        with pytest.raises(TypeError):
            len(loader_type(Shards(), batch_size=4))


def test_worker_init_fn_configures_each_workers_copy_as_in_torchs_docs():
    def init(worker_id):
        info = tud.get_worker_info()
        copy = info.dataset  # this worker's copy: its range is cut to the worker's share
        per = (copy.end - copy.start) // info.num_workers
        copy.start, copy.end = copy.start + worker_id * per, copy.start + (worker_id + 1) * per

    class Whole(Shards):
        def __iter__(self):
            return iter(self._items(self.start, self.end))

    for worker_type in ("thread", "process"):
        theirs = list(tud.DataLoader(Whole(0, 24), batch_size=5, num_workers=2,
                                     worker_init_fn=init))
        ours = list(stoker.DataLoader(Whole(0, 24), batch_size=5, num_workers=2,
                                      worker_init_fn=init, worker_type=worker_type))
        assert len(ours) == len(theirs) == 6
        for a, b in zip(theirs, ours):
            assert_same(a, b)


@pytest.mark.parametrize("worker_type", ["thread", "process"])
def test_an_error_in_a_stream_is_raised_in_the_loop_with_its_type(worker_type):
    class Breaks(tud.IterableDataset):
        def __iter__(self):
            for i in range(20):
                if i == 5:
                    raise KeyError("stream broke")
                yield torch.tensor(i)

    for loader in (tud.DataLoader(Breaks(), batch_size=2, num_workers=2),
                   stoker.DataLoader(Breaks(), batch_size=2, num_workers=2,
                                     worker_type=worker_type)):
        got, error = until_error(loader, KeyError, lambda batch: batch.tolist())
        assert "stream broke" in str(error)
        assert got == [[0, 1], [0, 1], [2, 3], [2, 3]]  # each worker's two batches, in turn


def test_stream_options_torch_refuses_are_refused():
    for kwargs in (dict(shuffle=True), dict(sampler=[0, 1]), dict(batch_sampler=[[0]]),
                   dict(batch_size=None, drop_last=True)):
        for loader_type in (tud.DataLoader, stoker.DataLoader):
            with pytest.raises(ValueError):
                loader_type(Shards(), **kwargs)


@pytest.mark.parametrize("workers", [0, 2])
def test_batch_size_none_yields_samples(workers):
    theirs, ours = both(Pairs(5), batch_size=None, num_workers=workers)
    assert len(ours) == 5
    for a, b in zip(theirs, ours):
        assert_same(a, b)


@pytest.mark.parametrize("worker_type", ["thread", "process"])
def test_a_batch_sampler_of_varying_sizes_as_torch(worker_type):
    class Buckets:
        """Batches of similar lengths, of as many samples as fit a token budget."""

        def __init__(self, lengths, budget):
            self.lengths, self.budget = lengths, budget

        def __iter__(self):
            order = sorted(range(len(self.lengths)), key=self.lengths.__getitem__)
            batch = []
            for i in order:
                if batch and (len(batch) + 1) * self.lengths[i] > self.budget:
                    yield batch
                    batch = []
                batch.append(i)
            yield batch

        def __len__(self):
            return sum(1 for _ in self)

    def pad(samples):
        return torch.nn.utils.rnn.pad_sequence([s for s, _ in samples], batch_first=True), \
            torch.tensor([i for _, i in samples])

    class Ragged(Pairs):
        def __getitem__(self, i):
            return torch.arange(float((i * 7) % 13 + 1)), i

    data = Ragged(40)
    sampler = Buckets([len(data[i][0]) for i in range(len(data))], budget=30)
    theirs = list(tud.DataLoader(data, batch_sampler=sampler, collate_fn=pad))
    ours = list(stoker.DataLoader(data, batch_sampler=sampler, collate_fn=pad, num_workers=2,
                                  worker_type=worker_type))
    assert len({len(b[1]) for b in theirs}) > 2  # the sizes do vary
    assert len(ours) == len(theirs)
    for a, b in zip(theirs, ours):
        assert_same(a, b)
    # Also with default_collate.
    theirs, ours = both(Pairs(), batch_sampler=[[0, 1, 2], [3], [4, 5]])
    for a, b in zip(theirs, ours):
        assert_same(a, b)


@pytest.mark.parametrize("worker_type", ["thread", "process"])
def test_an_error_in_collate_fn_is_raised_with_its_type(worker_type):
    def collate(samples):
        if samples[0][1] == 8:
            raise ZeroDivisionError("bad batch")
        return tud.default_collate(samples)

    for loader in (tud.DataLoader(Pairs(20), batch_size=4, num_workers=2, collate_fn=collate),
                   stoker.DataLoader(Pairs(20), batch_size=4, num_workers=2, collate_fn=collate,
                                     worker_type=worker_type)):
        got, error = until_error(loader, ZeroDivisionError, lambda batch: batch[1].tolist())
        assert got == [[0, 1, 2, 3], [4, 5, 6, 7]]
    notes = "\n".join(getattr(error, "__notes__", []))
    assert "batch 2" in notes and "samples [8, 9, 10, 11]" in notes


def test_tensors_default_collate_cannot_stack_raise_its_error():
    data = Samples(lambda i: torch.nested.nested_tensor([torch.ones(2), torch.ones(i + 1)]))
    for loader_type in (tud.DataLoader, stoker.DataLoader):
        with pytest.raises(RuntimeError, match="nested tensors are not currently supported"):
            list(loader_type(data, batch_size=2, num_workers=0))


def test_attributes_are_torchs():
    data = Pairs()
    init = tud.DataLoader.__init__
    cases = [dict(batch_size=4, num_workers=0),
             dict(batch_size=3, shuffle=True, drop_last=True, num_workers=1),
             dict(batch_sampler=tud.BatchSampler(tud.SequentialSampler(data), 5, False),
                  num_workers=0),
             dict(batch_size=2, num_workers=2, prefetch_factor=3, timeout=5.0,
                  worker_init_fn=print, persistent_workers=True,
                  generator=torch.Generator().manual_seed(1))]
    for kwargs in cases:
        theirs, ours = tud.DataLoader(data, **kwargs), stoker.DataLoader(data, **kwargs)
        assert isinstance(ours, tud.DataLoader) and isinstance(ours, stoker.DataLoader)
        for name in ("dataset", "batch_size", "drop_last", "timeout", "worker_init_fn",
                     "prefetch_factor", "persistent_workers", "generator", "collate_fn",
                     "multiprocessing_context", "pin_memory_device", "in_order"):
            assert getattr(ours, name) == getattr(theirs, name), (name, kwargs)
        assert type(ours.sampler) is type(theirs.sampler), kwargs
        assert type(ours.batch_sampler) is type(theirs.batch_sampler), kwargs
        assert ours.batch_sampler.batch_size == theirs.batch_sampler.batch_size
        assert len(ours) == len(theirs)
    assert stoker.DataLoader[int] is not None and tud.DataLoader[int] is not None
    assert init is tud.DataLoader.__init__  # torch's class is left as it was


def test_isinstance_answers_when_torchs_name_is_stokers(monkeypatch):
    """As in tools/torch_dataloader_suite.py, which puts stoker's class in torch's place."""
    monkeypatch.setattr(tud, "DataLoader", stoker.DataLoader)
    loader = stoker.DataLoader(Pairs(), batch_size=4, num_workers=0)
    assert isinstance(loader, tud.DataLoader) and not isinstance(loader, int)


@pytest.mark.parametrize("name", ["batch_size", "sampler", "batch_sampler", "drop_last",
                                  "dataset", "persistent_workers"])
def test_attributes_that_define_the_batches_cannot_be_set_after_init(name):
    for loader_type in (tud.DataLoader, stoker.DataLoader):
        loader = loader_type(Pairs(), batch_size=4, num_workers=0)
        with pytest.raises(ValueError, match=f"{name} attribute should not be set"):
            setattr(loader, name, 2)
        loader.timeout = 3.0  # the others can be


@pytest.mark.parametrize("order", ["sequential", "shuffle", "random_sampler"])
def test_len_follows_a_growing_data_set_and_iter_says_what_is_read(order):
    """Shuffled, too (torch's RandomSampler's permutations, which stoker draws as torch does):
    PyTorch's test_growing_dataset checks len() of a shuffling loader."""
    data = [torch.full((2,), float(i)) for i in range(4)]
    kwargs = {"sequential": {}, "shuffle": {"shuffle": True},
              "random_sampler": {"sampler": tud.RandomSampler(data)}}[order]
    theirs = tud.DataLoader(data, batch_size=3, **kwargs)
    ours = stoker.DataLoader(data, batch_size=3, num_workers=0, **kwargs)
    data.append(torch.ones(2))
    data.append(torch.ones(2))
    data.append(torch.ones(2))
    assert len(ours) == len(theirs) == 3
    for _ in range(2):  # each epoch reads the samples there were when the loader was made
        with pytest.warns(UserWarning, match="it reads those 4"):
            read = torch.cat([b[:, 0] for b in ours])
        assert sorted(read.tolist()) == [0.0, 1.0, 2.0, 3.0]


def test_a_loader_made_again_from_its_attributes_as_lightning_does():
    """Lightning adds a DistributedSampler by calling type(loader)(**attributes) with the
    public attributes whose values differ from the __init__ defaults; it resets _iterator."""
    import inspect

    def remade(loader, sampler):
        attrs = {k: v for k, v in vars(loader).items() if not k.startswith("_")}
        attrs["multiprocessing_context"] = loader.multiprocessing_context
        params = inspect.signature(type(loader).__init__).parameters
        kwargs = {k: v for k, v in attrs.items() if k in params and params[k].default is not v}
        kwargs.update(sampler=sampler, shuffle=False, batch_sampler=None)
        return type(loader)(**kwargs)

    data = Pairs(30)
    batches = []
    for loader_type in (tud.DataLoader, stoker.DataLoader):
        loader = loader_type(data, batch_size=4, shuffle=True, num_workers=0)
        sampler = tud.distributed.DistributedSampler(data, num_replicas=2, rank=1, shuffle=False)
        again = remade(loader, sampler)
        assert type(again) is type(loader) and again.batch_size == 4
        batches.append(list(again))
        loader._iterator = None
        assert len(list(loader)) == len(loader)
    for a, b in zip(*batches):
        assert_same(a, b)


@pytest.mark.parametrize("kwargs, error, words", [
    (dict(num_workers=0, multiprocessing_context="spawn"), ValueError,
     r"multi-process loading \(num_workers > 0\), but got"),
    (dict(num_workers=1, multiprocessing_context="bad"), ValueError,
     "should specify a valid start method in"),
    (dict(num_workers=1, multiprocessing_context=object()), TypeError,
     "should be a valid context object"),
    (dict(batch_size=None, drop_last=True), ValueError, "mutually exclusive with drop_last"),
    (dict(batch_sampler=tud.BatchSampler(tud.SequentialSampler(range(5)), 2, False),
          sampler=tud.SequentialSampler(range(5)), shuffle=True), ValueError,
     "sampler option is mutually exclusive with shuffle"),
    (dict(batch_sampler=tud.BatchSampler(tud.SequentialSampler(range(5)), 2, False),
          drop_last=True), ValueError, "batch_sampler option is mutually exclusive with"),
    (dict(num_workers=0, prefetch_factor=2), ValueError, "prefetch_factor option could only"),
    (dict(num_workers=0, persistent_workers=True), ValueError, "persistent_workers option"),
])
def test_argument_errors_are_torchs(kwargs, error, words):
    for loader_type in (tud.DataLoader, stoker.DataLoader):
        with pytest.raises(error, match=words):
            loader_type(Pairs(), **kwargs)


@pytest.mark.parametrize("kwargs, words", [
    (dict(pin_memory_device="cuda"), "pin_memory_device='cuda' is not used"),
    (dict(in_order=False), "in_order=False is not used"),
    (dict(num_workers=2, worker_type="thread", multiprocessing_context="spawn"),
     "multiprocessing_context is not used"),
    (dict(num_workers=1, worker_type="process", persistent_workers=False),
     "persistent_workers=False is not honoured"),
])
def test_arguments_stoker_does_not_honour_warn(kwargs, words):
    with pytest.warns(UserWarning, match=words):
        loader = stoker.DataLoader(Pairs(), batch_size=4, **kwargs)
    loader.close()


def test_torchs_default_persistent_workers_does_not_warn(recwarn):
    loader = stoker.DataLoader(Pairs(), batch_size=4, num_workers=1, worker_type="process")
    assert loader.persistent_workers is False
    list(loader)
    loader.close()
    assert not [w for w in recwarn if "persistent_workers" in str(w.message)]


def test_pin_memory_without_a_gpu_warns_as_torch():
    if torch.cuda.is_available():
        pytest.skip("a GPU answers")
    with pytest.warns(UserWarning, match="no accelerator is found"):
        stoker.DataLoader(Pairs(), batch_size=4, pin_memory=True, num_workers=0)


def test_keep_on_host_names_fields():
    data = Samples(lambda i: {"x": torch.full((3,), float(i)), "id": i}, n=10)
    loader = stoker.DataLoader(data, batch_size=5, keep_on_host=["id"], device="sim",
                               num_workers=0)
    assert [b["id"].tolist() for b in loader] == [[0, 1, 2, 3, 4], [5, 6, 7, 8, 9]]
    # The layout, and so the check, comes with the first sample read.
    loader = stoker.DataLoader(data, batch_size=5, keep_on_host=["nope"], num_workers=0)
    with pytest.raises(ValueError, match="keep_on_host names field 'nope'.*'x', 'id'"):
        next(iter(loader))


def test_reiteration_and_len():
    loader = stoker.DataLoader(Pairs(50), batch_size=8)
    assert len(loader) == len(tud.DataLoader(Pairs(50), batch_size=8)) == 7
    first = [y.tolist() for _, y in loader]
    second = [y.tolist() for _, y in loader]
    assert first == second  # unshuffled: the same every epoch
    random.shuffle(first)  # lists, not views of recycled memory


# --- construction reads nothing; the first samples are read by the workers ---------------

class Counted(Pairs):
    """Counts the __getitem__ calls made in this process."""

    def __init__(self, n=12):
        super().__init__(n)
        self.calls = 0

    def __getitem__(self, i):
        self.calls += 1
        return super().__getitem__(i)


@pytest.mark.parametrize("workers", [0, 2])
def test_construction_and_len_read_nothing(workers):
    for loader_type in (tud.DataLoader, stoker.DataLoader):
        data = Counted()
        loader = loader_type(data, batch_size=5, num_workers=workers)
        assert len(loader) == 3 and data.calls == 0, loader_type


class Synchronized(tud.Dataset):
    """Each worker's first __getitem__ waits until every worker has reached its own (torch's
    test_dataloader has such data sets): a loader that reads a sample alone first hangs."""

    def __init__(self, workers, n=8):
        self.barrier = multiprocessing.get_context("fork").Barrier(workers)
        self.synced = set()
        self.n = n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        info = tud.get_worker_info()
        if info is not None and info.id not in self.synced:
            self.synced.add(info.id)
            self.barrier.wait(timeout=20)  # broken, rather than a hang, if a worker is missing
        return torch.tensor([i])


@pytest.mark.parametrize("worker_type", ["thread", "process"])
def test_workers_that_wait_for_each_other(worker_type):
    theirs = list(tud.DataLoader(Synchronized(2), batch_size=2, num_workers=2))
    ours = list(stoker.DataLoader(Synchronized(2), batch_size=2, num_workers=2,
                                  worker_type=worker_type))
    assert_same(theirs, ours)


class SlowFirst(Pairs):
    """The first sample a process reads takes a while (opening a file, a cache warming)."""

    def __init__(self):
        super().__init__(8)
        self.slow = True

    def __getitem__(self, i):
        if self.slow:
            self.slow = False
            time.sleep(1.5)
        return super().__getitem__(i)


def test_a_slow_first_sample_times_out_in_the_first_next():
    for loader_type in (tud.DataLoader, stoker.DataLoader):
        loader = loader_type(SlowFirst(), batch_size=4, num_workers=1, timeout=0.3)
        with pytest.raises(RuntimeError, match="DataLoader timed out after 0.3 seconds"):
            next(iter(loader))
        del loader


@pytest.mark.parametrize("workers", [0, 2])
def test_a_failing_first_sample_fails_its_batch_only(workers):
    class FirstFails(Pairs):
        def __getitem__(self, i):
            if i == 0:
                raise ValueError("sample zero")
            return super().__getitem__(i)

    results = []
    for loader_type in (tud.DataLoader, stoker.DataLoader):
        loader = loader_type(FirstFails(12), batch_size=4, num_workers=workers)
        it = iter(loader)
        with pytest.raises(ValueError, match="sample zero"):
            next(it)
        results.append(list(it))
    assert len(results[0]) == 2
    assert_same(*results)


def failures_per_epoch(loader, error):
    """What each next() of two epochs gave: 'batch', or `error` (torch's worker processes
    raise it again with the worker's traceback as its message)."""
    epochs = []
    for _ in range(2):
        seen, it = [], iter(loader)
        for _ in range(len(loader) + 1):  # one more: the end of the epoch
            try:
                next(it)
                seen.append("batch")
            except StopIteration:
                break
            except error:
                seen.append(error.__name__)
        epochs.append(seen)
    return epochs


class FailsBelow(Pairs):
    """Samples below `bad` raise LookupError(index): the layout is not known until the first
    sample that reads, if any."""

    def __init__(self, n, bad):
        super().__init__(n)
        self.bad = bad

    def __getitem__(self, i):
        if i < self.bad:
            raise LookupError(i)
        return super().__getitem__(i)


@pytest.mark.parametrize("workers, worker_type", [(0, "auto"), (3, "thread"), (2, "process")])
@pytest.mark.parametrize("bad", [41, 7])
def test_batches_of_failing_samples_each_raise_the_samples_type_then_the_epoch_ends(
        workers, worker_type, bad):
    # Every sample failing (bad=41) is torch's test_error: each batch raises, then the epoch
    # ends; bad=7 learns the layout only after three failed batches.
    kwargs = dict(batch_size=3, num_workers=workers)
    theirs = failures_per_epoch(tud.DataLoader(FailsBelow(41, bad), **kwargs), LookupError)
    ours = failures_per_epoch(stoker.DataLoader(FailsBelow(41, bad), worker_type=worker_type,
                                                **kwargs), LookupError)
    assert theirs == ours


_KEEP_EVERY_BATCH = """
import resource, sys, torch, torch.utils.data as tud, stoker
loader_type = {"torch": tud.DataLoader, "stoker": stoker.DataLoader}[sys.argv[1]]

class Random(tud.IterableDataset):
    def __iter__(self):
        return (torch.randn(2, 2) for _ in range(200))

resource.setrlimit(resource.RLIMIT_NOFILE, (100, 100))
try:
    kept = list(loader_type(Random(), num_workers=1, multiprocessing_context="fork"))
    assert len(kept) == 200 and all(t.shape == (1, 2, 2) for t in kept)
except RuntimeError as e:
    assert "ulimit -n" in str(e), e
"""


@pytest.mark.parametrize("loader", ["torch", "stoker"])
def test_keeping_every_batch_under_a_low_open_files_limit_works_or_says_why(loader):
    # torch's test_fd_limit_exceeded: each batch kept holds shared memory (a file descriptor
    # in the worker); torch's loader either copes or says to raise the limit. stoker's copes:
    # out of descriptors, its worker pickles the batches whole.
    subprocess.run([sys.executable, "-c", _KEEP_EVERY_BATCH, loader], check=True, timeout=120)


@pytest.mark.parametrize("stream", [False, True])
def test_worker_processes_of_a_dropped_loader_exit_with_code_zero(stream):
    # torch's iterator lists its worker processes (_workers); once the loader is gone they
    # exit cleanly, and their Process objects still answer.
    dataset = Shards() if stream else Pairs()
    for loader_type, extra in ((tud.DataLoader, {}), (stoker.DataLoader,
                                                      {"worker_type": "process"})):
        loader = loader_type(dataset, batch_size=4, num_workers=2, **extra)
        it = iter(loader)
        next(it)
        workers = list(it._workers)
        assert len(workers) == 2, loader_type
        del it, loader
        gc.collect()
        for w in workers:
            w.join(10)
            assert (w.is_alive(), w.exitcode) == (False, 0), loader_type
