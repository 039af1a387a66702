"""The DataLoader's arguments resolved into a Plan (python/stoker/loader/plan.py), without
starting anything: each check, each mode, the defaults; and every method of a DataLoader in
each mode (samples, batch jobs, stream)."""

import json
import multiprocessing

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import stoker  # noqa: E402
from stoker.loader.plan import BATCH_JOBS, SAMPLES, STREAM, Host, Plan, resolve  # noqa: E402

HOST = Host(cores=4, cpu_share=4, has_gpu=False, gpu=False, peek_seed=lambda generator: 1234)


class Squares:
    def __len__(self):
        return 10

    def __getitem__(self, i):
        return np.float32(i * i)


class Stream(torch.utils.data.IterableDataset):
    def __iter__(self):
        return iter(range(6))


class Counting(torch.utils.data.IterableDataset):
    """A stream with torchdata's Stateful protocol (its position can be saved)."""

    def __init__(self):
        self.at = 0

    def __iter__(self):
        while self.at < 6:
            self.at += 1
            yield self.at - 1

    def state_dict(self):
        return {"at": self.at}

    def load_state_dict(self, state):
        self.at = state["at"]


def plan(dataset=None, **arguments) -> Plan:
    return resolve(Squares() if dataset is None else dataset, host=HOST, **arguments)


# --- defaults and modes -------------------------------------------------------------------

def test_defaults_of_a_map_style_data_set():
    p = plan()
    assert (p.mode, p.order, p.worker_type, p.measure_worker_type) == (
        SAMPLES, "sequential", "thread", True)
    assert p.worker_type_reason == "auto: measuring the first batches on threads"
    assert (p.num_workers, p.tune_workers, p.max_workers) == (4, True, 32)
    assert p.depth == 2 * 4  # prefetch_factor 2 per worker
    assert (p.batch_size, p.drop_last, p.shuffle, p.seed, p.engine_seed) == (1, False, False, 0, 0)
    assert (p.device, p.pin_memory, p.native) == ("cpu", "auto", False)
    assert p.pipeline == "python: Squares.__getitem__ in workers"
    assert p.warnings == ()


def test_the_dataloader_s_defaults_are_the_plan_s_and_the_engine_s():
    import inspect

    given = inspect.signature(stoker.DataLoader.__init__).parameters
    planned = inspect.signature(resolve).parameters
    assert [n for n in given if n != "self"] == [n for n in planned if n != "host"]
    for name, parameter in planned.items():
        if name != "host":
            assert given[name].default == parameter.default, name


def test_the_dataloaders_defaults_are_written_once_and_match_loader_options():
    import dataclasses
    import inspect

    from stoker.loader.defaults import DEFAULTS

    written = dataclasses.asdict(DEFAULTS)
    for signature in (inspect.signature(stoker.DataLoader.__init__),
                      inspect.signature(resolve)):
        defaults = {name: p.default for name, p in signature.parameters.items()
                    if p.default not in (None, inspect.Parameter.empty)}
        assert defaults == written  # every default besides None is the record's
    engine = stoker._stoker.LoaderOptions()  # include/stoker/options.h, as constructed
    for name in ("batch_size", "drop_last", "max_skipped", "device_depth", "memory_limit",
                 "pin_budget"):
        assert getattr(DEFAULTS, name) == getattr(engine, name), name
    assert DEFAULTS.on_error == engine.on_error.name
    assert DEFAULTS.pin_memory == engine.pin_memory.name
    assert list(DEFAULTS.keep_on_host) == list(engine.keep_on_host)


def test_the_plan_is_frozen_and_its_repr_and_str_are_readable():
    p = plan()
    with pytest.raises(AttributeError):
        p.mode = STREAM
    assert repr(p).startswith("Plan(mode='samples', pipeline=")
    assert "dataset=" not in repr(p)  # the objects it is built of are left out
    assert str(p).startswith("mode='samples'; pipeline='python: Squares.__getitem__")


