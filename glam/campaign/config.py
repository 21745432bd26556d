"""The campaign file: a training script, preset, overrides, arms, grid, seeds and resources.

A campaign is a YAML file (see `configs/campaign/glam_paper.yaml` for every key, and
`configs/campaign/ablation_gotoredball.yaml` for `arms`) read into `CampaignConfig` by
`load_campaign`, which names any unknown, repeated or missing key and any value of the wrong
type. Whether its overrides fit the script's schema is checked later, job by job, when
the jobs are planned and composed (`glam.campaign.submission.check_jobs`).

`ENTRY_POINTS` is the table of the scripts a job may run, each with the schema and the preset
folder its config is composed from: a new training script is one line there.
"""

from __future__ import annotations

import dataclasses
import importlib
import re
import types
import typing
from collections.abc import Hashable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

REPO_ROOT = Path(__file__).resolve().parents[2]
TEMPLATE_DIR = REPO_ROOT / "slurm"
RESERVED_KEYS = ("train.seed", "train.output_dir", "train.resume")
"""Overrides the launcher sets for every run; a campaign may not set them."""
_OVERRIDE_KEY = re.compile(r"^[+~]{0,2}[A-Za-z_][\w.]*$")
_ARM_NAME = re.compile(r"[A-Za-z0-9][\w.-]*")
"""An arm's name is the first part of its runs' folder names."""
LABEL_KEY = "train.label"
"""What `scripts/compare_runs.py` groups runs by; the launcher sets it to each run's arm."""
_SLURM_TIME = re.compile(r"^(?:(\d+)-)?(\d+)(?::(\d+))?(?::(\d+))?$")


class CampaignError(ValueError):
    """A campaign file that cannot be run; the message says what to fix."""


@dataclass(frozen=True)
class EntryPoint:
    """A script that campaign jobs run, and how its config is composed and checked."""

    kind: str
    """`train` (a run folder with checkpoints, `train.*` keys) or `eval` (a results folder)."""
    schema: str
    """The script's config dataclass, `"module:Class"`, imported only when a job is checked."""
    config_dir: str
    """Its presets (`--config-name`), relative to the repository root."""
    default_preset: str | None = None
    """The preset the script composes without `--config-name` (evaluation jobs rely on it)."""

    def load_schema(self) -> type:
        """The config dataclass named by `schema`."""
        module, _, name = self.schema.partition(":")
        return getattr(importlib.import_module(module), name)

    @property
    def threads_key(self) -> str:
        """The config key of the script's torch threads."""
        return "train.torch_threads" if self.kind == "train" else "eval.torch_threads"


DEFAULT_TRAINING_SCRIPT = "scripts/train_language_agent.py"
EVALUATION_SCRIPT = "scripts/post_training_tests.py"
TRAINING_SCHEMA = "glam.run_config:TrainingRunConfig"
ENTRY_POINTS: dict[str, EntryPoint] = {
    DEFAULT_TRAINING_SCRIPT: EntryPoint("train", TRAINING_SCHEMA, "configs"),
    # The symbolic PPO and DRRN baselines (`--config-name symbolic_ppo|drrn`): `policy.kind`
    # of the same schema, the same `train.*` keys and checkpoints.
    "scripts/train_baseline.py": EntryPoint("train", TRAINING_SCHEMA, "configs"),
    EVALUATION_SCRIPT: EntryPoint(
        "eval",
        "glam.eval.config:PostTrainingTestsConfig",
        "configs/eval",
        default_preset="post_training_tests",
    ),
}
"""Script (relative to the repository root) -> what it runs; `script` of a campaign is one of
the `train` kind."""


