"""Keep the records of runs (no weights) in a folder that can be committed, so that a figure can
be redrawn with `scripts/compare_runs.py` once the run folders are gone.

    python scripts/keep_runs.py runs/ablation/ablation_gotoredball/*seed-* \
        --into docs/runs/ablation_gotoredball
    python scripts/compare_runs.py docs/runs/ablation_gotoredball/* --out runs/cmp

Each run folder (or evaluation folder) RUN becomes `--into`/RUN's name, holding its config.yaml,
metrics.csv, probe.csv, summary.json and the results and episodes of every evaluation below it
(`glam.runs.record`). Exit status: 0 done; 2 a folder that holds no record, or a destination
that exists and is not empty.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from glam.cli import exit_on
from glam.runs.record import keep_record


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run_dirs", nargs="+", type=Path, help="run or evaluation folders")
    parser.add_argument("--into", type=Path, required=True, help="folder of the records")
    args = parser.parse_args(argv)
    names = [run.resolve().name for run in args.run_dirs]
    with exit_on(FileNotFoundError, FileExistsError, ValueError):
        if len(set(names)) != len(names):
            raise ValueError("two run folders have the same name: keep them into separate --into")
        for run, name in zip(args.run_dirs, names, strict=True):
            written = keep_record(run, args.into / name)
            size = sum(path.stat().st_size for path in written)
            print(f"kept {run} -> {args.into / name}: {len(written)} files, {size / 1024:.0f} KiB")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
