"""Draw a run's learning curves (success rate, return, entropy, value loss) from metrics.csv.

    python scripts/plot_learning_curve.py runs/tiny                     # -> runs/tiny/learning_curve.png
    python scripts/plot_learning_curve.py runs/tiny --out docs/curve.png --smooth 5
    python scripts/plot_learning_curve.py runs/a runs/b --labels lr=1e-4 lr=1e-3 --out cmp.png

Points are per update (episodes that ended during its rollout); the thick line is a moving
average over `--smooth` updates, weighted by the number of episodes, so updates in which few
episodes ended count little. A run with no logged update yet (no metrics.csv, or one with a
header only or nothing), a metrics.csv that is not one (binary, no frames column, a value that
is not a number) and an `--out` that cannot be written are errors: `error: ...`, exit status 2,
no PNG. An existing PNG at `--out` is replaced (a plot is redrawn from the runs at will).
"""

from __future__ import annotations

import argparse
import csv
import math
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from glam.cli import exit_on  # noqa: E402
from glam.outputs import (  # noqa: E402
    PLOT_SUFFIXES,
    add_output_file_options,
    check_output_file,
    png_metadata,
)

PANELS = (
    ("charts/success_rate", "success rate", True),
    ("charts/episode_return", "episode return (BabyAI reward)", True),
    ("losses/entropy", "policy entropy", False),
    ("losses/value", "value loss", False),
)
"""(metric, axis label, weighted by episodes)."""


def read_metrics(run_dir: Path) -> list[dict[str, float]]:
    """The rows of `RUN_DIR/metrics.csv` as floats (NaN for blanks: no episode ended).

    Read here rather than through `glam.ppo.logger.read_metrics` so that plotting never imports
    torch and transformers (seconds saved, and it works in a plotting-only environment).

    Raises:
        ValueError: the file is missing, empty (no logged update), not text, without a `frames`
            column, or holds a value that is not a number; the message names it.
    """
    path = run_dir / "metrics.csv"
    if not path.is_file():
        raise ValueError(f"{run_dir} has no metrics.csv: the run has no logged update yet")
    try:
        with path.open(newline="", encoding="utf-8") as file:
            reader = csv.DictReader(file)
            rows = [
                {key: float(value) if value != "" else math.nan for key, value in row.items()}
                for row in reader
            ]
    except (OSError, UnicodeDecodeError, csv.Error, ValueError, TypeError) as error:
        # TypeError: a row longer than the header (its extra values come as a list).
        first = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        raise ValueError(f"{path} is not a metrics.csv of a training run ({first})") from None
    if not rows:  # a run killed before its first update leaves a header or nothing
        raise ValueError(f"{path} is empty: the run has no logged update yet")
    if "frames" not in rows[0]:
        raise ValueError(f"{path} has no frames column: not a metrics.csv of a training run")
    return rows


def moving_average(values: list[float], weights: list[float], window: int) -> list[float]:
    """Trailing average of the finite `values` over `window` points, weighted by `weights`."""
    out = []
    for i in range(len(values)):
        pairs = [
            (v, w)
            for v, w in zip(
                values[max(0, i - window + 1) : i + 1],
                weights[max(0, i - window + 1) : i + 1],
                strict=True,
            )
            if math.isfinite(v) and w > 0
        ]
        total = sum(w for _, w in pairs)
        out.append(sum(v * w for v, w in pairs) / total if total else math.nan)
    return out


def plot(runs: list[list[dict[str, float]]], labels: list[str], out: Path, smooth: int) -> None:
    """Write one PNG with a panel per metric and a line per run (`runs`: each run's rows)."""
    figure, axes = plt.subplots(2, 2, figsize=(11, 7), sharex=True)
    for rows, label in zip(runs, labels, strict=True):
        frames = [row["frames"] for row in rows]
        episodes = [row.get("charts/episodes", 1.0) for row in rows]
        for axis, (key, title, weighted) in zip(axes.flat, PANELS, strict=True):
            values = [row.get(key, math.nan) for row in rows]
            weights = episodes if weighted else [1.0] * len(values)
            (line,) = axis.plot(frames, moving_average(values, weights, smooth), lw=2, label=label)
            axis.plot(frames, values, ".", ms=3, alpha=0.35, color=line.get_color())
            axis.set_title(title)
            axis.grid(alpha=0.3)
    axes[0, 0].set_ylim(-0.02, 1.02)
    for axis in axes[1]:
        axis.set_xlabel("frames (environment steps, all processes)")
    if len(runs) > 1:
        axes[0, 0].legend()
    figure.suptitle(", ".join(labels))
    figure.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(
        out, dpi=120, metadata=png_metadata(WRITER) if out.suffix.lower() == ".png" else None
    )
    plt.close(figure)


WRITER = "scripts/plot_learning_curve.py"
"""The mark of the PNG this script writes (`glam.outputs.png_metadata`)."""


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run_dirs", nargs="+", type=Path, help="run folders holding metrics.csv")
    add_output_file_options(parser, help="PNG path (default RUN_DIR/learning_curve.png)")
    parser.add_argument("--labels", nargs="+", help="one label per run (default: folder names)")
    parser.add_argument("--smooth", type=int, default=10, help="moving-average window, updates")
    args = parser.parse_args(argv)
    labels = args.labels or [run_dir.name for run_dir in args.run_dirs]
    if len(labels) != len(args.run_dirs):
        parser.error("give one --labels entry per run folder")
    out = args.out or args.run_dirs[0] / "learning_curve.png"
    with exit_on(ValueError):  # OutputDirError is one
        check_output_file(
            out, key="--out", writer=WRITER, overwrite=args.overwrite, suffixes=PLOT_SUFFIXES
        )
        runs = [read_metrics(run_dir) for run_dir in args.run_dirs]
    plot(runs, labels, out, max(args.smooth, 1))
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
