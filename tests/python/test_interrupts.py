"""Ctrl-C: a blocked next() is interrupted promptly, an in-line read ends its batch, a signal
while next() waits loses no batch, and a loop over threads, processes or a stream stops with
nothing left behind.

Each test runs its loader in a child process (interrupts.run_child) that restores Python's
SIGINT handler itself and is signalled only at the point the test is about (interrupts.py):
nothing reaches the test process, and nothing depends on timing, so the tests pass on a busy
machine and under a runner that starts the suite with SIGINT ignored."""

import json
import textwrap

import pytest

from interrupts import run_child
from test_workers import alive


def child_lines(script, tmp_path):
    result = run_child(f"TMP = {str(tmp_path)!r}\n" + textwrap.dedent(script))
    assert result.returncode == 0, result.stdout + result.stderr
    return dict(line.split(" ", 1) for line in result.stdout.splitlines())


def test_ctrl_c_interrupts_a_blocked_next_promptly(tmp_path):
    out = child_lines("""
        import threading, time, stoker, interrupts as ix
        gate = ix.Gate(TMP)
        loader = stoker.DataLoader(ix.Squares(4, gate, stop_at=1), batch_size=2, num_workers=1)
        watch, sent = ix.NextWatch(), []

        def ctrl_c():  # once sample 1 is being read and next() waits for its batch
            gate.wait_arrived("read")
            watch.wait_inside()
            sent.append(time.monotonic())
            ix.interrupt_main()

        threading.Thread(target=ctrl_c).start()
        try:
            next(iter(loader))
        except KeyboardInterrupt:
            print("interrupted", time.monotonic() - sent[0])
        gate.open("read")
        start = time.monotonic()
        loader.close()  # waits only for the __getitem__ call already running
        print("closed", time.monotonic() - start)
    """, tmp_path)
    # The read stays blocked for a minute: a next() that did not look for the signal would
    # not return before then. The bounds only tell prompt from stuck.
    assert float(out["interrupted"]) < 10 and float(out["closed"]) < 10, out


@pytest.mark.parametrize("read", ["getitem", "getitems"])
def test_ctrl_c_without_workers_ends_the_batch_being_read(tmp_path, read):
    out = child_lines(f"""
        import threading, stoker, interrupts as ix
        gate = ix.Gate(TMP)
        ds = (ix.Squares if {read!r} == "getitem" else ix.SquaresItems)(8, gate, stop_at=1)
        loader = stoker.DataLoader(ds, batch_size=4, num_workers=0)
        it = iter(loader)

        def ctrl_c():  # the main thread reads sample 1 in-line and waits at the gate
            gate.wait_arrived("read")
            ix.interrupt_main()

        threading.Thread(target=ctrl_c).start()
        try:
            next(it)  # one Ctrl-C, though the batch's later rows would each wait too
        except KeyboardInterrupt:
            print("interrupted", ds.reads)
        gate.open("read")
        print("next", next(it)[1].tolist())  # the loader goes on
    """, tmp_path)
    if read == "getitem":
        # The rows after the interrupted one were not read.
        assert out["interrupted"] == "[0, 1]", out
    else:
        # The probe (sample 0, which teaches the layout), then the rest of the batch in one
        # call, not read again sample by sample after the interrupt.
        assert out["interrupted"] == "[[0], [1, 2, 3]]", out
    assert out["next"] == "[16, 25, 36, 49]"


