"""The PPO trainer's schema: the core of a run (`glam.config.CoreRunConfig`) plus the sections
its set-up reads, `generate` (how a writing policy answers) and `algorithm` (the update's
advantages and loss, or SAC). SAC's schema (`glam.offpolicy.run_config`) extends it, and the
training run's (`glam.run_config.TrainingRunConfig`) extends that.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from glam.config import CoreRunConfig
from glam.policy.generation_config import GenerationConfig
from glam.ppo.algorithm_config import AlgorithmConfig

__all__ = ["PPORunConfig"]


@dataclass
class PPORunConfig(CoreRunConfig):
    """What `glam.ppo.trainer.train` and its set-up read of a run."""

    generate: GenerationConfig = field(default_factory=GenerationConfig)
    """How a policy that writes its action samples and reads it (`policy.kind=generate`)."""
    algorithm: AlgorithmConfig = field(default_factory=AlgorithmConfig)
    """The update's advantages and loss: PPO (default), GRPO or GiGPO (`glam.ppo.algorithms`);
    or `sac`, trained off-policy (`glam.offpolicy`)."""
