"""stoker.DataLoader against torch.utils.data.DataLoader's meanings."""

import collections
import os
import pickle
import threading
import time

import numpy as np
import pytest
import torch
import torch.utils.data as tud

import stoker


class Squares:
    """A map-style Python data set: tuple of (tensor, int, str)."""

    def __init__(self, n=100):
        self.n = n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        return torch.full((2, 3), float(i)), i * i, f"s{i}"


def indices_of(loader):
    return [int(i) for batch in loader for i in batch[1]]


def test_array_dataset_every_sample_once_in_contiguous_tensors():
    x = torch.arange(1000 * 4, dtype=torch.float32).reshape(1000, 4)
    y = torch.arange(1000)
    loader = stoker.DataLoader(stoker.ArrayDataset(x, y), batch_size=64, shuffle=True, seed=3)
    seen = []
    for images, labels in loader:
        assert images.dtype == torch.float32 and images.is_contiguous()
        assert torch.equal(images, x[labels])
        seen += labels.tolist()
    assert len(loader) == 16
    assert sorted(seen) == list(range(1000))
    assert seen != list(range(1000))


def test_same_seed_same_order_and_epochs_differ():
    ds = stoker.ArrayDataset(np.arange(200, dtype=np.int64))

    def epochs(seed):
        loader = stoker.DataLoader(ds, batch_size=32, shuffle=True, seed=seed)
        return [[int(i) for b in loader for i in b[0]] for _ in range(2)]

    a, b = epochs(7), epochs(7)
    assert a == b
    assert a[0] != a[1]
    assert sorted(a[1]) == list(range(200))


def test_torch_manual_seed_makes_shuffling_repeat():
    ds = stoker.ArrayDataset(np.arange(100, dtype=np.int64))
    torch.manual_seed(1)
    first = [int(i) for b in stoker.DataLoader(ds, batch_size=10, shuffle=True) for i in b[0]]
    torch.manual_seed(1)
    again = [int(i) for b in stoker.DataLoader(ds, batch_size=10, shuffle=True) for i in b[0]]
    g = torch.Generator().manual_seed(1)
    with_gen = stoker.DataLoader(ds, batch_size=10, shuffle=True, generator=g)
    assert first == again
    assert sorted(int(i) for b in with_gen for i in b[0]) == list(range(100))


@pytest.mark.parametrize("workers", [0, 1, 3])
def test_python_dataset_batches_like_default_collate(workers):
    ds = Squares(50)
    ours = list(stoker.DataLoader(ds, batch_size=8, num_workers=workers))
    theirs = list(tud.DataLoader(ds, batch_size=8))
    assert len(ours) == len(theirs) == 7
    for a, b in zip(ours, theirs):
        assert type(a) is type(b) is list
        assert torch.equal(a[0], b[0]) and a[0].dtype == b[0].dtype
        assert torch.equal(a[1], b[1]) and a[1].dtype == torch.int64
        assert list(a[2]) == list(b[2])  # torch gives a tuple here, a list in a dict


def test_dict_namedtuple_bool_float_and_numpy_leaves():
    Pair = collections.namedtuple("Pair", "left right")

    class D:
        def __len__(self):
            return 20

        def __getitem__(self, i):
            return {"pair": Pair(np.full(3, i, np.uint8), float(i) / 2),
                    "flag": i % 2 == 0, "mask": np.array([True, False])}

    ours = list(stoker.DataLoader(D(), batch_size=5, num_workers=2))
    theirs = list(tud.DataLoader(D(), batch_size=5))
    for a, b in zip(ours, theirs):
        assert isinstance(a["pair"], Pair)
        for x, y in [(a["pair"].left, b["pair"].left), (a["pair"].right, b["pair"].right),
                     (a["flag"], b["flag"]), (a["mask"], b["mask"])]:
            assert x.dtype == y.dtype and torch.equal(x, y)


def test_drop_last_and_len():
    ds = stoker.ArrayDataset(np.arange(10, dtype=np.int32))
    assert len(stoker.DataLoader(ds, batch_size=4)) == 3
    loader = stoker.DataLoader(ds, batch_size=4, drop_last=True)
    assert len(loader) == 2
    assert [b[0].tolist() for b in loader] == [[0, 1, 2, 3], [4, 5, 6, 7]]


