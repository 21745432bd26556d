"""SAC's schema: the PPO trainer's (`glam.ppo.run_config`) plus the section `sac`, what the
off-policy learner (`glam.offpolicy.trainer`) reads of a run. The training run's schema
(`glam.run_config.TrainingRunConfig`) extends it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from glam.offpolicy.config import SAC_POLICIES, SacConfig
from glam.ppo.run_config import PPORunConfig

__all__ = ["SacRunConfig"]


@dataclass
class SacRunConfig(PPORunConfig):
    """A run that `algorithm.name=sac` may train off-policy."""

    sac: SacConfig = field(default_factory=SacConfig)
    """Discrete Soft Actor-Critic's learner (`algorithm.name=sac`; unused otherwise)."""

    def check_sections(self) -> None:
        """With `algorithm.name=sac`: a policy that scores its actions (envs and batches that
        split evenly are checked against the launch at start-up)."""
        super().check_sections()
        if self.algorithm.name == "sac" and self.policy.kind not in SAC_POLICIES:
            raise ValueError(
                f"algorithm.name=sac trains a policy that scores its actions "
                f"(policy.kind={' or '.join(SAC_POLICIES)}), got policy.kind="
                f"{self.policy.kind!r}"
            )
