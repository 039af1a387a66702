"""Resuming an epoch on another topology: the ranks' states merged into one, and what a rank
reads of the rest of the epoch.

An epoch's position is global: which positions of the epoch's order (its order on one rank)
the ranks have consumed, kept as a few ranges (ranks that stop at the same batch consumed one
prefix). Each rank saves its own state; `merge_states` turns the states of every rank into one,
and a loader of any number of ranks, workers, worker kind or batch size loads it: the rest of
the epoch is split over the new ranks as a fresh epoch would be (each remaining sample once),
and the epochs after it are those of a fresh run on the new topology. The position arithmetic
is C++ (stoker/sampler.h: consumed_positions, resumed_order), tested there.
"""

from __future__ import annotations

from typing import Any, Iterable, Optional

from .. import _stoker

VERSION = 2
# Keys that every rank's state of one checkpoint shares.
_SHARED = ("epoch", "seed", "samples", "shuffle", "world_size", "shard_drop_last", "consumed")


def rank_state(position: tuple[int, int], *, seed: int, batches_per_epoch: int, samples: int,
               shuffle: bool, batch_size: int, rank: int, world_size: int,
               shard_drop_last: bool, epoch_samples: int, consumed: list) -> dict[str, Any]:
    """One rank's state at `position` (epoch, batches handed out in it). `epoch_samples`: the
    samples this rank reads in that epoch; `consumed`: the positions consumed before this
    rank's order of that epoch began (an elastic resume), else []."""
    epoch, batch = position
    return {"version": VERSION, "epoch": int(epoch), "batch": int(batch), "seed": int(seed),
            "batches_per_epoch": int(batches_per_epoch), "samples": int(samples),
            "shuffle": bool(shuffle), "batch_size": int(batch_size), "rank": int(rank),
            "world_size": int(world_size), "shard_drop_last": bool(shard_drop_last),
            "taken": min(int(batch) * int(batch_size), int(epoch_samples)),
            "consumed": [list(r) for r in consumed]}


def merge_states(states: Iterable[dict]) -> dict[str, Any]:
    """The state of every rank of one checkpoint (each rank's ``loader.state_dict()``, in any
    order) as one, which a loader on any number of ranks, with any workers, worker kind or
    batch size, restores with ``load_state_dict``: the rest of the epoch, each remaining
    sample once over the new ranks. ``DataLoader.global_state_dict()`` gathers and merges
    them itself where torch.distributed is initialized."""
    states = list(states)
    if not states:
        raise ValueError("stoker.merge_states: no states to merge")
    for state in states:
        if "stream" in state:
            raise ValueError(
                "stoker.merge_states: a stream's state (an IterableDataset's) resumes only on "
                "the topology it was saved on (the same ranks and workers); load each rank's "
                "own state there")
        if state.get("version", 1) < VERSION or "world_size" not in state:
            raise ValueError(
                "stoker.merge_states: a state saved by an older stoker, or by a loader with a "
                "custom sampler or batch jobs, has no global position; it resumes only on the "
                "topology it was saved on")
    if len(states) == 1 and states[0].get("merged"):
        return dict(states[0])
    if any(state.get("merged") for state in states):
        raise ValueError("stoker.merge_states: a merged state cannot be merged with others")
    first = states[0]
    for state in states[1:]:
        for key in _SHARED:
            if state[key] != first[key]:
                raise ValueError(
                    f"stoker.merge_states: the states are not of one checkpoint: {key} is "
                    f"{first[key]!r} on rank {first['rank']} and {state[key]!r} on rank "
                    f"{state['rank']} (save every rank's state at the same step)")
    world = first["world_size"]
    by_rank = {}
    for state in states:
        if state["rank"] in by_rank:
            raise ValueError(f"stoker.merge_states: two states of rank {state['rank']}")
        by_rank[state["rank"]] = state
    missing = sorted(set(range(world)) - set(by_rank))
    if missing:
        raise ValueError(f"stoker.merge_states: the checkpoint was taken on {world} ranks; the "
                         f"states of ranks {missing} are missing")
    taken = [by_rank[r]["taken"] for r in range(world)]
    samples = first["samples"]
    consumed = _stoker.consumed_positions(samples, [tuple(r) for r in first["consumed"]],
                                          taken, first["shard_drop_last"])
    epoch = first["epoch"]
    if consumed == [(0, samples)] or samples == 0:  # the epoch is over: the next one, fresh
        epoch, consumed = epoch + 1, []
    return {"version": VERSION, "merged": True, "epoch": int(epoch), "seed": first["seed"],
            "samples": samples, "shuffle": first["shuffle"],
            "consumed": [list(r) for r in consumed]}


def gather(state: dict) -> list:
    """Every rank's state, on every rank (torch.distributed's all_gather_object)."""
    import torch.distributed as dist

    states: list[Optional[dict]] = [None] * dist.get_world_size()
    dist.all_gather_object(states, state)
    return states