def test_collate_fn_gets_the_samples_as_they_are():
    def collate(samples):
        return [s[2] for s in samples]

    loader = stoker.DataLoader(Squares(10), batch_size=4, collate_fn=collate, num_workers=2)
    assert list(loader) == [["s0", "s1", "s2", "s3"], ["s4", "s5", "s6", "s7"], ["s8", "s9"]]


def test_worker_init_fn_runs_once_per_worker():
    ids = []
    lock = threading.Lock()

    def init(worker_id):
        with lock:
            ids.append(worker_id)

    list(stoker.DataLoader(Squares(64), batch_size=4, num_workers=3, worker_init_fn=init))
    assert sorted(ids) == list(range(len(ids))) and 1 <= len(ids) <= 3


def test_without_workers_the_calling_thread_reads_and_is_no_worker():
    calls = []
    readers = set()

    class Where(Squares):
        def __getitem__(self, i):
            readers.add(threading.get_ident())
            return super().__getitem__(i)

    loader = stoker.DataLoader(Where(10), batch_size=4, num_workers=0, timeout=5,
                               worker_init_fn=calls.append)
    for _ in range(2):
        assert [b[1].tolist() for b in loader] == [[0, 1, 4, 9], [16, 25, 36, 49], [64, 81]]
    assert calls == []  # as torch: no worker, no worker_init_fn
    assert readers == {threading.get_ident()}


def test_exception_keeps_type_traceback_and_names_the_sample():
    class Bad(Squares):
        def __getitem__(self, i):
            if i == 13:
                raise KeyError("no such record")
            return super().__getitem__(i)

    loader = stoker.DataLoader(Bad(40), batch_size=4, num_workers=2)
    it = iter(loader)
    got = [next(it) for _ in range(3)]
    with pytest.raises(KeyError, match="no such record") as info:
        next(it)
    assert any("sample 13" in n for n in getattr(info.value, "__notes__", []))
    assert any("__getitem__" in str(f.name) for f in info.traceback)
    # The loader goes on with the next batch.
    assert next(it)[1].tolist() == [16 * 16, 17 * 17, 18 * 18, 19 * 19]
    assert len(got) == 3


def test_skip_policy_keeps_batch_shape_and_reports():
    class Bad(Squares):
        def __getitem__(self, i):
            if i % 10 == 3:
                raise ValueError(f"corrupt {i}")
            return super().__getitem__(i)

    loader = stoker.DataLoader(Bad(40), batch_size=8, num_workers=2, on_error="skip")
    batches = list(loader)
    assert [len(b[2]) for b in batches] == [8] * 5
    assert loader.stats()["skipped"] >= 4  # a replacement may fail too, and is replaced
    assert all(int(v) % 10 != 3 for b in batches for v in b[0][:, 0, 0])


def test_skip_budget_exhausted_raises():
    class Bad(Squares):
        def __getitem__(self, i):
            if i % 2:
                raise OSError("disk gone")
            return super().__getitem__(i)

    loader = stoker.DataLoader(Bad(10), batch_size=2, on_error="skip", max_skipped=3)
    with pytest.raises(OSError, match="disk gone"):
        list(loader)


def test_state_dict_resumes_with_exactly_the_remaining_batches():
    ds = stoker.ArrayDataset(np.arange(300, dtype=np.int64))
    loader = stoker.DataLoader(ds, batch_size=16, shuffle=True, seed=5, num_workers=2)
    list(loader)  # epoch 0
    it = iter(loader)  # epoch 1
    head = [next(it)[0].tolist() for _ in range(7)]
    state = pickle.loads(pickle.dumps(loader.state_dict()))
    tail = [b[0].tolist() for b in it]
    assert state["epoch"] == 1 and state["batch"] == 7

    fresh = stoker.DataLoader(ds, batch_size=16, shuffle=True, seed=5, num_workers=3)
    fresh.load_state_dict(state)
    assert [b[0].tolist() for b in fresh] == tail
    assert len(head) + len(tail) == len(loader)
    # and then the next epoch follows, as in the original
    assert [b[0].tolist() for b in fresh] == [b[0].tolist() for b in loader]

    # saved between epochs: the next epoch, from its start
    between = loader.state_dict()
    assert (between["epoch"], between["batch"]) == (3, 0)

    other_seed = stoker.DataLoader(ds, batch_size=16, shuffle=True, seed=6)
    with pytest.raises(ValueError, match="seed"):
        other_seed.load_state_dict(state)


