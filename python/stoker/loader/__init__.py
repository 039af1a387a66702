"""stoker.DataLoader and what it is made of: the torch surface (dataloader), the arguments
resolved once (plan, with torch's checks in compat), and the two pipelines it delegates to
(pipeline: the protocol; engine: map-style data sets on the C++ engine, with worker_choice's
decisions; stream and streams: iterable data sets), with how a delivered batch becomes tensors
(assemble) and how the batch path collates and moves its batches (collate)."""

from .dataloader import DataLoader, Report, SkippedSample

__all__ = ["DataLoader", "Report", "SkippedSample"]
