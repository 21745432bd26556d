"""The training run's schema: the core of `glam.config` plus the section of each coupling and
algorithm, each declared in its own package with `glam.config.config_section`.

`TrainingRunConfig` is registered with Hydra as `training_run_schema`, the root of the training
presets (`defaults: [training_run_schema, _self_]`). Adding a coupling or an algorithm: declare
its section in a light module of its package (no torch; `glam/teach/config.py` is an example),
with its own checks in `__post_init__` and what it requires of the rest of the run in
`check_run`, then add its field below; `glam/config.py` does not change.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from glam.ask.config import AskConfig
from glam.baselines.config import DRRNConfig, SymbolicConfig
from glam.codeact.config import CodeactConfig
from glam.config import CoreRunConfig, hydra_schema
from glam.offpolicy.config import SacConfig
from glam.oni.config import OniConfig
from glam.policy.generation_config import GenerationConfig
from glam.ppo.algorithm_config import AlgorithmConfig
from glam.teach.config import TeachConfig

__all__ = ["TrainingRunConfig"]


@hydra_schema("training_run_schema")
@dataclass
class TrainingRunConfig(CoreRunConfig):
    """Everything `scripts/train_language_agent.py` needs: the root of the Hydra presets.

    `TrainingRunConfig()` is the default preset, `smollm2_lora_cpu`: the embedded SmolLM2-135M
    with a LoRA adapter, on the CPU, going to the red ball (docs/training.md). The core sections
    (`model`, `policy`, `env`, `ppo`, `train`) come first (`glam.config.CoreRunConfig`); each
    field below is a section declared with `config_section` under its name, whose `check_run`
    the run's `__post_init__` calls in this order.
    """

    symbolic: SymbolicConfig = field(default_factory=SymbolicConfig)
    """The symbolic agent's network (`policy.kind=symbolic`; unused otherwise)."""
    drrn: DRRNConfig = field(default_factory=DRRNConfig)
    """The DRRN agent and its TD learning (`policy.kind=drrn`; unused otherwise)."""
    teach: TeachConfig = field(default_factory=TeachConfig)
    """A teacher whose action distribution the student distils early on (`glam.teach`)."""
    ask: AskConfig = field(default_factory=AskConfig)
    """A planner asked for subgoals, and when to ask it (`glam.ask`)."""
    oni: OniConfig = field(default_factory=OniConfig)
    """An intrinsic reward from an LLM's labels of the agent's events (`glam.oni`)."""
    codeact: CodeactConfig = field(default_factory=CodeactConfig)
    """Coded actions chosen by a slow LLM agent and refined by a critic (`glam.codeact`)."""
    generate: GenerationConfig = field(default_factory=GenerationConfig)
    """How a policy that writes its action samples and reads it (`policy.kind=generate`)."""
    algorithm: AlgorithmConfig = field(default_factory=AlgorithmConfig)
    """The update's advantages and loss: PPO (default), GRPO or GiGPO (`glam.ppo.algorithms`);
    or `sac`, trained off-policy (`glam.offpolicy`)."""
    sac: SacConfig = field(default_factory=SacConfig)
    """Discrete Soft Actor-Critic's learner (`algorithm.name=sac`; unused otherwise)."""