def test_a_new_iter_replaces_the_old_one_and_starts_the_next_epoch():
    ds = stoker.ArrayDataset(np.arange(100, dtype=np.int64))
    loader = stoker.DataLoader(ds, batch_size=10, shuffle=False)
    it = iter(loader)
    next(it)
    it2 = iter(loader)
    with pytest.raises(RuntimeError, match="newer iter"):
        next(it)
    assert [int(b[0][0]) for b in it2] == list(range(0, 100, 10))


def test_torch_samplers_run_natively_and_custom_ones_are_followed():
    ds = stoker.ArrayDataset(np.arange(50, dtype=np.int64))
    seq = stoker.DataLoader(ds, batch_size=10, sampler=tud.SequentialSampler(ds))
    assert [int(i) for b in seq for i in b[0]] == list(range(50))
    rnd = stoker.DataLoader(ds, batch_size=10, sampler=tud.RandomSampler(ds))
    assert sorted(int(i) for b in rnd for i in b[0]) == list(range(50))

    class Backwards(tud.Sampler):
        def __init__(self):
            self.calls = 0

        def __len__(self):
            return 20

        def __iter__(self):
            self.calls += 1
            start = 49 if self.calls % 2 else 39
            return iter(range(start, start - 20, -1))

    backwards = Backwards()
    custom = stoker.DataLoader(ds, batch_size=8, sampler=backwards)
    assert backwards.calls == 0  # read when an epoch starts, as torch does
    assert [int(i) for b in custom for i in b[0]] == list(range(49, 29, -1))
    assert [int(i) for b in custom for i in b[0]] == list(range(39, 19, -1))
    assert backwards.calls == 2

    batched = stoker.DataLoader(
        ds, batch_sampler=tud.BatchSampler(tud.SequentialSampler(ds), 16, drop_last=True))
    assert [b[0].tolist()[0] for b in batched] == [0, 16, 32]


def test_timeout_raises_like_torch_and_the_batch_is_not_lost():
    release = threading.Event()

    class Held(Squares):
        def __getitem__(self, i):
            if i == 1:
                release.wait(60)  # the batch cannot be ready before the timeout
            return super().__getitem__(i)

    loader = stoker.DataLoader(Held(8), batch_size=4, num_workers=1, timeout=0.1)
    it = iter(loader)
    with pytest.raises(RuntimeError, match="timed out after 0.1 seconds"):
        next(it)
    release.set()
    for _ in range(6000):  # however long the batch takes: each time out loses nothing
        try:
            batch = next(it)
            break
        except RuntimeError as e:
            assert "timed out" in str(e)
    assert batch[1].tolist() == [0, 1, 4, 9]


def test_destroying_a_loader_with_batches_in_flight_is_prompt():
    ds = stoker.ArrayDataset(np.zeros((4096, 3, 64, 64), np.uint8), np.arange(4096))
    for _ in range(20):
        loader = stoker.DataLoader(ds, batch_size=64, shuffle=True, num_workers=2)
        it = iter(loader)
        next(it)
        start = time.monotonic()
        del it, loader
        assert time.monotonic() - start < 10  # tells prompt from stuck, on a loaded machine too


def test_batches_are_zero_copy_and_slabs_recycle():
    ds = stoker.ArrayDataset(np.zeros((256, 1024), np.uint8))
    loader = stoker.DataLoader(ds, batch_size=32, num_workers=2)
    pointers = set()
    for _ in range(5):
        for (batch,) in loader:
            pointers.add(batch.data_ptr())
    stats = loader.stats()
    assert len(pointers) <= stats["slabs"] <= 2 * 4 + 2


