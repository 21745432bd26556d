"""Submit a campaign to SLURM: a grid of training overrides x seeds, one requeueable job per run.

    python scripts/launch_campaign.py configs/campaign/glam_paper.yaml --dry-run   # print only
    python scripts/launch_campaign.py configs/campaign/glam_paper.yaml             # submit
    python scripts/launch_campaign.py configs/campaign/tiny_local.yaml --output-root /tmp/runs

A campaign file names a training preset, fixed overrides, a grid of overrides (cartesian
product) and seeds, and the SLURM resources (see configs/campaign/glam_paper.yaml for every key).
Each run trains in `OUTPUT_ROOT/CAMPAIGN/RUN` where RUN is built from the grid point and the seed,
e.g. `ppo.lr-1e-05_seed-2`. For each run the launcher writes a self-contained batch script,
`OUTPUT_ROOT/CAMPAIGN/slurm/RUN.train.sbatch` (a template from slurm/ with this run's #SBATCH
lines, environment and arguments filled in), submits it with `sbatch`, prints the job id and
appends it to `OUTPUT_ROOT/CAMPAIGN/slurm/jobs.tsv`. With an `evaluation` section, one evaluation
job per run and level follows its training job (`--dependency=afterok`). `--dry-run` prints the
sbatch commands and scripts and writes nothing.
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import re
import shlex
import subprocess
import sys
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

REPO_ROOT = Path(__file__).resolve().parent.parent
TEMPLATE_DIR = REPO_ROOT / "slurm"
RESERVED_KEYS = ("train.seed", "train.output_dir", "train.resume")
"""Overrides the launcher sets for every run; a campaign may not set them."""
_OVERRIDE_KEY = re.compile(r"^[+~]{0,2}[A-Za-z_][\w.]*$")
_PLAIN_VALUE = re.compile(r"^[\w./:@+-]+$")
_SLURM_TIME = re.compile(r"^(?:(\d+)-)?(\d+)(?::(\d+))?(?::(\d+))?$")


class CampaignError(ValueError):
    """A campaign file that cannot be run; the message says what to fix."""


# --------------------------------------------------------------------------------------------
# Campaign file
# --------------------------------------------------------------------------------------------


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
    """Environment variables exported in the job (HF_HOME, NCCL_*, GLAM_TRAIN_SCRIPT...)."""
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
class CampaignConfig:
    """A campaign: `preset` + `overrides` + each point of `grid`, for each seed."""

    name: str
    """Campaign name: the folder under output_root and the prefix of job names."""
    preset: str
    """Training preset (`--config-name`), e.g. glam_paper."""
    seeds: list[int]
    """One run per seed and grid point (`train.seed`)."""
    overrides: dict[str, Any] = field(default_factory=dict)
    """Hydra overrides shared by every run."""
    grid: dict[str, list[Any]] | None = None
    """Hydra override -> values; runs cover the cartesian product. None: the seeds only."""
    output_root: str = "runs"
    """Runs go to OUTPUT_ROOT/NAME/RUN (relative to the repository root)."""
    slurm: SlurmConfig = field(default_factory=SlurmConfig)
    """Resources of each training job."""
    evaluation: EvaluationConfig | None = None
    """Evaluation jobs chained after each training job; None: none."""

    def __post_init__(self) -> None:
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
        for key in [*self.overrides, *grid_keys]:
            if not _OVERRIDE_KEY.match(key):
                raise CampaignError(f"{key!r} is not a Hydra override key")
            if key.lstrip("+~") in RESERVED_KEYS:
                raise CampaignError(f"{key} is set by the launcher for each run; remove it")
        if not self.slurm.template_name.startswith("train_"):
            raise CampaignError(
                f"slurm.template {self.slurm.template!r} is not a training template"
            )
        if both := grid_keys & set(self.overrides):
            raise CampaignError(f"keys in both overrides and grid: {sorted(both)}")


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


def _build(cls: type, data: Any, where: str) -> Any:
    """Instantiate dataclass `cls` from a YAML mapping, naming unknown and missing keys."""
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
            values[key] = _build(nested[0], value, prefix + key)
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


def load_campaign(path: Path) -> CampaignConfig:
    """Read and validate a campaign file."""
    if not path.is_file():
        raise CampaignError("no such campaign file")
    try:
        data = yaml.safe_load(path.read_text())
    except yaml.YAMLError as error:
        raise CampaignError(f"not valid YAML: {error}") from error
    return _build(CampaignConfig, data, "")


# --------------------------------------------------------------------------------------------
# Runs
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Run:
    """One training run of a campaign: a grid point and a seed."""

    name: str
    seed: int
    point: tuple[tuple[str, Any], ...]
    """The grid values of this run, in grid order."""
    output_dir: Path

    def training_arguments(self, campaign: CampaignConfig) -> list[str]:
        """Arguments of the training script (the template appends `train.resume=true`)."""
        overrides = {**campaign.overrides, **dict(self.point)}
        return [
            "--config-name",
            campaign.preset,
            *(f"{key}={format_override_value(value)}" for key, value in overrides.items()),
            f"train.seed={self.seed}",
            f"train.output_dir={self.output_dir}",
        ]


def format_override_value(value: Any) -> str:
    """A YAML value as Hydra override syntax (true, null, [a,b], quoted odd strings)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return "null"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, list):
        return "[" + ",".join(format_override_value(item) for item in value) + "]"
    if isinstance(value, dict):
        items = (f"{key}:{format_override_value(item)}" for key, item in value.items())
        return "{" + ",".join(items) + "}"
    text = str(value)
    if _PLAIN_VALUE.match(text):
        return text
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"


