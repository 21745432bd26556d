"""Check a campaign's jobs against the scripts' schemas, then submit them with sbatch.

`launch` is what `scripts/launch_campaign.py` runs: read the campaign file, plan its jobs,
compose the config of every job with Hydra's compose API and validate it as the job's script
will (`glam.config.compose_config`), report every error before anything is submitted, then
print (`dry_run`) or submit the jobs in order, or run them on this machine
(`local_jobs`, `glam.campaign.local`).
"""

from __future__ import annotations

import difflib
import shlex
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from omegaconf import OmegaConf

from babyai_text.actions import ACTION_SPACES
from babyai_text.env import known_level_ids
from glam.campaign.config import REPO_ROOT, CampaignError, load_campaign
from glam.campaign.jobs import Job, plan_jobs
from glam.campaign.local import plan_local, run_local
from glam.config import ConfigError, compose_config
from glam.models.specs import model_layer_count, model_spec_problem


def compose_jobs(jobs: Sequence[Job]) -> tuple[list[Any], list[str]]:
    """Each job's composed and validated config (None where it failed), and the errors, one
    line per distinct error with the jobs it hits.

    Each job's config is composed from its preset and overrides and validated against the
    schema of the script the job runs (`ENTRY_POINTS`): unknown keys (a misspelt grid key), an
    unknown preset, values that fail a check, and levels, action spaces and models that do not
    exist (`setting_problems`) are all found here, before any job starts.
    """
    configs = []
    labels_by_error: dict[str, list[str]] = {}
    for job in jobs:
        config = job.config
        try:
            schema = config.entry.load_schema()
            composed = compose_config(config.preset, config.overrides, schema, config.config_dir)
            problems = setting_problems(composed)
        except ConfigError as error:
            composed, problems = None, [str(error)]
        configs.append(None if problems else composed)
        for problem in problems:
            labels_by_error.setdefault(problem, []).append(job.label)
    errors = [f"{', '.join(labels)}: {error}" for error, labels in labels_by_error.items()]
    return configs, errors


def setting_problems(config: Any) -> list[str]:
    """What in a job's validated config names nothing that exists: a level, an action space, a
    model (`glam.models.specs.model_spec_problem`). The schemas check types and ranges only; a
    misspelt level would otherwise pass `--dry-run` and fail on the cluster, job after job."""
    problems = []
    levels = [("env.name", getattr(getattr(config, "env", None), "name", None))]
    levels.append(("eval.level", getattr(getattr(config, "eval", None), "level", None)))
    known = set(known_level_ids())
    for key, level in levels:
        if level is not None and level not in known:
            close = difflib.get_close_matches(level, sorted(known), n=1)
            hint = f" (did you mean {close[0]}?)" if close else ""
            problems.append(f"{key}={level!r} is not a BabyAI level{hint}")
    space = getattr(getattr(config, "env", None), "action_space", None)
    if space is not None and space not in ACTION_SPACES:
        problems.append(f"env.action_space={space!r} is not one of {sorted(ACTION_SPACES)}")
    policy = getattr(getattr(config, "policy", None), "kind", None)
    model = getattr(getattr(config, "model", None), "name_or_path", None)
    if policy == "llm" and model is not None and (problem := model_spec_problem(model)):
        problems.append(f"model.name_or_path: {problem}")
    elif policy == "llm" and model is not None:
        problems += _layer_problems(config.model, model_layer_count(model))
    return problems


def _layer_problems(model: Any, count: int | None) -> list[str]:
    """`model.lora.layers` and `model.trained_layers` against the model's `count` layers (not
    checked where the count needs the hub)."""
    if count is None:
        return []
    problems = []
    for key, layers in (
        ("model.lora.layers", getattr(getattr(model, "lora", None), "layers", None)),
        ("model.trained_layers", getattr(model, "trained_layers", None)),
    ):
        if isinstance(layers, int) and layers > count:
            problems.append(f"{key}={layers}: the model has {count} layers")
        elif isinstance(layers, (list, tuple)) or OmegaConf.is_list(layers):
            outside = [index for index in layers if not 0 <= index < count]
            if outside:
                problems.append(
                    f"{key}={list(layers)}: the model's layers are 0 to {count - 1} ({outside} "
                    "outside)"
                )
    return problems


def check_jobs(jobs: Sequence[Job]) -> list[str]:
    """The configuration errors of `jobs` (`compose_jobs`), one line per distinct error."""
    return compose_jobs(jobs)[1]


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


def launch(
    campaign_path: Path,
    *,
    output_root: Path | None = None,
    dry_run: bool = False,
    local_jobs: int | None = None,
) -> int:
    """Check, then print (`dry_run`), submit, or run here (`local_jobs` at a time, see
    `glam.campaign.local.run_local`) every job of a campaign; return an exit status.

    Exit status: 0 done; 1 sbatch failed (the jobs submitted before stay submitted), or a local
    job failed; 2 the campaign is invalid (its file, or the config of any job), and nothing was
    written; 128 + N a local launch stopped by signal N.
    """
    try:
        campaign = load_campaign(campaign_path)
        root = output_root or Path(campaign.output_root)
        if not root.is_absolute():
            root = REPO_ROOT / root
        jobs = plan_jobs(campaign, root)
        settings = plan_local(campaign, jobs, local_jobs) if local_jobs is not None else None
    except CampaignError as error:
        print(f"error: {campaign_path}: {error}", file=sys.stderr)
        return 2
    configs, errors = compose_jobs(jobs)
    if errors:
        print(
            f"error: {campaign_path}: invalid configuration of {len(errors)} kind(s), nothing "
            f"{'started' if settings else 'submitted'}:\n"
            + "\n".join(f"  {line}" for line in errors),
            file=sys.stderr,
        )
        return 2
    if settings is not None:
        campaign_dir = root / campaign.name
        return run_local(campaign, jobs, configs, settings, campaign_dir, dry_run=dry_run)

    if dry_run:
        for job in jobs:
            print(f"### {job.label}: {job.script_path}")
            print(job.script)
            print("$ " + shlex.join(job.sbatch_command()) + "\n")
        print(f"dry run: {len(jobs)} job(s) checked, nothing written or submitted")
        return 0

    jobs_file = root / campaign.name / "slurm" / "jobs.tsv"
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
