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
    final_values: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Advantages and returns of a rollout of `steps` steps in `envs` environments.

    Convention: `dones[t]` is true when the episode ended with the action of step `t` (the
    observation at `t + 1` then starts a new episode), so nothing is bootstrapped across it.
    By default time-outs count as terminal (GLAM's choice: BabyAI's prompt does not show the step
    count). With `final_values`, an episode cut by a time-out at step `t` is bootstrapped from the
    value of its final observation: `delta_t = r_t + gamma * final_values[t] - values[t]`, and the
    advantage recursion still stops there (the next step belongs to another episode).

    Args:
        rewards: `(steps, envs)` rewards received after each action.
        values: `(steps, envs)` value estimates of the states the actions were taken in.
        dones: `(steps, envs)` episode-ended flags (bool or 0/1).
        last_values: `(envs,)` value of the state after the last step (the bootstrap).
        gamma: discount factor.
        gae_lambda: GAE lambda (0: one-step TD errors, 1: Monte-Carlo returns minus values).
        final_values: `(steps, envs)` value of the final observation where the episode was
            truncated by a time-out at that step, 0 elsewhere (None: no bootstrap).

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
    if final_values is not None:
        if final_values.shape != rewards.shape:
            raise ValueError(f"final_values {tuple(final_values.shape)} must be (steps, envs)")
        deltas = deltas + gamma * final_values.to(values.dtype) * dones.to(values.dtype)
    advantages = torch.zeros_like(values)
    running = torch.zeros_like(last_values)
    # The recursion is sequential in time but vectorised over environments.
    for t in reversed(range(rewards.shape[0])):
        running = deltas[t] + gamma * gae_lambda * not_done[t] * running
        advantages[t] = running
    return advantages, advantages + values