def run_name(point: tuple[tuple[str, Any], ...], seed: int) -> str:
    """Folder name of a run: `key-value` for each grid value, then the seed."""
    parts = []
    for key, value in point:
        text = value if isinstance(value, str) else format_override_value(value)
        parts.append(f"{key.lstrip('+~')}-" + re.sub(r"[^\w.+-]+", "-", text).strip("-"))
    return "_".join([*parts, f"seed-{seed}"])


def expand_runs(campaign: CampaignConfig, output_root: Path) -> list[Run]:
    """The cartesian product of the grid, times the seeds, in file order (seeds vary fastest)."""
    grid = campaign.grid or {}
    points = [tuple(zip(grid, values, strict=True)) for values in itertools.product(*grid.values())]
    runs = []
    for point in points:
        for seed in campaign.seeds:
            name = run_name(point, seed)
            runs.append(Run(name, seed, point, output_root / campaign.name / name))
    names = [run.name for run in runs]
    if duplicates := sorted({name for name in names if names.count(name) > 1}):
        raise CampaignError(f"grid values give the same run folder twice: {duplicates}")
    return runs


# --------------------------------------------------------------------------------------------
# Batch scripts
# --------------------------------------------------------------------------------------------


def sbatch_directives(
    slurm: SlurmConfig, job_name: str, log_path: Path, requeue: bool
) -> list[str]:
    """The #SBATCH options of one job."""
    options = [
        f"--job-name={job_name}",
        f"--nodes={slurm.nodes}",
        "--ntasks-per-node=1",
        f"--time={slurm.time}",
        f"--chdir={REPO_ROOT}",
        f"--output={log_path}",
        "--open-mode=append",
    ]
    if slurm.gpus_per_node:
        options.append(f"--gpus-per-node={slurm.gpus_per_node}")
    for option, value in (
        ("cpus-per-task", slurm.cpus_per_task),
        ("mem", slurm.mem),
        ("partition", slurm.partition),
        ("account", slurm.account),
        ("qos", slurm.qos),
    ):
        if value is not None:
            options.append(f"--{option}={value}")
    if requeue:
        options += [f"--signal=B:USR1@{slurm.signal_seconds}", "--requeue"]
    return options + list(slurm.sbatch_args)


def render_job_script(
    template: str,
    slurm: SlurmConfig,
    directives: list[str],
    arguments: list[str],
    title: str,
    script_path: Path,
) -> str:
    """A template from slurm/ with its #SBATCH defaults replaced and this job's values filled in.

    Resources, environment and arguments are all in the script, so SLURM reruns the same job on
    requeue and a user can resubmit it with a plain `sbatch script_path`.
    """
    lines = (TEMPLATE_DIR / f"{template}.sbatch").read_text().splitlines()
    last_directive = max(i for i, line in enumerate(lines) if line.startswith("#SBATCH"))
    body = lines[last_directive + 1 :]
    environment = {
        "GLAM_ROOT": str(REPO_ROOT),
        "GLAM_GPUS_PER_NODE": str(slurm.gpus_per_node),
        "GLAM_MAX_REQUEUES": str(slurm.max_requeues),
        "GLAM_ACCELERATE_ARGS": shlex.join(slurm.accelerate_args),
        **{key: str(value) for key, value in slurm.env.items()},
    }
    return "\n".join(
        [
            "#!/usr/bin/env bash",
            f"# {title}",
            f"# Written by scripts/launch_campaign.py from slurm/{template}.sbatch.",
            f"# Resubmit with: sbatch {script_path}",
            *(f"#SBATCH {option}" for option in directives),
            *(f"export {key}={shlex.quote(value)}" for key, value in environment.items()),
            *slurm.setup,
            "set -- " + shlex.join(arguments),
            *body,
            "",
        ]
    )


@dataclass
class Job:
    """One batch script to submit, possibly after another job of the campaign."""

    script_path: Path
    script: str
    label: str
    after: Job | None = None
    job_id: str | None = None

    def sbatch_command(self) -> list[str]:
        """The sbatch call; a dependency names its job's id (a placeholder before submission)."""
        command = ["sbatch", "--parsable"]
        if self.after is not None:
            after_id = self.after.job_id or f"<job id of {self.after.label}>"
            command.append(f"--dependency=afterok:{after_id}")
        return [*command, str(self.script_path)]


