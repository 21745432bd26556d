"""MLP heads on the prompt's final hidden state: the critic, and the action-heads policy.

Both read one vector per prompt (the last prompt token for causal models, the first decoder
position for encoder-decoder ones), so they depend on the prompt only. The original GLAM heads
are hidden -> 1024 -> 1024 -> out with sigmoid activations.

Both heads run in fp32 whatever the language model's dtype and whatever autocast is active
around them (Accelerate's `mixed_precision: bf16` runs the whole policy's forward under autocast,
which would otherwise compute every `nn.Linear` in bf16): the value regression is sensitive to
bf16 rounding (8 bits of mantissa are about 2-3 significant digits of a return), and the action
heads' outputs are the policy's logits, whose bf16 rounding (up to 0.03 on a logit of 8) would
land in PPO's probability ratio as noise. The heads are small MLPs: fp32 costs nothing visible.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor, nn

ACTIVATIONS: dict[str, type[nn.Module]] = {
    "sigmoid": nn.Sigmoid,
    "relu": nn.ReLU,
    "tanh": nn.Tanh,
    "gelu": nn.GELU,
}


def mlp(
    in_features: int, hidden_sizes: Sequence[int], out_features: int, activation: str
) -> nn.Sequential:
    """Linear layers of the given widths with `activation` between them (none after the last)."""
    if activation not in ACTIVATIONS:
        raise ValueError(f"activation={activation!r} is not one of {sorted(ACTIVATIONS)}")
    widths = [in_features, *hidden_sizes]
    layers: list[nn.Module] = []
    for width_in, width_out in zip(widths[:-1], widths[1:], strict=True):
        layers += [nn.Linear(width_in, width_out), ACTIVATIONS[activation]()]
    layers.append(nn.Linear(widths[-1], out_features))
    return nn.Sequential(*layers)


def run_fp32(net: nn.Module, hidden: Tensor) -> Tensor:
    """`net(hidden)` in fp32 with autocast switched off (an outer autocast would run it in bf16)."""
    with torch.autocast(device_type=hidden.device.type, enabled=False):
        return net(hidden.float())


class ValueHead(nn.Module):
    """State value from the prompt representation: (B, hidden_size) -> (B,)."""

    def __init__(
        self,
        hidden_size: int,
        hidden_sizes: Sequence[int] = (1024, 1024),
        activation: str = "sigmoid",
    ) -> None:
        super().__init__()
        self.net = mlp(hidden_size, hidden_sizes, 1, activation)

    def forward(self, hidden: Tensor) -> Tensor:
        return run_fp32(self.net, hidden).squeeze(-1)


class ActionHeads(nn.Module):
    """One logit per action from the prompt representation: (B, hidden_size) -> (B, A).

    The paper's AFlan-T5 and NPAE variants: no string scoring, the action words are only indices.
    """

    def __init__(
        self,
        hidden_size: int,
        num_actions: int,
        hidden_sizes: Sequence[int] = (1024, 1024),
        activation: str = "sigmoid",
    ) -> None:
        super().__init__()
        if num_actions < 1:
            raise ValueError(f"num_actions must be >= 1, got {num_actions}")
        self.net = mlp(hidden_size, hidden_sizes, num_actions, activation)

    def forward(self, hidden: Tensor) -> Tensor:
        return run_fp32(self.net, hidden)
