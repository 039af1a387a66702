"""stoker.DataLoader against torch.utils.data.DataLoader, from Python, in the same run.

    python bench/python_bench.py [--workload seed003 tiny] [--runs 3] [--json]

Workloads:
  seed003  seed 003's benchmark: its HeavyDataset (1024 x float32 3x224x224 made with
           torch.rand, __getitem__ sleeps 5 ms), batch 64, shuffled, and its training loop
           (Linear(150528, 10) with Adam on this machine's CPU, plus a 10 ms sleep every 5th
           batch). Prints epoch times, and the compute-only bound: the same loop over batches
           made in advance.
  jpeg     the native image pipelines (train and val, image folder, batch 64, 2 workers)
           through stoker.DataLoader against the same from `stoker bench -w jpeg` (C++), on
           the same generated JPEGs, alternated --runs times. Not in the default set.
  tiny     60000 float32 samples of 784 plus an int64 label (MNIST-like), batch 256,
           shuffled, from in-memory tensors: stoker.ArrayDataset against TensorDataset, and a
           consumer that touches each batch (sums it).
  bytecode a Python __getitem__ that computes in bytecode (holds the GIL, ~1.5 ms a sample)
           and returns a float32 array of 64 plus a label; batch 64. Also prints the
           machine's limit: cores x one process's __getitem__ rate over the same samples.
  cheap    cheap samples: a dict of a small tensor (16 float32), an int and a string;
           batch 256.
  tvfolder torchvision.datasets.ImageFolder with torchvision's train transforms
           (RandomResizedCrop, flip, ToTensor, Normalize) on generated JPEGs, unchanged;
           batch 64 (needs torchvision: run with .venv-vision).
  tvjitter the same with ColorJitter added (a transform stoker does not run natively).
  stream   an IterableDataset of small tensors (200000 float32 samples of 32 plus an int64
           label, made with torch ops), sharded over the workers with get_worker_info();
           batch 256, default collate, in the workers.
  padding  variable-size samples (float32 of L x 64, L from 16 to 256: audio frames or
           embeddings) with a collate_fn that pads them (pad_sequence) and stacks their
           lengths; batch 64, shuffled. Also prints worker processes' limit on this machine:
           a process per core, all at once, doing nothing but make batches and write them
           into shared memory.
           stream and padding then measure torch's best and stoker twice more, alternately,
           and compare their medians (the load of a shared machine moves both).
The user's-data-set workloads (bytecode, cheap, tvfolder, tvjitter) also report the peak
proportional set size (PSS: shared pages counted once) of the training process and all its
workers while loading, for stoker and for PyTorch's best.
PyTorch runs with num_workers 0, 1, 2, 4 (persistent workers) and the best is the baseline.
Figures are medians over --runs epochs after a warm-up epoch.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import pathlib
import statistics
import sys
import tempfile
import threading
import time

import numpy as np

import torch
import torch.utils.data as tud

import stoker
from stoker.progress import progress

TORCH_WORKERS = (0, 1, 2, 4)


# --- seed 003 --------------------------------------------------------------------------------

# The seed's own HeavyDataset, from its script (examples/seed003_prefetch.py).
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "examples"))
from seed003_prefetch import HeavyDataset  # noqa: E402


class Trainer:
    """seed 003's train_epoch, with the model made once so every loader trains the same."""

    def __init__(self) -> None:
        torch.manual_seed(0)
        self.model = torch.nn.Linear(224 * 224 * 3, 10)
        self.criterion = torch.nn.CrossEntropyLoss()
        self.optimizer = torch.optim.Adam(self.model.parameters())

    def step(self, i, inputs, labels) -> None:
        inputs = inputs.view(inputs.size(0), -1)
        if i % 5 == 0:
            time.sleep(0.01)
        self.optimizer.zero_grad()
        loss = self.criterion(self.model(inputs), labels)
        loss.backward()
        self.optimizer.step()

    def epoch(self, batches) -> float:
        start = time.perf_counter()
        for i, (inputs, labels) in enumerate(batches):
            self.step(i, inputs, labels)
        return time.perf_counter() - start