def plan_jobs(campaign: CampaignConfig, output_root: Path) -> list[Job]:
    """Every job of the campaign: each training run, then its evaluations."""
    slurm_dir = output_root / campaign.name / "slurm"
    jobs = []
    for run in expand_runs(campaign, output_root):
        train = _plan_job(
            campaign,
            campaign.slurm,
            slurm_dir / f"{run.name}.train",
            run.training_arguments(campaign),
            label=f"{run.name} train",
            title=f"run {run.name}: training into {run.output_dir}",
        )
        jobs.append(train)
        if campaign.evaluation is not None:
            jobs += _plan_evaluations(campaign, campaign.evaluation, run, train, slurm_dir)
    return jobs


def _plan_evaluations(
    campaign: CampaignConfig, evaluation: EvaluationConfig, run: Run, train: Job, slurm_dir: Path
) -> list[Job]:
    """One evaluation job per level, each waiting for the run's training job."""
    slurm = _build(
        SlurmConfig,
        {**dataclasses.asdict(campaign.slurm), "template": "evaluate", **evaluation.slurm},
        "evaluation.slurm",
    )
    jobs = []
    for level in evaluation.levels:
        suites = evaluation.suites_for(level)
        overrides = {
            "agent.kind": "checkpoint",
            "agent.path": str(run.output_dir),
            "eval.level": level,
            "eval.episodes": evaluation.episodes,
            **({"eval.suites": suites} if suites else {}),
            **evaluation.overrides,
            "eval.output_dir": str(run.output_dir / "eval" / level),
        }
        arguments = [f"{key}={format_override_value(value)}" for key, value in overrides.items()]
        job = _plan_job(
            campaign,
            slurm,
            slurm_dir / f"{run.name}.eval.{level}",
            arguments,
            label=f"{run.name} eval {level}",
            title=f"run {run.name}: evaluation on {level}",
        )
        job.after = train
        jobs.append(job)
    return jobs


def _plan_job(
    campaign: CampaignConfig,
    slurm: SlurmConfig,
    stem: Path,
    arguments: list[str],
    label: str,
    title: str,
) -> Job:
    """A job whose script is `STEM.sbatch` and whose log is `STEM.JOBID.log`."""
    is_training = slurm.template_name != "evaluate"
    script_path = stem.with_name(stem.name + ".sbatch")
    directives = sbatch_directives(
        slurm,
        job_name=f"{campaign.name}.{stem.name}",
        log_path=stem.with_name(stem.name + ".%j.log"),
        requeue=is_training,
    )
    script = render_job_script(
        slurm.template_name,
        slurm,
        directives,
        arguments,
        title=f"Campaign {campaign.name}, {title}",
        script_path=script_path,
    )
    return Job(script_path, script, label)


# --------------------------------------------------------------------------------------------
# Submission
# --------------------------------------------------------------------------------------------


def submit(job: Job) -> str:
    """Write the job's script and sbatch it; return the job id."""
    job.script_path.parent.mkdir(parents=True, exist_ok=True)
    job.script_path.write_text(job.script)
    result = subprocess.run(job.sbatch_command(), capture_output=True, text=True, check=False)
    if result.returncode != 0:
        raise RuntimeError(
            f"sbatch failed for {job.label} (exit {result.returncode}): {result.stderr.strip()}"
        )
    return result.stdout.strip().split(";")[0]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("campaign", type=Path, help="campaign YAML, e.g. configs/campaign/...")
    parser.add_argument("--dry-run", action="store_true", help="print, do not write or submit")
    parser.add_argument("--output-root", type=Path, help="replaces the file's output_root")
    args = parser.parse_args(argv)

    try:
        campaign = load_campaign(args.campaign)
        output_root = args.output_root or Path(campaign.output_root)
        if not output_root.is_absolute():
            output_root = REPO_ROOT / output_root
        jobs = plan_jobs(campaign, output_root)
    except CampaignError as error:
        print(f"error: {args.campaign}: {error}", file=sys.stderr)
        return 2

    if args.dry_run:
        for job in jobs:
            print(f"### {job.label}: {job.script_path}")
            print(job.script)
            print("$ " + shlex.join(job.sbatch_command()) + "\n")
        print(f"dry run: {len(jobs)} job(s), nothing written or submitted")
        return 0

    jobs_file = output_root / campaign.name / "slurm" / "jobs.tsv"
    for job in jobs:
        try:
            job.job_id = submit(job)
        except (RuntimeError, FileNotFoundError) as error:
            print(f"error: {error}", file=sys.stderr)
            return 1
        with jobs_file.open("a") as file:
            file.write(f"{job.job_id}\t{job.label}\t{job.script_path}\n")
        print(f"submitted {job.label}: job {job.job_id}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
