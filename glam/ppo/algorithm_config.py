"""The section `algorithm` of a training run: how an update turns a rollout into advantages and
a loss (`glam.ppo.algorithms` implements them), declared with `glam.config.config_section`. A
light module (no torch; `glam.ppo`'s own names load on first use): the PPO trainer's schema
(`glam.ppo.run_config`) and the writing policy import it.
"""

from __future__ import annotations

from dataclasses import dataclass

from glam.config import CoreRunConfig, check_choice, check_positive, config_section

ALGORITHM_NAMES: tuple[str, ...] = ("ppo", "grpo", "gigpo", "sac")
"""The update's algorithm (`glam.ppo.algorithms`): PPO (GAE with a value head), GRPO (group-
normalised episode returns, no value head, KL to the reference) and GiGPO (GRPO plus step-level
advantages from identical observations across a group's episodes); or `sac`, discrete Soft
Actor-Critic from a replay buffer, trained by its own loop (`glam.offpolicy.trainer`, section
`sac`)."""

CLIP_LEVELS: tuple[str, ...] = ("sequence", "token")


@config_section("algorithm")
@dataclass
class AlgorithmConfig:
    """How an update turns a rollout into advantages and a loss. `ppo` is the trainer's PPO,
    bit for bit; `grpo` and `gigpo` play groups of `group_size` envs on the same episode seeds,
    start every rollout on new episodes, and train on the episodes that end within it
    (docs/written_actions.md). The PPO keys (`ppo.clip_eps`, `ppo.entropy_coef`, `ppo.gamma`,
    epochs, minibatches, learning rate) apply to all three."""

    name: str = "ppo"
    """`ppo`, `grpo`, `gigpo` or `sac` (see `ALGORITHM_NAMES`)."""
    group_size: int = 4
    """`grpo`, `gigpo`: envs per group, playing the same seeds (G); it divides each process's
    envs. Ignored by `ppo`."""
    kl_coef: float = 0.01
    """`grpo`, `gigpo`: weight of the KL penalty to the reference, the base model with the LoRA
    adapter switched off (GRPO's k3 estimator per answer token; verl-agent's GiGPO recipe uses
    0.01). Needs `policy.kind=generate` when above 0."""
    clip_level: str | None = None
    """Where the ratio is clipped: `sequence` (the whole answer's probability ratio: turn-level
    PPO) or `token` (each answer token's, GRPO's and GiGPO's; needs `policy.kind=generate`).
    None: `sequence` for `ppo`, `token` for `grpo` and `gigpo`."""
    std_normalize: bool = True
    """`grpo`, `gigpo`: divide by the group's standard deviation after subtracting its mean
    (GRPO); false subtracts the mean only (GiGPO's `mean_norm` mode, Dr. GRPO)."""
    step_advantage_weight: float = 1.0
    """`gigpo`: omega, the weight of the step-level advantage added to the episode-level one.
    Step returns are discounted by `ppo.gamma` (GiGPO's recipe: 0.95)."""

    def __post_init__(self) -> None:
        check_choice("algorithm.name", self.name, ALGORITHM_NAMES)
        check_positive("algorithm.group_size", self.group_size)
        if self.kl_coef < 0 or self.step_advantage_weight < 0:
            raise ValueError("algorithm.kl_coef and algorithm.step_advantage_weight must be >= 0")
        if self.clip_level is None:
            self.clip_level = "sequence" if self.name == "ppo" else "token"
        check_choice("algorithm.clip_level", self.clip_level, CLIP_LEVELS)
        if self.name == "ppo" and self.clip_level != "sequence":
            raise ValueError(
                "algorithm.clip_level=token with algorithm.name=ppo: turn-level PPO clips the "
                "ratio of the whole answer (`sequence`); token-level clipping is GRPO's and GiGPO's"
            )
        if self.name != "ppo" and self.group_size < 2:
            raise ValueError(
                f"algorithm.group_size={self.group_size}: {self.name} compares the episodes of a "
                "group; give at least 2"
            )

    def check_run(self, run: CoreRunConfig) -> None:
        """The policies and the env layouts the group estimators can train (a symbolic
        network's memory: `glam.baselines.run_config`)."""
        if self.name in ("ppo", "sac"):  # sac: its schema checks the run (glam.offpolicy)
            return
        if run.policy.kind == "drrn":
            raise ValueError(f"algorithm.name={self.name!r} is a policy gradient: not for DRRN")
        if run.policy.kind != "generate" and (self.kl_coef > 0 or self.clip_level == "token"):
            raise ValueError(
                f"algorithm.name={self.name!r} with policy.kind={run.policy.kind!r}: the KL "
                "penalty to the reference and token-level clipping need the answer's tokens "
                "(policy.kind=generate); set algorithm.kl_coef=0 algorithm.clip_level=sequence"
            )
        if run.env.num_envs % self.group_size:
            raise ValueError(
                f"algorithm.group_size={self.group_size} must divide env.num_envs="
                f"{run.env.num_envs} (each group is G envs on the same seeds)"
            )
