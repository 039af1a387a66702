"""Reproducibility check (issue 45): a resumed run gets the uninterrupted run's batches, and
with ``seed_per_sample=True`` a Python data set's random draws are the same on any number and
kind of workers.

Resume: each case runs 3 epochs uninterrupted, a training step drawing from torch's generator
after each batch, and saves ``loader.state_dict()`` at random cut points (after iter() before
the first batch, mid-epoch, after an epoch's last batch, after its loop ended); a new process
restores each state into a fresh loader (made after ``torch.manual_seed`` as at the start)
and runs the rest of the 3 epochs. A cut counts when every following batch equals the
uninterrupted run's (compared by a hash of each tensor's bytes). The cases: Python data sets
with every way an order is made, and stoker's own data sets on small JPEGs written to a
temporary directory: ImageFolder and WebDataset with T.train(224) (the crops compared too)
and a WebDataset stream (shard shuffle, a shuffle buffer). torchdata's StatefulDataLoader
runs the Python cases beside it.

Topology: a ``__getitem__`` drawing from ``torch.rand``, ``random.random``, ``random.gauss``,
``np.random.rand`` and ``np.random.standard_normal``,
read with 0, 1, 2 and 4 workers, threads or processes and on 1 or 2 ranks: the samples
(by index) counted equal to those of in-line reads.

    python bench/reproducibility.py            # 20 cut points per case
    python bench/reproducibility.py --smoke    # 4 cut points, a smaller data set, three
                                               # cases and three topologies (with --cost:
                                               # a tenth of the data, one round, 2
                                               # batches in flight a worker)
    python bench/reproducibility.py --cost     # the cost of seed_per_sample=True (medians
                                               # of 5 rounds; --sides 32 for the cheap one)
"""

from __future__ import annotations

import argparse
import hashlib
import io
import json
import os
import pathlib
import pickle
import random
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time

import numpy as np
import torch
import torch.utils.data as tud

import stoker
from stoker.loader.sample_seeding import seed_generators

EPOCHS = 3


class Indices(tud.Dataset):
    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i):
        return torch.tensor(i)