def test_numpy_arrays_without_torch(tmp_path):
    import subprocess
    import sys

    script = (
        "import sys, numpy as np, stoker\n"
        "ds = stoker.ArrayDataset(np.arange(30, dtype=np.int16).reshape(10, 3))\n"
        "out = [b[0] for b in stoker.DataLoader(ds, batch_size=4)]\n"
        "assert type(out[0]) is np.ndarray and out[0].dtype == np.int16, out\n"
        "assert 'torch' not in sys.modules\n"
        "print(np.concatenate(out).sum())\n"
    )
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                            check=True)
    assert result.stdout.strip() == str(sum(range(30)))


def test_a_python_data_set_shuffled_without_torch_has_stoker_s_order():
    # torch's order needs torch: without it loaded, shuffle=True is stoker's own permutation
    import subprocess
    import sys

    script = (
        "import sys, numpy as np, stoker\n"
        "class Squares:\n"
        "    def __len__(self): return 12\n"
        "    def __getitem__(self, i): return np.int64(i * i)\n"
        "loader = stoker.DataLoader(Squares(), batch_size=5, shuffle=True, num_workers=2)\n"
        "epochs = [sorted(int(x) for b in loader for x in b) for _ in range(2)]\n"
        "assert epochs == [[i * i for i in range(12)]] * 2, epochs\n"
        "assert 'torch' not in sys.modules\n"
        "print(loader.stats()['worker_type'])\n"
    )
    subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True)


def test_bad_options_are_named():
    ds = stoker.ArrayDataset(np.arange(10))
    with pytest.raises(ValueError, match="batch_size"):
        stoker.DataLoader(ds, batch_size=0)
    with pytest.raises(ValueError, match="mutually exclusive"):
        stoker.DataLoader(ds, shuffle=True, sampler=tud.SequentialSampler(ds))
    with pytest.raises(ValueError, match="on_error"):
        stoker.DataLoader(ds, on_error="ignore")
    with pytest.raises(ValueError, match="num_workers"):
        stoker.DataLoader(ds, num_workers=-1)
    with pytest.raises(ValueError, match="device"):
        stoker.DataLoader(ds, device="tpu")


def test_device_cuda_without_a_gpu_falls_back_to_cpu():
    ds = stoker.ArrayDataset(np.arange(10, dtype=np.float32))
    loader = stoker.DataLoader(ds, batch_size=5, device="cuda")
    batches = list(loader)
    assert batches[0][0].device.type == "cpu" or torch.cuda.is_available()
    assert loader.stats()["device"] in ("cpu", "cuda:0")


def test_sample_seed_is_a_function_of_seed_epoch_and_index():
    class Seeds:
        def __len__(self):
            return 32

        def __getitem__(self, i):
            return np.array([stoker.sample_seed() >> 1], dtype=np.int64)

    def seeds(workers):
        loader = stoker.DataLoader(Seeds(), batch_size=8, shuffle=True, seed=9,
                                   num_workers=workers)
        return [int(s) for b in loader for s in b[0]]

    assert seeds(1) == seeds(4)
    assert stoker.sample_seed() is None


def test_batches_through_the_simulated_device_stage():
    # The device stage (side-stream copies, device_depth ahead) wired through Python; the
    # simulated device keeps its "device memory" on the host, so the tensors stay CPU ones.
    x = torch.arange(500 * 6, dtype=torch.float32).reshape(500, 6)
    loader = stoker.DataLoader(stoker.ArrayDataset(x, torch.arange(500)), batch_size=32,
                               shuffle=True, seed=1, device="sim", device_depth=3)
    for _ in range(2):
        seen = []
        for images, labels in loader:
            assert torch.equal(images, x[labels])
            seen += labels.tolist()
        assert sorted(seen) == list(range(500))
    stats = loader.stats()
    assert stats["device"] == "sim" and stats["copies"] >= 2 * len(loader)


