"""Generalised advantage estimation (Schulman et al., 2016), as a pure tensor function."""

from __future__ import annotations

import torch


def compute_gae(
    rewards: torch.Tensor,
    values: torch.Tensor,
    dones: torch.Tensor,
    last_values: torch.Tensor,
    *,
    gamma: float,
    gae_lambda: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Advantages and returns of a rollout of `steps` steps in `envs` environments.

    Convention: `dones[t]` is true when the episode ended with the action of step `t` (the
    observation at `t + 1` then starts a new episode), so nothing is bootstrapped across it.
    Time-outs count as ends: BabyAI's prompt does not show the step count, so a state just before
    the time limit looks like any other and its value cannot be bootstrapped meaningfully.

    Args:
        rewards: `(steps, envs)` rewards received after each action.
        values: `(steps, envs)` value estimates of the states the actions were taken in.
        dones: `(steps, envs)` episode-ended flags (bool or 0/1).
        last_values: `(envs,)` value of the state after the last step (the bootstrap).
        gamma: discount factor.
        gae_lambda: GAE lambda (0: one-step TD errors, 1: Monte-Carlo returns minus values).

    Returns:
        `(advantages, returns)`, each `(steps, envs)`, with `returns = advantages + values`.
    """
    if rewards.shape != values.shape or rewards.shape != dones.shape:
        raise ValueError(
            f"rewards {tuple(rewards.shape)}, values {tuple(values.shape)} and dones "
            f"{tuple(dones.shape)} must have the same (steps, envs) shape"
        )
    if last_values.shape != rewards.shape[1:]:
        raise ValueError(f"last_values {tuple(last_values.shape)} must be (envs,)")
    not_done = 1.0 - dones.to(values.dtype)
    next_values = torch.cat([values[1:], last_values.unsqueeze(0)], dim=0)
    deltas = rewards + gamma * next_values * not_done - values  # (steps, envs)
    advantages = torch.zeros_like(values)
    running = torch.zeros_like(last_values)
    # The recursion is sequential in time but vectorised over environments.
    for t in reversed(range(rewards.shape[0])):
        running = deltas[t] + gamma * gae_lambda * not_done[t] * running
        advantages[t] = running
    return advantages, advantages + values
