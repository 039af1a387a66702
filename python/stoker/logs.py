"""The engine's log lines on Python's `logging`: the `stoker` logger.

The C++ engine logs rarely: a fallback it took (no GPU, a memory budget reached) and, with a
fixed ``num_workers``, one line of advice once the training loop waits ("with workers = 4 and
depth = 8 fixed, the training loop waits; tune_workers (num_workers='auto') would change
..."). Once stoker is imported, those lines are queued by the engine (whichever thread logs)
and handed to the ``stoker`` logger on the main thread, at its next bytecode (a pending call)
or a loader's next batch, whichever comes first. The advice is given once per loader (the
engine's tuner says it once). Where ``logging`` is not configured (no handler on the logger
or above it), lines at INFO and up are printed on stderr as ``stoker: ...``, as the engine
prints them by itself (DEBUG too with ``STOKER_LOG=debug``); where it is, the configuration
decides. Either way, ``logging.getLogger("stoker").setLevel(logging.WARNING)`` silences the
advice (a benchmark does).
"""

from __future__ import annotations

import logging
import sys

from . import _stoker

_log = logging.getLogger("stoker")

_LEVELS = {_stoker.LogLevel.debug: logging.DEBUG, _stoker.LogLevel.info: logging.INFO,
           _stoker.LogLevel.warning: logging.WARNING}

_routed = False


def route() -> None:
    """From now on, the engine's log lines of this process go to the `stoker` logger (taken by
    drain()). Idempotent; importing stoker calls it, and so does each DataLoader made (after
    at_exit, a loader made in an exit handler routes them again)."""
    global _routed
    if not _routed:
        _stoker.route_log_lines(True)
        _routed = True


def at_exit() -> None:
    """The last lines (of the loaders closed at exit too), then stderr for any after them."""
    global _routed
    drain()
    if _routed:
        _stoker.route_log_lines(False)
        _routed = False


def drain() -> None:
    """Hands the engine's queued lines to the `stoker` logger, oldest first. Cheap when nothing
    is queued (one atomic read)."""
    if not _stoker.log_lines_pending():
        return
    for level, message in _stoker.take_log_lines():
        emit(_LEVELS[level], message)


def emit(level: int, message: str) -> None:
    """One engine line at `level`: through the `stoker` logger where logging has a handler for
    it, else on stderr from INFO up (DEBUG too where the engine logs debug lines), unless the
    logger's own level or `disabled` says otherwise."""
    if _log.disabled:
        return
    if _log.hasHandlers():
        _log.log(level, "stoker: %s", message)
        return
    if _log.level != logging.NOTSET:
        threshold = _log.level
    else:
        threshold = logging.DEBUG if _stoker.log_level() == _stoker.LogLevel.debug else (
            logging.INFO)
    if level >= threshold:
        print(f"stoker: {message}", file=sys.stderr, flush=True)