def test_auto_workers_grow_while_the_loop_waits_on_a_waiting_dataset():
    class Waits(Squares):
        def __getitem__(self, i):
            time.sleep(0.004)  # like a file read: the GIL is released
            return super().__getitem__(i)

    loader = stoker.DataLoader(Waits(240), batch_size=8)  # num_workers='auto'
    start = loader.stats()["workers"]
    for _ in range(3):
        assert sorted(int(v) for b in loader for v in b[0][:, 0, 0]) == list(range(240))
    assert loader.stats()["workers"] > start


def test_a_loader_collected_on_its_own_worker_thread_shuts_down_cleanly():
    # The cyclic garbage collector runs on whatever thread allocates, including a worker
    # inside __getitem__; finalizing the loader that owns that worker must not join it.
    import subprocess
    import sys

    script = (
        "import gc, time, numpy as np, stoker\n"
        "class Collects:\n"
        "    def __len__(self): return 10000\n"
        "    def __getitem__(self, i):\n"
        "        gc.collect()\n"
        "        return np.full(4, i)\n"
        "for _ in range(5):\n"
        "    loader = stoker.DataLoader(Collects(), batch_size=4, num_workers=2)\n"
        "    loader.cycle = loader  # only the cyclic collector can free it\n"
        "    it = iter(loader)\n"
        "    next(it)\n"
        "    del it, loader\n"
        "    time.sleep(0.2)  # the workers, still prefetching, collect it\n"
        "print('ok')\n"
    )
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                            timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.strip() == "ok"


def test_stats_keys_are_the_cpp_stats_fields():
    # The dict is made from stats.h's field table, which src/stats.cc checks at compile time
    # against the members of stoker::Stats; durations are in seconds ("_s").
    from stoker import _stoker
    ds = stoker.ArrayDataset(np.zeros((8, 2), np.float32))
    loader = stoker.DataLoader(ds, batch_size=4, num_workers=1)
    assert len(list(loader)) == 2
    fields = _stoker.stats_fields()
    assert len(fields) == len(set(fields))
    derived = {"samples_per_second", "bytes_per_second", "wait_fraction",
               "network_bytes_per_second"}
    # Added by the Python package: which pipeline and which kind of worker reads.
    python_only = {"pipeline", "worker_type", "worker_type_reason", "worker_type_left",
                   "worker_pids", "worker_deaths"}
    assert set(loader.stats()) == set(fields) | derived | python_only
    assert {"worker_cpu_s", "consumer_wait_s", "copies", "device"} <= set(fields)
    assert loader.stats()["batches"] == 2
    assert fields == _stoker.FIELDS["Stats"]


def test_every_dict_from_cpp_is_its_field_table(tmp_path):
    # Report, CudaInfo, PackResult and the source and object-storage counters cross as dicts
    # made from their C++ field tables (python/src/fields.h; src/field_tables.cc checks at
    # compile time that each table names every member): the keys are the table's, plus what
    # the Python package adds, named here.
    from stoker import _stoker
    tables = _stoker.FIELDS
    assert set(tables) == {"Stats", "Report", "CudaInfo", "PackResult", "SourceCounters",
                           "ObjectStorageCounters"}
    for name, keys in tables.items():
        assert keys and len(keys) == len(set(keys)), name
    ds = stoker.ArrayDataset(np.zeros((8, 2), np.float32))
    loader = stoker.DataLoader(ds, batch_size=4, num_workers=1)
    assert len(list(loader)) == 2
    report = loader.report()
    # The front end's own keys: the plan, which workers read now and why, and what a resumed
    # run repeats and why.
    assert set(report) == set(tables["Report"]) | {"text", "plan", "readers", "readers_reason",
                                                   "reproducibility", "reproducibility_reason"}
    assert report["verdict"] and report["workers"] == 1
    assert set(_stoker.cuda_info()) == set(tables["CudaInfo"])
    Image = pytest.importorskip("PIL.Image")
    for i in range(2):
        folder = tmp_path / "src" / f"c{i}"
        folder.mkdir(parents=True)
        Image.fromarray(np.full((8, 8, 3), 40 * i, np.uint8)).save(folder / "a.png")
    packed = stoker.pack(tmp_path / "src", tmp_path / "packed")
    assert set(packed) == set(tables["PackResult"])
    assert packed["records"] == 2 and packed["classes"] == 2
    images = stoker.ImageFolder(tmp_path / "src", transform=stoker.transforms.val(8, 8))
    images[0]
    counters = images.counters()
    assert set(counters) == set(tables["SourceCounters"]) and counters["reads"] == 1
    # Durations are in seconds, as in stats(): "fetch_s", "wait_s".
    storage = set(tables["ObjectStorageCounters"])
    assert {"requests", "get_requests", "fetch_s", "wait_s"} <= storage