def seed003(runs: int, smoke: bool, size: int | None = None,
            torch_workers: tuple | None = None) -> dict:
    """`size` samples (default 1024, 128 with `smoke`); torch at each of `torch_workers`
    (default TORCH_WORKERS, 0 and 2 with `smoke`)."""
    dataset = HeavyDataset(size=size or (128 if smoke else 1024), sleep_time=0.005)
    trainer = Trainer()
    made = list(tud.DataLoader(dataset, batch_size=64, shuffle=True))  # compute-only bound
    trainer.epoch(made)  # warm-up: Adam's state, allocator caches
    compute = statistics.median(trainer.epoch(made) for _ in range(runs))
    del made

    def measure(loader) -> float:
        trainer.epoch(loader)  # warm-up: worker start, first epoch
        return statistics.median(trainer.epoch(loader) for _ in range(runs))

    torch_times = {}
    for w in torch_workers or ((0, 2) if smoke else TORCH_WORKERS):
        loader = tud.DataLoader(dataset, batch_size=64, shuffle=True, num_workers=w,
                                pin_memory=False, persistent_workers=w > 0)
        torch_times[w] = measure(loader)
        del loader
    stoker_loader = stoker.DataLoader(dataset, batch_size=64, shuffle=True)
    stoker_time = measure(stoker_loader)
    stats = stoker_loader.stats()
    best = min(torch_times, key=torch_times.get)
    return {
        "workload": "seed003",
        "samples": len(dataset),
        "compute_only_s": compute,
        "torch_epoch_s": torch_times,
        "torch_best_workers": best,
        "stoker_epoch_s": stoker_time,
        "stoker_workers": stats["workers"],
        "stoker_wait_fraction": stats["wait_fraction"],
        "speedup": torch_times[best] / stoker_time,
        "stoker_over_compute": stoker_time / compute,
    }


# --- tiny ------------------------------------------------------------------------------------

def tiny(runs: int, smoke: bool, samples: int | None = None,
         torch_workers: tuple | None = None) -> dict:
    n = samples or (3000 if smoke else 60000)
    g = torch.Generator().manual_seed(0)
    x = torch.rand(n, 784, generator=g)
    y = torch.randint(0, 10, (n,), generator=g)

    def measure(loader) -> float:
        def epoch():
            start = time.perf_counter()
            total = 0.0
            for images, labels in loader:
                total += float(images[:, 0].sum()) + float(labels[0])
            return time.perf_counter() - start

        epoch()
        return n / statistics.median(epoch() for _ in range(runs))

    torch_rates = {}
    for w in torch_workers or ((0, 2) if smoke else TORCH_WORKERS):
        loader = tud.DataLoader(tud.TensorDataset(x, y), batch_size=256, shuffle=True,
                                num_workers=w, persistent_workers=w > 0)
        torch_rates[w] = measure(loader)
        del loader
    stoker_loader = stoker.DataLoader(stoker.ArrayDataset(x, y), batch_size=256, shuffle=True)
    rate = measure(stoker_loader)
    best = max(torch_rates, key=torch_rates.get)
    return {
        "workload": "tiny",
        "samples": n,
        "torch_samples_per_s": torch_rates,
        "torch_best_workers": best,
        "stoker_samples_per_s": rate,
        "stoker_workers": stoker_loader.stats()["workers"],
        "speedup": rate / torch_rates[best],
    }


# --- the user's own data sets -----------------------------------------------------------------

def _descendants(pid: int) -> list[int]:
    """`pid` and every process below it (from /proc/PID/task/TID/children, which costs far
    less than scanning /proc on a machine with many processes)."""
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        try:
            tasks = list(pathlib.Path(f"/proc/{p}/task").iterdir())
        except OSError:
            continue
        for task in tasks:
            try:
                todo.extend(int(c) for c in (task / "children").read_text().split())
            except OSError:
                pass
    return out


def _tree_pss_bytes() -> int:
    """Proportional set size of this process and its workers (shared pages counted once)."""
    total = 0
    for pid in _descendants(os.getpid()):
        try:
            for line in pathlib.Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
                if line.startswith("Pss:"):
                    total += int(line.split()[1]) * 1024
                    break
        except OSError:
            pass
    return total


