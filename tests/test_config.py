"""glam.config: the defaults are the default preset, the training run's schema is the core plus
the sections its packages declare, and one validation path for every script.

.venv/bin/python -m pytest tests/test_config.py
"""

from __future__ import annotations

import ast
import dataclasses
import inspect
import itertools
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

import glam.config
from glam.config import (
    CONFIG_DIR,
    SECTIONS,
    ConfigError,
    CoreRunConfig,
    check_override_keys,
    compose_config,
    config_section,
    register_configs,
    validate_config,
)
from glam.eval.config import PostTrainingTestsConfig
from glam.run_config import TrainingRunConfig, compose_run

ROOT = Path(__file__).resolve().parents[1]


def _compose(name: str, overrides: list[str] = (), folder: Path = CONFIG_DIR):  # noqa: ANN202
    """Hydra's compose API alone, without glam's checks (what `to_object` used to get)."""
    register_configs()
    with initialize_config_dir(str(folder), version_base="1.3"):
        return compose(name, overrides=list(overrides))


# --------------------------------------------------------------------------------------------
# One source of truth for the defaults
# --------------------------------------------------------------------------------------------


def test_default_preset_is_exactly_the_dataclass_defaults() -> None:
    preset = _compose("smollm2_lora_cpu")
    assert OmegaConf.to_container(preset) == OmegaConf.to_container(
        OmegaConf.structured(TrainingRunConfig())
    )
    assert compose_run("smollm2_lora_cpu") == TrainingRunConfig()


def test_paper_preset_holds_the_papers_values() -> None:
    paper = compose_run("glam_paper")
    assert paper.model.name_or_path == "google/flan-t5-large" and not paper.model.lora.enabled
    assert (paper.policy.temperature, paper.policy.prompt_format) == (1.0, "glam")
    env = paper.env
    assert (env.name, env.num_envs, env.nbr_obs, env.action_space, env.reward_scale) == (
        "BabyAI-MixedTrainLocal-v0",
        32,
        3,
        "default",
        20.0,
    )
    ppo = paper.ppo
    assert (ppo.lr, ppo.frames_per_env, ppo.epochs, ppo.minibatch_size, ppo.micro_batch_size) == (
        1e-6,
        40,
        4,
        64,
        8,
    )
    assert (ppo.clip_eps, ppo.gamma, ppo.gae_lambda, ppo.entropy_coef, ppo.value_coef) == (
        0.2,
        0.99,
        0.99,
        0.01,
        0.5,
    )
    assert (paper.train.total_frames, paper.train.save_every) == (1_500_000, 10)


def test_tiny_preset_keeps_the_values_it_was_tuned_with() -> None:
    tiny = compose_run("tiny")
    assert (tiny.policy.temperature, tiny.env.reward_scale, tiny.ppo.micro_batch_size) == (
        1.0,
        20.0,
        None,
    )
    assert (tiny.env.nbr_obs, tiny.env.action_space, tiny.env.num_envs) == (1, "nav", 4)


# --------------------------------------------------------------------------------------------
# The schema: glam.config's core, and a section per coupling and algorithm in its own package
# --------------------------------------------------------------------------------------------

CORE_KEYS = [item.name for item in dataclasses.fields(CoreRunConfig)]
SECTION_KEYS = [
    item.name for item in dataclasses.fields(TrainingRunConfig) if item.name not in CORE_KEYS
]


def test_the_training_schema_is_the_core_then_the_declared_sections() -> None:
    assert CORE_KEYS == ["model", "policy", "env", "ppo", "train"]
    assert list(glam.config._CORE_KEYS) == CORE_KEYS  # what config_section refuses
    assert SECTION_KEYS == [
        "generate", "algorithm", "sac", "symbolic", "drrn", "teach", "ask", "oni", "codeact"
    ]  # fmt: skip
    hints = {item.name: item.type for item in dataclasses.fields(TrainingRunConfig)}
    for key in SECTION_KEYS:
        section = SECTIONS[key]  # declared with config_section(key)...
        assert hints[key] == section.__name__  # ...and typed by its class
        # ...in its own package, not in the core's file
        assert section.__module__.startswith("glam.") and section.__module__ != "glam.config"
    # Every section a glam package declares is in the schema.
    assert {key for key, cls in SECTIONS.items() if cls.__module__.startswith("glam.")} == set(
        SECTION_KEYS
    )
    assert list(TrainingRunConfig().sections()) == SECTION_KEYS
    # Every section checks only what it requires of the core.
    for key in SECTION_KEYS:
        check_run = getattr(SECTIONS[key], "check_run", None)
        if check_run is not None:
            assert inspect.signature(check_run).parameters["run"].annotation == "CoreRunConfig"


