"""Compare training runs: learning curves over seeds, frames to success thresholds, final success.

    # any machine (reads run folders only): every seed of two presets, with the baselines
    python scripts/compare_runs.py runs/glam_paper/seed-* runs/npae/seed-* --out runs/cmp \
        --baselines runs/eval/random runs/eval/bot
    # group a sweep by a config key instead of train.label
    python scripts/compare_runs.py runs/lr-sweep/* --out runs/cmp-lr --label-by ppo.lr
    python scripts/compare_runs.py runs/a runs/b --out runs/cmp --thresholds 0.5 0.9 --smooth 5
    # agents whose updates differ in size (256 frames, 2,048): smooth over the same frames
    python scripts/compare_runs.py runs/llm/seed-* runs/symbolic/seed-* --out runs/cmp \
        --smooth-frames 10240

Runs are grouped by label (`train.label` of config.yaml; empty: the preset of `--config-name`,
else the folder name; `--label-by KEY...` uses config keys instead), and the runs of a label are
its seeds. Per group: the mean and 95% Student-t band over seeds of the smoothed success and
return against frames (smoothing: the episodes that ended in the last `--smooth` updates, or in
each run's updates that hold about `--smooth-frames` frames), the
frames each seed took to reach each `--thresholds` success rate, and the final success: a held-out
evaluation when the run folder holds one (`RUN/eval/<name>/results.json`, written by
`python scripts/post_training_tests.py agent.kind=checkpoint agent.path=RUN
eval.output_dir=RUN/eval/<name>`), else the last smoothed training success, marked as such.
`--baselines` adds evaluation results (random, bot) as reference lines and rows. Beside final
success: each group's training wall time (the trainer's clock), a writing policy's share of
invalid answers held out, and the agent figures of `--figures` that the evaluations hold (by
default a mediator's `ask/queries_per_episode`), then a table of every agent figure. The training
metrics of `--metrics` (by default a writing policy's `answers/invalid_share`) get a panel of
curves and their first and last values. docs/comparing_runs.md explains every figure.

Writes comparison.csv (tidy: label, seed, run, frames, success, return on the common frame grid),
final.csv (one row per seed of the final table, with wall time and agent figures), comparison.md
and comparison.png into `--out`: a folder holding an earlier comparison is refused unless
`--overwrite`, one that is a file, cannot be written or holds another kind of output (a training
run...) always, before any run is read. Exit status: 0 done; 2 bad input (a folder without
metrics.csv or config.yaml, a file that is not a CSV, a run with no logged update, an unknown
label key, two runs of one label and seed, baselines without results, an `--out` it may not
write).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from glam.cli import exit_on
from glam.compare import (
    DEFAULT_FIGURES,
    DEFAULT_LABEL_KEY,
    DEFAULT_METRICS,
    ComparisonError,
    FrameWindow,
    baseline_rows,
    load_run,
    write_comparison,
)
from glam.outputs import COMPARISON, OutputDirError, check_output_dir


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "run_dirs", nargs="+", type=Path, help="run folders (config.yaml, metrics.csv)"
    )
    parser.add_argument("--out", type=Path, required=True, help="folder for the comparison files")
    parser.add_argument(
        "--overwrite", action="store_true", help="replace an earlier comparison in --out"
    )
    parser.add_argument(
        "--label-by",
        nargs="+",
        default=[DEFAULT_LABEL_KEY],
        metavar="KEY",
        help="config key(s) whose values name a run's group (default: train.label)",
    )
    parser.add_argument(
        "--thresholds", nargs="+", type=float, default=[0.5, 0.8, 0.9], help="success rates"
    )
    window = parser.add_mutually_exclusive_group()
    window.add_argument("--smooth", type=int, default=10, help="smoothing window, in updates")
    window.add_argument(
        "--smooth-frames",
        type=int,
        default=None,
        help="smoothing window in frames: each run's updates that hold about this many (for "
        "runs whose updates differ in size)",
    )
    parser.add_argument(
        "--min-episodes",
        type=int,
        default=30,
        help="episodes a smoothing window needs for a value (early windows hold only the "
        "episodes that succeeded fast)",
    )
    parser.add_argument(
        "--baselines", nargs="+", type=Path, default=[], help="results.json files or folders"
    )
    parser.add_argument("--suite", default="no_change", help="evaluation suite of final success")
    parser.add_argument("--grid-points", type=int, default=200, help="frames of the common grid")
    parser.add_argument(
        "--figures",
        nargs="*",
        default=list(DEFAULT_FIGURES),
        metavar="KEY",
        help="agent figures of the evaluations (results.json agent_figures) shown beside "
        "success, where some run has them (default: ask/queries_per_episode)",
    )
    parser.add_argument(
        "--metrics",
        nargs="*",
        default=list(DEFAULT_METRICS),
        metavar="KEY",
        help="training metrics (metrics.csv columns) drawn and tabled beside success, where "
        "some run has them (default: answers/invalid_share, a writing policy's)",
    )
    args = parser.parse_args(argv)
    if args.smooth < 1 or args.grid_points < 2:
        parser.error("--smooth must be >= 1 and --grid-points >= 2")
    if args.smooth_frames is not None and args.smooth_frames < 1:
        parser.error(f"--smooth-frames must be >= 1, got {args.smooth_frames}")
    if not all(0 <= t <= 1 for t in args.thresholds):
        parser.error(f"--thresholds are success rates in [0, 1], got {args.thresholds}")
    with exit_on(ComparisonError, OutputDirError):
        check_output_dir(
            args.out, COMPARISON, key="--out", overwrite=args.overwrite, overwrite_key="--overwrite"
        )
        runs = [load_run(run_dir, args.label_by, args.metrics) for run_dir in args.run_dirs]
        baselines = baseline_rows(args.baselines, args.suite)
        paths = write_comparison(
            args.out,
            runs,
            thresholds=args.thresholds,
            window=args.smooth if args.smooth_frames is None else FrameWindow(args.smooth_frames),
            min_episodes=args.min_episodes,
            grid_points=args.grid_points,
            baselines=baselines,
            suite=args.suite,
            figures=args.figures,
            metrics=args.metrics,
        )
    print(paths["md"].read_text())
    for kind, path in paths.items():
        print(f"wrote {kind:3s} {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
