"""Data sets and a worker_init_fn for test_frameworks.py, in a module of their own that
worker processes import to unpickle them; and how the frameworks' jobs end."""

import atexit
import os
import sys
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


def exit_before_finalizing() -> None:
    """Ends a framework job (accelerate_job.py, lightning_job.py) after running the exit
    handlers (stoker's close_all among them), without the interpreter's finalization.

    torch 2.13 keeps its gloo threads (pt_gloo_runloop) alive after Accelerate's
    end_training() and Lightning's teardown destroy the process group (something still holds
    the group), and one of them may drop its last AsyncWork while Py_FinalizeEx runs: the
    work's destructor takes the GIL, the finalizing interpreter ends that thread, and the
    unwind through a noexcept destructor aborts the process ("terminate called without an
    active exception"; the open pytorch/pytorch#179291 describes it). Reproduced with no
    stoker import at all (1 of 8 torch-loader Accelerate runs on a loaded machine); the core's
    backtrace showed exactly that."""
    atexit._run_exitfuncs()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
