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

    value_loss = clipped_value_loss(new_values, old_values, returns, value_clip_eps)

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


def clipped_value_loss(
    new_values: torch.Tensor,
    old_values: torch.Tensor,
    returns: torch.Tensor,
    value_clip_eps: float | None,
) -> torch.Tensor:
    """PPO's value loss, `0.5 * mean(max((V - R)^2, (V_old + clip(V - V_old, +-veps) - R)^2))`,
    or the plain squared error when `value_clip_eps` is None."""
    value_error = (new_values - returns).square()
    if value_clip_eps is not None:
        clipped_values = old_values + (new_values - old_values).clamp(
            -value_clip_eps, value_clip_eps
        )
        value_error = torch.max(value_error, (clipped_values - returns).square())
    return 0.5 * value_error.mean()


def explained_variance(predictions: torch.Tensor, targets: torch.Tensor) -> float:
    """`1 - Var(targets - predictions) / Var(targets)`: 1 is perfect, <= 0 no better than a
    constant; NaN when the targets do not vary."""
    target_variance = targets.var(unbiased=False)
    if target_variance == 0:
        return float("nan")
    return float(1.0 - (targets - predictions).var(unbiased=False) / target_variance)


def clipped_surrogate_loss(
    new_logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    weights: torch.Tensor,
    *,
    clip_eps: float,
    token_mask: torch.Tensor | None = None,
    entropy: torch.Tensor | None = None,
    entropy_coef: float = 0.0,
    kl_new_logprobs: torch.Tensor | None = None,
    kl_ref_logprobs: torch.Tensor | None = None,
    kl_mask: torch.Tensor | None = None,
    kl_coef: float = 0.0,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """The policy loss of GRPO and GiGPO on one micro-batch of B rows: PPO's clipped surrogate,
    a KL penalty to a reference, an entropy bonus, and no value term.

    - Sequence level (`token_mask` None): `new_logprobs`, `old_logprobs` are `(B,)`, one ratio
      per row (the whole answer's).
    - Token level: they are `(B, T)` with `token_mask` `(B, T)`; each token has its ratio and its
      clipped surrogate, and a row's is the mean over its tokens (GRPO's `1/|o| sum_t`).
    - KL (with `kl_coef` > 0): the k3 estimator `exp(ref - new) - (ref - new) - 1` per token of
      `kl_new_logprobs` and `kl_ref_logprobs` `(B, T)` under `kl_mask`, averaged per row: 0 when
      the policy is the reference.

    A row's loss is `surrogate + kl_coef * kl - entropy_coef * entropy`, and the loss is
    `sum(weights * row loss) / B`: rows of weight 0 (steps of cut episodes) count for nothing, and
    the result does not depend on how a minibatch is cut into micro-batches.

    Returns:
        `(loss, stats)`: stats are detached scalars over the rows of weight > 0: `policy`,
        `value` (NaN: there is no critic), `entropy`, `approx_kl` (to the rollout policy),
        `kl_ref`, `clip_fraction`; and `ratio_max_deviation`, `max |r - 1|` over every row.
    """
    log_ratio = new_logprobs - old_logprobs
    ratio = log_ratio.exp()
    if token_mask is None:
        row_advantages = advantages
        real = torch.ones_like(ratio, dtype=torch.bool)
    else:
        row_advantages = advantages[:, None]
        real = token_mask.bool()
    surrogate = torch.max(
        -row_advantages * ratio, -row_advantages * ratio.clamp(1.0 - clip_eps, 1.0 + clip_eps)
    )

    def per_row(values: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
        if mask is None:
            return values
        mask = mask.to(values.dtype)
        return (values * mask).sum(-1) / mask.sum(-1).clamp(min=1)

    row_loss = per_row(surrogate, token_mask)
    kl = torch.zeros_like(row_loss)
    if kl_coef > 0:
        if kl_new_logprobs is None or kl_ref_logprobs is None or kl_mask is None:
            raise ValueError("kl_coef > 0 needs kl_new_logprobs, kl_ref_logprobs and kl_mask")
        delta = kl_ref_logprobs - kl_new_logprobs
        kl = per_row(delta.exp() - delta - 1.0, kl_mask)
    entropy = torch.zeros_like(row_loss) if entropy is None else entropy
    weights = weights.to(row_loss.dtype)
    total = (weights * (row_loss + kl_coef * kl - entropy_coef * entropy)).sum() / len(weights)
    with torch.no_grad():
        trained = weights > 0
        count = trained.sum().clamp(min=1)
        token_trained = trained[:, None] & real if token_mask is not None else trained
        tokens = token_trained.sum().clamp(min=1)
        stats = {
            "policy": (row_loss * trained).sum() / count,
            "value": torch.tensor(float("nan")),
            "entropy": (entropy * trained).sum() / count,
            "approx_kl": (((ratio - 1.0) - log_ratio) * token_trained).sum() / tokens,
            "kl_ref": (kl * trained).sum() / count,
            "clip_fraction": (((ratio - 1.0).abs() > clip_eps) & token_trained).sum() / tokens,
            "ratio_max_deviation": ((ratio - 1.0).abs() * real).max(),
        }
    return total, stats
