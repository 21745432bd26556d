"""Check a campaign's jobs against the scripts' schemas, then submit them with sbatch.

`launch` is what `scripts/launch_campaign.py` runs: read the campaign file, plan its jobs,
compose the config of every job with Hydra's compose API and validate it as the job's script
will (`glam.config.compose_config`), report every error before anything is submitted, then
print (`dry_run`) or submit the jobs in order, or run them on this machine
(`local_jobs`, `glam.campaign.local`).
"""

from __future__ import annotations

import shlex
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from glam.campaign.config import REPO_ROOT, CampaignError, load_campaign
from glam.campaign.jobs import Job, plan_jobs
from glam.campaign.local import plan_local, run_local
from glam.config import ConfigError, compose_config


def compose_jobs(jobs: Sequence[Job]) -> tuple[list[Any], list[str]]:
    """Each job's composed and validated config (None where it failed), and the errors, one
    line per distinct error with the jobs it hits.

    Each job's config is composed from its preset and overrides and validated against the
    schema of the script the job runs (`ENTRY_POINTS`): unknown keys (a misspelt grid key), an
    unknown preset, and values that fail a check are all found here, before any job starts.
    """
    configs = []
    labels_by_error: dict[str, list[str]] = {}
    for job in jobs:
        config = job.config
        try:
            schema = config.entry.load_schema()
            configs.append(
                compose_config(config.preset, config.overrides, schema, config.config_dir)
            )
        except ConfigError as error:
            configs.append(None)
            labels_by_error.setdefault(str(error), []).append(job.label)
    errors = [f"{', '.join(labels)}: {error}" for error, labels in labels_by_error.items()]
    return configs, errors


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
