"""Rollout storage: what the policy saw and did at each step of each local environment.

For a policy with memory the buffer also keeps the memory each step read, and hands the rollout
to the update env by env (`RolloutBuffer.transitions`): a sequence of consecutive steps of one env
is then a run of consecutive positions, which the update replays with that memory.
"""

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
    dones: torch.Tensor | None = None
    """`(batch,)` the episode ended with this step's action (the next step of the env starts
    from a zero memory); None where not recorded."""
    memories: torch.Tensor | None = None
    """`(batch, memory_size)` the memory the policy read at this step (a policy with memory);
    None for a policy without memory."""
    mask: torch.Tensor | None = None
    """`(batch,)` bool: the transitions the loss trains on (a group estimator leaves out the
    steps of episodes the rollout cut, `glam.ppo.algorithms`); None: all of them."""

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
            dones=None if self.dones is None else self.dones[index],
            memories=None if self.memories is None else self.memories[index],
            mask=None if self.mask is None else self.mask[index],
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
        self.memories: torch.Tensor | None = None
        """`(steps, envs, memory_size)` the memory each env's policy read at each step (a policy
        with memory; made at first use), None for a policy without memory."""
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
        memories: torch.Tensor | None = None,
    ) -> None:
        """Store one step: what each env's policy saw, chose and got. Tensors are `(envs,)`;
        `extras` are `(envs, ...)` tensors of the hooks, by name (the same names every step);
        `memories` `(envs, memory_size)` the memory a policy with memory read (at every step of
        a rollout or at none)."""
        if self.step >= self.num_steps:
            raise IndexError(f"rollout buffer is full ({self.num_steps} steps)")
        if len(observations) != self.num_envs:
            raise ValueError(f"expected {self.num_envs} observations, got {len(observations)}")
        t = self.step
        if t == 0:
            self.memories = (
                None
                if memories is None
                else torch.zeros((self.num_steps, *memories.shape), dtype=torch.float32)
            )
        if (memories is None) != (self.memories is None):
            raise ValueError(
                f"step {t} {'brings no' if memories is None else 'brings a'} memory, the "
                f"rollout's first step {'did' if memories is None else 'did not'}"
            )
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
        if memories is not None:
            self.memories[t] = memories.detach().to("cpu", torch.float32)
        self.step += 1

    @property
    def full(self) -> bool:
        """True once `num_steps` steps are stored."""
        return self.step == self.num_steps

    def reset(self) -> None:
        """Empty the buffer for the next rollout (and let go of the stored observations)."""
        self.step = 0
        self.final_values.zero_()
        self.observations = [None] * self.num_steps

    def transitions(
        self,
        advantages: torch.Tensor,
        returns: torch.Tensor,
        mask: torch.Tensor | None = None,
    ) -> Transitions:
        """All stored steps as one flat batch: step-major (`t * num_envs + env`), or env-major
        (`env * num_steps + t`) when the policy has memory, so that consecutive steps of an env
        are consecutive positions (the update's sequences).

        `advantages` and `returns` are `(steps, envs)`, as GAE computes them; `mask` `(steps,
        envs)` the transitions to train on (None: all).
        """
        if not self.full:
            raise RuntimeError(f"rollout buffer holds {self.step} of {self.num_steps} steps")
        first = self.observations[0]
        observations = type(first).cat(self.observations)
        if self.memories is None:
            flat = _step_major
        else:
            flat = _env_major
            order = torch.arange(self.num_steps * self.num_envs).reshape(self.num_steps, -1)
            observations = observations.select(flat(order).tolist())
        return Transitions(
            observations=observations,
            actions=flat(self.actions),
            logprobs=flat(self.logprobs),
            values=flat(self.values),
            advantages=flat(advantages),
            returns=flat(returns),
            extras={name: flat(values) for name, values in self.extras.items()},
            dones=flat(self.dones),
            memories=None if self.memories is None else flat(self.memories),
            mask=None if mask is None else flat(mask),
        )


def _step_major(values: torch.Tensor) -> torch.Tensor:
    """`(steps, envs, ...)` -> `(steps * envs, ...)`, position `t * envs + env`."""
    return values.reshape(-1, *values.shape[2:])


def _env_major(values: torch.Tensor) -> torch.Tensor:
    """`(steps, envs, ...)` -> `(envs * steps, ...)`, position `env * steps + t`."""
    return values.transpose(0, 1).reshape(-1, *values.shape[2:])


def sequence_positions(sequences: torch.Tensor, recurrence: int) -> torch.Tensor:
    """Positions in an env-major batch (`RolloutBuffer.transitions` of a policy with memory) of
    the sequences numbered `sequences` `(S,)`, sequence j being positions `j * recurrence` to
    `j * recurrence + recurrence - 1`: `(recurrence * S,)`, step by step (the first step of
    every sequence, then the second...). With `recurrence` 1, `sequences` themselves."""
    steps = torch.arange(recurrence, dtype=sequences.dtype)
    return (sequences[None, :] * recurrence + steps[:, None]).reshape(-1)