@dataclass
class SlurmConfig:
    """SLURM resources of one job (each training run, or each evaluation)."""

    template: str | None = None
    """Template in slurm/ without `.sbatch`; None picks train_one_node or train_multi_node."""
    nodes: int = 1
    """Nodes per run; one accelerate launcher per node."""
    gpus_per_node: int = 0
    """GPUs (= training processes) per node; 0 runs one CPU process."""
    cpus_per_task: int | None = None
    """CPUs per node (one task per node)."""
    mem: str | None = None
    """Memory per node, SLURM syntax (`400G`)."""
    time: str = "24:00:00"
    """Time limit of one job, SLURM syntax (`D-HH:MM:SS`); requeues restart it."""
    partition: str | None = None
    account: str | None = None
    qos: str | None = None
    signal_seconds: int = 300
    """USR1 this long before the time limit: time to write a checkpoint, then requeue."""
    max_requeues: int = 20
    """Stop requeuing after this many restarts (a run that cannot progress would loop)."""
    accelerate_args: list[str] = field(default_factory=list)
    """Extra `accelerate launch` options, e.g. [--config_file, configs/accelerate/multi_gpu.yaml]."""
    sbatch_args: list[str] = field(default_factory=list)
    """Extra #SBATCH options, e.g. [--constraint=a100]."""
    env: dict[str, str] = field(default_factory=dict)
    """Environment variables exported in the job (HF_HOME, NCCL_*...). GLAM_TRAIN_SCRIPT here runs
    another script than the campaign's `script`, unchecked: for stand-ins in tests."""
    setup: list[str] = field(default_factory=list)
    """Shell lines run first in the job (`module load cuda`); the repo's .venv is activated after."""

    def __post_init__(self) -> None:
        if self.nodes < 1:
            raise CampaignError(f"slurm.nodes must be >= 1, got {self.nodes}")
        if self.gpus_per_node < 0:
            raise CampaignError(f"slurm.gpus_per_node must be >= 0, got {self.gpus_per_node}")
        if self.template is not None and not (TEMPLATE_DIR / f"{self.template}.sbatch").is_file():
            known = sorted(path.stem for path in TEMPLATE_DIR.glob("*.sbatch"))
            raise CampaignError(f"slurm.template {self.template!r} is not one of {known}")
        if self.template == "train_one_node" and self.nodes > 1:
            raise CampaignError(
                "slurm.template train_one_node runs on 1 node; use train_multi_node"
            )
        limit = parse_slurm_time(self.time)
        if not 0 < self.signal_seconds < limit:
            raise CampaignError(
                f"slurm.signal_seconds={self.signal_seconds} must be > 0 and below the time "
                f"limit ({self.time} = {limit} s)"
            )
        for key in self.env:
            if not re.fullmatch(r"[A-Za-z_]\w*", key):
                raise CampaignError(f"slurm.env: {key!r} is not a variable name")

    @property
    def template_name(self) -> str:
        """The template actually used for training."""
        if self.template is not None:
            return self.template
        return "train_one_node" if self.nodes == 1 else "train_multi_node"


@dataclass
class EvaluationConfig:
    """Post-training tests run after each training run, one job per level."""

    levels: list[str] = field(default_factory=lambda: ["BabyAI-MixedTestLocal-v0"])
    """Levels to evaluate on (`eval.level`)."""
    episodes: int = 1000
    """Episodes per suite (`eval.episodes`)."""
    suites: list[str] | dict[str, list[str]] | None = None
    """Test suites (`eval.suites`): one list for every level, or a list per level (a level left
    out keeps the default); None keeps the evaluation script's default (every suite)."""
    overrides: dict[str, Any] = field(default_factory=dict)
    """Further evaluation overrides."""
    slurm: dict[str, Any] = field(
        default_factory=lambda: {"nodes": 1, "gpus_per_node": 1, "time": "4:00:00"}
    )
    """Changes to the campaign's slurm section for evaluation jobs (partition etc. are kept)."""

    def __post_init__(self) -> None:
        if not self.levels:
            raise CampaignError("evaluation.levels is empty")
        if self.episodes < 1:
            raise CampaignError(f"evaluation.episodes must be >= 1, got {self.episodes}")
        if isinstance(self.suites, dict) and (extra := sorted(set(self.suites) - set(self.levels))):
            raise CampaignError(
                f"evaluation.suites names level(s) not in evaluation.levels: {', '.join(extra)}"
            )

    def suites_for(self, level: str) -> list[str] | None:
        """The suites evaluated on `level` (None: the evaluation script's default)."""
        if isinstance(self.suites, dict):
            return self.suites.get(level)
        return self.suites