def test_each_layer_of_the_schema_adds_the_sections_its_code_reads() -> None:
    """The schema is assembled upward (docs/architecture.md): the PPO trainer's, SAC's, the
    baselines', then the whole run's above the couplings; each module imports the one below."""
    from glam.baselines.run_config import BaselineRunConfig
    from glam.offpolicy.run_config import SacRunConfig
    from glam.ppo.run_config import PPORunConfig

    tower = [CoreRunConfig, PPORunConfig, SacRunConfig, BaselineRunConfig, TrainingRunConfig]
    names = [[item.name for item in dataclasses.fields(schema)] for schema in tower]
    added = [upper[len(lower) :] for lower, upper in itertools.pairwise(names)]
    assert added == [
        ["generate", "algorithm"], ["sac"], ["symbolic", "drrn"], ["teach", "ask", "oni", "codeact"]
    ]  # fmt: skip
    assert all(issubclass(upper, lower) for lower, upper in itertools.pairwise(tower))


def test_the_core_config_file_names_no_section() -> None:
    """glam/config.py knows no coupling or algorithm: none of the sections' names (classes,
    constants) appears in it, and its code reads no section of the run (`run.teach...`)."""
    source = inspect.getsource(glam.config)
    modules = {sys.modules[SECTIONS[key].__module__] for key in SECTION_KEYS}
    names = {  # the classes and constants the section modules define
        getattr(node, "name", None) or ast.unparse(node.target)
        for module in modules
        for node in ast.parse(inspect.getsource(module)).body
        if isinstance(node, (ast.ClassDef, ast.AnnAssign))
    }
    assert {"TeachConfig", "TEACHERS", "AlgorithmConfig", "GenerationConfig"} <= names
    assert not [name for name in sorted(names) if name in source]
    attributes = {
        node.attr for node in ast.walk(ast.parse(source)) if isinstance(node, ast.Attribute)
    }
    assert not attributes & set(SECTION_KEYS)


@dataclass
class ToyConfig:
    """A coupling's section, declared outside glam (by the test, with `config_section("toy")`)."""

    size: int = 1

    def check_run(self, run: CoreRunConfig) -> None:
        if self.size > run.env.num_envs:
            raise ValueError(f"toy.size={self.size} exceeds env.num_envs={run.env.num_envs}")


@dataclass
class ToyRunConfig(TrainingRunConfig):
    toy: ToyConfig = dataclasses.field(default_factory=ToyConfig)


@dataclass
class UndeclaredRunConfig(TrainingRunConfig):
    other: ToyConfig = dataclasses.field(default_factory=ToyConfig)


