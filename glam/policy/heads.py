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


class RunningNorm(nn.Module):
    """Per-dimension standardisation with running statistics: `(x - mean) / sqrt(var + eps)`,
    clipped to +-`clip`.

    The statistics are those of every batch it has seen in eval mode without gradients (the
    rollout's forwards; an evaluation's too), merged exactly (Chan et al.'s parallel variance),
    and fixed in train mode (the update) and under autograd. Before any batch it is the identity.
    They are buffers: saved and restored with the head.
    """

    def __init__(self, features: int, eps: float = 1e-5, clip: float = 10.0) -> None:
        super().__init__()
        self.eps, self.clip = eps, clip
        self.register_buffer("count", torch.zeros((), dtype=torch.float64))
        self.register_buffer("mean", torch.zeros(features, dtype=torch.float64))
        self.register_buffer("var", torch.ones(features, dtype=torch.float64))

    @torch.no_grad()
    def update(self, x: Tensor) -> None:
        """Merge the statistics of the rows of `x` `(B, features)` into the running ones."""
        x = x.detach().to(torch.float64)
        n = x.shape[0]
        if n == 0:
            return
        batch_mean, batch_var = x.mean(0), x.var(0, unbiased=False)
        total = self.count + n
        delta = batch_mean - self.mean
        m2 = self.var * self.count + batch_var * n + delta.square() * self.count * n / total
        self.mean += delta * n / total
        self.var.copy_(m2 / total)
        self.count.copy_(total)

    def forward(self, x: Tensor) -> Tensor:
        if not self.training and not torch.is_grad_enabled():
            self.update(x)
        if not self.count:
            return x
        scale = (self.var + self.eps).rsqrt()
        normed = (x.to(torch.float64) - self.mean) * scale
        return normed.clamp(-self.clip, self.clip).to(x.dtype)


class ValueHead(nn.Module):
    """State value from the prompt representation: (B, hidden_size) -> (B,).

    `normalize` standardises its input first (`RunningNorm`): the last prompt token's state of a
    pretrained model holds a few large, nearly constant dimensions (SmolLM2-135M on GoToRedBall:
    5 dimensions carry 59% of its squared norm, and 0.6% of it varies between states,
    docs/diagnosis_gotoredball.md), so an MLP on the raw state sees the differences between
    states at a small fraction of its input's scale.
    """

    def __init__(
        self,
        hidden_size: int,
        hidden_sizes: Sequence[int] = (1024, 1024),
        activation: str = "sigmoid",
        normalize: bool = False,
        time: bool = False,
    ) -> None:
        super().__init__()
        self.norm = RunningNorm(hidden_size) if normalize else None
        self.time = time
        """Read the episode's elapsed share of its time limit beside the state
        (`policy.value_time`): one more input, after the norm."""
        self.net = mlp(hidden_size + int(time), hidden_sizes, 1, activation)

    def forward(self, hidden: Tensor, elapsed: Tensor | None = None) -> Tensor:
        """`elapsed` `(B,)`: the share of its time limit each state's episode has used, read
        by a head with `time` (required there, ignored otherwise)."""
        if self.norm is not None:
            with torch.autocast(device_type=hidden.device.type, enabled=False):
                hidden = self.norm(hidden.float())
        if self.time:
            if elapsed is None:
                raise ValueError(
                    "this value head reads the episode's elapsed time (policy.value_time=true), "
                    "and none was given"
                )
            elapsed = elapsed.to(hidden.device, torch.float32).reshape(-1, 1)
            hidden = torch.cat([hidden.float(), elapsed], dim=1)
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