@dataclass
class LocalConfig:
    """How `--local` runs each job on this machine (no SLURM); the `slurm` section is not read."""

    processes: int = 1
    """Training processes per run: 1 runs `python SCRIPT`, more `accelerate launch
    --num_processes N SCRIPT` (on GPUs, each job gets its own N devices)."""
    accelerate_args: list[str] = field(default_factory=list)
    """`accelerate launch` options when processes > 1 (e.g. [--config_file,
    configs/accelerate/zero2.yaml]); empty: `--multi_gpu` where CUDA is, else --config_file
    configs/accelerate/multi_cpu.yaml (N CPU processes over gloo)."""
    torch_threads: int | None = None
    """Threads per process (`train.torch_threads`, `eval.torch_threads`, OMP_NUM_THREADS); None:
    the cores this launcher may use divided by jobs x processes, at least 1."""
    env: dict[str, str] = field(default_factory=dict)
    """Environment variables of every local job (HF_HOME, HF_HUB_OFFLINE...)."""

    def __post_init__(self) -> None:
        if self.processes < 1:
            raise CampaignError(f"local.processes must be >= 1, got {self.processes}")
        if self.torch_threads is not None and self.torch_threads < 1:
            raise CampaignError(f"local.torch_threads must be >= 1, got {self.torch_threads}")
        for key in self.env:
            if not re.fullmatch(r"[A-Za-z_]\w*", key):
                raise CampaignError(f"local.env: {key!r} is not a variable name")


