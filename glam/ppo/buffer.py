"""Rollout storage: what the policy saw and did at each step of each local environment."""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class Transitions:
    """A flat batch of transitions, indexable by a tensor of positions (a minibatch)."""

    prompts: list[str]
    """Prompt shown to the policy."""
    candidates: list[list[str]]
    """Action strings it chose among."""
    actions: torch.Tensor
    """`(batch,)` index of the chosen candidate."""
    logprobs: torch.Tensor
    """`(batch,)` log-probability of the chosen action under the rollout policy."""
    values: torch.Tensor
    """`(batch,)` value estimate under the rollout policy."""
    advantages: torch.Tensor
    """`(batch,)` GAE advantages."""
    returns: torch.Tensor
    """`(batch,)` value targets (advantages + values)."""

    def __len__(self) -> int:
        return len(self.prompts)

    def select(self, index: torch.Tensor) -> Transitions:
        """The transitions at `index` (a 1-D tensor of positions), in that order."""
        positions = index.tolist()
        return Transitions(
            prompts=[self.prompts[i] for i in positions],
            candidates=[self.candidates[i] for i in positions],
            actions=self.actions[index],
            logprobs=self.logprobs[index],
            values=self.values[index],
            advantages=self.advantages[index],
            returns=self.returns[index],
        )


class RolloutBuffer:
    """Fixed-size storage for `num_steps` steps of `num_envs` environments.

    Tensors are `(steps, envs)` on the CPU (text does not go to an accelerator, and the
    per-step tensors are tiny next to one LLM forward).
    """

    def __init__(self, num_steps: int, num_envs: int) -> None:
        self.num_steps = num_steps
        self.num_envs = num_envs
        self.prompts: list[list[str]] = [[] for _ in range(num_steps)]
        self.candidates: list[list[list[str]]] = [[] for _ in range(num_steps)]
        shape = (num_steps, num_envs)
        self.actions = torch.zeros(shape, dtype=torch.long)
        self.logprobs = torch.zeros(shape)
        self.values = torch.zeros(shape)
        self.rewards = torch.zeros(shape)
        self.dones = torch.zeros(shape, dtype=torch.bool)
        self.final_values = torch.zeros(shape)
        """Value of the final observation where an episode was truncated at that step (with
        `ppo.bootstrap_truncated`), 0 elsewhere."""
        self.step = 0

    def add(
        self,
        prompts: list[str],
        candidates: list[list[str]],
        actions: torch.Tensor,
        logprobs: torch.Tensor,
        values: torch.Tensor,
        rewards: torch.Tensor,
        dones: torch.Tensor,
    ) -> None:
        """Store one step: what each env's policy saw, chose and got. Tensors are `(envs,)`."""
        if self.step >= self.num_steps:
            raise IndexError(f"rollout buffer is full ({self.num_steps} steps)")
        if len(prompts) != self.num_envs or len(candidates) != self.num_envs:
            raise ValueError(f"expected {self.num_envs} prompts and candidate lists")
        t = self.step
        self.prompts[t] = list(prompts)
        self.candidates[t] = [list(c) for c in candidates]
        self.actions[t] = actions.detach().to("cpu", torch.long)
        self.logprobs[t] = logprobs.detach().to("cpu", torch.float32)
        self.values[t] = values.detach().to("cpu", torch.float32)
        self.rewards[t] = rewards.detach().to("cpu", torch.float32)
        self.dones[t] = dones.detach().to("cpu", torch.bool)
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
        return Transitions(
            prompts=[p for step in self.prompts for p in step],
            candidates=[c for step in self.candidates for c in step],
            actions=self.actions.reshape(-1),
            logprobs=self.logprobs.reshape(-1),
            values=self.values.reshape(-1),
            advantages=advantages.reshape(-1),
            returns=returns.reshape(-1),
        )
