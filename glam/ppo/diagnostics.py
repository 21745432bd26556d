"""What a PPO update's gradient is made of: the policy's part and the value's part.

With a critic that shares the trainable weights (a value head on the language model's last
prompt token, LoRA below it), one clipped gradient carries both objectives. When the value
loss's gradient is much larger than the policy's, clipping the sum to `ppo.max_grad_norm`
shrinks the policy's step, and Adam's per-weight scaling follows the value's gradient: the
policy learns slowly whatever its advantages say. `gradient_split` measures it on the update's
first micro-batch, before any step (so the ratio is 1 and nothing is clipped yet), over the
weights both parts train (the shared ones: the adapter or the trunk; not the value head's own
weights, which only the value loss trains, nor the action heads'):

- `grad/policy_norm`: the norm of the gradient of `policy_loss - entropy_coef * entropy`;
- `grad/value_norm`: the norm of the gradient of `value_coef * value_loss`;
- `grad/value_share`: `|g_v|^2 / (|g_p|^2 + |g_v|^2)`, the value's share of the two squared
  norms (0: the shared weights move for the policy; 1: for the value);
- `grad/cosine`: the cosine between the two (negative: they pull the shared weights apart).

NaN where no weight is shared (a critic of its own).

It costs one more forward and two backward passes of one micro-batch per update, and runs on
the policy module itself (outside DDP's hooks, so it never syncs), on each process's own
micro-batch: the metrics are the processes' mean.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from glam.config import PPOConfig
from glam.ppo.losses import ppo_loss

__all__ = ["GRADIENT_SPLIT_KEYS", "gradient_split"]

GRADIENT_SPLIT_KEYS = ("grad/policy_norm", "grad/value_norm", "grad/value_share", "grad/cosine")


def gradient_split(
    output_logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    values: torch.Tensor,
    old_values: torch.Tensor,
    returns: torch.Tensor,
    entropy: torch.Tensor,
    ppo: PPOConfig,
    parameters: Sequence[torch.Tensor],
) -> dict[str, float]:
    """The `GRADIENT_SPLIT_KEYS` of PPO's loss on one micro-batch (the tensors of `ppo_loss`,
    still attached to the graph of `parameters`), over the parameters both parts reach;
    `parameters` get no `.grad`."""
    settings = dict(
        clip_eps=ppo.clip_eps,
        value_clip_eps=ppo.value_clip_eps,
        value_coef=ppo.value_coef,
        entropy_coef=ppo.entropy_coef,
    )
    # Each part is PPO's loss with the other part's inputs detached: its gradient is that
    # part's alone, and a weight the part does not reach gets none (not a zero).
    policy_part, _ = ppo_loss(
        output_logprobs,
        old_logprobs,
        advantages,
        values.detach(),
        old_values,
        returns,
        entropy,
        **settings,
    )
    value_part, _ = ppo_loss(
        output_logprobs.detach(),
        old_logprobs,
        advantages,
        values,
        old_values,
        returns,
        entropy.detach(),
        **settings,
    )
    grads = [
        torch.autograd.grad(part, parameters, retain_graph=True, allow_unused=True)
        for part in (policy_part, value_part)
    ]
    shared = [
        (g_p, g_v) for g_p, g_v in zip(*grads, strict=True) if g_p is not None and g_v is not None
    ]
    if not shared:
        return dict.fromkeys(GRADIENT_SPLIT_KEYS, float("nan"))
    flat = [torch.cat([pair[k].reshape(-1).double() for pair in shared]) for k in (0, 1)]
    policy_norm, value_norm = (float(v.norm()) for v in flat)
    squares = policy_norm**2 + value_norm**2
    product = policy_norm * value_norm
    return {
        "grad/policy_norm": policy_norm,
        "grad/value_norm": value_norm,
        "grad/value_share": value_norm**2 / squares if squares > 0 else float("nan"),
        "grad/cosine": float(flat[0] @ flat[1]) / product if product > 0 else float("nan"),
    }