@dataclass
class CampaignConfig:
    """A campaign: `preset` + `overrides` + each arm of `arms` + each point of `grid`, for each
    seed."""

    name: str
    """Campaign name: the folder under output_root and the prefix of job names."""
    preset: str
    """Training preset (`--config-name`), e.g. glam_paper."""
    seeds: list[int]
    """One run per seed and grid point (`train.seed`)."""
    script: str = DEFAULT_TRAINING_SCRIPT
    """Training script, relative to the repository root: a `train` entry of `ENTRY_POINTS`
    (`scripts/train_baseline.py` for the symbolic_ppo and drrn presets)."""
    overrides: dict[str, Any] = field(default_factory=dict)
    """Hydra overrides shared by every run."""
    arms: dict[str, dict[str, Any]] | None = None
    """Arm name -> Hydra overrides on top of `overrides` (`{}`: them unchanged): the rows of an
    ablation table, each a change of one or more keys, which a grid cannot express. Runs cover
    arms x grid x seeds, in file order; each run is labelled with its arm (`train.label`, unless
    the arm sets it) and its folder name starts with it (`regime_seed-1`). None: no arms."""
    grid: dict[str, list[Any]] | None = None
    """Hydra override -> values; runs cover the cartesian product. None: the seeds only."""
    output_root: str = "runs"
    """Runs go to OUTPUT_ROOT/NAME/RUN (relative to the repository root)."""
    slurm: SlurmConfig = field(default_factory=SlurmConfig)
    """Resources of each training job."""
    evaluation: EvaluationConfig | None = None
    """Evaluation jobs chained after each training job; None: none."""
    local: LocalConfig = field(default_factory=LocalConfig)
    """How each job runs with `--local` (this machine, no SLURM)."""

    def __post_init__(self) -> None:
        entry = ENTRY_POINTS.get(self.script)
        if entry is None or entry.kind != "train":
            known = [path for path, entry in ENTRY_POINTS.items() if entry.kind == "train"]
            raise CampaignError(
                f"script {self.script!r} is not a training script of glam.campaign.config."
                f"ENTRY_POINTS: {', '.join(known)}"
            )
        if not (REPO_ROOT / self.script).is_file():
            raise CampaignError(f"script {self.script} does not exist in {REPO_ROOT}")
        if not re.fullmatch(r"[\w.-]+", self.name):
            raise CampaignError(f"name {self.name!r} may only hold letters, digits, '_.-'")
        if not self.seeds or not all(type(seed) is int for seed in self.seeds):
            raise CampaignError(f"seeds must be a non-empty list of integers, got {self.seeds!r}")
        if len(set(self.seeds)) != len(self.seeds):
            raise CampaignError(f"seeds has duplicates: {self.seeds}")
        if self.grid is not None:
            if not self.grid:
                raise CampaignError("grid is empty; leave it out to run only the seeds")
            for key, values in self.grid.items():
                if not isinstance(values, list) or not values:
                    raise CampaignError(
                        f"grid.{key} must be a non-empty list of values, got {values!r}"
                    )
        grid_keys = set(self.grid or {})
        check_override_keys([*self.overrides, *grid_keys])
        if not self.slurm.template_name.startswith("train_"):
            raise CampaignError(
                f"slurm.template {self.slurm.template!r} is not a training template"
            )
        if both := grid_keys & set(self.overrides):
            raise CampaignError(f"keys in both overrides and grid: {sorted(both)}")
        if self.arms is not None:
            self._check_arms()

    def _check_arms(self) -> None:
        """Arm names that make distinct folder names; override keys as for `overrides`, none of
        them varied by the grid; the label left to the arms."""
        if not self.arms:
            raise CampaignError("arms is empty; leave it out to run without arms")
        grid_keys = {key.lstrip("+~") for key in self.grid or {}}
        for name, changes in self.arms.items():
            if not isinstance(name, str) or not _ARM_NAME.fullmatch(name):
                raise CampaignError(
                    f"arm name {name!r} is not a folder name: letters, digits and '_.-', "
                    "starting with a letter or a digit"
                )
            if not isinstance(changes, dict):
                raise CampaignError(
                    f"arms.{name} must be a mapping of overrides ({{}} for the preset "
                    f"unchanged), got {changes!r}"
                )
            check_override_keys(changes, where=f"arms.{name}: ")
            if both := sorted(grid_keys & {key.lstrip("+~") for key in changes}):
                raise CampaignError(
                    f"arms.{name} sets {', '.join(both)}, which the grid varies: give the "
                    "values to the arms, or drop the key from the grid"
                )
        folded = [name.casefold() for name in self.arms]
        if clash := sorted({name for name in self.arms if folded.count(name.casefold()) > 1}):
            raise CampaignError(
                f"arm names {clash} differ only in case: their folders would be one on "
                "case-insensitive file systems"
            )
        for where, keys in (("overrides", self.overrides), ("grid", self.grid or {})):
            if any(key.lstrip("+~") == LABEL_KEY for key in keys):
                raise CampaignError(
                    f"{LABEL_KEY} in {where}: with arms, each run is labelled with its arm's "
                    f"name; set {LABEL_KEY} in an arm to label it otherwise"
                )

    def arm_overrides(self, arm: str | None) -> dict[str, Any]:
        """The overrides of `arm` with its label (`train.label=ARM` unless it sets one); {} for
        None, a campaign without arms."""
        if arm is None:
            return {}
        changes = self.arms[arm]
        if any(key.lstrip("+~") == LABEL_KEY for key in changes):
            return dict(changes)
        return {**changes, LABEL_KEY: arm}


def check_override_keys(keys: Any, where: str = "") -> None:
    """Refuse what is not a Hydra override key and the keys the launcher sets for each run
    (`RESERVED_KEYS`); `where` starts the message (`arms.NAME: `)."""
    for key in keys:
        if not isinstance(key, str) or not _OVERRIDE_KEY.match(key):
            raise CampaignError(f"{where}{key!r} is not a Hydra override key")
        if key.lstrip("+~") in RESERVED_KEYS:
            raise CampaignError(f"{where}{key} is set by the launcher for each run; remove it")


