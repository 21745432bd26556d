"""Run a campaign: arms x a grid of training overrides x seeds, on SLURM or on this machine.

    python scripts/launch_campaign.py configs/campaign/glam_paper.yaml --dry-run   # print only
    python scripts/launch_campaign.py configs/campaign/glam_paper.yaml             # submit
    python scripts/launch_campaign.py configs/campaign/tiny_local.yaml --output-root /tmp/runs
    # no SLURM: 2 jobs at a time on this machine (again to continue after a stop or a failure)
    python scripts/launch_campaign.py configs/campaign/tiny_local.yaml --local --jobs 2

A campaign file names a training preset, fixed overrides, optional arms (named sets of overrides,
the rows of an ablation table), a grid of overrides (cartesian product) and seeds, and the SLURM
resources (see configs/campaign/glam_paper.yaml for every key, ablation_gotoredball.yaml for
arms). Each run trains in `OUTPUT_ROOT/CAMPAIGN/RUN` where RUN is built from the arm, the grid
point and the seed, e.g. `ppo.lr-1e-05_seed-2`, `regime_seed-1`. For each run the launcher writes
a self-contained batch script, `OUTPUT_ROOT/CAMPAIGN/slurm/RUN.train.sbatch` (a template from
slurm/ with this run's #SBATCH lines, environment and arguments filled in), submits it with
`sbatch`, prints the job id and appends it to `OUTPUT_ROOT/CAMPAIGN/slurm/jobs.tsv`. With an
`evaluation` section, one evaluation job per run and level follows its training job
(`--dependency=afterok`).

Before anything is submitted, every job's config is composed with Hydra from `configs/` (the
preset and the job's overrides) and validated against the schema of the script it runs: an
unknown key (`ppo.lrr`), an unknown preset or an invalid value is reported for every job it
hits, and nothing is written or submitted. `--dry-run` runs the same checks, prints the sbatch
commands and scripts and writes nothing. Exit status: 0 done, 1 sbatch failed, 2 the campaign
is invalid. The code lives in `glam.campaign`.

`--local --jobs N` runs the jobs here instead, N at a time, each the command its batch script
would run (`python SCRIPT ...`, or `accelerate launch` for `local.processes` > 1), with its log in
`OUTPUT_ROOT/CAMPAIGN/local/` and each job's status in `OUTPUT_ROOT/CAMPAIGN/local/jobs.tsv`. Runs
already finished are skipped, interrupted ones resume from their newest checkpoint, evaluations
follow their training. Ctrl-C or SIGTERM stops the running jobs cleanly (a training saves a
checkpoint) and exits 128 + the signal; running the same command again continues. Exit status:
0 every job finished, 1 a job failed (the others went on), 2 invalid campaign (nothing started).
See docs/cluster.md, "Campaigns on one machine".
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from glam.campaign import launch


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("campaign", type=Path, help="campaign YAML, e.g. configs/campaign/...")
    parser.add_argument(
        "--dry-run", action="store_true", help="check and print, do not write or submit"
    )
    parser.add_argument("--output-root", type=Path, help="replaces the file's output_root")
    parser.add_argument(
        "--local", action="store_true", help="run the jobs on this machine instead of SLURM"
    )
    parser.add_argument(
        "--jobs", type=int, metavar="N", help="with --local: jobs running at once (default 1)"
    )
    args = parser.parse_args(argv)
    if args.jobs is not None and not args.local:
        parser.error("--jobs needs --local")
    local_jobs = (args.jobs if args.jobs is not None else 1) if args.local else None
    return launch(
        args.campaign, output_root=args.output_root, dry_run=args.dry_run, local_jobs=local_jobs
    )


if __name__ == "__main__":
    sys.exit(main())
