"""The pipeline of a plan: the engine's for map-style data sets (samples or batch jobs), the
stream's for iterable ones; both follow protocol.py."""

from __future__ import annotations

from .engine_pipeline import EnginePipeline
from .plan import STREAM, Plan
from .protocol import Pipeline
from .stream_pipeline import StreamPipeline


def build(plan: Plan, index: dict) -> Pipeline:
    """The pipeline of `plan`; `index`: torch's public attributes the batches follow."""
    return StreamPipeline(plan) if plan.mode == STREAM else EnginePipeline(plan, index)
