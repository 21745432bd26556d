"""What a rollout's episodes add up to, and a quick check of a policy on a few episodes.

The environments themselves, with their prompt histories and seed schedule, are
`glam.envs.EnvRunner`'s; `EpisodeStats` sums the episodes that ended during a rollout (over
processes), and `play_episodes` plays one episode per env with a policy.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from glam.envs import EnvRunner
from glam.policy.observations import new_episodes_forget, policy_inputs


@dataclass
class EpisodeStats:
    """Sums over the episodes that ended during a rollout (summable over processes)."""

    count: int = 0
    successes: int = 0
    returns: float = 0.0
    lengths: int = 0

    def add(self, episode: dict[str, Any]) -> None:
        """Count one ended episode (`infos[i]["episode"]` of `TextVectorEnv`)."""
        self.count += 1
        self.successes += int(bool(episode["success"]))
        self.returns += float(episode["return"])
        self.lengths += int(episode["length"])

    def as_tensor(self) -> torch.Tensor:
        """`[count, successes, returns, lengths]`, for a sum over processes."""
        return torch.tensor(
            [self.count, self.successes, self.returns, self.lengths], dtype=torch.float64
        )


@torch.no_grad()
def play_episodes(
    policy: torch.nn.Module, runner: EnvRunner, *, greedy: bool = False
) -> list[dict[str, Any]]:
    """Play the next episode of every env of `runner` with `policy`; return their stats.

    A quick check of a policy on a fixed set of seeds (those of `runner`'s schedule), used by
    the learning test; `glam.eval` is the full evaluation harness. A policy with memory
    (`memory_size`) carries one per env, zero at each episode's start.
    """
    runner.reset()
    results: list[dict[str, Any] | None] = [None] * runner.num_envs
    size = getattr(policy, "memory_size", 0)
    memory = torch.zeros(runner.num_envs, size) if size else None
    while any(result is None for result in results):
        output = policy(**policy_inputs(runner.observations(), memory))
        actions = output.logits.argmax(-1) if greedy else output.dist.sample()
        _, dones, episodes = runner.step(actions.tolist())
        if memory is not None:
            memory = new_episodes_forget(output.memory, dones)
        for i, episode in enumerate(episodes):
            if episode is not None and results[i] is None:
                results[i] = episode
    return results  # type: ignore[return-value]