class PeakPss:
    """Samples the process tree's PSS every 250 ms while in the `with` block (a sample costs
    ~7 ms of CPU with torch loaded: at 50 ms it took ~7% of a 2-core machine from the loaders
    being measured)."""

    def __enter__(self) -> "PeakPss":
        self.peak = _tree_pss_bytes()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.wait(0.25):
            self.peak = max(self.peak, _tree_pss_bytes())

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, _tree_pss_bytes())


def _touch(batch) -> None:
    """What a training step needs of the batch: every tensor's first element. A column of
    strings is not walked (a training step does nothing per string; walking 256 of them was
    40% of the training thread's time in the cheap case, for both loaders)."""
    if isinstance(batch, torch.Tensor):
        float(batch.reshape(-1)[0])
    elif isinstance(batch, dict):
        for v in batch.values():
            _touch(v)
    elif isinstance(batch, (list, tuple)) and not (batch and isinstance(batch[0], str)):
        for v in batch:
            _touch(v)


def compare(name: str, dataset, batch_size: int, runs: int, smoke: bool,
            loader_args: dict | None = None, samples: int | None = None, rounds: int = 3,
            stoker_args: dict | None = None, torch_workers: tuple | None = None,
            torch_dataset=None, **extra) -> dict:
    """Samples/s over `runs` epochs after a warm-up epoch, and the peak PSS, for torch's
    DataLoader with each num_workers and for stoker.DataLoader's defaults; both get
    `loader_args` (default: shuffle=True), stoker also `stoker_args`. `samples`: an epoch's,
    if not len(dataset).
    With `rounds` > 1, torch's best and stoker are then measured `rounds - 1` more times,
    alternately, and the ratio is that of their medians: a machine whose load changes moves
    both, not one of them.
    `torch_workers`: torch's num_workers to try (default TORCH_WORKERS, 0 and 2 with `smoke`);
    `torch_dataset`: what torch's loader reads, if not `dataset` (a native data set's
    equivalent)."""
    n = samples if samples is not None else len(dataset)
    torch_dataset = dataset if torch_dataset is None else torch_dataset
    loader_args = {"shuffle": True} if loader_args is None else loader_args
    stoker_args = {**loader_args, **(stoker_args or {})}

    def measure(loader) -> tuple[float, int]:
        # `runs` epochs back to back, timed as one span after a warm-up epoch: stoker starts
        # the next epoch while the last batches of one are consumed (torch's persistent
        # workers wait for iter()), so a per-epoch time would credit it with batches read
        # before the clock started; over one span that is at most `depth` batches in all.
        with PeakPss() as pss:
            for batch in loader:
                _touch(batch)
            start = time.perf_counter()
            for _ in range(runs):
                for batch in loader:
                    _touch(batch)
            seconds = time.perf_counter() - start
        return runs * n / seconds, pss.peak

    torch_rates, torch_pss = {}, {}
    for w in torch_workers or ((0, 2) if smoke else TORCH_WORKERS):
        loader = tud.DataLoader(torch_dataset, batch_size=batch_size, num_workers=w,
                                persistent_workers=w > 0, **loader_args)
        torch_rates[w], torch_pss[w] = measure(loader)
        del loader
    stoker_loader = stoker.DataLoader(dataset, batch_size=batch_size, **stoker_args)
    rate, pss = measure(stoker_loader)
    stats = stoker_loader.stats()
    stoker_loader.close()
    best = max(torch_rates, key=torch_rates.get)
    best_rates, stoker_rates = [torch_rates[best]], [rate]
    for _ in range(0 if smoke else rounds - 1):
        loader = tud.DataLoader(torch_dataset, batch_size=batch_size, num_workers=best,
                                persistent_workers=best > 0, **loader_args)
        best_rates.append(measure(loader)[0])
        del loader
        stoker_loader = stoker.DataLoader(dataset, batch_size=batch_size, **stoker_args)
        stoker_rates.append(measure(stoker_loader)[0])
        stoker_loader.close()
    rate = statistics.median(stoker_rates)
    if len(stoker_rates) > 1:
        extra = {**extra, "rounds": {"torch_best": best_rates, "stoker": stoker_rates}}
    return {
        "workload": name,
        "samples": n,
        "torch_samples_per_s": torch_rates,
        "torch_best_workers": best,
        "stoker_samples_per_s": rate,
        "stoker_workers": stats["workers"],
        "stoker_worker_type": stats.get("worker_type", "thread"),
        "stoker_pipeline": stats.get("pipeline", ""),
        "speedup": rate / statistics.median(best_rates),
        "torch_best_peak_pss_mb": torch_pss[best] / 2**20,
        "torch_peak_pss_mb": {w: v / 2**20 for w, v in torch_pss.items()},
        "stoker_peak_pss_mb": pss / 2**20,
        **extra,
    }


