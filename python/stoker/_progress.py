"""Progress bars for stoker's long-running helpers (benchmarks, tuning): tqdm's, on a terminal,
when tqdm is installed; silent otherwise (pipes, logs, --json, or no tqdm)."""

from __future__ import annotations

import sys
from typing import Iterable, Iterator, Optional, TypeVar

T = TypeVar("T")


def progress(iterable: Iterable[T], *, total: Optional[int] = None, desc: Optional[str] = None,
             quiet: bool = False) -> Iterator[T]:
    """Yields what `iterable` yields, with a tqdm bar on stderr while stderr is a terminal."""
    if quiet or not sys.stderr.isatty():
        return iter(iterable)
    try:
        from tqdm.auto import tqdm
    except ImportError:
        return iter(iterable)
    return iter(tqdm(iterable, total=total, desc=desc, leave=False, file=sys.stderr))
