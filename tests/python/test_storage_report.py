"""The object-storage verdict of report() (stoker/loader/object_storage.py), on made-up
counters: network-bound only when the loop waits and the reads mostly wait for the store."""
from stoker.loader.object_storage import NETWORK_SHARE, since, with_object_storage

REPORT = {"verdict": "input-bound", "text": "input-bound: ...", "wait_fraction": 0.6,
          "samples_per_second": 500.0, "workers": 2, "busiest": "reads", "busiest_load": 1.2,
          "suggestions": ["more batches in flight (depth; prefetch_factor in Python)"]}
STATS = {"worker_busy_s": 8.0, "inline_busy_s": 0.0, "elapsed_s": 5.0}


def storage(wait_s, fetches=40, fetch_s=2.0, bytes_fetched=40 << 20):
    return {"wait_s": wait_s, "chunk_fetches": fetches, "fetch_s": fetch_s,
            "bytes_fetched": bytes_fetched, "retries": 3, "cache_hits": 7}


def test_reads_waiting_on_the_store_make_the_loop_network_bound():
    r = with_object_storage(REPORT, STATS, storage(wait_s=6.0))
    assert r["verdict"] == "network-bound" and r["busiest"] == "the object store"
    assert r["storage_wait"] == 0.75
    assert r["storage_fetch_latency"] == 0.05
    assert r["storage_bytes_per_second"] == (40 << 20) / 5.0
    assert r["text"].startswith("network-bound: the training loop waited 60% of its time")
    assert "40 chunk GETs at 50 ms each" in r["text"] and "3 retries" in r["text"]
    assert r["suggestions"][0].startswith("more reads in flight: num_workers above 2")
    assert r["suggestions"][-1] == REPORT["suggestions"][0]


def test_below_the_share_or_when_the_loop_does_not_wait_the_verdict_stays():
    below = with_object_storage(REPORT, STATS, storage(wait_s=NETWORK_SHARE * 8.0 - 0.1))
    assert below["verdict"] == "input-bound" and below["text"] == REPORT["text"]
    calm = with_object_storage(dict(REPORT, verdict="compute-bound"), STATS, storage(6.0))
    assert calm["verdict"] == "compute-bound" and calm["storage_wait"] == 0.75


def test_no_reads_yet_and_counters_since_the_start():
    r = with_object_storage(REPORT, dict(STATS, worker_busy_s=0.0, elapsed_s=0.0),
                            storage(0.0, fetches=0, fetch_s=0.0))
    assert r["storage_wait"] == 0.0 and r["storage_fetch_latency"] == 0.0
    assert since({"get_requests": 12, "wait_s": 3.5}, {"get_requests": 2, "wait_s": 0.5}) == {
        "get_requests": 10, "wait_s": 3.0}
