"""The training run's schema, assembled above every coupling: the baselines' schema
(`glam.baselines.run_config`, itself SAC's and the PPO trainer's over the core of
`glam.config`) plus the section of each coupling, declared in its own package with
`glam.config.config_section`.

`TrainingRunConfig` is registered with Hydra as `training_run_schema`, the root of the training
presets (`defaults: [training_run_schema, _self_]`). Adding a coupling: declare its section in a
light module of its package (no torch; `glam/teach/config.py` is an example), with its own
checks in `__post_init__` and what it requires of the core in `check_run`, add its field below,
and what it cannot run with beside the other couplings to `check_sections`. An algorithm or a
network whose code sits lower adds its field to the schema of that layer instead
(`glam.ppo.run_config`, `glam.offpolicy.run_config`, `glam.baselines.run_config`), so that its
code reads it without importing this module.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from glam.ask.config import AskConfig
from glam.baselines.run_config import BaselineRunConfig
from glam.codeact.config import CodeactConfig
from glam.config import CONFIG_DIR, compose_config, hydra_schema
from glam.oni.config import OniConfig
from glam.policy.generation_config import written_clash
from glam.teach.config import TeachConfig

__all__ = ["TrainingRunConfig", "compose_run"]


@hydra_schema("training_run_schema")
@dataclass
class TrainingRunConfig(BaselineRunConfig):
    """Everything `scripts/train_language_agent.py` needs: the root of the Hydra presets.

    `TrainingRunConfig()` is the default preset, `smollm2_lora_cpu`: the embedded SmolLM2-135M
    with a LoRA adapter, on the CPU, going to the red ball (docs/training.md). The core sections
    (`model`, `policy`, `env`, `ppo`, `train`) come first (`glam.config.CoreRunConfig`), then
    those of the layers below (`generate`, `algorithm`, `sac`, `symbolic`, `drrn`); each field
    is a section declared with `config_section` under its name, whose `check_run` the run's
    `__post_init__` calls in this order.
    """

    teach: TeachConfig = field(default_factory=TeachConfig)
    """A teacher whose action distribution the student distils early on (`glam.teach`)."""
    ask: AskConfig = field(default_factory=AskConfig)
    """A planner asked for subgoals, and when to ask it (`glam.ask`)."""
    oni: OniConfig = field(default_factory=OniConfig)
    """An intrinsic reward from an LLM's labels of the agent's events (`glam.oni`)."""
    codeact: CodeactConfig = field(default_factory=CodeactConfig)
    """Coded actions chosen by a slow LLM agent and refined by a critic (`glam.codeact`)."""

    def check_sections(self) -> None:
        """The couplings that do not run together, and those a writing policy does not run
        with."""
        super().check_sections()
        teacher, mode = self.teach.teacher, self.ask.mode
        if mode != "none" and teacher != "none":
            raise ValueError(
                f"ask.mode={mode!r} with teach.teacher={teacher!r}: a teacher advises primitive "
                "actions, the mediator's actions are ask and continue"
            )
        if self.oni.reward_model != "none" and mode != "none":
            raise ValueError(
                f"oni.reward_model={self.oni.reward_model!r} with ask.mode={mode!r}: the "
                "mediated env's steps are skills', whose events are not reported one by one"
            )
        others = {"teach.teacher": teacher, "ask.mode": mode}
        if self.codeact.chooser != "none" and (used := _used(others)):
            raise ValueError(self.codeact.clash(used))
        if self.policy.kind == "generate" and (
            used := _used({**others, "codeact.chooser": self.codeact.chooser})
        ):
            raise ValueError(written_clash(used))


def _used(settings: dict[str, str]) -> list[str]:
    """`key=value` of the settings that are not "none"."""
    return [f"{key}={value!r}" for key, value in settings.items() if value != "none"]


def compose_run(
    config_name: str, overrides: Sequence[str] = (), config_dir: Path | str = CONFIG_DIR
) -> TrainingRunConfig:
    """The training preset `config_name` with `overrides`, composed and validated as the
    training script does (`glam.config.compose_config` with this schema).

    Raises:
        ConfigError: an unknown preset, bad override syntax, unknown key or invalid value.
    """
    return compose_config(config_name, overrides, TrainingRunConfig, config_dir)
