"""A campaign's jobs: the runs of its arms x grid x seeds, and one batch script per job.

`plan_jobs` expands a `CampaignConfig` into `Job`s: for each run (`expand_runs`) a training job
whose script is a template of `slurm/` with this run's #SBATCH lines, environment and arguments
filled in (`render_job_script`), then one evaluation job per level chained after it. Each job
also records what it runs (`JobConfig`: the script, its preset and overrides), for
`glam.campaign.submission.check_jobs` and for `glam.campaign.local`, which runs the same command
without SLURM.
"""

from __future__ import annotations

import dataclasses
import itertools
import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from glam.campaign.config import (
    ENTRY_POINTS,
    EVALUATION_SCRIPT,
    REPO_ROOT,
    TEMPLATE_DIR,
    CampaignConfig,
    CampaignError,
    EntryPoint,
    EvaluationConfig,
    SlurmConfig,
    from_mapping,
)

_PLAIN_VALUE = re.compile(r"^[\w./:@+-]+$")


@dataclass(frozen=True)
class Run:
    """One training run of a campaign: an arm (if the campaign has arms), a grid point and a
    seed."""

    name: str
    seed: int
    point: tuple[tuple[str, Any], ...]
    """The grid values of this run, in grid order."""
    output_dir: Path
    arm: str | None = None
    """The run's arm, a key of `campaign.arms`; None in a campaign without arms."""

    def training_overrides(self, campaign: CampaignConfig) -> list[str]:
        """Hydra overrides of this run's training (the template appends `train.resume=true`):
        the campaign's, its arm's with its label (an arm's value replaces the campaign's), its
        grid point's, then its seed and folder."""
        arm = campaign.arm_overrides(self.arm)
        overrides = {**campaign.overrides, **arm, **dict(self.point)}
        return [
            *(f"{key}={format_override_value(value)}" for key, value in overrides.items()),
            f"train.seed={self.seed}",
            f"train.output_dir={self.output_dir}",
        ]

    def training_arguments(self, campaign: CampaignConfig) -> list[str]:
        """Arguments of the training script: the preset, then `training_overrides`."""
        return ["--config-name", campaign.preset, *self.training_overrides(campaign)]


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


def run_name(point: tuple[tuple[str, Any], ...], seed: int, arm: str | None = None) -> str:
    """Folder name of a run: its arm if any, `key-value` for each grid value, then the seed
    (`regime_ppo.lr-0.001_seed-1`)."""
    parts = [arm] if arm is not None else []
    for key, value in point:
        text = value if isinstance(value, str) else format_override_value(value)
        parts.append(f"{key.lstrip('+~')}-" + re.sub(r"[^\w.+-]+", "-", text).strip("-"))
    return "_".join([*parts, f"seed-{seed}"])


def expand_runs(campaign: CampaignConfig, output_root: Path) -> list[Run]:
    """The arms times the cartesian product of the grid times the seeds, in file order (seeds
    vary fastest, arms slowest)."""
    grid = campaign.grid or {}
    points = [tuple(zip(grid, values, strict=True)) for values in itertools.product(*grid.values())]
    arms = list(campaign.arms) if campaign.arms is not None else [None]
    runs = []
    for arm, point, seed in itertools.product(arms, points, campaign.seeds):
        name = run_name(point, seed, arm)
        runs.append(Run(name, seed, point, output_root / campaign.name / name, arm))
    names = [run.name for run in runs]
    if duplicates := sorted({name for name in names if names.count(name) > 1}):
        raise CampaignError(f"grid values give the same run folder twice: {duplicates}")
    return runs


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
    entry_point: str | None = None,
) -> str:
    """A template from slurm/ with its #SBATCH defaults replaced and this job's values filled in.

    Resources, environment and arguments are all in the script, so SLURM reruns the same job on
    requeue and a user can resubmit it with a plain `sbatch script_path`. `entry_point` is the
    training script the template runs (`GLAM_TRAIN_SCRIPT`; `slurm.env` may replace it).
    """
    lines = (TEMPLATE_DIR / f"{template}.sbatch").read_text().splitlines()
    last_directive = max(i for i, line in enumerate(lines) if line.startswith("#SBATCH"))
    body = lines[last_directive + 1 :]
    environment = {
        "GLAM_ROOT": str(REPO_ROOT),
        "GLAM_GPUS_PER_NODE": str(slurm.gpus_per_node),
        "GLAM_MAX_REQUEUES": str(slurm.max_requeues),
        "GLAM_ACCELERATE_ARGS": shlex.join(slurm.accelerate_args),
        **({"GLAM_TRAIN_SCRIPT": entry_point} if entry_point else {}),
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
class JobConfig:
    """What a job runs: a script of `ENTRY_POINTS`, a preset of its folder, Hydra overrides."""

    entry_point: str
    """The script, relative to the repository root (a key of `ENTRY_POINTS`)."""
    preset: str
    overrides: list[str] = field(default_factory=list)

    @property
    def entry(self) -> EntryPoint:
        """The script's kind, schema and preset folder."""
        return ENTRY_POINTS[self.entry_point]

    @property
    def kind(self) -> str:
        """`train` or `eval`."""
        return self.entry.kind

    @property
    def config_dir(self) -> Path:
        """The folder of the script's presets."""
        return REPO_ROOT / self.entry.config_dir

    def arguments(self) -> list[str]:
        """The script's arguments: `--config-name PRESET` unless the script composes that preset
        by default, then the overrides."""
        name = [] if self.preset == self.entry.default_preset else ["--config-name", self.preset]
        return [*name, *self.overrides]


@dataclass
class Job:
    """One job of the campaign, possibly after another one: its batch script for SLURM, and what
    the script runs (`config`, also what `--local` runs)."""

    script_path: Path
    script: str
    label: str
    config: JobConfig
    """What the job's script will run, checked against the schema before anything is submitted."""
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
        config = JobConfig(
            campaign.script,
            campaign.preset,
            # The templates resume: the run composes with it too.
            [*run.training_overrides(campaign), "train.resume=true"],
        )
        train = _plan_job(
            campaign,
            campaign.slurm,
            slurm_dir / f"{run.name}.train",
            run.training_arguments(campaign),
            config,
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
    slurm = from_mapping(
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
            JobConfig(EVALUATION_SCRIPT, ENTRY_POINTS[EVALUATION_SCRIPT].default_preset, arguments),
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
    config: JobConfig,
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
        entry_point=config.entry_point if is_training else None,
    )
    return Job(script_path, script, label, config)