def test_a_section_declared_outside_the_core_joins_a_schema(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The way a new coupling plugs in: a section declared in its own module is a field of a
    schema built on the core; its keys are checked like the core's, and the run's __post_init__
    calls its `check_run` with the whole run. A field that is not a declared section is refused."""
    monkeypatch.setattr(glam.config, "SECTIONS", dict(SECTIONS))  # forget the toy afterwards
    with pytest.raises(TypeError, match="ToyRunConfig.toy is not a section declared with"):
        ToyRunConfig()
    config_section("toy")(ToyConfig)

    cfg = validate_config({"toy": {"size": 3}, "env": {"num_envs": 4}}, ToyRunConfig)
    assert cfg.toy.size == 3 and list(cfg.sections())[-1] == "toy"
    with pytest.raises(ConfigError, match=r"^toy.size=5 exceeds env.num_envs=4$"):
        validate_config({"toy": {"size": 5}, "env": {"num_envs": 4}}, ToyRunConfig)
    with pytest.raises(ConfigError, match="unknown key toy.sise .*valid keys of toy: size"):
        validate_config({"toy": {"sise": 5}}, ToyRunConfig)
    with pytest.raises(TypeError, match="UndeclaredRunConfig.other is not a section declared"):
        UndeclaredRunConfig()  # `toy`'s class, under another name
    with pytest.raises(ValueError, match="section 'ppo' is a core section"):
        config_section("ppo")(ToyConfig)
    with pytest.raises(ValueError, match="section 'teach' is declared twice"):
        config_section("teach")(ToyConfig)


# --------------------------------------------------------------------------------------------
# validate_config and the override check
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("override", "message"),
    [
        (
            "+ppo.lrr=1e-3",
            "unknown key ppo.lrr (did you mean ppo.lr?); valid keys of ppo: lr, lr_schedule,",
        ),
        ("+model.lora.rr=4", "unknown key model.lora.rr (did you mean model.lora.r?)"),
        ("+seed=3", "unknown key seed; valid keys at the top level: model, policy, env, ppo"),
    ],
)
def test_keys_added_with_plus_are_refused_not_dropped(override: str, message: str) -> None:
    raw = _compose("tiny", [override])  # Hydra adds the key to the structured config
    with pytest.raises(ConfigError) as caught:
        validate_config(raw, TrainingRunConfig)
    assert message in str(caught.value)


def test_invalid_values_and_types_become_config_errors() -> None:
    with pytest.raises(ConfigError, match=r"^ppo.gamma must be in \[0, 1\], got 1.5$"):
        validate_config(_compose("tiny", ["ppo.gamma=1.5"]), TrainingRunConfig)
    with pytest.raises(ConfigError, match="ppo.lr"):
        validate_config({"ppo": {"lr": "fast"}}, TrainingRunConfig)
    cfg = validate_config({"ppo": {"lr": 3e-4}}, TrainingRunConfig)  # a plain mapping works too
    assert isinstance(cfg, TrainingRunConfig) and cfg.ppo.lr == 3e-4


@pytest.mark.parametrize("override", ["ppo.lrr=1", "+ppo.lrr=1", "++ppo.lrr=1", "~ppo.lrr"])
def test_command_line_keys_are_checked_with_or_without_plus(override: str) -> None:
    with pytest.raises(ConfigError, match="unknown key ppo.lrr"):
        check_override_keys([override], TrainingRunConfig)
    # Known keys, Hydra's own settings and config groups pass.
    check_override_keys(
        ["ppo.lr=1", "+model.lora.target_modules=[q]", "hydra.run.dir=.", "hydra/job_logging=none"],
        TrainingRunConfig,
    )


def test_compose_config_reports_unknown_presets_and_bad_values() -> None:
    with pytest.raises(ConfigError, match="Cannot find primary config 'tiny-nope'.*tiny"):
        compose_run("tiny-nope")
    with pytest.raises(ConfigError, match="ppo.lr: Value 'abc' .* could not be converted"):
        compose_run("tiny", ["ppo.lr=abc"])
    evaluation = compose_config(
        "post_training_tests", ["eval.episodes=3"], PostTrainingTestsConfig, CONFIG_DIR / "eval"
    )
    assert evaluation.eval.episodes == 3


# --------------------------------------------------------------------------------------------
# Every Hydra script stops on an unknown key
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("script", "arguments", "message"),
    [
        (
            "train_language_agent.py",
            ["--config-name", "tiny", "+ppo.lrr=1e-3"],
            "unknown key ppo.lrr (did you mean ppo.lr?); valid keys of ppo: lr,",
        ),
        (
            "train_language_agent.py",
            ["--config-name", "tiny", "ppo.lrr=1e-3"],
            "unknown key ppo.lrr (did you mean ppo.lr?); valid keys of ppo: lr,",
        ),
        (
            "post_training_tests.py",
            ["agent.kind=random", "+eval.episode=3"],
            "unknown key eval.episode (did you mean eval.episodes?)",
        ),
        (
            "zero_shot_generation.py",
            ["+agent.modle=x"],
            "unknown key agent.modle (did you mean agent.model?)",
        ),
        (
            "clm_behavioral_cloning.py",
            ["+bc.lerning_rate=1e-3"],
            "unknown key bc.lerning_rate (did you mean bc.learning_rate?)",
        ),
        ("collect_bot_demos.py", ["+demos.episods=3"], "unknown key demos.episods"),
        (
            "clone_policy.py",
            ["+clone.epoch=3"],
            "unknown key clone.epoch (did you mean clone.epochs?)",
        ),
        ("serve_openai.py", ["prot=0"], "unknown key prot (did you mean port?)"),
        ("test_results.py", ["inputs=[x]", "+outputdir=y"], "unknown key outputdir"),
    ],
    ids=[
        "train_plus",
        "train",
        "post_training_tests",
        "zero_shot",
        "bc",
        "demos",
        "clone",
        "serve",
        "results",
    ],
)
def test_every_script_exits_1_on_an_unknown_key(
    script: str, arguments: list[str], message: str, tmp_path: Path
) -> None:
    result = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / script), *arguments],
        cwd=tmp_path,  # anything the script wrongly wrote would land here
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    assert result.returncode == 1, result.stderr[-2000:]
    assert f"error: invalid configuration: {message}" in result.stderr
    assert "Traceback" not in result.stderr
    assert list(tmp_path.iterdir()) == []
