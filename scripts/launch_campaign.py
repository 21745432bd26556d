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
job per run and level follows its training job (`--dependency=afterok`).

Before anything is submitted, every job's config is composed with Hydra from `configs/` (the
preset and the job's overrides) and validated against the schema of the script it runs: an
unknown key (`ppo.lrr`), an unknown preset or an invalid value is reported for every job it
hits, and nothing is written or submitted. `--dry-run` runs the same checks, prints the sbatch
commands and scripts and writes nothing. Exit status: 0 done, 1 sbatch failed, 2 the campaign
is invalid. The code lives in `glam.campaign`.
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
    args = parser.parse_args(argv)
    return launch(args.campaign, output_root=args.output_root, dry_run=args.dry_run)


if __name__ == "__main__":
    sys.exit(main())
