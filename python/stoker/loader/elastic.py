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
_SHARED = ("epoch", "seed", "samples", "shuffle", "shuffle_window", "shuffle_nodes",
           "world_size", "shard_drop_last", "consumed")


def rank_state(position: tuple[int, int], *, seed: int, batches_per_epoch: int, samples: int,
               shuffle: bool, shuffle_window: int, shuffle_nodes: tuple, batch_size: int,
               rank: int, world_size: int, shard_drop_last: bool, epoch_samples: int,
               consumed: list) -> dict[str, Any]:
    """One rank's state at `position` (epoch, batches handed out in it). `shuffle_window`:
    the windowed shuffle's blocks (0: global); `shuffle_nodes`: (nodes, ranks a node) its
    order is laid out for; `epoch_samples`: the samples this rank reads in
    that epoch; `consumed`: the positions consumed before this rank's order of that epoch
    began (an elastic resume), else []."""
    epoch, batch = position
    return {"version": VERSION, "epoch": int(epoch), "batch": int(batch), "seed": int(seed),
            "batches_per_epoch": int(batches_per_epoch), "samples": int(samples),
            "shuffle": bool(shuffle), "shuffle_window": int(shuffle_window),
            "shuffle_nodes": [int(n) for n in shuffle_nodes], "batch_size": int(batch_size),
            "rank": int(rank),
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
    if any("stream" in state for state in states):
        return _merge_streams(states)
    for state in states:
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
            if state.get(key, 0) != first.get(key, 0):
                raise ValueError(
                    f"stoker.merge_states: the states are not of one checkpoint: {key} is "
                    f"{first[key]!r} on rank {first['rank']} and {state[key]!r} on rank "
                    f"{state['rank']} (save every rank's state at the same step)")
    world = first["world_size"]
    by_rank = _ranks(states, "checkpoint")
    taken = [by_rank[r]["taken"] for r in range(world)]
    samples = first["samples"]
    consumed = _stoker.consumed_positions(samples, [tuple(r) for r in first["consumed"]],
                                          taken, first["shard_drop_last"])
    epoch = first["epoch"]
    if consumed == [(0, samples)] or samples == 0:  # the epoch is over: the next one, fresh
        epoch, consumed = epoch + 1, []
    merged = {"version": VERSION, "merged": True, "epoch": int(epoch), "seed": first["seed"],
              "samples": samples, "shuffle": first["shuffle"],
              "shuffle_window": int(first.get("shuffle_window", 0)),
              "shuffle_nodes": list(first.get("shuffle_nodes", (1, 1))),
              "consumed": [list(r) for r in consumed]}
    if "data" in first:  # what the data set's rows follow from (a TokenMix's schedule)
        merged["data"] = first["data"]
    return merged


def samples_read(state: dict) -> int:
    """How far into the data set's index a state's run has read, at most: the end of the
    positions consumed in its epoch (in index order: not shuffled), every sample after an
    epoch or when shuffled (positions anywhere), 0 before the first batch."""
    everything = 1 << 62
    epoch = int(state.get("epoch", 0))
    if "world_size" not in state and not state.get("merged"):  # the batch alone: its order
        return everything if epoch > 0 or int(state.get("batch", 0)) > 0 else 0  # unknown
    samples = int(state["samples"])
    consumed = [tuple(r) for r in state.get("consumed", [])]
    if not state.get("merged"):  # every rank taken as far as this one (one checkpoint's step)
        taken = [int(state["taken"])] * int(state["world_size"])
        try:
            consumed = _stoker.consumed_positions(samples, consumed, taken,
                                                  bool(state["shard_drop_last"]))
        except ValueError:  # the last rank's share is shorter: at most the whole epoch
            return samples
    read = max((int(end) for begin, end in consumed if end > begin), default=0)
    if epoch > 0:
        return everything
    if read > 0 and bool(state.get("shuffle")):
        return everything
    return read


def merged_for(state: dict, plan, samples: Optional[int], own_order: bool,
               shuffle_window: int = 0, shuffle_nodes: tuple = (1, 1)) -> dict:
    """A map-style loader's state from another topology (ranks, batch size, the nodes a
    windowed shuffle is laid out for), merged or of one rank, checked against this loader's
    `plan` (of a data set of `samples`; `own_order`: stoker's own order, which alone can be
    split over other ranks; `shuffle_window`, `shuffle_nodes`: its windowed shuffle's blocks
    and layout): the merged state."""
    if not own_order:
        raise ValueError(
            "stoker: this loader resumes only on the topology its state was saved on: "
            "its order is not stoker's own (a custom sampler, torch's samplers followed as "
            "torch draws them, e.g. shuffle=True without seed=, or batch jobs), so the "
            "rest of the epoch cannot be split over other ranks; stoker.DistributedSampler "
            "or seed= gives stoker's order")
    check_window(state, shuffle_window)
    if not state.get("merged"):
        if state["world_size"] != 1:
            saved, mine = ("", "")
            if state.get("shuffle_window"):  # the layout may be all that differs
                saved = ", its windowed order laid out for {} node(s) of {} rank(s)".format(
                    *state["shuffle_nodes"])
                mine = ", laid out for {} of {}".format(*shuffle_nodes)
            raise ValueError(
                f"stoker: the state was saved on rank {state['rank']} of "
                f"{state['world_size']} with batch size {state['batch_size']}{saved}; this "
                f"loader is rank {plan.rank} of {plan.world_size} with batch size "
                f"{plan.batch_size}{mine}. Resume on another topology from every rank's "
                f"state merged: stoker.merge_states(states), or loader.global_state_dict() "
                f"when saving")
        state = merge_states([state])
    if state["samples"] != samples:
        raise ValueError(f"stoker: the state is of a data set of {state['samples']} "
                         f"samples, this loader's has {samples}")
    if bool(state["shuffle"]) != plan.engine_shuffle or (
            plan.engine_shuffle and int(state["seed"]) != plan.engine_seed):
        raise ValueError(
            f"stoker: the state was saved with shuffle={state['shuffle']} and seed "
            f"{state['seed']}; this loader has shuffle={plan.engine_shuffle} and seed "
            f"{plan.engine_seed}: pass the same shuffle and seed= to resume")
    return state


def check_window(state: dict, shuffle_window: int) -> None:
    """Raises ValueError when `state` was saved with another windowed shuffle than this
    loader's (`shuffle_window` blocks; 0: global): its order would not be the saved one."""
    saved = int(state.get("shuffle_window", 0))
    if saved and "shuffle_nodes" not in state:
        raise ValueError(
            "stoker: the state was saved by an older stoker, whose windowed shuffle placed the "
            "samples otherwise: it cannot be resumed mid-epoch into the same order; start the "
            "epoch again (load_state_dict of a state at its start) or resume with that stoker")
    if bool(state.get("shuffle", True)) and saved != shuffle_window:
        def name(window):
            return f"a window of {window} blocks" if window else "the global shuffle"
        raise ValueError(
            f"stoker: the state was saved with {name(saved)}, this loader has "
            f"{name(shuffle_window)} (the object cache or its size differs, or shuffle=): "
            f"resume with the same object_cache_bytes and shuffle= so that the order is the "
            f"saved one")


def _ranks(states: list, what: str) -> dict:
    """The states by rank, every rank of the checkpoint there once."""
    world = states[0]["world_size"]
    by_rank = {}
    for state in states:
        if state["world_size"] != world:
            raise ValueError(f"stoker.merge_states: the states are not of one checkpoint: "
                             f"saved on {world} and on {state['world_size']} ranks")
        if state["rank"] in by_rank:
            raise ValueError(f"stoker.merge_states: two states of rank {state['rank']}")
        by_rank[state["rank"]] = state
    missing = sorted(set(range(world)) - set(by_rank))
    if missing:
        raise ValueError(f"stoker.merge_states: the {what} was taken on {world} ranks; the "
                         f"states of ranks {missing} are missing")
    return by_rank


def _merge_streams(states: list) -> dict[str, Any]:
    """Stream states: those of stoker's shard streams merge (every worker's position per
    shard, stoker/datasets/shard_progress.py); any other stream's state is each worker's own
    and resumes only where it was saved."""
    from ..datasets import shard_progress

    if not all("stream" in state for state in states):
        raise ValueError("stoker.merge_states: a stream's state and a map-style loader's "
                         "cannot be merged")
    if len(states) == 1 and (states[0]["stream"] or {}).get("merged"):
        return dict(states[0])
    if any("world_size" not in state for state in states):
        raise ValueError("stoker.merge_states: a stream state saved by an older stoker has "
                         "no rank; it resumes only on the topology it was saved on")
    _ranks(states, "checkpoint")
    epochs = {state["epoch"] for state in states}
    if len(epochs) > 1:
        raise ValueError(f"stoker.merge_states: the states are not of one checkpoint: epochs "
                         f"{sorted(epochs)} (save every rank's state at the same step)")
    epoch = epochs.pop()
    positions = [state["stream"] for state in states]
    if all(p is None for p in positions):  # between epochs: the next one starts fresh
        return {"version": VERSION, "merged": True, "epoch": epoch, "stream": None}
    if any(p is None or p.get("merged") for p in positions):
        raise ValueError("stoker.merge_states: some ranks' states are between epochs or "
                         "merged already, others mid-epoch: not one checkpoint")
    parts = [s for p in positions for s in p["states"]]
    if not all(s is None or (isinstance(s, dict) and s.get("kind") == shard_progress.KIND)
               for s in parts):
        raise ValueError(
            "stoker.merge_states: this stream's state is its workers' own (its data set is "
            "not one of stoker's shard streams), which cannot be split over other ranks or "
            "workers; resume each rank's own state with the same ranks and num_workers")
    if all(s is None for s in parts):  # nothing handed out yet in this epoch
        return {"version": VERSION, "merged": True, "epoch": epoch, "stream": None}
    merged = shard_progress.merge_states(parts)
    done = merged["epoch"] - next(s for s in parts if s is not None)["epoch"]
    return {"version": VERSION, "merged": True, "epoch": epoch + done,
            "stream": None if done else {"merged": True, "dataset": merged}}


def gather(state: dict) -> list:
    """Every rank's state, on every rank (torch.distributed's all_gather_object)."""
    import torch.distributed as dist

    states: list[Optional[dict]] = [None] * dist.get_world_size()
    dist.all_gather_object(states, state)
    return states


def global_state(state: dict) -> dict:
    """This rank's `state` merged with every other rank's (gathered where torch.distributed is
    initialized): DataLoader.global_state_dict()."""
    from ..distributed import _torch_distributed

    dist = _torch_distributed()
    return merge_states(gather(state) if dist is not None and dist.get_world_size() > 1
                        else [state])