@pytest.mark.parametrize("worker_type", ["thread", "process"])
def test_ctrl_c_while_next_waits_loses_no_batch(tmp_path, worker_type):
    # The signal lands while next() waits for batch 2, whose last sample is released just
    # then: KeyboardInterrupt is raised and the batch is the next next()'s, as with torch's
    # loader, whether it arrived before the signal was seen or after.
    out = child_lines(f"""
        import json, threading, time, stoker, interrupts as ix
        gate = ix.Gate(TMP)
        loader = stoker.DataLoader(ix.Squares(24, gate, stop_at=11), batch_size=4,
                                   num_workers=2, worker_type={worker_type!r})
        it, got = iter(loader), []
        watch = ix.NextWatch()

        def ctrl_c():
            gate.wait_arrived("read")
            deadline = time.monotonic() + ix.LIMIT_S
            while not (len(got) >= 2 and watch.inside.is_set()):  # waiting for batch 2
                assert time.monotonic() < deadline, "next() never waited for batch 2"
                time.sleep(0.001)
            ix.interrupt_main()
            gate.open("read")

        threading.Thread(target=ctrl_c).start()
        while True:
            try:
                got.append(next(it)[1].tolist())
            except StopIteration:
                break
            except KeyboardInterrupt:
                got.append("KI")
        loader.close()
        print("got", json.dumps(got))
    """, tmp_path)
    got = json.loads(out["got"])
    assert got.count("KI") == 1 and got.index("KI") == 2, got
    assert [b for b in got if b != "KI"] == [[i * i for i in range(k, k + 4)]
                                             for k in range(0, 24, 4)]


@pytest.mark.parametrize("what", ["stream", "processes"])
def test_ctrl_c_stops_a_loop_promptly_and_leaves_no_worker(tmp_path, what):
    dataset = {"stream": "wd.SlowStream()",  # worker processes, each iterating its share
               "processes": "wd.Slow(100000, 0.05)"}[what]
    out = child_lines(f"""
        import threading, torch, stoker, interrupts as ix, worker_datasets as wd
        loader = stoker.DataLoader({dataset}, batch_size=4, num_workers=2,
                                   worker_type="process")
        it = iter(loader)  # worker processes start with the first epoch, as torch's
        print("pids", *loader.stats()["worker_pids"], flush=True)
        try:
            for i, batch in enumerate(it):
                if i == 0:  # mid-loop: the signal lands in next() or in the loop's body
                    threading.Thread(target=ix.interrupt_main).start()
        except KeyboardInterrupt:
            print("interrupted yes", flush=True)
    """, tmp_path)
    pids = [int(p) for p in out["pids"].split()]
    assert "interrupted" in out and len(pids) == 2
    assert not any(alive(p) for p in pids)


def test_ctrl_c_while_processes_start_in_the_background_leaves_no_worker(tmp_path):
    # A stream on auto, forced to 2 worker processes whose forks are free: they are forked
    # during epoch 1 (a stream that is not Stateful), which goes on in-line meanwhile; Ctrl-C
    # in it ends the loop, and the processes, never used, are stopped as the interpreter
    # exits (the loader left open).
    out = child_lines("""
        import threading, torch, stoker, interrupts as ix
        from stoker.loader import stream_pipeline
        stream_pipeline._stoker.choose_stream_threads = lambda *a: (0, "no threads (forced)")
        stream_pipeline._stoker.choose_stream_workers = lambda *a: (2, "auto: 2 (forced)")
        stream_pipeline._stoker.stream_thread_trial = lambda *a: (0, "no thread tried (forced)")
        stream_pipeline._stoker.BACKGROUND_START_SECONDS = 0.0
        stream_pipeline._stoker.PROCESS_START_SECONDS = float("inf")
        class Stream(torch.utils.data.IterableDataset):
            def __iter__(self):
                info = torch.utils.data.get_worker_info()
                first, step = (info.id, info.num_workers) if info else (0, 1)
                return iter(range(first, 4000, step))
        loader = stoker.DataLoader(Stream(), batch_size=2)
        try:
            for i, batch in enumerate(loader):
                if i == 100:  # mid-loop: the signal lands in next() or in the loop's body
                    print("pids", *[p.pid for p in loader._pipeline._made[0].processes()],
                          flush=True)
                    threading.Thread(target=ix.interrupt_main).start()
        except KeyboardInterrupt:
            print("interrupted", loader.num_workers, flush=True)
    """, tmp_path)
    pids = [int(p) for p in out["pids"].split()]
    assert out["interrupted"] == "0" and len(pids) == 2
    assert not any(alive(p) for p in pids)
