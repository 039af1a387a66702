"""Progress bars for stoker's long-running helpers (pack, benchmarks, tuning): tqdm's, on a
terminal, when tqdm is installed; silent otherwise (pipes, logs, --json, or no tqdm)."""

from __future__ import annotations

import sys
from typing import Iterable, Iterator, Optional, TypeVar

T = TypeVar("T")


def _tqdm(quiet: bool):
    """tqdm's class if a bar should be drawn, else None."""
    if quiet or not sys.stderr.isatty():
        return None
    try:
        from tqdm.auto import tqdm
    except ImportError:
        return None
    return tqdm


def progress(iterable: Iterable[T], *, total: Optional[int] = None, desc: Optional[str] = None,
             quiet: bool = False) -> Iterator[T]:
    """Yields what `iterable` yields, with a bar on stderr while stderr is a terminal."""
    tqdm = _tqdm(quiet)
    if tqdm is None:
        return iter(iterable)
    return iter(tqdm(iterable, total=total, desc=desc, leave=False, file=sys.stderr))


class Bar:
    """A bar for work that reports how far it is (a callback): ``with Bar("pack") as bar:``
    and ``bar.update_to(done, total)``; nothing is drawn where progress() draws nothing."""

    def __init__(self, desc: str, *, unit: str = "it", quiet: bool = False) -> None:
        tqdm = _tqdm(quiet)
        # Callers report every so often (pack: every 64 files), so each report is drawn.
        self._bar = None if tqdm is None else tqdm(desc=desc, unit=unit, leave=False,
                                                   file=sys.stderr, mininterval=0)

    def update_to(self, done: int, total: Optional[int] = None) -> None:
        if self._bar is None:
            return
        if total is not None and self._bar.total != total:
            self._bar.total = total
        self._bar.update(done - self._bar.n)

    def __enter__(self) -> "Bar":
        return self

    def __exit__(self, *exc) -> None:
        if self._bar is not None:
            self._bar.close()