def test_shuffle_follows_torch_s_random_sampler_and_a_seed_given_is_stoker_s_own():
    p = plan(shuffle=True)  # each epoch's permutation drawn as it starts, as torch's
    assert (p.order, p.order_length, p.engine_shuffle, p.seed) == (
        "random, as torch's RandomSampler", 10, False, 0)
    assert isinstance(p.sampler, stoker.loader.seeding.TorchRandomOrder)
    assert plan(shuffle=True, seed=7).seed == plan(shuffle=True, seed=7).engine_seed == 7
    assert plan(shuffle=True, seed=7).order == "random"  # stoker's own permutation
    native = plan(stoker.ArrayDataset(np.zeros((8, 2), np.float32)), shuffle=True)
    assert (native.order, native.engine_seed) == ("random", 1234)  # peeked, not drawn


def test_torch_s_distributed_sampler_is_followed_at_each_epoch():
    sampler = torch.utils.data.DistributedSampler(Squares(), num_replicas=2, rank=1, seed=5)
    p = plan(sampler=sampler)
    assert (p.order, p.order_length, p.rank, p.world_size) == (
        "torch's DistributedSampler, at each epoch", 5, 0, 1)


@pytest.mark.parametrize("arguments", [dict(collate_fn=lambda b: b), dict(batch_size=None),
                                       dict(batch_sampler=[[0, 1], [2]])])
def test_collate_fn_batch_size_none_and_any_batch_sampler_are_batch_jobs(arguments):
    p = plan(**arguments)
    assert p.mode == BATCH_JOBS
    assert (p.batch_size, p.engine_shuffle) == (1, False)  # engine sample k is batch k
    assert p.pipeline == "python: batches of Squares, fetched and collated in workers"


def test_default_collate_is_stoker_s_own_batching():
    assert plan(collate_fn=torch.utils.data.default_collate).mode == SAMPLES


def test_a_torch_batch_sampler_is_batched_natively():
    sampler = torch.utils.data.BatchSampler(torch.utils.data.RandomSampler(Squares()), 3, True)
    p = plan(batch_sampler=sampler)
    assert (p.mode, p.order, p.batch_size, p.drop_last) == (
        SAMPLES, "random, as torch's RandomSampler", 3, True)


def test_a_custom_sampler_is_read_at_each_epoch():
    p = plan(sampler=[3, 1, 2])
    assert (p.order, p.order_length) == ("custom sampler", 3)


def test_a_distributed_sampler_shards_natively():
    sampler = stoker.DistributedSampler(Squares(), num_replicas=2, rank=1, seed=5)
    p = plan(sampler=sampler)
    assert (p.order, p.rank, p.world_size, p.seed) == ("distributed", 1, 2, 5)


def test_a_stream():
    # Both on auto: epoch 1 in-line, measured; one worker process at most after it.
    p = plan(Stream(), batch_size=2)
    assert (p.mode, p.order, p.num_workers, p.worker_type, p.depth) == (
        STREAM, "stream", 0, "thread", 2)
    assert (p.measure_worker_type, p.process_count) == (True, 1)
    assert p.worker_type_reason.startswith("auto: epoch 1 read in-line and measured")
    p = plan(Stream(), batch_size=2, num_workers=2)
    assert (p.num_workers, p.worker_type, p.measure_worker_type) == (2, "process", False)
    assert p.worker_type_reason.startswith("auto: a stream is read by worker processes")
    assert p.collate_fn is stoker.loader.collate._default_collate  # into ordinary memory
    p = plan(Stream(), num_workers=0, batch_size=None)
    assert (p.worker_type, p.num_workers) == ("thread", 0)
    assert p.collate_fn is torch.utils.data.default_convert


def test_a_native_data_set_reads_on_threads():
    p = plan(stoker.ArrayDataset(np.zeros((8, 2), np.float32)), worker_type="process")
    assert (p.native, p.worker_type, p.measure_worker_type) == (True, "thread", False)
    assert p.max_workers == 8 * 4  # per core of the share


