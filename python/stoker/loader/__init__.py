"""stoker.DataLoader and what it is made of: the torch surface (dataloader, with torch's
checks and attributes in compat), the arguments resolved once (plan), and the two pipelines it
delegates to (protocol: what they share; pipelines: which one a plan gets; engine_pipeline:
map-style data sets on the C++ engine, with the worker-kind decisions of
src/tune/worker_kind.cc; stream_pipeline, stream_epochs and stream_producers: iterable data
sets), with how a delivered batch becomes tensors (assemble) and how the batch path collates
and moves its batches (collate)."""

from .dataloader import DataLoader, Report, SkippedSample

__all__ = ["DataLoader", "Report", "SkippedSample"]
