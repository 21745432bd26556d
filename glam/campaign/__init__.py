"""Campaigns: arms x a grid of training overrides x seeds, one job per run, on SLURM or here.

- `glam.campaign.config`: the campaign file (`load_campaign`, `CampaignConfig`, `SlurmConfig`,
  `EvaluationConfig`, `LocalConfig`) and the scripts jobs may run (`ENTRY_POINTS`);
- `glam.campaign.jobs`: its runs and batch scripts (`expand_runs`, `plan_jobs`, `Job`);
- `glam.campaign.submission`: checking every job's config against its script's schema, and
  submission (`check_jobs`, `compose_jobs`, `launch`);
- `glam.campaign.local`: running the jobs here, N at a time, without SLURM (`run_local`).

`scripts/launch_campaign.py` is the command line; docs/cluster.md shows how to use it.
"""

from __future__ import annotations

from glam.campaign.config import (
    ENTRY_POINTS,
    CampaignConfig,
    CampaignError,
    EntryPoint,
    EvaluationConfig,
    LocalConfig,
    SlurmConfig,
    load_campaign,
    parse_slurm_time,
)
from glam.campaign.jobs import (
    Job,
    JobConfig,
    Run,
    expand_runs,
    format_override_value,
    plan_jobs,
    render_job_script,
    run_name,
)
from glam.campaign.local import run_local
from glam.campaign.submission import check_jobs, compose_jobs, launch, submit

__all__ = [
    "ENTRY_POINTS",
    "CampaignConfig",
    "CampaignError",
    "EntryPoint",
    "EvaluationConfig",
    "Job",
    "JobConfig",
    "LocalConfig",
    "Run",
    "SlurmConfig",
    "check_jobs",
    "compose_jobs",
    "expand_runs",
    "format_override_value",
    "launch",
    "load_campaign",
    "parse_slurm_time",
    "plan_jobs",
    "render_job_script",
    "run_local",
    "run_name",
    "submit",
]
