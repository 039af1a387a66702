"""What resuming on another topology costs: the first batch after `load_state_dict` of a
checkpoint taken late in an epoch on 4 ranks, restored on 3, against the first batch of a
fresh loader, in one run (the issue's target: within 2x). Reads wait `--read-ms` per sample,
so re-reading what was consumed (a fast-forward) would show as a first batch many times
slower.

    python bench/elastic_resume.py [--samples 20000] [--read-ms 1] [--runs 5]
"""
import argparse
import statistics
import time

import torch

import stoker


class Slow(torch.utils.data.Dataset):
    def __init__(self, n, read_s):
        self.n, self.read_s = n, read_s

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        time.sleep(self.read_s)
        return torch.tensor(i)


def first_batch(loader):
    t0 = time.perf_counter()
    next(iter(loader))
    return time.perf_counter() - t0


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--samples", type=int, default=20000)
    p.add_argument("--read-ms", type=float, default=1.0)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--runs", type=int, default=5)
    p.add_argument("--smoke", action="store_true")
    a = p.parse_args()
    if a.smoke:
        a.samples, a.runs = 2000, 1
    ds = Slow(a.samples, a.read_ms / 1e3)

    def make(rank, world):
        sampler = stoker.DistributedSampler(ds, num_replicas=world, rank=rank, seed=3)
        return stoker.DataLoader(ds, batch_size=a.batch_size, sampler=sampler, num_workers=4)

    # The checkpoint: 4 ranks, 90% through the epoch, states made without reading (a rank's
    # state after k batches is its position; reading them would only take time here).
    per_rank = -(-a.samples // 4)
    stop = int(0.9 * per_rank) // a.batch_size
    states = []
    for r in range(4):
        loader = make(r, 4)
        state = loader.state_dict()
        state.update(batch=stop, taken=stop * a.batch_size)
        states.append(state)
        loader.close()
    merged = stoker.merge_states(states)
    fresh, resumed = [], []
    for run in range(a.runs):
        for kind in ("fresh", "resumed")[::1 if run % 2 == 0 else -1]:  # alternated
            loader = make(0, 3)
            if kind == "resumed":
                loader.load_state_dict(merged)
            (resumed if kind == "resumed" else fresh).append(first_batch(loader))
            loader.close()
    f, r = statistics.median(fresh), statistics.median(resumed)
    print(f"elastic_resume: {a.samples} samples, {a.read_ms} ms per read, checkpoint on 4 ranks "
          f"at {stop} of {-(-per_rank // a.batch_size)} batches, restored on rank 0 of 3 "
          f"(median of {a.runs})")
    print(f"  first batch, fresh loader    {1e3 * f:8.1f} ms")
    print(f"  first batch, resumed loader  {1e3 * r:8.1f} ms   {r / f:.2f}x fresh (target <= 2x)")


if __name__ == "__main__":
    main()
