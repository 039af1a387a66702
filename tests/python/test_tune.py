"""stoker.tune(), DataLoader.report(), and the CPU budget that ranks on one node share."""

import os

import numpy as np

import stoker
from worker_datasets import Sleepy




def test_report_of_a_loader_whose_training_loop_waits():
    loader = stoker.DataLoader(Sleepy(), batch_size=8, num_workers=1, worker_type="thread")
    assert loader.report()["verdict"] == "no data yet"
    for _ in range(2):
        list(loader)
    report = loader.report()
    assert isinstance(report, stoker.Report)
    assert report["verdict"] == "input-bound"  # nothing but reading: it always waits
    assert str(report) == report["text"]
    assert report["text"].startswith("input-bound: the training loop waited")
    assert report["busiest"] == "reads"
    assert report["cpu_cores"] == loader.stats()["cpu_cores"] > 0
    assert "more workers would help" in report["more_workers"]
    assert report["suggestions"]
    loader.close()


def test_ranks_on_one_node_divide_the_cores(monkeypatch):
    cores = len(os.sched_getaffinity(0))
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    loader = stoker.DataLoader(stoker.ArrayDataset(np.zeros((64, 4), np.float32)),
                               batch_size=8)
    stats = loader.stats()
    assert stats["cpu_cores"] == max(1.0, cores / 2)
    assert stats["workers"] == max(1, cores // 2)  # 'auto' starts with the rank's share
    loader.close()


def test_tune_with_a_grid_and_its_chart(tmp_path):
    chart = tmp_path / "tune.svg"
    steps = []
    level = stoker._stoker.log_level()
    result = stoker.tune(Sleepy(48), batch_size=8, seconds=0.2, measure=0.1,
                         step=steps.append, grid=True, grid_workers=(1, 2), grid_depth=(2,),
                         plot=str(chart), quiet=True, worker_type="thread")
    tuned = result["tuned"]
    assert tuned["workers"] >= 1 and tuned["depth"] >= 1
    assert tuned["samples_per_s"] > 0
    assert tuned["peak_slab_bytes"] > 0
    assert [(p["workers"], p["depth"], p["pin"]) for p in result["grid"]] == [
        (1, 2, "off"), (2, 2, "off")]
    assert result["best"] in result["grid"]
    assert result["ratio"] == tuned["samples_per_s"] / result["best"]["samples_per_s"]
    assert steps, "the training step was called"
    assert stoker._stoker.log_level() == level  # quieted for the grid only
    assert "<svg" in chart.read_text()


def test_reached_is_where_the_throughput_stays_within_reach():
    from stoker.tuning import _reached
    steady = [(t / 2, 50 * t) for t in range(9)]  # 100 samples/s throughout
    assert _reached(steady, 90) == 0.0
    slow_start = [(0, 0), (1, 10), (2, 110), (3, 210), (4, 310)]
    assert _reached(slow_start, 90) == 1


def test_remote_workers_are_asked_for_only_past_saturated_local_workers():
    # The policy is src/tune/worker_kind.cc's (tests/worker_kind_test.cc); this is its binding.
    from stoker._stoker import next_remote_workers as next_active

    # The loop waits and the local workers are saturated: one more, up to the count.
    assert next_active(0, 2, wait_fraction=0.5, local_load=0.95) == 1
    assert next_active(2, 2, wait_fraction=0.5, local_load=0.95) == 2
    # The loop waits but local cores are idle (I/O, a slow storage): no remote worker helps.
    assert next_active(0, 2, wait_fraction=0.5, local_load=0.3) == 0
    # The loop no longer waits: one given back; in between, no change.
    assert next_active(2, 2, wait_fraction=0.0, local_load=0.95) == 1
    assert next_active(1, 2, wait_fraction=0.05, local_load=0.95) == 1
    # The remote worker in use reads 90% of its time: saturated too, one more helps.
    assert next_active(1, 2, wait_fraction=0.5, local_load=0.95, remote_busy=0.9) == 2
    # It idles 40% of its time while its rows travel (network-bound): one more would idle too.
    assert next_active(1, 2, wait_fraction=0.5, local_load=0.95, remote_busy=0.6) == 1
