"""An engine pipeline's state_dict() and load_state_dict() (EnginePipeline's, engine_pipeline.py):
the position in its epoch, as one rank's state on stoker's own order (elastic.py, which can be
merged and resumed on other ranks) or the batch alone; what the epochs draw from (seeding.py's
DrawSources); a state of another topology merged and resumed here."""

from __future__ import annotations

from typing import Optional

from . import elastic


class EngineStates:
    """The state methods of EnginePipeline, over its attributes: plan, _loader, _samples,
    _elastic, _sources, _pending, _resumed, _replay, _loaded_draws; and reseed()."""

    def state_dict(self, resume, next_epoch: Optional[int]) -> dict:
        if resume is not None:
            epoch, batch = resume
        elif next_epoch is not None:  # between epochs: the next one from its start
            epoch, batch = next_epoch, 0
        else:
            epoch, batch = self._loader.position()
        state = self._position_state(epoch, batch)
        of_data = getattr(self.plan.dataset, "_state_of_data", None)
        if of_data is not None:  # what a TokenMix's rows follow from (its weight schedule)
            state["data"] = of_data()
        if self._sources is not None:
            state["draws"] = (self._loaded_draws if resume is not None
                              else self._sources.state(begun=next_epoch is None))
        return state

    def _position_state(self, epoch: int, batch: int) -> dict:
        if not self._elastic:
            # engine_seed: the samples' seeds' base (stoker.sample_seed(); seed_per_sample),
            # drawn from torch's generator when the loader was made if its order is torch's.
            return {"epoch": int(epoch), "batch": int(batch), "seed": self.plan.seed,
                    "engine_seed": self.plan.engine_seed, "batches_per_epoch": len(self)}
        consumed, epoch_samples = [], self._loader.samples_per_epoch
        if self._pending is not None and self._pending[0] == epoch:
            consumed, epoch_samples = self._pending[1], len(self._pending[2])
        elif self._resumed is not None and self._resumed[0] == epoch:
            consumed, epoch_samples = self._resumed[1], self._resumed[2]
        plan = self.plan
        return elastic.rank_state(
            (epoch, batch), seed=plan.seed, batches_per_epoch=len(self), samples=self._samples,
            shuffle=plan.engine_shuffle, shuffle_window=self._loader.shuffle_window,
            shuffle_nodes=self._loader.shuffle_nodes, batch_size=plan.batch_size, rank=plan.rank,
            world_size=plan.world_size, shard_drop_last=plan.shard_drop_last,
            epoch_samples=epoch_samples, consumed=consumed)

    def load_state_dict(self, state: dict) -> tuple[int, int]:
        self._replay = self._loaded_draws = None
        if "batch" not in state and not state.get("merged"):
            raise ValueError("stoker: the state is not a map-style data set's (a stream's "
                             "state has no batch number)" if "stream" in state else
                             "stoker: the state has no batch number")
        plan = self.plan
        check = getattr(plan.dataset, "_check_state_of_data", None)
        if check is not None and state.get("data") is not None:
            check(state["data"], elastic.samples_read(state))
        if state.get("merged") or ("world_size" in state and (
                state["world_size"], state["rank"], state["batch_size"], state["samples"]) != (
                plan.world_size, plan.rank, plan.batch_size, self._samples)) or (
                state.get("shuffle_window") and tuple(state.get("shuffle_nodes", ())) !=
                tuple(self._loader.shuffle_nodes)):  # laid out for other nodes: as elsewhere
            return self._load_elsewhere(state)
        if int(state.get("batches_per_epoch", len(self))) != len(self):
            raise ValueError(f"the state is for {state['batches_per_epoch']} batches per epoch, "
                             f"this loader has {len(self)}")
        if "seed" in state and int(state["seed"]) != plan.seed:
            raise ValueError(f"the state was saved with seed {state['seed']}, this loader has "
                             f"seed {plan.seed}: pass seed= (or the same generator) to "
                             f"resume")
        if int(state.get("engine_seed", plan.engine_seed)) != plan.engine_seed:
            self.reseed(int(state["engine_seed"]))  # the samples seeded as before the save
        if self._elastic:
            elastic.check_window(state, self._loader.shuffle_window)
        epoch, batch = int(state["epoch"]), int(state["batch"])
        draws = state.get("draws")
        if self._sources is not None and draws is not None:
            self._replay, self._loaded_draws = self._sources.load(draws), draws
        self._pending = None
        if state.get("consumed"):  # saved in an epoch resumed on another topology
            self._pending = (epoch, state["consumed"], self._resumed_order(epoch, state),
                             batch)
        return epoch, batch

    def _load_elsewhere(self, state: dict) -> tuple[int, int]:
        """A state from another topology (ranks, batch size), merged or of one rank."""
        state = elastic.merged_for(state, self.plan, self._samples, self._elastic,
                                   self._loader.shuffle_window, self._loader.shuffle_nodes)
        epoch = int(state["epoch"])
        self._pending = None
        if state["consumed"]:
            self._pending = (epoch, state["consumed"], self._resumed_order(epoch, state), 0)
        return epoch, 0

    def _resumed_order(self, epoch: int, state: dict):
        # The loader's own order (its shuffle resolved: windowed over storage blocks where the
        # data set does not fit its object cache, laid out over the nodes the epoch began on),
        # less what was consumed.
        return self._loader.resumed_order(epoch, [tuple(r) for r in state["consumed"]],
                                          tuple(state.get("shuffle_nodes", (1, 1))))