def parse_slurm_time(text: str) -> int:
    """Seconds in a SLURM time limit: MM, MM:SS, HH:MM:SS, D-HH, D-HH:MM or D-HH:MM:SS."""
    match = _SLURM_TIME.match(str(text))
    if match is None:
        raise CampaignError(f"slurm.time {text!r} is not a SLURM time (e.g. 24:00:00, 1-12:00)")
    days, *parts = match.groups()
    numbers = [int(part) for part in parts if part is not None]
    if days is not None:
        hours, minutes, seconds = (numbers + [0, 0])[:3]
    elif len(numbers) == 3:
        hours, minutes, seconds = numbers
    else:
        hours, (minutes, seconds) = 0, (numbers + [0])[:2]
    return ((int(days or 0) * 24 + hours) * 60 + minutes) * 60 + seconds


def from_mapping(cls: type, data: Any, where: str) -> Any:
    """Instantiate dataclass `cls` from a YAML mapping, naming unknown and missing keys.

    `where` is the mapping's dotted place in the file (empty for the top), used in messages.
    """
    if not isinstance(data, dict):
        raise CampaignError(f"{where or 'the file'} must be a mapping, got {type(data).__name__}")
    names = {item.name: item for item in dataclasses.fields(cls)}
    prefix = f"{where}." if where else ""
    if unknown := sorted(set(data) - set(names)):
        raise CampaignError(
            f"unknown key(s) {', '.join(prefix + key for key in unknown)}; "
            f"known in {where or 'the file'}: {', '.join(names)}"
        )
    required = [
        name
        for name, item in names.items()
        if item.default is dataclasses.MISSING and item.default_factory is dataclasses.MISSING
    ]
    if missing := [name for name in required if name not in data]:
        raise CampaignError(f"missing key(s): {', '.join(prefix + key for key in missing)}")
    hints = typing.get_type_hints(cls)
    for key, value in data.items():
        if not _has_type(value, hints[key]):
            raise CampaignError(f"{prefix}{key} must be {_type_name(hints[key])}, got {value!r}")
    values = dict(data)
    for key, value in data.items():
        options = typing.get_args(hints[key]) or (hints[key],)
        nested = [option for option in options if dataclasses.is_dataclass(option)]
        if nested and isinstance(value, dict):
            values[key] = from_mapping(nested[0], value, prefix + key)
    return cls(**values)


def _has_type(value: Any, hint: Any) -> bool:
    """Whether a YAML value fits a field's type (outer type only for lists and dicts)."""
    if hint is Any:
        return True
    if dataclasses.is_dataclass(hint):
        return isinstance(value, dict)
    if isinstance(hint, types.UnionType):
        return any(_has_type(value, option) for option in typing.get_args(hint))
    if hint is type(None):
        return value is None
    origin = typing.get_origin(hint) or hint
    if origin is int:
        return type(value) is int  # not bool
    if origin is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if origin is str:
        return isinstance(value, (str, int)) and not isinstance(value, bool)  # 24 -> "24"
    return isinstance(value, origin)


def _type_name(hint: Any) -> str:
    if isinstance(hint, types.UnionType):
        return " or ".join(_type_name(option) for option in typing.get_args(hint))
    origin = typing.get_origin(hint) or hint
    if dataclasses.is_dataclass(origin):
        return "a mapping"
    return {type(None): "null", list: "a list", dict: "a mapping"}.get(origin, origin.__name__)


class _UniqueKeyLoader(yaml.SafeLoader):
    """YAML's safe loader, refusing a key given twice in one mapping: PyYAML would keep the last
    one without a word (two arms of one name, an override set twice)."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict:
        seen: set[Any] = set()
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                continue
            key = self.construct_object(key_node, deep=deep)
            if not isinstance(key, Hashable):
                continue  # refused by the base constructor
            if key in seen:
                raise CampaignError(
                    f"line {key_node.start_mark.line + 1}: key {key!r} is given twice in one "
                    "mapping"
                )
            seen.add(key)
        return super().construct_mapping(node, deep=deep)


def load_campaign(path: Path) -> CampaignConfig:
    """Read and validate a campaign file."""
    if not path.is_file():
        raise CampaignError("no such campaign file")
    try:
        data = yaml.load(path.read_text(), Loader=_UniqueKeyLoader)
    except yaml.YAMLError as error:
        raise CampaignError(f"not valid YAML: {error}") from error
    return from_mapping(CampaignConfig, data, "")
