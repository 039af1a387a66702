"""One epoch's iterator of a DataLoader (``iter(loader)``): its batches from the pipeline,
torch's warning for a stream longer than it said, and where the epoch stands (its epoch, at
its start, resumed at its end) for the loader's set_epoch()."""

from __future__ import annotations

import warnings
from typing import Optional

from .. import logs
from .protocol import EPOCH_END


def _epoch_batches(loader) -> Optional[int]:
    """Batches in an epoch where the loader knows them: not for a stream or a sampler
    without len()."""
    if not loader._pipeline.exact_len:
        return None
    try:
        return len(loader)
    except TypeError:
        return None


class EpochIterator:
    """One epoch of a DataLoader. A new iter() of the same loader ends this one."""

    def __init__(self, loader, epoch: int, first_batch: int) -> None:
        self._loader = loader
        self._epoch, self._first_batch = epoch, first_batch
        self._stale = False
        self._done = False
        # Resumed from a state taken after its epoch's last batch: nothing of it left.
        self._at_end = first_batch > 0 and first_batch == _epoch_batches(loader)
        # A stream yielding more than the len() it reported (workers that do not shard it)
        # warns from then on, as torch's iterator does: it counts what it yields against the
        # data set's len() as of the last len(loader) before this iter().
        self._reported_len = loader._pipeline.reported_len
        self._yielded = 0

    def __iter__(self) -> "EpochIterator":
        return self

    def __len__(self) -> int:
        return len(self._loader)

    @property
    def _workers(self) -> list:
        """torch's list of worker processes: stoker's, or none while threads read."""
        return self._loader._pipeline.processes()

    def __next__(self):
        if self._stale:
            raise RuntimeError("stoker: a newer iter() of this DataLoader replaced this iterator")
        if self._done:
            raise StopIteration
        batch = self._loader._pipeline.next(self._loader.timeout)
        logs.drain()
        if batch is EPOCH_END:
            self._done = True
            raise StopIteration
        self._yielded += 1
        if self._reported_len is not None and self._yielded > self._reported_len:
            self._warn_longer_than_reported()
        return batch

    def _warn_longer_than_reported(self) -> None:
        message = (f"Length of IterableDataset {self._loader.dataset} was reported to be "
                   f"{self._reported_len} (when accessing len(dataloader)), but "
                   f"{self._yielded} samples have been fetched. ")
        if self._loader.num_workers > 0:
            message += ("For multiprocessing data-loading, this could be caused by not "
                        "properly configuring the IterableDataset replica at each worker. "
                        "Please see https://pytorch.org/docs/stable/data.html"
                        "#torch.utils.data.IterableDataset for examples.")
        warnings.warn(message, UserWarning, stacklevel=3)
