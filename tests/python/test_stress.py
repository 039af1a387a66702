"""Stress: 200 short epochs with random early breaks, loaders destroyed mid-epoch and reads
that fail at random, with worker threads and with worker processes. Every batch that is
handed out is the one its position in the epoch calls for (nothing lost, repeated or out of
order), a failed read costs exactly its own batch, resident memory stays flat after warm-up,
and nothing is left behind: no thread, no process, no shared-memory segment."""

import gc
import multiprocessing
import os
import random

import numpy as np
import pytest

import stoker
from test_workers import memfds
from worker_datasets import Flaky

EPOCHS = 200
LOADERS = 8  # a new loader every EPOCHS / LOADERS epochs, the old one dropped mid-epoch
N, BATCH = 384, 16
WARM_UP = 40  # epochs before memory is measured


def rss_bytes():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


# Threads other libraries start when they first need them, which an earlier test's objects
# freed during this one can wake: pyarrow's allocator (jemalloc) and its S3 client.
FOREIGN = ("jemalloc_bg_thd", "AwsEventLoop")


def threads() -> dict:
    """This process's threads: {tid: name}."""
    out = {}
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/comm") as f:
                out[tid] = f.read().strip()
        except OSError:  # it ended meanwhile
            pass
    return out


@pytest.mark.parametrize("worker_type", ["thread", "process"])
def test_two_hundred_broken_epochs(worker_type):
    rng = random.Random(7)
    gc.collect()  # loaders of earlier tests
    threads_before, memfds_before = threads(), memfds()
    dataset = Flaky(N, p=0.002)
    batches = N // BATCH
    loader, it, rss_warm = None, None, None
    delivered = failed = finished = 0
    for epoch in range(EPOCHS):
        if epoch % (EPOCHS // LOADERS) == 0:
            # Dropped mid-epoch, batches in flight: its workers stop, its memory returns.
            del loader, it
            loader = stoker.DataLoader(dataset, batch_size=BATCH, num_workers=2,
                                       worker_type=worker_type, shuffle=False)
        if epoch == WARM_UP:
            gc.collect()
            rss_warm = rss_bytes()
        stop = batches if rng.random() < 0.5 else rng.randrange(batches + 1)
        it = iter(loader)
        for k in range(stop):
            try:
                x, payload = next(it)
            except RuntimeError as e:  # the read's own exception: this batch only
                index = int(str(e).rsplit(" ", 1)[1])
                assert str(e).startswith("flaky read of sample")
                assert k * BATCH <= index < (k + 1) * BATCH, (k, index)
                failed += 1
                continue
            expected = np.arange(k * BATCH, (k + 1) * BATCH)
            np.testing.assert_array_equal(x.numpy()[:, 0], expected)
            assert (payload.numpy()[:, 0] == expected & 255).all()
            delivered += 1
        if stop == batches:
            with pytest.raises(StopIteration):
                next(it)
            finished += 1
    gc.collect()
    rss_end = rss_bytes()
    pids = loader.stats()["worker_pids"]
    del loader, it, x, payload  # the last batch's tensors hold its slab
    gc.collect()
    print(f"{worker_type}: {finished} whole epochs, {delivered} batches, {failed} failed; "
          f"RSS {rss_warm / 2**20:.1f} MiB after warm-up, {rss_end / 2**20:.1f} MiB at the end")
    assert failed > 0 and finished > EPOCHS // 3
    assert rss_end <= 1.05 * rss_warm
    new = {tid: name for tid, name in threads().items() if tid not in threads_before}
    assert not {tid: name for tid, name in new.items() if not name.startswith(FOREIGN)}, new
    assert memfds() == memfds_before
    assert not multiprocessing.active_children()
    for pid in pids:
        assert not os.path.exists(f"/proc/{pid}"), f"worker process {pid} left behind"
