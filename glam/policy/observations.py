"""What a policy reads at each step, batched over environments.

The PPO trainer never looks inside: it stores a step's observations, selects and concatenates
them into minibatches, and calls `model(**observations.inputs())`. A text policy (the LLM)
reads `TextObservations`; BabyAI's symbolic agent reads `GridObservations`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from glam.trunk import TrunkStates


@dataclass
class TextObservations:
    """One prompt and one list of candidate action strings per env."""

    prompts: list[str]
    candidates: list[list[str]]
    trunk: list[TrunkStates] | None = None
    """What the policy's frozen trunk computed for each prompt in the rollout (`glam.trunk`),
    handed back to it in the update; None: the policy computes everything again."""
    elapsed: list[float] | None = None
    """The share of its time limit each prompt's episode has used, for a value head that reads
    it (`policy.value_time`); None: not given to the policy."""

    kind = "text"

    def __len__(self) -> int:
        return len(self.prompts)

    def select(self, positions: Sequence[int]) -> TextObservations:
        """The observations at `positions`, in that order."""
        return TextObservations(
            [self.prompts[i] for i in positions],
            [self.candidates[i] for i in positions],
            None if self.trunk is None else [self.trunk[i] for i in positions],
            None if self.elapsed is None else [self.elapsed[i] for i in positions],
        )

    @classmethod
    def cat(cls, parts: Sequence[TextObservations]) -> TextObservations:
        """The parts one after the other (with the trunk states, or the elapsed times, only if
        every part has them)."""
        trunks = [part.trunk for part in parts]
        times = [part.elapsed for part in parts]
        return cls(
            [p for part in parts for p in part.prompts],
            [c for part in parts for c in part.candidates],
            None if any(t is None for t in trunks) else [s for t in trunks for s in t],
            None if any(t is None for t in times) else [e for t in times for e in t],
        )

    def with_trunk(self, trunk: list[TrunkStates] | None) -> TextObservations:
        """The same observations carrying `trunk` (one per prompt)."""
        if trunk is not None and len(trunk) != len(self.prompts):
            raise ValueError(f"{len(trunk)} trunk states for {len(self.prompts)} prompts")
        return TextObservations(self.prompts, self.candidates, trunk, self.elapsed)

    @property
    def trunk_nbytes(self) -> int:
        """Bytes the trunk states take (0 without them)."""
        return sum(states.nbytes for states in self.trunk or ())

    def inputs(self) -> dict[str, Any]:
        """The policy's keyword arguments (`LLMActorCritic.forward`)."""
        inputs: dict[str, Any] = {"prompts": self.prompts, "candidates": self.candidates}
        if self.trunk is not None:
            inputs["trunk"] = self.trunk
        if self.elapsed is not None:
            inputs["elapsed"] = self.elapsed
        return inputs


@dataclass
class GridObservations:
    """minigrid's symbolic observation of each env: the egocentric view and the mission."""

    images: torch.Tensor
    """`(B, 7, 7, 3)` uint8: minigrid's encoding (object, colour, state) of each visible cell,
    indexed `[x, y]` with the agent at the bottom centre facing up."""
    directions: torch.Tensor
    """`(B,)` long: the agent's absolute direction (0: east, 1: south, 2: west, 3: north)."""
    missions: list[str]
    """The mission text."""

    kind = "grid"

    def __len__(self) -> int:
        return len(self.missions)

    def select(self, positions: Sequence[int]) -> GridObservations:
        index = torch.as_tensor(list(positions), dtype=torch.long)
        return GridObservations(
            self.images[index], self.directions[index], [self.missions[i] for i in positions]
        )

    @classmethod
    def cat(cls, parts: Sequence[GridObservations]) -> GridObservations:
        return cls(
            torch.cat([part.images for part in parts]),
            torch.cat([part.directions for part in parts]),
            [m for part in parts for m in part.missions],
        )

    @classmethod
    def from_minigrid(cls, observations: Sequence[dict[str, Any]]) -> GridObservations:
        """From minigrid observation dicts (`image`, `direction`, `mission`)."""
        return cls(
            torch.as_tensor(np.stack([obs["image"] for obs in observations]), dtype=torch.uint8),
            torch.as_tensor([int(obs["direction"]) for obs in observations], dtype=torch.long),
            [obs["mission"] for obs in observations],
        )

    def inputs(self) -> dict[str, Any]:
        """The policy's keyword arguments (`SymbolicActorCritic.forward`)."""
        return {"images": self.images, "directions": self.directions, "missions": self.missions}


Observations = TextObservations | GridObservations
"""What the trainer stores and replays, whatever the policy."""


def policy_inputs(observations: Observations, memory: torch.Tensor | None = None) -> dict[str, Any]:
    """The policy's keyword arguments: the observations', and `memory` if the policy has one
    (`PolicyOutput.memory` of its previous step)."""
    inputs = observations.inputs()
    if memory is not None:
        inputs["memory"] = memory
    return inputs


def new_episodes_forget(memory: torch.Tensor, dones: Sequence[bool] | np.ndarray) -> torch.Tensor:
    """`memory` `(envs, memory_size)` for each env's next step: zero where its episode just
    ended (the env's next step starts a new one)."""
    ended = torch.as_tensor(np.asarray(dones, dtype=bool), device=memory.device)
    return memory * ~ended[:, None]
