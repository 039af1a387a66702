"""Data sets for test_workers.py, in a module of their own that does not import torch, so
that spawned worker processes (which import it to unpickle them) start quickly."""

import os
import random
import sys
import time

import numpy as np


class Sleepy:
    """Reads that wait (like I/O): one worker cannot keep up, so the training loop waits."""

    def __init__(self, n=64, seconds=0.002):
        self.n, self.seconds = n, seconds

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        time.sleep(self.seconds)
        return np.full((4,), i, dtype=np.float32), i


class Mixed:
    """Deterministic samples with arrays, nested dicts, lists, numbers and strings."""

    def __init__(self, n=64):
        self.n = n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        return {
            "image": np.full((3, 4), i, dtype=np.float32) + np.arange(4, dtype=np.float32),
            "meta": {"label": i % 7, "weight": i / 4, "flag": bool(i % 2),
                     "name": f"sample-{i}", "tags": [f"t{i}", i]},
            "pair": (np.int64(i * 3), np.array([i, -i], dtype=np.int16)),
        }


class FailsAt:
    """Raises ValueError for the given indices."""

    def __init__(self, bad, n=40):
        self.bad = set(bad)
        self.n = n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        if i in self.bad:
            raise ValueError(f"bad sample {i}")
        return np.full(2, i, dtype=np.int64)


class OddError(Exception):
    """Cannot be rebuilt from its message or by pickle."""

    def __init__(self, a, b):
        super().__init__(f"{a} and {b}")


class OddFails:
    def __len__(self):
        return 16

    def __getitem__(self, i):
        if i == 5:
            raise OddError("left", "right")
        return np.full(2, i, dtype=np.int64)


class KillsItself:
    """Worker reading `index` SIGKILLs itself, once (a marker file makes it one-shot)."""

    def __init__(self, index, marker, n=48):
        self.index = index
        self.marker = marker
        self.n = n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        if i == self.index and not os.path.exists(self.marker):
            open(self.marker, "w").close()
            os.kill(os.getpid(), 9)
        return np.full(2, i, dtype=np.int64)


class AlwaysKills:
    """The worker reading one of `indices` SIGKILLs itself, every time (a sample that crashes
    native code, or that needs more memory than the OOM killer allows)."""

    def __init__(self, indices, n=48):
        self.indices = set(indices)
        self.n = n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        if i in self.indices:
            os.kill(os.getpid(), 9)
        return np.full(2, i, dtype=np.int64)


def stack(samples):
    """A collate_fn of our own (the loader runs it in a batch job)."""
    return np.stack(samples)


class Slow:
    def __init__(self, n=1000, seconds=0.01):
        self.n = n
        self.seconds = seconds

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        time.sleep(self.seconds)
        return np.full(2, i, dtype=np.int64)


class CpuBound:
    """Pure-Python bytecode, holding the GIL (~`loops` iterations a sample)."""

    def __init__(self, n=2000, loops=20000):
        self.n = n
        self.loops = loops

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        x = 0
        for k in range(self.loops):
            x += (k * i) % 7
        return np.array([i, x], dtype=np.int64)


class Batched:
    """PyTorch's batched protocol: each sample says how many indices its call had."""

    def __init__(self, n=64):
        self.n = n
        self.single_calls = 0

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        self.single_calls += 1
        return {"i": i, "group": 1}

    def __getitems__(self, indices):
        return [{"i": i, "group": len(indices)} for i in indices]


_init_state = {}


def record_seeds(worker_id):
    """worker_init_fn: the first draws of each generator right after the worker was seeded."""
    torch = sys.modules.get("torch")
    _init_state.update(worker=worker_id, random=random.random(),
                       numpy=float(np.random.rand()),
                       torch=float(torch.rand(1).item()) if torch else 0.0)


class WorkerInfo:
    def __len__(self):
        return 32

    def __getitem__(self, i):
        from torch.utils.data import get_worker_info

        info = get_worker_info()
        if info is None:  # read on the training loop's thread (num_workers=0)
            return {"i": i, "id": -1, "num_workers": 0, "seed": 0, "same_dataset": True,
                    "init_worker": -1, "random": 0.0, "numpy": 0.0, "torch": 0.0,
                    "pid": os.getpid()}
        return {"i": i, "id": info.id, "num_workers": info.num_workers, "seed": info.seed,
                "same_dataset": info.dataset is self or type(info.dataset) is type(self),
                "init_worker": _init_state.get("worker", -1),
                "random": _init_state.get("random", 0.0), "numpy": _init_state.get("numpy", 0.0),
                "torch": _init_state.get("torch", 0.0), "pid": os.getpid()}