class BytecodeDataset:
    """A __getitem__ that computes in Python bytecode, holding the GIL the whole time."""

    def __init__(self, samples: int, steps: int) -> None:
        self.samples, self.steps = samples, steps

    def __len__(self) -> int:
        return self.samples

    def __getitem__(self, i: int):
        x, acc = i + 1, 0
        for _ in range(self.steps):
            x = (x * 1103515245 + 12345) & 0x7FFFFFFF
            acc += x & 7
        return np.full(64, acc, dtype=np.float32), i % 10


def _rate(dataset, indices) -> float:
    start = time.perf_counter()
    for i in indices:
        dataset[i]
    return len(indices) / (time.perf_counter() - start)


def bytecode(runs: int, smoke: bool, samples: int | None = None, **compare_args) -> dict:
    probe = BytecodeDataset(1, 2000)
    steps = max(100, int(2000 * _rate(probe, [0] * 50) * 0.0015))  # ~1.5 ms a sample
    dataset = BytecodeDataset(samples or (256 if smoke else 2048), steps)

    # The machine's limit: every core running __getitem__ as fast as one process does,
    # measured before and after the loaders (a machine whose load changes moves it too).
    def one_process_rates() -> list[float]:
        return [_rate(dataset, range(k, len(dataset), 8)) for k in range(3 if not smoke else 1)]

    before = one_process_rates()
    result = compare("bytecode", dataset, 64, runs, smoke, **compare_args)
    one_process = statistics.median(before + one_process_rates())
    limit = len(os.sched_getaffinity(0)) * one_process
    torch_best = statistics.median(result.get("rounds", {}).get(
        "torch_best", [result["torch_samples_per_s"][result["torch_best_workers"]]]))
    result.update(ms_per_sample=1000 / one_process, machine_limit_samples_per_s=limit,
                  stoker_over_limit=result["stoker_samples_per_s"] / limit,
                  torch_best_over_limit=torch_best / limit)
    return result


class CheapDataset:
    """Cheap samples: a dict of a small tensor, an int and a string."""

    def __init__(self, samples: int) -> None:
        self.x = torch.randn(samples, 16, generator=torch.Generator().manual_seed(0))

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int):
        return {"x": self.x[i], "label": i % 10, "name": f"sample-{i}"}


def cheap(runs: int, smoke: bool, samples: int | None = None, **compare_args) -> dict:
    return compare("cheap", CheapDataset(samples or (5000 if smoke else 50000)), 256, runs,
                   smoke, **compare_args)


class SmallTensorStream(tud.IterableDataset):
    """A stream of small tensors, each worker reading its share (torch's documented pattern)."""

    def __init__(self, samples: int) -> None:
        self.samples = samples

    def __iter__(self):
        info = tud.get_worker_info()
        first, step = (info.id, info.num_workers) if info is not None else (0, 1)
        base = torch.arange(32, dtype=torch.float32)
        for i in range(first, self.samples, step):
            yield base * i, i


def stream(runs: int, smoke: bool, samples: int | None = None, **compare_args) -> dict:
    samples = samples or (20000 if smoke else 200000)
    # A stream's num_workers='auto' is one worker (an unsharded stream is read once, as with
    # torch's default); this one shards itself, so one per core, as a user would pass.
    return compare("stream", SmallTensorStream(samples), 256, runs, smoke, loader_args={},
                   samples=samples, stoker_args={"num_workers": len(os.sched_getaffinity(0))},
                   **compare_args)