def test_the_device_is_a_value_parsed_once_in_cpp():
    from stoker import _stoker
    assert _stoker.Device("cuda:1").kind == _stoker.DeviceKind.cuda
    assert _stoker.Device("cuda:1").index == 1 and _stoker.Device("cuda").index == -1
    assert _stoker.Device("cuda:1").is_cuda and not _stoker.Device("sim").is_cuda
    assert str(_stoker.Device("cuda:3")) == "cuda:3" and str(_stoker.Device("cpu")) == "cpu"
    assert _stoker.Device("sim") == _stoker.Device("sim")
    with pytest.raises(ValueError, match="device 'mps' is not one of cpu, cuda, cuda:N, sim"):
        _stoker.Device("mps")
    with pytest.raises(ValueError, match="device 'cuda:x': expected cuda:N"):
        _stoker.Device("cuda:x")
    ds = stoker.ArrayDataset(np.zeros((8, 2), np.float32))
    loader = stoker.DataLoader(ds, batch_size=4, num_workers=1)
    next(iter(loader))
    assert loader._pipeline._loader.device() == _stoker.Device(loader.stats()["device"])


def test_options_are_checked_by_name():
    ds = stoker.ArrayDataset(np.zeros((8, 2), np.float32))
    with pytest.raises(ValueError, match="on_error must be 'raise' or 'skip', not 'ignore'"):
        stoker.DataLoader(ds, on_error="ignore")
    with pytest.raises(ValueError, match="pin_memory must be 'auto', 'on' or 'off', not 'x'"):
        stoker.DataLoader(ds, pin_memory="x")


class _OrderAheadLog:
    """The loader's side of TorchOrderFeed: the orders given ahead, each taken."""

    def __init__(self):
        self.ahead = []

    def order_ahead(self, epoch, order):
        self.ahead.append((epoch, list(order)))
        return True

    def resume(self, epoch, order, batch):
        pass


def test_the_next_epochs_order_is_drawn_ahead_again_only_after_reads_moved_the_generator():
    # worker_type='auto' moving reads whose transforms draw from torch's default generator off
    # this process's threads: the next epoch's order, drawn ahead at this one's start, is
    # stale; drawn again, iter() takes it (its first batches read ahead are kept), and it is
    # the order iter() would have drawn then.
    from stoker.loader.seeding import TorchOrderFeed, TorchRandomOrder, WorkerSetup

    torch.manual_seed(7)
    setup = WorkerSetup(None, None, persistent=True)
    feed = TorchOrderFeed(TorchRandomOrder(range(50), None), setup)
    log = _OrderAheadLog()
    setup.begin_epoch()
    feed.start(log, 0, 0, feed.take(0, 0))
    assert [e for e, _ in log.ahead] == [1]
    feed.redraw_ahead(log)  # nothing drew since: nothing to draw again
    assert len(log.ahead) == 1
    torch.rand(3)  # a read on a thread, its random crop
    feed.redraw_ahead(log)
    assert [e for e, _ in log.ahead] == [1, 1]
    state = torch.get_rng_state()
    expected = TorchRandomOrder(range(50), None).draw()  # iter()'s draw from here
    torch.set_rng_state(state)
    assert feed.take(1, 0)  # taken: the generator moved as iter()'s draw moves it
    assert log.ahead[1][1] == list(expected)
    assert torch.equal(torch.get_rng_state(), _after_draw(state))


def _after_draw(state):
    torch.set_rng_state(state)
    from stoker.loader.seeding import TorchRandomOrder

    TorchRandomOrder(range(50), None).draw()
    after = torch.get_rng_state()
    torch.set_rng_state(state)
    return after