class Frozen:
    """How many objects the reading process's collections leave alone (gc.freeze)."""

    def __len__(self):
        return 8

    def __getitem__(self, i):
        import gc

        return gc.get_freeze_count()


class Stuck:
    """Sample 0 reads; every other sample blocks forever (and ignores SIGTERM)."""

    def __len__(self):
        return 64

    def __getitem__(self, i):
        if i == 0:
            return np.zeros(2, dtype=np.int64)
        import signal

        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        while True:
            time.sleep(1)


class Counting:
    """A stream of 0..n-1 split over the workers (round-robin by item), Stateful: its
    state_dict() is how many of its items it has yielded, and load_state_dict() resumes."""

    def __init__(self, n=40):
        self.n = n
        self.done = 0

    def __iter__(self):
        from torch.utils.data import get_worker_info

        info = get_worker_info()
        w, k = (info.id, info.num_workers) if info is not None else (0, 1)
        mine = list(range(w, self.n, k))
        while self.done < len(mine):
            self.done += 1
            yield np.full(2, mine[self.done - 1], dtype=np.int64)
        self.done = 0

    def state_dict(self):
        return {"done": self.done}

    def load_state_dict(self, state):
        self.done = state["done"]


class StreamKillsItself:
    """A stream whose worker 0 SIGKILLs itself after its second item."""

    def __iter__(self):
        from torch.utils.data import get_worker_info

        info = get_worker_info()
        for i in range(info.id * 100, info.id * 100 + 8):
            if info.id == 0 and i == 2:
                os.kill(os.getpid(), 9)
            yield np.full(2, i, dtype=np.int64)


class Flaky:
    """Sample i is [i] plus a 4 KB payload; each read fails with probability `p` (its own
    random stream per process and thread)."""

    def __init__(self, n, p):
        self.n, self.p = n, p

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        if random.random() < self.p:
            raise RuntimeError(f"flaky read of sample {i}")
        return np.array([i], dtype=np.int64), np.full(4096, i & 255, dtype=np.uint8)


class SlowStream:
    """A stream of `n` items, `seconds` apart, split over the workers."""

    def __init__(self, n=100000, seconds=0.05):
        self.n, self.seconds = n, seconds

    def __iter__(self):
        from torch.utils.data import get_worker_info

        info = get_worker_info()
        w, k = (info.id, info.num_workers) if info is not None else (0, 1)
        for i in range(w, self.n, k):
            time.sleep(self.seconds)
            yield np.full(2, i, dtype=np.int64)


class Seeded:
    """Samples that depend on the index and on the sample's seed (stoker.sample_seed()), with
    a string value; reading one takes `delay` seconds (so that every worker gets some)."""

    def __init__(self, n=96, delay=0.002):
        self.n = n
        self.delay = delay

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        import stoker

        if self.delay:
            time.sleep(self.delay)
        noise = np.random.default_rng(stoker.sample_seed()).integers(0, 255, 6, dtype=np.uint8)
        return {"image": np.full((2, 6), i % 256, dtype=np.uint8) ^ noise,
                "label": np.int64(i), "name": f"sample-{i}"}


class SlowInActors(Seeded):
    """Seeded, but sample `index` takes `seconds` when a Ray actor reads it (not locally)."""

    def __init__(self, index, seconds, n=64):
        super().__init__(n=n, delay=0)
        self.index = index
        self.seconds = seconds

    def __getitem__(self, i):
        if i == self.index and "ray" in sys.modules:
            import ray

            if ray.is_initialized() and ray.get_runtime_context().get_actor_id() is not None:
                time.sleep(self.seconds)
        return super().__getitem__(i)


def collate_names(samples):
    """A collate_fn (the batch path) for Seeded: the images stacked, the labels and names as
    lists."""
    return {"image": np.stack([s["image"] for s in samples]),
            "label": [int(s["label"]) for s in samples], "name": [s["name"] for s in samples]}
