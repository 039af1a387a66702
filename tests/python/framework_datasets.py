"""Data sets and a worker_init_fn for test_frameworks.py, in a module of their own that
worker processes import to unpickle them."""

import os
import threading

import torch


class RecordInit:
    """A worker_init_fn that writes "<id> of <num_workers>" (from get_worker_info()) to a file
    of its own in `directory`, one per call."""

    def __init__(self, directory):
        self.directory = str(directory)

    def __call__(self, worker_id):
        info = torch.utils.data.get_worker_info()
        name = f"{os.getpid()}-{threading.get_ident()}-{worker_id}"
        with open(os.path.join(self.directory, name), "w") as f:
            f.write(f"{info.id} of {info.num_workers}")


class WorkerIds(torch.utils.data.Dataset):
    """Sample i: {"i": i, "id": the worker that read it}."""

    def __init__(self, n):
        self.n = n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        info = torch.utils.data.get_worker_info()
        return {"i": i, "id": info.id if info is not None else -1}


class ShardedRange(torch.utils.data.IterableDataset):
    """range(n), each worker yielding every num_workers-th number."""

    def __init__(self, n):
        self.n = n

    def __iter__(self):
        info = torch.utils.data.get_worker_info()
        w, k = (info.id, info.num_workers) if info is not None else (0, 1)
        return iter(range(w, self.n, k))


class Indices(torch.utils.data.Dataset):
    """Sample i is i (as a float tensor), so that a batch says which samples it holds."""

    def __init__(self, n=40):
        self.n = n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        return torch.tensor([float(i)])
