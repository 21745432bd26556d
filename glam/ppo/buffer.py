"""Rollout storage: what the policy saw and did at each step of each local environment."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from glam.policy.observations import Observations


@dataclass
class Transitions:
    """A flat batch of transitions, indexable by a tensor of positions (a minibatch)."""

    observations: Observations
    """What the policy saw (prompts and candidates, or grids), one per transition."""
    actions: torch.Tensor
    """`(batch,)` index of the chosen action."""
    logprobs: torch.Tensor
    """`(batch,)` log-probability of the chosen action under the rollout policy."""
    values: torch.Tensor
    """`(batch,)` value estimate under the rollout policy."""
    advantages: torch.Tensor
    """`(batch,)` GAE advantages."""
    returns: torch.Tensor
    """`(batch,)` value targets (advantages + values)."""
    extras: dict[str, torch.Tensor] = field(default_factory=dict)
    """`(batch, ...)` tensors the trainer's hooks stored with the transitions, by name."""

    def __len__(self) -> int:
        return len(self.observations)

    def select(self, index: torch.Tensor) -> Transitions:
        """The transitions at `index` (a 1-D tensor of positions), in that order."""
        return Transitions(
            observations=self.observations.select(index.tolist()),
            actions=self.actions[index],
            logprobs=self.logprobs[index],
            values=self.values[index],
            advantages=self.advantages[index],
            returns=self.returns[index],
            extras={name: values[index] for name, values in self.extras.items()},
        )


class RolloutBuffer:
    """Fixed-size storage for `num_steps` steps of `num_envs` environments.

    Tensors are `(steps, envs)` on the CPU (observations are text or small grids, and the
    per-step tensors are tiny next to one policy forward).
    """

    def __init__(self, num_steps: int, num_envs: int) -> None:
        self.num_steps = num_steps
        self.num_envs = num_envs
        self.observations: list[Observations | None] = [None] * num_steps
        """Per step, the observations of every env."""
        shape = (num_steps, num_envs)
        self.actions = torch.zeros(shape, dtype=torch.long)
        self.logprobs = torch.zeros(shape)
        self.values = torch.zeros(shape)
        self.rewards = torch.zeros(shape)
        self.dones = torch.zeros(shape, dtype=torch.bool)
        self.final_values = torch.zeros(shape)
        """Value of the final observation where an episode was truncated at that step (with
        `ppo.bootstrap_truncated`), 0 elsewhere."""
        self.extras: dict[str, torch.Tensor] = {}
        """`(steps, envs, ...)` tensors of the trainer's hooks, by name (made at first use)."""
        self.step = 0

    def add(
        self,
        observations: Observations,
        actions: torch.Tensor,
        logprobs: torch.Tensor,
        values: torch.Tensor,
        rewards: torch.Tensor,
        dones: torch.Tensor,
        extras: dict[str, torch.Tensor] | None = None,
    ) -> None:
        """Store one step: what each env's policy saw, chose and got. Tensors are `(envs,)`;
        `extras` are `(envs, ...)` tensors of the hooks, by name (the same names every step)."""
        if self.step >= self.num_steps:
            raise IndexError(f"rollout buffer is full ({self.num_steps} steps)")
        if len(observations) != self.num_envs:
            raise ValueError(f"expected {self.num_envs} observations, got {len(observations)}")
        t = self.step
        self.observations[t] = observations
        self.actions[t] = actions.detach().to("cpu", torch.long)
        self.logprobs[t] = logprobs.detach().to("cpu", torch.float32)
        self.values[t] = values.detach().to("cpu", torch.float32)
        self.rewards[t] = rewards.detach().to("cpu", torch.float32)
        self.dones[t] = dones.detach().to("cpu", torch.bool)
        extras = extras or {}
        if t == 0:
            self.extras = {
                name: torch.zeros((self.num_steps, *values.shape), dtype=values.dtype)
                for name, values in extras.items()
            }
        if extras.keys() != self.extras.keys():
            raise ValueError(
                f"step {t} brings extras {sorted(extras)}, the rollout's first step brought "
                f"{sorted(self.extras)}"
            )
        for name, values in extras.items():
            self.extras[name][t] = values.detach().cpu()
        self.step += 1

    @property
    def full(self) -> bool:
        """True once `num_steps` steps are stored."""
        return self.step == self.num_steps

    def reset(self) -> None:
        """Empty the buffer for the next rollout."""
        self.step = 0
        self.final_values.zero_()

    def transitions(self, advantages: torch.Tensor, returns: torch.Tensor) -> Transitions:
        """All stored steps as one flat batch, step-major (`t * num_envs + env`)."""
        if not self.full:
            raise RuntimeError(f"rollout buffer holds {self.step} of {self.num_steps} steps")
        first = self.observations[0]
        return Transitions(
            observations=type(first).cat(self.observations),
            actions=self.actions.reshape(-1),
            logprobs=self.logprobs.reshape(-1),
            values=self.values.reshape(-1),
            advantages=advantages.reshape(-1),
            returns=returns.reshape(-1),
            extras={
                name: values.reshape(-1, *values.shape[2:]) for name, values in self.extras.items()
            },
        )
