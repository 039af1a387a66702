"""The engine's log lines on Python's logging (stoker/logs.py): the advice a loader with a fixed
num_workers gives once its training loop waits goes to the `stoker` logger, once per loader,
and a benchmark or a user silences it there; a line logged outside any loader gets there too."""

import logging
import subprocess
import sys
import textwrap

import stoker
from stoker import logs
from worker_datasets import Sleepy

ADVICE = "the training loop waits; tune_workers"


def waiting_loader(epochs=3):
    """A loader at a fixed setting whose training loop waits, run `epochs` epochs."""
    loader = stoker.DataLoader(Sleepy(96, 0.004), batch_size=8, num_workers=1,
                               worker_type="thread")
    for _ in range(epochs):
        for _ in loader:
            pass
    return loader


def advice(records):
    return [r for r in records if ADVICE in r.getMessage()]


def test_the_advice_of_a_fixed_loader_goes_to_the_stoker_logger_once(caplog, capfd):
    with caplog.at_level(logging.INFO, logger="stoker"):
        loader = waiting_loader()
        lines = advice(caplog.records)
    assert len(lines) == 1, [r.getMessage() for r in caplog.records]
    assert lines[0].name == "stoker" and lines[0].levelno == logging.INFO
    assert lines[0].getMessage().startswith("stoker: with workers = 1 and depth = ")
    assert loader.stats()["tuner"] in lines[0].getMessage()  # the same advice, kept in stats()
    assert ADVICE not in capfd.readouterr().err  # not on stderr besides
    loader.close()


def test_each_loader_gives_its_advice_once(caplog):
    with caplog.at_level(logging.INFO, logger="stoker"):
        first = waiting_loader()
        second = waiting_loader()
        assert len(advice(caplog.records)) == 2
    first.close()
    second.close()


def test_a_stoker_logger_at_warning_silences_the_advice(caplog, capfd):
    logger = logging.getLogger("stoker")
    level = logger.level
    logger.setLevel(logging.WARNING)
    try:
        with caplog.at_level(logging.DEBUG):  # the root would take it: the logger drops it
            loader = waiting_loader()
            assert loader.stats()["tuner"]  # the advice was given, and kept in stats()
            assert not advice(caplog.records)
    finally:
        logger.setLevel(level)
    assert ADVICE not in capfd.readouterr().err
    loader.close()


def test_engine_lines_keep_their_level_and_their_order(caplog):
    with caplog.at_level(logging.DEBUG, logger="stoker"):
        stoker._stoker.log_line(stoker._stoker.LogLevel.warning, "a fallback taken")
        stoker._stoker.log_line(stoker._stoker.LogLevel.info, "some advice")
        logs.drain()
        assert [(r.levelno, r.getMessage()) for r in caplog.records] == [
            (logging.WARNING, "stoker: a fallback taken"), (logging.INFO, "stoker: some advice")]
        logs.drain()  # nothing left queued
        assert len(caplog.records) == 2


def test_a_line_logged_outside_any_loader_reaches_the_logger_without_a_drain(caplog):
    with caplog.at_level(logging.INFO, logger="stoker"):
        stoker._stoker.log_line(stoker._stoker.LogLevel.warning, "from a data set's constructor")
        for _ in range(1000):  # bytecode: the interpreter runs the pending call
            if caplog.records:
                break
        assert [r.getMessage() for r in caplog.records] == [
            "stoker: from a data set's constructor"]


def run_script(body: str) -> subprocess.CompletedProcess:
    """`body` in a fresh interpreter (logging not configured), after the test module's
    waiting_loader is defined there."""
    script = textwrap.dedent("""
        import logging, sys, time
        import numpy as np
        import stoker
        sys.path.insert(0, {here!r})
        from test_logging import waiting_loader
    """).format(here=str(__import__("pathlib").Path(__file__).parent)) + textwrap.dedent(body)
    return subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=120)


def test_without_logging_configured_the_advice_is_printed_on_stderr_once():
    out = run_script("""
        loader = waiting_loader()
        assert loader.stats()["tuner"]
        loader.close()
    """)
    assert out.returncode == 0, out.stderr
    assert out.stderr.count(ADVICE) == 1, out.stderr
    assert "stoker: with workers = 1" in out.stderr


def test_without_logging_configured_a_logger_at_warning_prints_nothing():
    out = run_script("""
        logging.getLogger("stoker").setLevel(logging.WARNING)
        loader = waiting_loader()
        assert loader.stats()["tuner"]
        loader.close()
    """)
    assert out.returncode == 0, out.stderr
    assert ADVICE not in out.stderr, out.stderr
