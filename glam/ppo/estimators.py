"""Group-relative advantages (GRPO, GiGPO) of a rollout, as pure tensor functions.

A rollout is `(steps, envs)` tensors, as the buffer keeps them: `dones[t, e]` is true when env
e's episode ended with the action of step t. The envs come in groups of `group_size` consecutive
envs that play the same seeds (`babyai_text.TextVectorEnv`'s groups) and start every rollout on a
new episode together, so the k-th episode of every env of group g within a rollout is the same
task (the same seed): `(g, k)` names an episode group. An episode counts once it ends within the
rollout; the steps of an episode the rollout cut are not trained on (`mask` False).

- **GRPO** (Shao et al., 2024): an episode's advantage is its return minus the mean of its
  group's returns, divided by their standard deviation (unbiased, + 1e-6, verl's); every step of
  the episode gets it. An episode alone in its group (the others were cut by the rollout's end)
  gets 0: it is compared with nothing. (verl keeps the return of a prompt sampled once, with mean
  0 and std 1; there every episode ends, here a lone one would be trained on its raw, scaled
  return.)
- **GiGPO** (Feng et al., NeurIPS 2025; verl-agent): GRPO's episode advantage plus `weight` x a
  step advantage. The steps of a group's episodes that read the same observation (an "anchor
  state") form a step group; a step's discounted return within its episode is normalised in its
  step group the same way; a step alone in its step group gets 0 (verl-agent's `step_norm_reward`:
  it is its own mean). verl-agent computes the episode-level mean and std over the group's steps
  (an episode weighs by its length); here over its episodes, as GRPO and the paper define it.

With `std_normalize=False` only the mean is subtracted (Dr. GRPO; GiGPO's `mean_norm` mode, the
default of verl-agent's function, whose ALFWorld example sets `mean_std_norm`).
"""

from __future__ import annotations

import torch
from torch import Tensor

__all__ = [
    "complete_episodes",
    "discounted_returns",
    "episode_numbers",
    "gigpo_advantages",
    "grpo_advantages",
    "normalize_in_groups",
]

EPSILON = 1e-6
"""Added to a group's standard deviation (verl's)."""


def episode_numbers(dones: Tensor) -> Tensor:
    """`(steps, envs)` long: which episode of its env (0, 1, ...) within the rollout each step
    belongs to."""
    done = dones.long()
    return done.cumsum(0) - done


def complete_episodes(dones: Tensor) -> Tensor:
    """`(steps, envs)` bool: the step's episode ends within the rollout (at it or later)."""
    return dones.long().flip(0).cumsum(0).flip(0) > 0


def discounted_returns(rewards: Tensor, dones: Tensor, gamma: float) -> Tensor:
    """`(steps, envs)`: each step's discounted return to the end of its episode (to the end of
    the rollout for an episode it cut)."""
    not_done = 1.0 - dones.to(rewards.dtype)
    returns = torch.zeros_like(rewards)
    running = torch.zeros_like(rewards[0])
    for t in reversed(range(rewards.shape[0])):
        running = rewards[t] + gamma * not_done[t] * running
        returns[t] = running
    return returns


def normalize_in_groups(
    values: Tensor, groups: Tensor, counted: Tensor, *, std_normalize: bool
) -> Tensor:
    """`values` `(N,)` centred (and scaled) by the mean (and unbiased std, + 1e-6) of the
    `counted` values of their group (`groups` `(N,)` ids from 0); 0 in a group of fewer than
    two counted values. Values not `counted` get their group's statistics (callers mask them).
    """
    size = int(groups.max()) + 1 if len(groups) else 0
    weight = counted.to(values.dtype)
    count = torch.zeros(size, dtype=values.dtype).index_add(0, groups, weight)
    mean = torch.zeros(size, dtype=values.dtype).index_add(0, groups, values * weight)
    mean = mean / count.clamp(min=1)
    deviation = (values - mean[groups]) * weight
    variance = torch.zeros(size, dtype=values.dtype).index_add(0, groups, deviation.square())
    std = (variance / (count - 1).clamp(min=1)).sqrt()
    centred = values - mean[groups]
    normalized = centred / (std[groups] + EPSILON) if std_normalize else centred
    return normalized.masked_fill((count <= 1)[groups], 0.0)


def _ids(*columns: Tensor) -> Tensor:
    """One id from 0 per distinct row of the stacked `columns` (each `(N,)` long)."""
    return torch.unique(torch.stack(columns, 1), dim=0, return_inverse=True)[1]


def grpo_advantages(
    rewards: Tensor, dones: Tensor, group_size: int, *, std_normalize: bool = True
) -> tuple[Tensor, Tensor]:
    """GRPO's episode-level advantages of a rollout (the module docstring).

    Returns:
        `(advantages, mask)`, each `(steps, envs)`: every step gets its episode's advantage;
        `mask` is False on the steps of episodes the rollout cut (their advantage is 0).
    """
    steps, envs = rewards.shape
    if envs % group_size:
        raise ValueError(f"group_size={group_size} does not divide the {envs} envs")
    number = episode_numbers(dones).reshape(-1)
    env = torch.arange(envs).repeat(steps)
    mask = complete_episodes(dones)
    episode = _ids(env, number)  # (steps * envs,) one id per (env, k)
    episodes = int(episode.max()) + 1
    totals = torch.zeros(episodes, dtype=rewards.dtype).index_add(0, episode, rewards.reshape(-1))
    ended = torch.zeros(episodes, dtype=torch.bool).index_fill(0, episode[mask.reshape(-1)], True)
    # Each episode's group (g, k), read from any of its steps.
    group_of = torch.zeros(episodes, dtype=torch.long)
    group_of[episode] = _ids(env // group_size, number)
    per_episode = normalize_in_groups(totals, group_of, ended, std_normalize=std_normalize)
    advantages = (per_episode[episode] * mask.reshape(-1)).reshape(steps, envs)
    return advantages, mask


def gigpo_advantages(
    rewards: Tensor,
    dones: Tensor,
    anchors: Tensor,
    group_size: int,
    *,
    gamma: float,
    weight: float = 1.0,
    std_normalize: bool = True,
) -> tuple[Tensor, Tensor, Tensor]:
    """GiGPO's advantages: GRPO's episode-level ones plus `weight` x the step-level ones.

    `anchors` `(steps, envs)` long: an id per distinct observation (equal ids: the same
    observation). Returns `(advantages, mask, step_group_sizes)`, the last `(steps, envs)` the
    size of each step's step group (1: no other step of its episode group saw its observation).
    """
    steps, envs = rewards.shape
    episode_advantages, mask = grpo_advantages(
        rewards, dones, group_size, std_normalize=std_normalize
    )
    number = episode_numbers(dones).reshape(-1)
    env = torch.arange(envs).repeat(steps)
    step_group = _ids(env // group_size, number, anchors.reshape(-1))
    counted = mask.reshape(-1)
    returns = discounted_returns(rewards, dones, gamma).reshape(-1)
    step_advantages = normalize_in_groups(returns, step_group, counted, std_normalize=std_normalize)
    sizes = torch.zeros(int(step_group.max()) + 1).index_add(0, step_group, counted.float())
    step_advantages = (step_advantages * counted).reshape(steps, envs)
    advantages = episode_advantages + weight * step_advantages
    return advantages, mask, sizes[step_group].reshape(steps, envs) * mask
