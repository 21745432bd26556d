"""The update's algorithm: how a rollout becomes advantages, and which loss trains on them.

One loop (`glam.ppo.trainer`), several algorithms chosen by `algorithm.name`, as verl keeps its
advantage estimators in one registry. Each is a small object with two methods:

- `advantages(buffer, last_values, accelerator)` -> the flat batch of transitions with their
  advantages and returns (and, for the group estimators, the mask of the transitions trained
  on), plus metrics;
- `loss(output, batch, device)` -> a micro-batch's loss and its statistics.

`PPO` is the trainer's PPO as it was (GAE, then `ppo_loss`): with `algorithm.name=ppo` every
number is what it was (tests/test_algorithms.py compares with figures recorded before the seam).
`GRPO` and `GiGPO` need no value head (the policy's is frozen and its values are 0), estimate
advantages from groups of episodes (`glam.ppo.estimators`), and train with
`clipped_surrogate_loss`: PPO's clipped ratio at the level `algorithm.clip_level` says, a KL
penalty to the reference (a writing policy's answers carry the reference's log-probabilities),
the entropy bonus of `ppo.entropy_coef`. Their advantages are not normalised again over the
rollout: they are already relative to their groups.
"""

from __future__ import annotations

from collections.abc import Hashable
from typing import Any

import torch
from accelerate import Accelerator
from torch import Tensor

from glam.config import PPOConfig
from glam.policy.observations import GridObservations
from glam.policy.output import PolicyOutput
from glam.ppo.algorithm_config import AlgorithmConfig
from glam.ppo.buffer import RolloutBuffer, Transitions
from glam.ppo.estimators import gigpo_advantages, grpo_advantages
from glam.ppo.gae import compute_gae
from glam.ppo.losses import clipped_surrogate_loss, ppo_loss

__all__ = ["ALGORITHMS", "GRPO", "PPO", "Algorithm", "GiGPO", "anchor_ids", "build_algorithm"]


class PPO:
    """GAE over the value head's estimates, PPO's clipped policy and value losses."""

    name = "ppo"
    uses_value = True
    """The policy's value head is computed and trained."""
    grouped = False
    """Envs play in groups on the same seeds, every rollout on new episodes."""
    normalizes_advantages = True
    """`ppo.normalize_advantages` applies (over the whole rollout of every process)."""

    def __init__(self, cfg: AlgorithmConfig, ppo: PPOConfig) -> None:
        self.cfg = cfg
        self.ppo = ppo

    def advantages(
        self, buffer: RolloutBuffer, last_values: Tensor, accelerator: Accelerator | None = None
    ) -> tuple[Transitions, dict[str, float]]:
        """GAE's advantages and returns (`glam.ppo.gae.compute_gae`), no metrics."""
        advantages, returns = compute_gae(
            buffer.rewards,
            buffer.values,
            buffer.dones,
            last_values,
            gamma=self.ppo.gamma,
            gae_lambda=self.ppo.gae_lambda,
            final_values=buffer.final_values if self.ppo.bootstrap_truncated else None,
        )
        return buffer.transitions(advantages, returns), {}

    def loss_inputs(
        self, output: PolicyOutput, mb: Transitions, device: torch.device
    ) -> tuple[Tensor, ...]:
        """The tensors `ppo_loss` takes, in its order: the new and the rollout's log-probs of the
        actions, the advantages, the new and the rollout's values, the returns, the entropy."""
        return (
            output.dist.log_prob(mb.actions.to(device)).float(),
            mb.logprobs.to(device),
            mb.advantages.to(device),
            output.values.float(),
            mb.values.to(device),
            mb.returns.to(device),
            output.dist.entropy().float(),
        )

    def loss(
        self, output: PolicyOutput, mb: Transitions, device: torch.device
    ) -> tuple[Tensor, dict[str, Tensor]]:
        """`ppo_loss` on the micro-batch."""
        ppo = self.ppo
        return ppo_loss(
            *self.loss_inputs(output, mb, device),
            clip_eps=ppo.clip_eps,
            value_clip_eps=ppo.value_clip_eps,
            value_coef=ppo.value_coef,
            entropy_coef=ppo.entropy_coef,
        )


