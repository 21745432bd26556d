"""The replay buffer of an off-policy learner: every env step kept, replayed as n-step
transitions.

A step of the local envs is one slot: what each env's policy read (`obs`), the action it took,
the reward, whether its episode terminated or hit its time limit there, and what followed
(`next_obs`: the next step's observation, or a timed-out episode's final one). Slots form a
ring of `capacity` steps (the oldest is overwritten); `sample` draws (slot, env) pairs
uniformly among the filled ones and gives each its n-step return, computed over the slots in
the order they were played (`glam.offpolicy.returns`), with the observation to bootstrap from.

Observations are kept as the policy reads them, text (prompts and candidates) or grids, without
a language model's trunk states (the update recomputes them). `save` writes the buffer into a
folder as JSON (the texts) and safetensors (the numbers), never pickled objects; `load` reads it
back, and refuses a folder written for other envs or another kind of observation.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file
from torch import Tensor

from glam.offpolicy.returns import NStepReturns, n_step_returns
from glam.policy.observations import GridObservations, Observations, TextObservations

__all__ = ["ReplayBatch", "ReplayBuffer", "ReplayError"]

META = "replay.json"
TENSORS = "replay.safetensors"
TEXTS = "observations.jsonl"


class ReplayError(ValueError):
    """A replay folder that cannot be read back into this buffer; the message says why."""


@dataclass
class ReplayBatch:
    """Sampled transitions, each an n-step return with its bootstrap."""

    obs: Observations
    actions: Tensor
    """`(B,)` long."""
    returns: Tensor
    """`(B,)` the n-step discounted rewards."""
    discounts: Tensor
    """`(B,)` gamma^m of the bootstrapped value (0 where the episode terminated)."""
    bootstrap: Tensor
    """`(B,)` bool."""
    next_obs: Observations
    """What the target's value is read at (the observation after the window's last step)."""


class ReplayBuffer:
    """A ring of `capacity` steps of `num_envs` envs (see the module docstring)."""

    def __init__(self, capacity: int, num_envs: int) -> None:
        if capacity < 1 or num_envs < 1:
            raise ValueError(f"a replay needs capacity and envs >= 1, got {capacity}, {num_envs}")
        self.capacity, self.num_envs = capacity, num_envs
        self.actions = torch.zeros(capacity, num_envs, dtype=torch.long)
        self.rewards = torch.zeros(capacity, num_envs)
        self.terminated = torch.zeros(capacity, num_envs, dtype=torch.bool)
        self.truncated = torch.zeros(capacity, num_envs, dtype=torch.bool)
        self.obs: list[Observations | None] = [None] * capacity
        self.next_obs: list[Observations | None] = [None] * capacity
        self.size = 0
        """Filled slots."""
        self.position = 0
        """The slot the next step goes into."""
        self.added = 0
        """Steps added since the buffer was made (or the run that saved it began)."""
        self._returns: tuple[tuple[int, float, int], NStepReturns] | None = None
        """The n-step returns of the steps held, kept until the next step is added."""

    def __len__(self) -> int:
        """Transitions held: filled slots times envs."""
        return self.size * self.num_envs

    def add(
        self,
        obs: Observations,
        actions: Tensor,
        rewards: Tensor,
        terminated: Tensor,
        truncated: Tensor,
        next_obs: Observations,
    ) -> None:
        """Keep one step of every env (each argument over the `num_envs` envs)."""
        if len(obs) != self.num_envs or len(next_obs) != self.num_envs:
            raise ValueError(f"a step holds {self.num_envs} envs, got {len(obs)}")
        slot = self.position
        self.obs[slot], self.next_obs[slot] = _without_trunk(obs), _without_trunk(next_obs)
        self.actions[slot] = actions.long().cpu()
        self.rewards[slot] = rewards.float().cpu()
        self.terminated[slot] = terminated.bool().cpu()
        self.truncated[slot] = truncated.bool().cpu()
        self.position = (slot + 1) % self.capacity
        self.size = min(self.size + 1, self.capacity)
        self.added += 1

    def _order(self) -> Tensor:
        """The filled slots, oldest first."""
        start = self.position if self.size == self.capacity else 0
        return (torch.arange(self.size) + start) % self.capacity

    def sample(
        self, batch_size: int, gamma: float, n: int, generator: torch.Generator | None = None
    ) -> ReplayBatch:
        """`batch_size` transitions drawn uniformly (with replacement) among those held.

        The oldest slot may start a window cut by the ring (its episode's earlier steps are
        gone): that costs nothing, a window only looks forward."""
        if not self.size:
            raise ValueError("the replay holds no transition yet")
        order = self._order()
        key = (self.added, gamma, n)
        if self._returns is None or self._returns[0] != key:  # once per burst of steps
            returns = n_step_returns(
                self.rewards[order], self.terminated[order], self.truncated[order], gamma, n
            )
            self._returns = (key, returns)
        out = self._returns[1]
        draws = torch.randint(len(self), (batch_size,), generator=generator)
        steps, envs = draws // self.num_envs, draws % self.num_envs
        last = out.last[steps, envs]
        return ReplayBatch(
            obs=_gather(self.obs, order[steps].tolist(), envs.tolist()),
            actions=self.actions[order[steps], envs],
            returns=out.returns[steps, envs],
            discounts=out.discounts[steps, envs],
            bootstrap=out.bootstrap[steps, envs],
            next_obs=_gather(self.next_obs, order[last].tolist(), envs.tolist()),
        )

    # ---- checkpoints -----------------------------------------------------------------------

    def save(self, folder: str | Path) -> None:
        """Write the buffer into `folder` (created), oldest step first."""
        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        order = self._order()
        kinds = {type(obs).__name__ for obs in self.obs[: self.size] if obs is not None}
        meta = {
            "capacity": self.capacity,
            "num_envs": self.num_envs,
            "size": self.size,
            "added": self.added,
            "kind": kinds.pop() if kinds else None,
        }
        tensors = {
            "actions": self.actions[order].contiguous(),
            "rewards": self.rewards[order].contiguous(),
            "terminated": self.terminated[order].contiguous(),
            "truncated": self.truncated[order].contiguous(),
        }
        slots = [self.obs[i] for i in order.tolist()], [self.next_obs[i] for i in order.tolist()]
        if meta["kind"] == "GridObservations":
            for name, observations in zip(("obs", "next_obs"), slots, strict=True):
                grids = GridObservations.cat(observations)  # type: ignore[arg-type]
                tensors[f"{name}_images"] = grids.images.contiguous()
                tensors[f"{name}_directions"] = grids.directions.contiguous()
        with (folder / TEXTS).open("w") as file:
            for obs, next_obs in zip(*slots, strict=True):
                file.write(json.dumps({"obs": _texts(obs), "next_obs": _texts(next_obs)}) + "\n")
        save_file(tensors, str(folder / TENSORS))
        (folder / META).write_text(json.dumps(meta, indent=2) + "\n")  # last: the folder is whole

    @classmethod
    def load(cls, folder: str | Path, capacity: int, num_envs: int) -> ReplayBuffer:
        """The buffer saved in `folder`, in a ring of `capacity` (the newest steps kept if it
        held more).

        Raises:
            ReplayError: an incomplete or unreadable folder, or steps of another number of envs.
        """
        folder = Path(folder)
        try:
            meta = json.loads((folder / META).read_text())
            tensors = load_file(str(folder / TENSORS))
            lines = (folder / TEXTS).read_text().splitlines()
        except (OSError, ValueError) as error:
            raise ReplayError(f"cannot read the replay in {folder}: {error}") from None
        if meta.get("num_envs") != num_envs:
            raise ReplayError(
                f"the replay in {folder} holds steps of {meta.get('num_envs')} envs, this run has "
                f"{num_envs} per process"
            )
        size = int(meta["size"])
        if len(lines) != size:
            raise ReplayError(f"the replay in {folder} has {len(lines)} steps of {size}: cut short")
        buffer = cls(capacity, num_envs)
        first = max(0, size - capacity)
        for row in range(first, size):
            texts = json.loads(lines[row])
            obs = _observations(meta["kind"], texts["obs"], tensors, "obs", row, num_envs)
            next_obs = _observations(
                meta["kind"], texts["next_obs"], tensors, "next_obs", row, num_envs
            )
            buffer.add(
                obs,
                tensors["actions"][row],
                tensors["rewards"][row],
                tensors["terminated"][row],
                tensors["truncated"][row],
                next_obs,
            )
        buffer.added = int(meta.get("added", size))
        return buffer


def _without_trunk(observations: Observations) -> Observations:
    if isinstance(observations, TextObservations) and observations.trunk is not None:
        return observations.with_trunk(None)
    return observations


def _gather(slots: list[Any], steps: list[int], envs: list[int]) -> Observations:
    """The observations of env `envs[i]` at slot `steps[i]`, in order."""
    parts = [slots[step].select([env]) for step, env in zip(steps, envs, strict=True)]
    return type(parts[0]).cat(parts)


def _texts(observations: Observations) -> dict[str, Any]:
    if isinstance(observations, TextObservations):
        return {"prompts": observations.prompts, "candidates": observations.candidates}
    return {"missions": observations.missions}


def _observations(
    kind: str, texts: dict[str, Any], tensors: dict[str, Tensor], name: str, row: int, envs: int
) -> Observations:
    if kind == "TextObservations":
        return TextObservations(list(texts["prompts"]), [list(c) for c in texts["candidates"]])
    if kind == "GridObservations":
        rows = slice(row * envs, (row + 1) * envs)
        return GridObservations(
            tensors[f"{name}_images"][rows], tensors[f"{name}_directions"][rows], texts["missions"]
        )
    raise ReplayError(f"a replay of {kind!r} observations cannot be read back")
