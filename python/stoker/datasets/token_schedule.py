"""stoker.TokenMix's weight schedules: weights that change at given steps (global batches), read
from the ways a user writes them, and the check a DataLoader's resume makes that a schedule
changed only from where the run stands on (docs/formats.md, "Token data": Mixing)."""

from __future__ import annotations

import math
from typing import Optional

Schedule = list  # [(step, [weight, ...]), ...], the first at step 0, steps increasing


def schedule_of(weights) -> Optional[Schedule]:
    """`weights` as a schedule when it is one (a dict ``{step: weights}``, or a sequence of
    ``(step, weights)`` pairs), else None (plain weights, one a source). A dict's steps are
    taken in order; a sequence's as given (the C++ check names steps out of order)."""
    if isinstance(weights, dict):
        items = sorted(weights.items(), key=lambda kv: _step(kv[0]))
    else:
        items = list(weights)
        if not items or not all(_is_pair(x) for x in items):
            if any(_is_pair(x) for x in items):
                raise ValueError("stoker.TokenMix: weights are numbers, one a source, or a "
                                 "schedule of (step, weights) pairs, not both")
            return None
    return [(_step(step), [float(w) for w in ws]) for step, ws in items]


def _is_pair(x) -> bool:
    if isinstance(x, (str, bytes)) or not hasattr(x, "__len__") or len(x) != 2:
        return False
    return hasattr(x[1], "__len__") and not isinstance(x[1], (str, bytes))


def _step(step) -> int:
    if isinstance(step, bool) or not float(step).is_integer() or step < 0:
        raise ValueError(f"stoker.TokenMix: a weight schedule's step is a global batch number "
                         f"(an integer >= 0), not {step!r}")
    return int(step)


def normalized(schedule: Schedule) -> Schedule:
    """The schedule without its segments that change nothing (weights equal to the segment's
    before), as the C++ index reads it."""
    out: Schedule = []
    for step, weights in schedule:
        if not out or list(weights) != out[-1][1]:
            out.append((int(step), [float(w) for w in weights]))
    return out


def data_state(mix) -> dict:
    """What a DataLoader's state_dict() keeps of a TokenMix: what its rows before any step
    follow from, so that a resume can tell a schedule changed later from a past changed."""
    return {"kind": "stoker.TokenMix", "mixing": mix.mixing,
            "global_batch": int(mix._made_with[1]["global_batch"] or 1),
            "seed": int(mix._made_with[1]["seed"]), "samples": len(mix),
            "source_rows": [len(d) for d in mix.sources],
            "schedule": [[step, list(ws)] for step, ws in normalized(mix.schedule)]}


def check_data_state(mix, saved: dict, past: int) -> None:
    """Raises ValueError when the mix's samples before sample `past` (those a run saved in
    `saved` has read) would differ from that run's: other sources, mixing, global batch or
    seed, or weights of a step before the one the run resumes at. Later segments may change:
    the run continues from the rows its sources have drawn."""
    if saved.get("kind") != "stoker.TokenMix" or past <= 0:
        return
    now = data_state(mix)
    past = min(past, now["samples"])
    for key in ("mixing", "global_batch", "seed", "source_rows"):
        if saved.get(key) != now[key]:
            raise ValueError(
                f"stoker.TokenMix: the state was saved from a mix with {key} {saved.get(key)!r}, "
                f"this one has {now[key]!r}: its rows already read would differ. Only the "
                f"weights of the steps not yet read may change (a schedule's later segments)")
    batch = now["global_batch"]
    steps = math.ceil(past / batch)  # the steps read, wholly or in part

    def before(schedule):
        return [[int(s), [float(w) for w in ws]] for s, ws in schedule if s < steps]

    old, new = before(saved["schedule"]), before(now["schedule"])
    if old != new:
        k = next((k for k in range(min(len(old), len(new))) if old[k] != new[k]),
                 min(len(old), len(new)))
        step = min(old[k][0] if k < len(old) else steps, new[k][0] if k < len(new) else steps)
        raise ValueError(
            f"stoker.TokenMix: the state was saved at step {steps} (sample {past}) of a weight "
            f"schedule {old}, this mix's schedule before that step is {new}: they differ from "
            f"step {step}, which the run has already read. A schedule may change only from the "
            f"step a run resumes at on: keep its segments before step {steps} and give the new "
            f"weights from step {steps} or later")