class Augmented(tud.Dataset):
    """Sample i with draws from torch's, random's and numpy's generators (one normal deviate
    each from random and numpy: the other of their pair stays cached for the next draw)."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i):
        noise = (torch.rand(4) + random.random() + float(np.random.rand())
                 + random.gauss(0, 1) + float(np.random.standard_normal()))
        return torch.tensor(i), noise


class Cropped(tud.Dataset):
    """A cheap augmentation: a random crop of a side x side image (4 pixels smaller), flipped
    at random, with a brightness jitter (torch's, random's and numpy's generators, one draw
    or two each)."""

    def __init__(self, n: int, side: int = 32) -> None:
        self.n = n
        self.image = torch.rand(3, side, side)
        self.crop = side - 4

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i):
        x, y = random.randint(0, 4), random.randint(0, 4)
        crop = self.image[:, y:y + self.crop, x:x + self.crop]
        if torch.rand(()) < 0.5:
            crop = crop.flip(2)
        return crop * float(np.random.uniform(0.8, 1.2)), i


class ShuffledStateful(tud.Sampler):
    """A custom sampler that keeps its own state (torchdata's Stateful): its generator."""

    def __init__(self, n: int, seed: int) -> None:
        self.n = n
        self.rng = np.random.default_rng(seed)

    def __len__(self) -> int:
        return self.n

    def __iter__(self):
        return iter(self.rng.permutation(self.n).tolist())

    def state_dict(self):
        return {"rng": self.rng.bit_generator.state}

    def load_state_dict(self, state) -> None:
        self.rng.bit_generator.state = state["rng"]


def _collate(samples):
    return torch.stack(samples)


# Cases of stoker's own data sets, read from files written by write_data (in `data`).
NATIVE_CASES = ("image_folder", "webdataset", "stream")


def _jpeg(i: int) -> bytes:
    from PIL import Image

    w, h = 40 + i % 17, 36 + i % 13
    y, x = np.mgrid[0:h, 0:w]
    image = np.stack([(x * 7 + i * 31) % 256, (y * 5 + i) % 256, (x + y + i * 3) % 256], -1)
    out = io.BytesIO()
    Image.fromarray(image.astype(np.uint8)).save(out, "JPEG", quality=90)
    return out.getvalue()


def write_data(case: str, n: int, root: pathlib.Path) -> None:
    """`n` small JPEGs: an ImageFolder of 2 classes, or 3 WebDataset shards (jpg, cls)."""
    if case == "image_folder":
        for i in range(n):
            folder = root / f"class{i % 2}"
            folder.mkdir(parents=True, exist_ok=True)
            (folder / f"{i:04d}.jpg").write_bytes(_jpeg(i))
    elif case in ("webdataset", "stream"):
        root.mkdir(parents=True, exist_ok=True)
        for shard in range(3):
            with tarfile.open(root / f"train-{shard:06d}.tar", "w") as tar:
                for i in range(shard, n, 3):
                    for field, data in (("jpg", _jpeg(i)), ("cls", str(i).encode())):
                        info = tarfile.TarInfo(f"{i:06d}.{field}")
                        info.size = len(data)
                        tar.addfile(info, io.BytesIO(data))


def _native(case: str, data: pathlib.Path, loader_class):
    from stoker import transforms as T

    kw = dict(batch_size=4, num_workers=2)
    if case == "image_folder":
        ds = stoker.ImageFolder(data, transform=T.train(224))
        return loader_class(ds, shuffle=True, seed=13, **kw)
    cache = data / "index-cache"
    if case == "webdataset":
        ds = stoker.WebDataset(data, fields=("jpg", "cls"), transform=T.train(224),
                               index_cache=cache)
        return loader_class(ds, shuffle=True, seed=13, **kw)
    # a stream: shard shuffle and a shuffle buffer, its state its workers' positions
    ds = stoker.WebDataset(data, fields=("jpg", "cls"), transform=T.train(224), stream=True,
                           shuffle=5, seed=13)
    return loader_class(ds, **kw)


def make(case: str, n: int, loader_class, rank: int = 0, data=None):
    """The case's loader (of `loader_class`) and the sampler to set_epoch, or None."""
    if case in NATIVE_CASES:
        return _native(case, pathlib.Path(data), loader_class), None
    ds = Indices(n)
    kw = dict(num_workers=2)
    if case == "shuffle":
        return loader_class(ds, batch_size=4, shuffle=True, **kw), None
    if case == "generator":
        g = torch.Generator().manual_seed(7)
        return loader_class(ds, batch_size=4, shuffle=True, generator=g, **kw), None
    if case == "seed":
        return loader_class(ds, batch_size=4, shuffle=True, seed=3, **kw), None
    if case.startswith("distributed"):
        sampler = tud.distributed.DistributedSampler(ds, num_replicas=2, rank=rank, seed=5)
        return loader_class(ds, batch_size=4, sampler=sampler, **kw), sampler
    if case == "batch_sampler":
        sampler = tud.BatchSampler(tud.RandomSampler(ds), 4, drop_last=False)
        return loader_class(ds, batch_sampler=sampler, **kw), None
    if case == "batch_sampler_collate":
        sampler = tud.BatchSampler(tud.RandomSampler(ds), 4, drop_last=False)
        return loader_class(ds, batch_sampler=sampler, collate_fn=_collate, **kw), None
    if case == "stateful_sampler":
        return loader_class(ds, batch_size=4, sampler=ShuffledStateful(n, 11), **kw), None
    if case == "seed_per_sample":
        return loader_class(Augmented(n), batch_size=4, shuffle=True, seed_per_sample=True,
                            **kw), None
    raise ValueError(f"unknown case {case!r}")


def _cases(torchdata: bool) -> list:
    cases = ["shuffle", "generator", "seed", "distributed0", "distributed1", "batch_sampler",
             "batch_sampler_collate", "stateful_sampler", "seed_per_sample", *NATIVE_CASES]
    if torchdata:  # its reference runs: the Python cases with torch's own arguments
        return [c for c in cases if c not in ("seed", "seed_per_sample", *NATIVE_CASES)]
    return cases


def _loader_class(torchdata: bool):
    if torchdata:
        from torchdata.stateful_dataloader import StatefulDataLoader

        return StatefulDataLoader
    return stoker.DataLoader


def _epochs(loader, sampler, first: int, batches: list, states: dict, cuts: set,
            loop_state=None) -> None:
    """The training loop from epoch `first`: each batch recorded, then a step's draw from
    torch's generator; the state saved at each cut (epoch, b): b batches into the epoch
    (b=0: after iter()), or b=-1 after its loop ended."""
    for epoch in range(first, EPOCHS):
        if sampler is not None:
            sampler.set_epoch(epoch)
        it = iter(loader)
        b = 0
        while True:
            if (epoch, b) in cuts:
                states[(epoch, b)] = (len(batches), loader.state_dict())
            try:
                batch = next(it)
            except StopIteration:
                break
            batches.append(_digest(batch))
            torch.rand(1)
            b += 1
        if (epoch, -1) in cuts:
            states[(epoch, -1)] = (len(batches), loader.state_dict())


def _digest(batch) -> list:
    """A batch's tensors, each as its dtype, shape and a hash of its bytes (equal batches:
    equal digests; images of 224x224 are too large to keep)."""
    tensors = batch if isinstance(batch, (list, tuple)) else [batch]
    return [(str(t.dtype), tuple(t.shape), hashlib.sha256(t.numpy().tobytes()).hexdigest())
            for t in tensors]


def uninterrupted(case: str, n: int, torchdata: bool, cuts: set, data=None):
    torch.manual_seed(0)
    loader, sampler = make(case, n, _loader_class(torchdata), _rank(case), data)
    batches, states = [], {}
    _epochs(loader, sampler, 0, batches, states, cuts)
    return batches, states


def _rank(case: str) -> int:
    return int(case[-1]) if case.startswith("distributed") else 0


def resumed(case: str, n: int, torchdata: bool, cut: tuple, state, data=None) -> list:
    """The batches after restoring `state`, saved at `cut`, in a fresh loader."""
    torch.manual_seed(0)
    loader, sampler = make(case, n, _loader_class(torchdata), _rank(case), data)
    loader.load_state_dict(state)
    epoch, b = cut
    batches: list = []
    _epochs(loader, sampler, epoch + 1 if b == -1 else epoch, batches, {}, set())
    return batches


def check_resume(cases: list, n: int, cut_count: int, torchdata: bool, rng) -> dict:
    """{case: (cuts whose resumed batches all equal the uninterrupted run's, cuts)}."""
    results = {}
    for case in cases:
        with tempfile.TemporaryDirectory() as data:
            results[case] = _check_resume_case(case, n, cut_count, torchdata, rng, data)
    return results


def _check_resume_case(case: str, n: int, cut_count: int, torchdata: bool, rng,
                       data: str) -> tuple:
    write_data(case, n, pathlib.Path(data))
    torch.manual_seed(0)
    probe, _ = make(case, n, _loader_class(torchdata), _rank(case), data)
    batches = sum(1 for _ in probe) if case == "stream" else len(probe)  # a stream: no len
    del probe
    # Cut points: after iter(), mid-epoch, after the last batch, after the loop ended.
    every = [(e, b) for e in range(EPOCHS) for b in [*range(batches + 1), -1]]
    cuts = set(rng.sample(every, min(cut_count, len(every))))
    cuts |= {(0, -1), (1, batches)}  # an epoch's end, both ways, always among them
    full, states = uninterrupted(case, n, torchdata, cuts, data)
    with tempfile.NamedTemporaryFile(suffix=".pkl") as f:
        pickle.dump({"case": case, "n": n, "torchdata": torchdata, "data": data,
                     "states": {cut: state for cut, (_, state) in states.items()}}, f)
        f.flush()
        out = subprocess.run([sys.executable, __file__, "--resume", f.name],
                             capture_output=True, check=True)
    rest = pickle.loads(out.stdout)
    equal = sum(rest[cut] == full[at:] for cut, (at, _) in states.items())
    return equal, len(states)


# Topologies: (workers, worker_type, ranks); the reference is the first.
TOPOLOGIES = [(0, "auto", 1), (1, "process", 1), (2, "process", 1), (4, "process", 1),
              (2, "thread", 1), (4, "thread", 1), (2, "process", 2), (0, "auto", 2)]


def samples_on(workers: int, worker_type: str, ranks: int, n: int, epochs: int = 2) -> dict:
    """{(epoch, index): the sample's bytes} read with seed_per_sample=True on `ranks` ranks
    (stoker.DistributedSampler, one loader per rank), `workers` of `worker_type` each."""
    import warnings

    samples = {}
    for rank in range(ranks):
        sampler = stoker.DistributedSampler(Augmented(n), num_replicas=ranks, rank=rank,
                                            shuffle=True, seed=5)
        with warnings.catch_warnings():  # worker_type='thread' is said to read in processes
            warnings.simplefilter("ignore")
            loader = stoker.DataLoader(Augmented(n), batch_size=4, sampler=sampler,
                                       num_workers=workers, worker_type=worker_type,
                                       seed_per_sample=True)
        for epoch in range(epochs):
            sampler.set_epoch(epoch)
            for indices, noise in loader:
                for i, row in zip(indices.tolist(), noise):
                    samples[(epoch, i)] = row.numpy().tobytes()
        loader.close()
    return samples


def check_topologies(n: int, count: int = len(TOPOLOGIES)) -> dict:
    """{topology: (samples equal to the reference's, samples)}, for the first `count`."""
    reference = samples_on(*TOPOLOGIES[0], n)
    results = {}
    for workers, kind, ranks in TOPOLOGIES[1:count]:
        got = samples_on(workers, kind, ranks, n)
        equal = sum(got.get(key) == value for key, value in reference.items())
        results[f"{workers} {kind} worker(s), {ranks} rank(s)"] = (equal, len(reference))
    return results


def cost(n: int, rounds: int, side: int, calls: int = 20_000, prefetch: int = 8) -> dict:
    """Throughput (samples/s) of 2 worker processes reading Cropped(side) with and without
    seed_per_sample: the medians over `rounds` rounds, each a run of 2 epochs (after a warm
    one) of either, in alternating order; the ratio is the median of the rounds' ratios.
    Beside it, the CPU time the worker processes spent a sample (their utime + stime), which
    the machine's other users change less than the wall-clock rate: `cpu_ratio` is the
    median of the rounds' plain / seeded CPU time, the throughput ratio of CPU-bound reads."""
    runs = {False: [], True: []}
    cpu = {False: [], True: []}
    dataset = Cropped(n, side)
    for round_ in range(rounds):
        for seeded in ((False, True) if round_ % 2 == 0 else (True, False)):
            loader = stoker.DataLoader(dataset, batch_size=64, num_workers=2,
                                       worker_type="process", seed_per_sample=seeded,
                                       prefetch_factor=prefetch)
            for _ in loader:
                pass
            pids = loader.stats()["worker_pids"]
            start, start_cpu = time.perf_counter(), _cpu_seconds(pids)
            for _ in range(2):
                for _ in loader:
                    pass
            runs[seeded].append(2 * n / (time.perf_counter() - start))
            cpu[seeded].append((_cpu_seconds(pids) - start_cpu) / (2 * n) * 1e6)
            loader.close()
    return {"plain": statistics.median(runs[False]), "seeded": statistics.median(runs[True]),
            "ratio": statistics.median(s / p for p, s in zip(runs[False], runs[True])),
            "cpu_plain_us": statistics.median(cpu[False]),
            "cpu_seeded_us": statistics.median(cpu[True]),
            "cpu_ratio": statistics.median(p / s for p, s in zip(cpu[False], cpu[True])),
            "seeding_us": _per_call_us(lambda: seed_generators(0x9E3779B97F4A7C15), calls),
            "getitem_us": _per_call_us(lambda: dataset[0], calls)}


def _cpu_seconds(pids: list) -> float:
    """The CPU time (user + system) processes `pids` used so far, from /proc."""
    total = 0
    for pid in pids:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()  # from field 3, the state
        total += int(fields[11]) + int(fields[12])  # utime, stime
    return total / os.sysconf("SC_CLK_TCK")


def _per_call_us(call, number: int = 20_000) -> float:
    """The least of 5 timings of `call`, in microseconds a call."""
    best = float("inf")
    for _ in range(5):
        start = time.perf_counter()
        for _ in range(number):
            call()
        best = min(best, time.perf_counter() - start)
    return best / number * 1e6


def _resume_main(path: str) -> None:
    with open(path, "rb") as f:
        job = pickle.load(f)
    rest = {cut: resumed(job["case"], job["n"], job["torchdata"], cut, state, job["data"])
            for cut, state in job["states"].items()}
    sys.stdout.buffer.write(pickle.dumps(rest))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true")
    parser.add_argument("--resume", help=argparse.SUPPRESS)
    parser.add_argument("--cases", help="comma-separated resume cases (default: all)")
    parser.add_argument("--no-torchdata", action="store_true")
    parser.add_argument("--json", action="store_true", help="print the counts as JSON")
    parser.add_argument("--cost", action="store_true",
                        help="only the throughput cost of seed_per_sample=True")
    parser.add_argument("--sides", default="32,224",
                        help="--cost: the images' sides (default 32,224)")
    args = parser.parse_args()
    if args.resume:
        return _resume_main(args.resume)
    if args.cost:
        for side in map(int, args.sides.split(",")):  # CIFAR-sized, ImageNet-sized images
            n = (2_000 if args.smoke else 100_000) // (1 if side == 32 else 10)
            result = (cost(n, 1, side, calls=200, prefetch=2) if args.smoke
                      else cost(n, 5, side))
            print(f"seed_per_sample cost, {side}x{side} crop: {result['plain']:.0f} samples/s "
                  f"plain, {result['seeded']:.0f} seeded: ratio {result['ratio']:.3f}; "
                  f"workers' CPU a sample {result['cpu_plain_us']:.1f} us plain, "
                  f"{result['cpu_seeded_us']:.1f} us seeded: ratio {result['cpu_ratio']:.3f} "
                  f"(seeding {result['seeding_us']:.2f} us a sample; the __getitem__ "
                  f"{result['getitem_us']:.2f} us)")
        return
    rng = random.Random(45)
    n, cut_count = (30, 4) if args.smoke else (50, 20)
    cases = args.cases.split(",") if args.cases else _cases(False)
    if args.smoke and not args.cases:  # the harness's three kinds of order: torch's, stoker's,
        cases = ["shuffle", "seed", "stream"]  # a stream's
    counts = {"stoker": check_resume(cases, n, cut_count, False, rng)}
    if not args.no_torchdata and not args.cases:
        try:
            import torchdata.stateful_dataloader  # noqa: F401
        except ImportError:
            print("torchdata: not installed, its reference runs skipped")
        else:
            counts["torchdata"] = check_resume(_cases(True), n, cut_count, True, rng)
    if not args.cases:
        counts["topology"] = check_topologies(n, 3 if args.smoke else len(TOPOLOGIES))
    if args.json:
        print(json.dumps(counts))
        return
    for topology, (equal, total) in counts.pop("topology", {}).items():
        print(f"seed_per_sample {topology:30s} {equal}/{total} samples equal to in-line reads'")
    for loader, results in counts.items():
        for case, (equal, total) in results.items():
            print(f"resume {loader:9s} {case:22s} {equal}/{total} cuts: every later batch "
                  f"the uninterrupted run's")


if __name__ == "__main__":
    main()
