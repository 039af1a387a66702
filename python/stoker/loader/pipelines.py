"""The pipeline of a plan: the engine's for map-style data sets (samples or batch jobs), the
stream's for iterable ones; both follow protocol.py."""

from __future__ import annotations

from .engine_pipeline import EnginePipeline
from .plan import STREAM, Plan
from .protocol import Pipeline
from .seeding import WorkerSetup
from .stream_pipeline import StreamPipeline


def build(plan: Plan, index: dict, setup: WorkerSetup) -> Pipeline:
    """The pipeline of `plan`; `index`: torch's public attributes the batches follow; `setup`:
    what workers start with (worker_init_fn, each epoch's base seed)."""
    return (StreamPipeline(plan, setup) if plan.mode == STREAM
            else EnginePipeline(plan, index, setup))
