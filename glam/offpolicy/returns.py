"""n-step returns of stored steps (`n_step_returns`), the targets of an off-policy critic.

The steps are stored as the envs played them, `(T, E)`: step t of env e saw observation s_t,
took a_t, got r_t, and ended its episode there when `terminated` (the task's end: no value
after it) or `truncated` (the time limit: the state still has a value). `next_obs` of a step is
the observation that followed it: the next step's for an episode that goes on, the episode's
final observation at its end (the env has reset since, so the next stored step is another
episode's first).

For each step t the return sums at most n rewards of t's own episode,

    R_t = r_t + gamma r_{t+1} + ... + gamma^(m-1) r_{t+m-1},

m <= n stopping at the episode's end and at the last stored step, and the critic's target is
R_t + gamma^m V(next_obs_{t+m-1}) unless the episode terminated at t+m-1 (then R_t alone): a
time-out is bootstrapped from the final observation, as the episode would have gone on.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

__all__ = ["NStepReturns", "n_step_returns"]


@dataclass(frozen=True)
class NStepReturns:
    """What `n_step_returns` gives for every stored step, each `(T, E)`."""

    returns: Tensor
    """R_t: the discounted sum of the rewards of steps t to t+m-1."""
    discounts: Tensor
    """gamma^m, the weight of the bootstrapped value (0 where there is none)."""
    last: Tensor
    """t+m-1 (long): the step whose `next_obs` is bootstrapped from."""
    bootstrap: Tensor
    """True where the target adds gamma^m V(next_obs_last): the episode did not terminate."""


def n_step_returns(
    rewards: Tensor, terminated: Tensor, truncated: Tensor, gamma: float, n: int
) -> NStepReturns:
    """The n-step returns of stored steps `(T, E)` (see the module docstring).

    Args:
        rewards: `(T, E)` the reward of each step.
        terminated: `(T, E)` bool, the episode reached its end at this step.
        truncated: `(T, E)` bool, the episode hit its time limit at this step.
        gamma: the discount, in [0, 1].
        n: the most rewards summed, >= 1.

    Raises:
        ValueError: `n` < 1, `gamma` outside [0, 1], or shapes that differ.
    """
    if n < 1:
        raise ValueError(f"n-step returns need n >= 1, got {n}")
    if not 0.0 <= gamma <= 1.0:
        raise ValueError(f"the discount must be in [0, 1], got {gamma}")
    if not rewards.shape == terminated.shape == truncated.shape or rewards.dim() != 2:
        raise ValueError(
            f"rewards, terminated and truncated must share one (T, E) shape, got "
            f"{tuple(rewards.shape)}, {tuple(terminated.shape)}, {tuple(truncated.shape)}"
        )
    steps = rewards.shape[0]
    ended = terminated | truncated
    returns = torch.zeros_like(rewards, dtype=torch.float64)
    last = torch.arange(steps, device=rewards.device)[:, None].expand_as(rewards).clone()
    running = torch.ones_like(ended)  # the window of step t is still in t's episode
    for k in range(n):  # n is small: a loop over the window, tensors over (T, E)
        index = torch.arange(steps, device=rewards.device) + k
        inside = index < steps
        shifted = torch.zeros_like(returns)
        shifted[inside] = rewards[index[inside]].double()
        taking = running & inside[:, None]
        returns += torch.where(taking, gamma**k * shifted, 0.0)
        last = torch.where(taking, index[:, None].expand_as(last), last)
        ended_here = torch.zeros_like(ended)
        ended_here[inside] = ended[index[inside]]
        running = taking & ~ended_here
    length = last - torch.arange(steps, device=rewards.device)[:, None] + 1
    bootstrap = ~terminated.gather(0, last)
    discounts = torch.where(bootstrap, gamma ** length.double(), 0.0)
    return NStepReturns(returns.to(rewards.dtype), discounts.to(rewards.dtype), last, bootstrap)