def test_worker_type_process_starts_one_process_per_core_of_the_share():
    p = plan(worker_type="process")
    assert (p.worker_type, p.num_workers, p.tune_workers) == ("process", 4, False)
    p = plan(worker_type="process", num_workers=3)
    assert (p.num_workers, p.process_count) == (3, 3)
    assert plan(num_workers=0).worker_type_reason == "num_workers=0 reads in the training loop"


def test_device_and_pinning():
    assert plan(pin_memory=False).pin_memory == "off"
    assert plan(pin_memory=True).pin_memory == "auto"  # no GPU: pinning is the engine's call
    gpu = Host(cores=4, cpu_share=4, has_gpu=True, gpu=True, peek_seed=lambda g: 1)
    assert resolve(Squares(), pin_memory=True, host=gpu).pin_memory == "on"
    assert plan(Stream(), device="cuda").device == "cpu"  # no GPU answers
    assert plan(Stream(), device="cuda").log == ("stoker: no GPU answers; batches stay on the CPU",)
    assert resolve(Stream(), device="cuda:0", host=gpu).pin_memory == "on"


# --- the checks, each once ----------------------------------------------------------------

@pytest.mark.parametrize("arguments, error", [
    (dict(num_workers=-1), "num_workers option should be non-negative"),
    (dict(timeout=-1), "timeout option should be non-negative"),
    (dict(num_workers=0, prefetch_factor=2), "prefetch_factor option could only be specified"),
    (dict(prefetch_factor=-1), "prefetch_factor option should be non-negative"),
    (dict(prefetch_factor=0), "prefetch_factor must be greater than 0"),
    (dict(num_workers=0, persistent_workers=True), "persistent_workers option needs"),
    (dict(sampler=[0], shuffle=True), "sampler option is mutually exclusive with shuffle"),
    (dict(batch_sampler=[[0]], batch_size=2), "batch_sampler option is mutually exclusive"),
    (dict(batch_size=None, drop_last=True), "batch_size=None option disables auto-batching"),
    (dict(batch_size=0), "batch_size should be a positive integer value"),
    (dict(num_workers=0, multiprocessing_context="spawn"), "multiprocessing_context can only"),
    (dict(multiprocessing_context="nonsense"), "multiprocessing_context option should specify"),
    (dict(worker_type="fiber"), "worker_type must be 'auto', 'thread' or 'process'"),
    (dict(on_error="ignore"), "on_error must be"),
    (dict(pin_memory="always"), "pin_memory must be"),
    (dict(num_workers=0, worker_type="process"), "worker_type='process' needs num_workers >= 1"),
])
def test_each_check_of_a_map_style_data_set(arguments, error):
    with pytest.raises(ValueError, match=error.replace("(", r"\(")):
        plan(**arguments)


@pytest.mark.parametrize("arguments, error", [
    (dict(shuffle=True), "expected unspecified shuffle option"),
    (dict(sampler=[0]), "expected unspecified sampler option"),
    (dict(batch_sampler=[[0]]), "expected unspecified batch_sampler option"),
    (dict(prefetch_factor=0, num_workers=2), "prefetch_factor must be greater than 0"),
    (dict(num_workers=0, worker_type="process"), "worker_type='process' needs num_workers >= 1"),
    (dict(remote=object()), "streams run on local workers only"),
    (dict(timeout=-1), "timeout option should be non-negative"),
    (dict(worker_type="fiber"), "worker_type must be"),
])
def test_each_check_of_a_stream(arguments, error):
    with pytest.raises(ValueError, match=error):
        plan(Stream(), **arguments)


def test_prefetch_factor_zero_is_an_error_in_every_mode():
    # torch accepts it and fails as its workers start; stoker says so when the loader is made
    for dataset, extra in ((Squares(), {}), (Squares(), dict(collate_fn=list)),
                           (Stream(), dict(num_workers=1))):
        with pytest.raises(ValueError, match="prefetch_factor must be greater than 0"):
            stoker.DataLoader(dataset, prefetch_factor=0, **extra)