class VariableLength(tud.Dataset):
    """Samples of L x 64 float32, L from 16 to 256 (fixed per index)."""

    def __init__(self, samples: int) -> None:
        self.lengths = np.random.default_rng(0).integers(16, 257, samples).tolist()

    def __len__(self) -> int:
        return len(self.lengths)

    def __getitem__(self, i: int):
        length = self.lengths[i]
        return torch.full((length, 64), float(i)), length


def pad_collate(samples):
    """Pads a batch of (L x 64, L) samples to the longest L."""
    frames = torch.nn.utils.rnn.pad_sequence([x for x, _ in samples], batch_first=True)
    return frames, torch.tensor([n for _, n in samples])


def padding(runs: int, smoke: bool) -> dict:
    dataset = VariableLength(2000 if smoke else 20000)
    result = compare("padding", dataset, 64, runs, smoke,
                     loader_args={"shuffle": True, "collate_fn": pad_collate})
    limit = _process_limit(dataset, pad_collate, 64, 8 if smoke else 100)
    torch_best = statistics.median(result.get("rounds", {}).get(
        "torch_best", [result["torch_samples_per_s"][result["torch_best_workers"]]]))
    result.update(process_limit_samples_per_s=limit,
                  stoker_over_process_limit=result["stoker_samples_per_s"] / limit,
                  process_limit_over_torch_best=limit / torch_best)
    return result


def _limit_child(dataset, collate, batch_size, batches, seed, barrier, out) -> None:
    # Only what any loader of batches made in worker processes must do: make each batch (one
    # intra-op thread, as a worker has) and write its tensors into shared memory (streamed,
    # into arenas taken in turn, as stoker's workers do). glibc is told to keep freed memory,
    # so that no batch page-faults (stoker's workers do not), and `batches` are timed after
    # as many unmeasured ones.
    import ctypes
    import mmap

    from stoker import _stoker

    libc = ctypes.CDLL(None)
    libc.mallopt(-3, 32 << 20)  # M_MMAP_THRESHOLD
    libc.mallopt(-1, 64 << 20)  # M_TRIM_THRESHOLD
    torch.set_num_threads(1)
    order = np.random.default_rng(seed).permutation(len(dataset)).tolist()
    arenas = []
    for _ in range(4):
        fd = os.memfd_create("limit")
        os.ftruncate(fd, 64 << 20)
        arenas.append(mmap.mmap(fd, 64 << 20))
    for b in range(2 * batches):
        if b == batches:  # all the processes time the same stretch
            barrier.wait()
            start = time.perf_counter()
        first = b * batch_size % (len(order) - batch_size)
        made = collate([dataset[i] for i in order[first:first + batch_size]])
        offset, arena = 64, arenas[b % len(arenas)]
        for t in made:
            nbytes = t.numel() * t.element_size()
            _stoker.stream_copy(arena, offset, t.data_ptr(), nbytes)
            offset += (nbytes + 63) // 64 * 64
    out.put(batches * batch_size / (time.perf_counter() - start))


def _process_limit(dataset, collate, batch_size: int, batches: int) -> float:
    """Worker processes' limit on this machine: one process per core, all at once, each doing
    nothing but make batches and write them into shared memory (_limit_child); the sum of
    their rates, median of 3 tries."""
    import multiprocessing

    context = multiprocessing.get_context("fork")
    tries, cores = [], len(os.sched_getaffinity(0))
    for attempt in range(3):
        out, barrier = context.Queue(), context.Barrier(cores)
        children = [context.Process(target=_limit_child,
                                    args=(dataset, collate, batch_size, batches, 10 * attempt + k,
                                          barrier, out))
                    for k in range(cores)]
        for c in children:
            c.start()
        tries.append(sum(out.get() for _ in children))
        for c in children:
            c.join()
    return statistics.median(tries)


def _jpeg_folder(images: int) -> pathlib.Path:
    """`images` generated 500x375 JPEGs in 10 class folders (made once, then reused)."""
    from PIL import Image

    root = pathlib.Path(tempfile.gettempdir()) / f"stoker-bench-tvfolder-{images}"
    if (root / "done").exists():
        return root
    rng = np.random.default_rng(0)
    yy, xx = np.mgrid[0:375, 0:500]
    for i in range(images):
        folder = root / f"class{i % 10}"
        folder.mkdir(parents=True, exist_ok=True)
        phase = rng.uniform(0, 6.28, 3)
        freq = rng.uniform(0.005, 0.05, 3)
        rgb = np.stack([127 + 100 * np.sin(freq[c] * (xx + 0.7 * yy) + phase[c]) for c in range(3)],
                       axis=-1)
        rgb += rng.normal(0, 12, rgb.shape)
        Image.fromarray(np.clip(rgb, 0, 255).astype(np.uint8)).save(folder / f"{i:05d}.jpg",
                                                                     quality=90)
    (root / "done").touch()
    return root


