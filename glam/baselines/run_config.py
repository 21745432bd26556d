"""The baselines' schema: SAC's (`glam.offpolicy.run_config`) plus the sections `symbolic` and
`drrn`, the networks of the agents GLAM is compared with, which their policy factories and
DRRN's learner read. The training run's schema (`glam.run_config.TrainingRunConfig`) extends it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from glam.baselines.config import DRRNConfig, SymbolicConfig
from glam.offpolicy.run_config import SacRunConfig

__all__ = ["BaselineRunConfig"]


@dataclass
class BaselineRunConfig(SacRunConfig):
    """A run whose policy may be one of the baselines' networks."""

    symbolic: SymbolicConfig = field(default_factory=SymbolicConfig)
    """The symbolic agent's network (`policy.kind=symbolic`; unused otherwise)."""
    drrn: DRRNConfig = field(default_factory=DRRNConfig)
    """The DRRN agent and its TD learning (`policy.kind=drrn`; unused otherwise)."""

    def check_sections(self) -> None:
        """A symbolic network with memory needs whole sequences of one policy: PPO's."""
        super().check_sections()
        if self.policy.kind != "symbolic" or not self.symbolic.memory:
            return
        if self.algorithm.name == "sac":
            raise ValueError("algorithm.name=sac replays single steps: set symbolic.memory=false")
        if self.algorithm.name != "ppo":
            raise ValueError(
                f"algorithm.name={self.algorithm.name!r} with symbolic.memory=true: the group "
                "estimators train on whole episodes of a policy without memory"
            )