def test_arguments_not_honoured_as_torch_are_warnings_of_the_plan():
    p = plan(stoker.ArrayDataset(np.zeros((8, 2), np.float32)), worker_init_fn=print,
             in_order=False, pin_memory_device="cuda:1")
    assert [w.split(" is not ")[0] for w in p.warnings] == [
        "stoker: worker_init_fn", "stoker: pin_memory_device='cuda:1'", "stoker: in_order=False"]
    assert len(plan(num_workers=64).warnings) == 1  # more workers than stoker would start


def test_the_plan_starts_nothing():
    before = multiprocessing.active_children()
    plan(worker_type="process", num_workers=2)
    plan(Stream(), num_workers=2)
    assert multiprocessing.active_children() == before


# --- every method of DataLoader in every mode ----------------------------------------------

def _loaders():
    return {
        "samples": stoker.DataLoader(Squares(), batch_size=4, num_workers=1,
                                     worker_type="thread"),
        "batch jobs": stoker.DataLoader(Squares(), batch_size=4, num_workers=1,
                                        worker_type="thread", collate_fn=list),
        "stream": stoker.DataLoader(Counting(), batch_size=4, num_workers=1,
                                    worker_type="thread"),
    }


@pytest.mark.parametrize("mode", ["samples", "batch jobs", "stream"])
def test_report_trace_tracing_stats_and_state_dict_work_in_every_mode(mode, tmp_path):
    loader = _loaders()[mode]
    assert loader.report()["verdict"] == "no data yet"
    assert loader.stats()["worker_type"] == "thread"
    with loader.tracing(tmp_path / "block.json"):
        it = iter(loader)
        next(it)
        state = loader.state_dict()
        assert state["epoch"] == 0
        list(it)
    with open(tmp_path / "block.json") as f:
        events = json.load(f)["traceEvents"]
    assert any(e["name"] == "wait for batch" for e in events)
    loader.trace(tmp_path / "run.json")
    list(loader)
    loader.trace(None)
    with open(tmp_path / "run.json") as f:
        assert json.load(f)["traceEvents"]
    report = loader.report()
    assert isinstance(report, stoker.Report) and str(report) == report["text"]
    assert report["plan"].startswith(f"mode='{mode}'")
    stats = loader.stats()
    assert stats["pipeline"] and stats["worker_type_reason"] == "asked for"
    assert loader.skipped_samples() == []
    if mode != "stream":  # Counting has no len()
        assert len(loader) == 3
    # a position mid-epoch restores the batches still to come
    it = iter(loader)
    first = next(it)
    state = loader.state_dict()
    rest = list(it)
    loader.load_state_dict(state)
    assert _same(list(loader), rest), mode
    assert first is not None
    loader.close()
    loader.close()  # idempotent


def _same(a, b) -> bool:
    return len(a) == len(b) and all(
        torch.equal(torch.as_tensor(x), torch.as_tensor(y)) for x, y in zip(a, b))


def test_a_state_of_the_other_mode_is_refused_with_a_clear_error():
    loaders = _loaders()
    stream, samples = loaders["stream"].state_dict(), loaders["samples"].state_dict()
    with pytest.raises(ValueError, match="not a map-style data set's"):
        loaders["samples"].load_state_dict(stream)
    with pytest.raises(ValueError, match="not a stream's"):
        loaders["stream"].load_state_dict(samples)
    for loader in loaders.values():
        loader.close()


def test_a_stream_says_why_its_workers_and_depth_are_fixed():
    loader = _loaders()["stream"]
    with pytest.raises(ValueError, match="their count is fixed"):
        loader.set_workers(2)
    with pytest.raises(ValueError, match="prefetch_factor batches per worker"):
        loader.set_depth(4)
    loader.close()
