"""The PPO objective (clipped policy loss, clipped value loss, entropy bonus), pure functions."""

from __future__ import annotations

import torch


def normalize_advantages(
    advantages: torch.Tensor, mean: torch.Tensor | float, std: torch.Tensor | float
) -> torch.Tensor:
    """Shift and scale advantages by statistics computed by the caller (e.g. over all ranks)."""
    return (advantages - mean) / (std + 1e-8)


def ppo_loss(
    new_logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    new_values: torch.Tensor,
    old_values: torch.Tensor,
    returns: torch.Tensor,
    entropy: torch.Tensor,
    *,
    clip_eps: float,
    value_clip_eps: float | None,
    value_coef: float,
    entropy_coef: float,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """PPO's clipped surrogate loss on one minibatch of `(batch,)` tensors.

    `loss = policy_loss + value_coef * value_loss - entropy_coef * entropy`, with

    - policy_loss: `mean(max(-A r, -A clip(r, 1 - eps, 1 + eps)))`, `r = exp(new - old logp)`;
    - value_loss: `0.5 * mean(max((V - R)^2, (V_old + clip(V - V_old, +-veps) - R)^2))`, or the
      plain squared error when `value_clip_eps` is None.

    Returns:
        `(loss, stats)`: stats are detached scalars `policy`, `value`, `entropy`, `approx_kl`
        (the low-variance estimator `E[r - 1 - log r]`), `clip_fraction` and
        `ratio_max_deviation` (`max |r - 1|`, exactly 0 on the first minibatch of an update).
    """
    log_ratio = new_logprobs - old_logprobs
    ratio = log_ratio.exp()
    policy_loss = torch.max(
        -advantages * ratio, -advantages * ratio.clamp(1.0 - clip_eps, 1.0 + clip_eps)
    ).mean()

    value_error = (new_values - returns).square()
    if value_clip_eps is not None:
        clipped_values = old_values + (new_values - old_values).clamp(
            -value_clip_eps, value_clip_eps
        )
        value_error = torch.max(value_error, (clipped_values - returns).square())
    value_loss = 0.5 * value_error.mean()

    entropy_mean = entropy.mean()
    loss = policy_loss + value_coef * value_loss - entropy_coef * entropy_mean
    with torch.no_grad():
        stats = {
            "policy": policy_loss.detach(),
            "value": value_loss.detach(),
            "entropy": entropy_mean.detach(),
            "approx_kl": ((ratio - 1.0) - log_ratio).mean(),
            "clip_fraction": ((ratio - 1.0).abs() > clip_eps).float().mean(),
            "ratio_max_deviation": (ratio - 1.0).abs().max(),
        }
    return loss, stats


def explained_variance(predictions: torch.Tensor, targets: torch.Tensor) -> float:
    """`1 - Var(targets - predictions) / Var(targets)`: 1 is perfect, <= 0 no better than a
    constant; NaN when the targets do not vary."""
    target_variance = targets.var(unbiased=False)
    if target_variance == 0:
        return float("nan")
    return float(1.0 - (targets - predictions).var(unbiased=False) / target_variance)
