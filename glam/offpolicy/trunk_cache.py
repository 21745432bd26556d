"""The frozen trunk's states of replayed observations, kept under a memory cap (`sac.cache_trunk`).

PPO's update runs from the states its rollout kept (`glam.trunk`): with LoRA on the top 4 layers
of 30, a forward and backward cost about a seventh of the whole model's. An off-policy learner
reads each observation many times and long after it was played: as a transition's state (about
`sac.batch_size x sac.replay_ratio` times) and as what followed another's window. Its gradient
step would run the whole model twice on every sampled observation, though everything below the
lowest adapted layer is a fixed function of the text.

`TrunkCache` keeps those states by what the policy read, the prompt and its candidates, so one
entry serves an observation wherever it appears: the step that played it, the step before
(whose `next_obs` it is), a relabelled copy with the same text. The acting forward's states are
kept as it plays (`keep`); a replayed batch takes what is held and computes the rest in one
forward without gradient, keeping them too (`attach`). Past `budget_bytes` the least recently
used entries are dropped. Entries are stored in `dtype` (bfloat16 halves float32's memory) and
handed back in the dtype they were computed in. The cache is not checkpointed: a resumed run
starts it empty and refills it as it replays.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from glam.policy.observations import TextObservations, policy_inputs
from glam.trunk import TrunkStates

__all__ = ["TrunkCache", "TrunkCacheStats"]

Key = tuple[str, tuple[str, ...]]


@dataclass
class TrunkCacheStats:
    """Lookups since the last `TrunkCache.take_stats`."""

    hits: int = 0
    misses: int = 0

    @property
    def hit_rate(self) -> float:
        looked_up = self.hits + self.misses
        return self.hits / looked_up if looked_up else float("nan")


@dataclass
class _Entry:
    states: TrunkStates
    """As stored (in the cache's dtype)."""
    dtype: torch.dtype
    """The dtype the forward computed them in, the one `attach` hands back."""


class TrunkCache:
    """Trunk states by (prompt, candidates), the least recently used dropped past `budget_bytes`
    (see the module docstring)."""

    def __init__(self, budget_bytes: int, dtype: torch.dtype | None = torch.bfloat16) -> None:
        """`dtype`: how entries are stored; None: as computed."""
        if budget_bytes < 0:
            raise ValueError(f"a trunk cache's budget is >= 0 bytes, got {budget_bytes}")
        self.budget_bytes, self.dtype = budget_bytes, dtype
        self._entries: OrderedDict[Key, _Entry] = OrderedDict()
        self.nbytes = 0
        """Bytes the stored states take."""
        self.stats = TrunkCacheStats()

    def __len__(self) -> int:
        return len(self._entries)

    def keep(self, observations: TextObservations, trunk: Sequence[TrunkStates]) -> None:
        """Store each observation's states (a forward's `PolicyOutput.trunk`)."""
        if len(trunk) != len(observations):
            raise ValueError(f"{len(trunk)} trunk states for {len(observations)} observations")
        for key, states in zip(_keys(observations), trunk, strict=True):
            self._store(key, states)

    def attach(self, policy: nn.Module, observations: TextObservations) -> TextObservations:
        """`observations` carrying their trunk states: those held, and the others computed by
        `policy` (its trunk cache on, `LLMActorCritic.enable_trunk_cache`) in one forward
        without gradient, then kept."""
        keys = _keys(observations)
        found: list[TrunkStates | None] = [self._get(key) for key in keys]
        missing = [i for i, states in enumerate(found) if states is None]
        self.stats.hits += len(keys) - len(missing)
        self.stats.misses += len(missing)
        if missing:
            with torch.no_grad():
                output = policy(**policy_inputs(observations.select(missing)))
            if output.trunk is None:
                raise ValueError("the policy kept no trunk states: its trunk cache is off")
            for i, states in zip(missing, output.trunk, strict=True):
                found[i] = _handed_back(self._store(keys[i], states))
        return observations.with_trunk(found)  # type: ignore[arg-type]

    def take_stats(self) -> TrunkCacheStats:
        """The lookups since the last call, then zero."""
        stats, self.stats = self.stats, TrunkCacheStats()
        return stats

    def _get(self, key: Key) -> TrunkStates | None:
        entry = self._lookup(key)
        return None if entry is None else _handed_back(entry)

    def _lookup(self, key: Key) -> _Entry | None:
        entry = self._entries.get(key)
        if entry is not None:
            self._entries.move_to_end(key)
        return entry

    def _store(self, key: Key, states: TrunkStates) -> _Entry:
        """Keep `states` under `key` (unless larger than the whole budget); return the entry,
        whose states (rounded to the cache's dtype) a replayed observation reads whether it was
        held or just computed."""
        entry = self._lookup(key)
        if entry is not None:
            return entry
        entry = _Entry(
            TrunkStates(
                _copy(states.hidden, self.dtype),
                None if states.base_hidden is None else _copy(states.base_hidden, None),
            ),
            states.hidden.dtype,
        )
        if entry.states.nbytes <= self.budget_bytes:
            self._entries[key] = entry
            self.nbytes += entry.states.nbytes
            while self.nbytes > self.budget_bytes:
                _, dropped = self._entries.popitem(last=False)
                self.nbytes -= dropped.states.nbytes
        return entry


def _keys(observations: TextObservations) -> list[Key]:
    return [
        (prompt, tuple(candidates))
        for prompt, candidates in zip(observations.prompts, observations.candidates, strict=True)
    ]


def _copy(tensor: Tensor, dtype: torch.dtype | None) -> Tensor:
    """A copy of its own storage (a forward's states are views of the batch's)."""
    return tensor.detach().to(dtype=dtype or tensor.dtype, copy=True)


def _handed_back(entry: _Entry) -> TrunkStates:
    """An entry's states in the dtype they were computed in."""
    hidden = entry.states.hidden
    return TrunkStates(
        hidden if hidden.dtype == entry.dtype else hidden.to(entry.dtype), entry.states.base_hidden
    )