class GRPO(PPO):
    """Group-relative episode advantages, no critic, KL to the reference (the module
    docstring)."""

    name = "grpo"
    uses_value = False
    grouped = True
    normalizes_advantages = False

    def _estimate(self, buffer: RolloutBuffer) -> tuple[Tensor, Tensor, dict[str, Tensor]]:
        advantages, mask = grpo_advantages(
            buffer.rewards,
            buffer.dones,
            self.cfg.group_size,
            std_normalize=self.cfg.std_normalize,
        )
        return advantages, mask, {}

    def advantages(
        self, buffer: RolloutBuffer, last_values: Tensor, accelerator: Accelerator | None = None
    ) -> tuple[Transitions, dict[str, float]]:
        """The group estimate; `returns` are the advantages (nothing learns a value).

        Metrics (over every process): `charts/trained_share`, the transitions of episodes that
        ended within the rollout; `charts/zero_advantage_share`, those of them whose advantage
        is 0 (a group whose episodes all scored the same: nothing to learn from, the first sign
        of RAGEN's Echo Trap); GiGPO adds `charts/anchor_share`."""
        advantages, mask, extra = self._estimate(buffer)
        counts = {
            "trained": mask.sum(),
            "zero": ((advantages == 0) & mask).sum(),
            **extra,
        }
        totals = torch.stack(
            [value.double() for value in counts.values()] + [torch.tensor(float(mask.numel()))]
        )
        if accelerator is not None and accelerator.num_processes > 1:
            totals = accelerator.reduce(totals.to(accelerator.device), "sum").cpu()
        values = dict(zip([*counts, "all"], totals.tolist(), strict=True))
        metrics = {
            "charts/trained_share": values["trained"] / values["all"],
            "charts/zero_advantage_share": values["zero"] / max(values["trained"], 1.0),
        }
        if "anchored" in values:
            metrics["charts/anchor_share"] = values["anchored"] / max(values["trained"], 1.0)
        return buffer.transitions(advantages, advantages.clone(), mask=mask), metrics

    def loss(
        self, output: PolicyOutput, mb: Transitions, device: torch.device
    ) -> tuple[Tensor, dict[str, Tensor]]:
        """`clipped_surrogate_loss` on the micro-batch, at `algorithm.clip_level`."""
        cfg, ppo = self.cfg, self.ppo
        weights = torch.ones(len(mb)) if mb.mask is None else mb.mask.float()
        answers = getattr(mb.observations, "answers", None)
        tokens = getattr(output, "token_logprobs", None)
        needs_tokens = cfg.clip_level == "token" or cfg.kl_coef > 0
        if needs_tokens and (answers is None or tokens is None):
            raise ValueError(
                f"algorithm.clip_level={cfg.clip_level} / kl_coef={cfg.kl_coef} need the "
                "answer's tokens: a policy that writes its action (policy.kind=generate)"
            )
        if cfg.clip_level == "token":
            new, old = tokens.float(), answers.logprobs.to(device)
            token_mask = answers.token_mask.to(device)
        else:
            new = output.dist.log_prob(mb.actions.to(device)).float()
            old, token_mask = mb.logprobs.to(device), None
        kl: dict[str, Any] = {}
        if cfg.kl_coef > 0:
            if answers.ref_logprobs is None:
                raise ValueError(
                    "algorithm.kl_coef > 0 but the answers carry no reference log-probabilities "
                    "(the policy was built without its reference)"
                )
            kl = {
                "kl_new_logprobs": tokens.float(),
                "kl_ref_logprobs": answers.ref_logprobs.to(device),
                "kl_mask": answers.token_mask.to(device),
                "kl_coef": cfg.kl_coef,
            }
        return clipped_surrogate_loss(
            new,
            old,
            mb.advantages.to(device),
            weights.to(device),
            clip_eps=ppo.clip_eps,
            token_mask=token_mask,
            entropy=output.dist.entropy().float(),
            entropy_coef=ppo.entropy_coef,
            **kl,
        )


class GiGPO(GRPO):
    """GRPO plus step-level advantages from anchor states (`glam.ppo.estimators`)."""

    name = "gigpo"

    def _estimate(self, buffer: RolloutBuffer) -> tuple[Tensor, Tensor, dict[str, Tensor]]:
        anchors = anchor_ids([buffer.observations[t] for t in range(buffer.num_steps)])
        advantages, mask, sizes = gigpo_advantages(
            buffer.rewards,
            buffer.dones,
            anchors,
            self.cfg.group_size,
            gamma=self.ppo.gamma,
            weight=self.cfg.step_advantage_weight,
            std_normalize=self.cfg.std_normalize,
        )
        return advantages, mask, {"anchored": (sizes > 1).sum()}


def anchor_ids(steps: list[Any]) -> Tensor:
    """`(steps, envs)` long: one id per distinct observation of the rollout (GiGPO's anchor
    states). A writing policy's observations compare their `states` (the mission and the
    current view, without history or feedback); a scoring policy's, their prompts; a grid
    policy's, the view, direction and mission."""
    ids: dict[Hashable, int] = {}
    rows = []
    for observations in steps:
        keys: list[Hashable]
        if isinstance(observations, GridObservations):
            keys = [
                (image.numpy().tobytes(), int(direction), mission)
                for image, direction, mission in zip(
                    observations.images,
                    observations.directions,
                    observations.missions,
                    strict=True,
                )
            ]
        else:
            keys = list(getattr(observations, "states", None) or observations.prompts)
        rows.append([ids.setdefault(key, len(ids)) for key in keys])
    return torch.tensor(rows, dtype=torch.long)


Algorithm = PPO
"""The interface every algorithm has (`PPO`'s): `name`, `uses_value`, `grouped`,
`normalizes_advantages`, `advantages` and `loss`."""

ALGORITHMS: dict[str, type[PPO]] = {"ppo": PPO, "grpo": GRPO, "gigpo": GiGPO}
"""`algorithm.name` -> its class."""


def build_algorithm(cfg: AlgorithmConfig, ppo: PPOConfig) -> PPO:
    """The algorithm `cfg.name` names, with its settings.

    Raises:
        ValueError: `sac`, which this trainer does not run (`glam.offpolicy.trainer` does).
    """
    if cfg.name not in ALGORITHMS:
        raise ValueError(
            f"algorithm.name={cfg.name!r} is not trained by the PPO trainer: its own loop "
            "(glam.offpolicy.trainer.train_sac) runs it; the training scripts choose it for you"
        )
    return ALGORITHMS[cfg.name](cfg, ppo)
