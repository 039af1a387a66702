"""The object-storage part of a loader's stats() and report(): what a data set's URL shards
fetched while the loader ran (stoker.WebDataset's object_storage() counters, from the loader's
start on), and the verdict "network-bound" when the training loop waits for reads that mostly
wait for the store. Pure functions of the counters, tested with made-up numbers."""

from __future__ import annotations

# Of the reads' time, the share waiting for the object store above which the network (the
# store, its latency) is the bottleneck rather than the CPU.
NETWORK_SHARE = 0.5


def since(now: dict, start: dict) -> dict:
    """Counters `now` less those at the loader's start (the cache and the store are shared by
    every loader of the process)."""
    return {k: v - start.get(k, 0) for k, v in now.items()}


def with_object_storage(report: dict, stats: dict, storage: dict) -> dict:
    """`report` (the engine's, as a dict) with the object store's numbers, and the verdict
    network-bound when the loop waits (input-bound) and the reads wait for the store at least
    NETWORK_SHARE of their time: `storage_wait` (that share), `storage_fetch_latency` (seconds
    per chunk GET), `storage_bytes_per_second` (fetched, over the loader's time)."""
    busy = stats["worker_busy_s"] + stats["inline_busy_s"]
    share = min(1.0, storage["wait_s"] / busy) if busy > 0 else 0.0
    fetches = storage["chunk_fetches"]
    latency = storage["fetch_s"] / fetches if fetches else 0.0
    elapsed = stats["elapsed_s"]
    bandwidth = storage["bytes_fetched"] / elapsed if elapsed > 0 else 0.0
    out = dict(report, storage_wait=share, storage_fetch_latency=latency,
               storage_bytes_per_second=bandwidth)
    if report["verdict"] != "input-bound" or share < NETWORK_SHARE:
        return out
    workers = report["workers"]
    suggestions = [
        f"more reads in flight: num_workers above {workers} (a read waiting "
        f"{1e3 * latency:.0f} ms for its chunk holds a worker thread and no CPU)",
        "a local object cache that holds the data set (object_cache_bytes), so that later "
        "epochs read from disk",
        "the bucket in the machines' region, or an endpoint closer to them (AWS_ENDPOINT_URL)",
    ]
    text = (f"network-bound: the training loop waited {report['wait_fraction']:.0%} of its "
            f"time ({report['samples_per_second']:.0f} samples/s); reads waited for object "
            f"storage {share:.0%} of their time ({fetches} chunk GETs at "
            f"{1e3 * latency:.0f} ms each, {bandwidth / 1e6:.1f} MB/s fetched, "
            f"{storage['retries']} retries, {storage['cache_hits']} reads from the local "
            f"cache); try: " + " / ".join(suggestions))
    out.update(verdict="network-bound", busiest="the object store", busiest_load=share,
               text=text, suggestions=suggestions + list(report["suggestions"]))
    return out
