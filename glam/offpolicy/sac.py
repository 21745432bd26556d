"""Discrete Soft Actor-Critic over a policy's candidate actions (Christodoulou, 2019; the
learner of SAC-GLAM), as pure tensor functions.

With a discrete action set the expectations over actions are sums, not samples. For a batch of
states with `(B, A)` logits (-inf where a candidate is absent: `mask` False), twin critics
`q1, q2` `(B, A)` and the entropy temperature alpha:

- the soft state value of a state: V(s) = sum_a pi(a|s) [min(q1, q2)(s, a) - alpha log pi(a|s)]
  (`soft_state_values`, from the target critics at the bootstrapped state);
- the critics' target of a stored transition: y = R + gamma^m V(s') where it bootstraps, R
  alone where the episode terminated (`critic_targets`; R, gamma^m and s' from
  `glam.offpolicy.returns.n_step_returns`);
- the critics' loss: the mean over the batch of (q1(s, a) - y)^2 + (q2(s, a) - y)^2, halved
  (`critic_loss`);
- the actor's loss: the mean over states of sum_a pi(a|s) [alpha log pi(a|s) - min(q1, q2)(s, a)],
  the critics held fixed (`actor_loss`);
- the temperature's loss: log(alpha) (H(pi(.|s)) - H_target), the entropy held fixed, whose
  gradient raises alpha when the policy's entropy is below the target and lowers it above
  (`temperature_loss`);
- the target critics follow the critics by Polyak averaging (`polyak_update`).
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
from torch import Tensor

__all__ = [
    "actor_loss",
    "critic_loss",
    "critic_targets",
    "policy_entropy",
    "polyak_update",
    "soft_state_values",
    "temperature_loss",
]


def _log_probs(logits: Tensor, mask: Tensor) -> tuple[Tensor, Tensor]:
    """`(probs, log_probs)` `(B, A)` of the candidates; 0 for both where a candidate is absent
    (so that pi log pi sums to the entropy without NaN)."""
    log_probs = torch.log_softmax(logits.masked_fill(~mask, float("-inf")), dim=-1)
    log_probs = log_probs.masked_fill(~mask, 0.0)
    return log_probs.exp() * mask, log_probs


def policy_entropy(logits: Tensor, mask: Tensor) -> Tensor:
    """`(B,)` the entropy of each state's distribution over its candidates."""
    probs, log_probs = _log_probs(logits, mask)
    return -(probs * log_probs).sum(-1)


def soft_state_values(
    logits: Tensor, q1: Tensor, q2: Tensor, mask: Tensor, alpha: float | Tensor
) -> Tensor:
    """`(B,)` V(s) = sum_a pi(a|s) [min(q1, q2)(s, a) - alpha log pi(a|s)]."""
    probs, log_probs = _log_probs(logits, mask)
    q = torch.minimum(q1, q2).masked_fill(~mask, 0.0)
    return (probs * (q - alpha * log_probs)).sum(-1)


def critic_targets(
    returns: Tensor, discounts: Tensor, bootstrap: Tensor, next_values: Tensor
) -> Tensor:
    """`(B,)` y = R + gamma^m V(s') where `bootstrap`, R alone elsewhere (no gradient)."""
    values = torch.where(bootstrap, next_values, torch.zeros_like(next_values))
    return (returns + discounts * values).detach()


def critic_loss(q1: Tensor, q2: Tensor, actions: Tensor, targets: Tensor) -> Tensor:
    """Half the mean over the batch of each critic's squared error at the taken action."""
    taken = actions.long()[:, None]
    error1 = q1.gather(1, taken)[:, 0] - targets
    error2 = q2.gather(1, taken)[:, 0] - targets
    return 0.5 * (error1.pow(2) + error2.pow(2)).mean()


def actor_loss(
    logits: Tensor, q1: Tensor, q2: Tensor, mask: Tensor, alpha: float | Tensor
) -> Tensor:
    """The mean over states of sum_a pi(a|s) [alpha log pi(a|s) - min(q1, q2)(s, a)], with the
    critics and alpha held fixed: its gradient moves only the policy."""
    probs, log_probs = _log_probs(logits, mask)
    q = torch.minimum(q1, q2).detach().masked_fill(~mask, 0.0)
    alpha = alpha.detach() if isinstance(alpha, Tensor) else alpha
    return (probs * (alpha * log_probs - q)).sum(-1).mean()


def temperature_loss(log_alpha: Tensor, entropy: Tensor, target_entropy: float) -> Tensor:
    """log(alpha) times the mean of (H(pi(.|s)) - H_target), the entropy held fixed: gradient
    descent raises alpha while the policy's entropy is below the target."""
    return log_alpha * (entropy.detach() - target_entropy).mean()


@torch.no_grad()
def polyak_update(
    targets: Iterable[torch.nn.Parameter], sources: Iterable[torch.nn.Parameter], tau: float
) -> None:
    """target <- (1 - tau) target + tau source, parameter by parameter (tau in (0, 1])."""
    if not 0.0 < tau <= 1.0:
        raise ValueError(f"Polyak averaging needs tau in (0, 1], got {tau}")
    for target, source in zip(targets, sources, strict=True):
        target.mul_(1.0 - tau).add_(source, alpha=tau)