def torchvision_image_folder(root, jitter: bool = False):
    """torchvision.datasets.ImageFolder at `root` with torchvision's train transforms
    (RandomResizedCrop 224, flip, [ColorJitter,] ToTensor, Normalize)."""
    import torchvision
    import torchvision.transforms as tvt

    steps = [tvt.RandomResizedCrop(224), tvt.RandomHorizontalFlip()]
    if jitter:
        steps.append(tvt.ColorJitter(0.4, 0.4, 0.4))
    steps += [tvt.ToTensor(), tvt.Normalize((0.485, 0.456, 0.406), (0.229, 0.224, 0.225))]
    return torchvision.datasets.ImageFolder(root, transform=tvt.Compose(steps))


def _torchvision_folder(runs: int, smoke: bool, name: str, jitter: bool,
                        images: int | None = None, **compare_args) -> dict:
    dataset = torchvision_image_folder(_jpeg_folder(images or (128 if smoke else 512)), jitter)
    return compare(name, dataset, 64, runs, smoke, **compare_args)


def tvfolder(runs: int, smoke: bool, **kw) -> dict:
    return _torchvision_folder(runs, smoke, "tvfolder", jitter=False, **kw)


def tvjitter(runs: int, smoke: bool, **kw) -> dict:
    return _torchvision_folder(runs, smoke, "tvjitter", jitter=True, **kw)


# --- jpeg: the native image pipeline from Python against the same from the command line -----

def jpeg(runs: int, smoke: bool, stoker_bin: str) -> dict:
    """`stoker bench -w jpeg --no-baseline` (C++: image folder, batch 64, 2 workers) and the
    same pipelines through stoker.DataLoader on the same files, alternated `runs` times."""
    import subprocess

    cli, py = {"train": [], "val": []}, {"train": [], "val": []}
    epochs = 2 if smoke else 3
    data_dir = None
    for _ in range(runs):
        args = [stoker_bin, "bench", "-w", "jpeg", "--no-baseline", "--json",
                "--epochs", str(epochs)] + (["--smoke"] if smoke else [])
        out = json.loads(subprocess.run(args, check=True, capture_output=True,
                                        text=True).stdout)
        out = out["workloads"][0] if "workloads" in out else out
        data_dir = out["data_dir"]
        for name in ("train", "val"):
            cli[name].append(out[name]["stoker"]["folder"]["images_per_s"])
            pipeline = stoker.transforms.train() if name == "train" else stoker.transforms.val()
            ds = stoker.ImageFolder(pathlib.Path(data_dir) / "folder", transform=pipeline)
            loader = stoker.DataLoader(ds, batch_size=64, shuffle=True, num_workers=2,
                                       prefetch_factor=2)
            times = []
            for _ in range(epochs):
                start = time.perf_counter()
                for images, labels in loader:
                    pass
                times.append(time.perf_counter() - start)
            loader.close()
            py[name].append(len(ds) / statistics.median(times[1:] if epochs > 1 else times))
    result = {"workload": "jpeg", "data_dir": data_dir}
    for name in ("train", "val"):
        result[name] = {
            "cli_images_per_s": statistics.median(cli[name]),
            "python_images_per_s": statistics.median(py[name]),
            "python_over_cli": statistics.median(p / c for p, c in zip(py[name], cli[name])),
        }
    return result


