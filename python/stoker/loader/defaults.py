"""The DataLoader's defaults, written once: DataLoader.__init__'s signature and resolve()'s
(plan.py) read them from DEFAULTS. An argument whose default is None ("not given") is left
out: what None resolves to is the plan's rule. The defaults of the arguments that are
LoaderOptions fields are the engine's (include/stoker/options.h); tests/python/test_plan.py
checks them against a default-constructed ``_stoker.LoaderOptions()``."""

from __future__ import annotations

import dataclasses
from typing import Optional, Union


@dataclasses.dataclass(frozen=True)
class Defaults:
    """The default of each DataLoader argument that has one besides None."""

    # torch's
    batch_size: Optional[int] = 1
    num_workers: Union[int, str] = "auto"  # torch's is 0: stoker tunes the count
    pin_memory: Union[bool, str] = "auto"  # LoaderOptions::pin_memory (PinMemory.auto)
    drop_last: bool = False  # LoaderOptions::drop_last
    timeout: float = 0
    pin_memory_device: str = ""
    in_order: bool = True
    # stoker's
    on_error: str = "raise"  # LoaderOptions::on_error (ErrorPolicy.raise)
    max_skipped: int = 1000  # LoaderOptions::max_skipped
    pin_budget: int = 0  # LoaderOptions::pin_budget (0: a quarter of MemAvailable)
    memory_limit: int = 0  # LoaderOptions::memory_limit (0: half of MemAvailable)
    device_depth: int = 2  # LoaderOptions::device_depth
    worker_type: str = "auto"
    native: bool = True
    keep_on_host: tuple = ()  # LoaderOptions::keep_on_host
    seed_per_sample: bool = False


DEFAULTS = Defaults()

# Batches in flight per worker when prefetch_factor is None (torch's).
PREFETCH_FACTOR = 2
