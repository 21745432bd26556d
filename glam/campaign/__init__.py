"""Campaigns: a grid of training overrides x seeds, one requeueable SLURM job per run.

- `glam.campaign.config`: the campaign file (`load_campaign`, `CampaignConfig`, `SlurmConfig`,
  `EvaluationConfig`);
- `glam.campaign.jobs`: its runs and batch scripts (`expand_runs`, `plan_jobs`, `Job`);
- `glam.campaign.submission`: checking every job's config against the schema, and submission
  (`check_jobs`, `launch`).

`scripts/launch_campaign.py` is the command line; docs/cluster.md shows how to use it.
"""

from __future__ import annotations

from glam.campaign.config import (
    CampaignConfig,
    CampaignError,
    EvaluationConfig,
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
from glam.campaign.submission import check_jobs, launch, submit

__all__ = [
    "CampaignConfig",
    "CampaignError",
    "EvaluationConfig",
    "Job",
    "JobConfig",
    "Run",
    "SlurmConfig",
    "check_jobs",
    "expand_runs",
    "format_override_value",
    "launch",
    "load_campaign",
    "parse_slurm_time",
    "plan_jobs",
    "render_job_script",
    "run_name",
    "submit",
]