WORKLOADS = {"seed003": seed003, "tiny": tiny, "bytecode": bytecode, "cheap": cheap,
             "stream": stream, "padding": padding, "tvfolder": tvfolder, "tvjitter": tvjitter}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workload", nargs="+",
                        default=["seed003", "tiny", "bytecode", "cheap", "stream", "padding"],
                        choices=list(WORKLOADS) + ["jpeg"])
    parser.add_argument("--stoker-bin", default=str(pathlib.Path(__file__).resolve().parents[1]
                                                   / "build" / "stoker"),
                        help="jpeg: the stoker command line to compare with")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--smoke", action="store_true",
                        help="tiny sizes, one run: checks the harness, measures nothing")
    args = parser.parse_args()
    # The loaders' advice at fixed settings ("... would change ..."): not in the tables.
    logging.getLogger("stoker").setLevel(logging.WARNING)
    runs = 1 if args.smoke else args.runs
    workloads = {**WORKLOADS, "jpeg": lambda r, s: jpeg(r, s, args.stoker_bin)}
    results = [workloads[w](runs, args.smoke)
               for w in progress(args.workload, desc="workloads", quiet=args.json)]
    if args.json:
        print(json.dumps(results, indent=2))
        return
    for r in results:
        if r["workload"] == "seed003":
            torch_s = ", ".join(f"{w}: {t:.2f}" for w, t in r["torch_epoch_s"].items())
            print(f"seed003: epoch s, torch by num_workers {{{torch_s}}}; stoker "
                  f"{r['stoker_epoch_s']:.2f} ({r['stoker_workers']} threads, waited "
                  f"{100 * r['stoker_wait_fraction']:.1f}%); compute only "
                  f"{r['compute_only_s']:.2f}")
            print(f"  stoker / torch best: {r['speedup']:.2f}x faster; stoker epoch / compute "
                  f"only: {r['stoker_over_compute']:.3f}")
        elif r["workload"] == "jpeg":
            for name in ("train", "val"):
                p = r[name]
                print(f"jpeg {name}: images/s from Python {p['python_images_per_s']:,.0f}, from "
                      f"the command line {p['cli_images_per_s']:,.0f}: Python / CLI "
                      f"{p['python_over_cli']:.3f}")
        else:
            torch_r = ", ".join(f"{w}: {v:,.0f}" for w, v in r["torch_samples_per_s"].items())
            print(f"{r['workload']}: samples/s, torch by num_workers {{{torch_r}}}; stoker "
                  f"{r['stoker_samples_per_s']:,.0f}")
            print(f"  stoker / torch best: {r['speedup']:.2f}x")
            if "rounds" in r:
                rounds = r["rounds"]
                print(f"  medians of {len(rounds['stoker'])} alternated rounds: torch best "
                      f"{statistics.median(rounds['torch_best']):,.0f}, stoker "
                      f"{statistics.median(rounds['stoker']):,.0f} (torch best "
                      f"{', '.join(f'{v:,.0f}' for v in rounds['torch_best'])}; stoker "
                      f"{', '.join(f'{v:,.0f}' for v in rounds['stoker'])})")
            if "stoker_peak_pss_mb" in r:
                same = r["torch_peak_pss_mb"].get(r["stoker_workers"])
                print(f"  stoker: {r['stoker_workers']} {r['stoker_worker_type']} workers, "
                      f"{r['stoker_pipeline'] or 'python'}; peak PSS stoker "
                      f"{r['stoker_peak_pss_mb']:,.0f} MB, torch best "
                      f"{r['torch_best_peak_pss_mb']:,.0f} MB"
                      + (f", torch with {r['stoker_workers']} workers {same:,.0f} MB"
                         if same is not None else ""))
            if "process_limit_samples_per_s" in r:
                print(f"  worker processes' limit (a process per core making batches and "
                      f"writing them into shared memory, nothing else) "
                      f"{r['process_limit_samples_per_s']:,.0f}/s: stoker "
                      f"{100 * r['stoker_over_process_limit']:.0f}% of it; the limit is "
                      f"{r['process_limit_over_torch_best']:.2f}x torch's best")
            if "machine_limit_samples_per_s" in r:
                print(f"  machine limit (cores x one process, {r['ms_per_sample']:.2f} ms a "
                      f"sample) {r['machine_limit_samples_per_s']:,.0f}/s: stoker "
                      f"{100 * r['stoker_over_limit']:.0f}%, torch best "
                      f"{100 * r['torch_best_over_limit']:.0f}%")


if __name__ == "__main__":
    main()
