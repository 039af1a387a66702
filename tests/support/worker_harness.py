"""What the tests and the benchmarks of worker processes share (a harness, not stoker):
whether a process is still alive, and the extension's worker half set up as a worker
process's is, without a worker process."""

from __future__ import annotations

import pickle


def alive(pid: int) -> bool:
    """Whether process `pid` exists and is not a zombie."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ")[1][0] != "Z"
    except FileNotFoundError:
        return False


def writer_with_layout(dataset, batch_size: int):
    """A ``_stoker.SampleWriter`` (python/src/row_reader.h) with `dataset`'s batch layout,
    learned by a loader from its first batch as in a real run, and the bytes of a row of each
    field. The writer has no shared-memory region mapped yet."""
    import stoker
    from stoker import _stoker

    loader = stoker.DataLoader(dataset, batch_size=batch_size, num_workers=0)
    next(iter(loader))
    description, slots = pickle.loads(loader._pipeline._handle.layout_message())
    row_bytes = loader._pipeline._handle.row_bytes()
    loader.close()
    writer = _stoker.SampleWriter()
    writer.set_layout(description, slots)
    return writer, row_bytes
