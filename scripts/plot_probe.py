"""Draw GLAM's action-probability probe of a run: the probability of the right action per task
type against updates, from the run's probe.csv (`train.probe_every`, `glam.probe`).

    python scripts/plot_probe.py runs/tiny                    # -> runs/tiny/probe.png
    python scripts/plot_probe.py runs/tiny --out docs/probe.png

One line per task type (the mean over its situations of the probability the policy gives the
right action), thin lines for the situations, and the uniform policy's level (1 / the number of
actions) for reference. A run without probe.csv, or with an empty one, is an error: exit
status 2, no PNG.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import matplotlib
import pandas as pd

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from glam.cli import report  # noqa: E402
from glam.outputs import (  # noqa: E402
    PLOT_SUFFIXES,
    add_output_file_options,
    check_output_file,
    png_metadata,
)

PROBE_CSV = "probe.csv"
"""`glam.probe.PROBE_CSV`, restated so that plotting never imports torch."""


def right_action_probabilities(probe: pd.DataFrame) -> pd.DataFrame:
    """Per update and situation: the task type and the right action's probability."""
    right = probe[probe["is_right"].astype(str).str.lower() == "true"]
    return right[["update", "probe", "task_type", "probability"]].reset_index(drop=True)


def plot(probe: pd.DataFrame, title: str, out: Path) -> None:
    """Write the PNG: per task type its mean (thick) and its situations (thin)."""
    right = right_action_probabilities(probe)
    actions = probe.groupby(["update", "probe"]).size().max()
    figure, axis = plt.subplots(figsize=(8, 4.8))
    for k, (task_type, rows) in enumerate(right.groupby("task_type", sort=True)):
        color = f"C{k % 10}"
        for _, situation in rows.groupby("probe"):
            axis.plot(
                situation["update"], situation["probability"], color=color, lw=0.6, alpha=0.35
            )
        mean = rows.groupby("update")["probability"].mean()
        situations = rows["probe"].nunique()
        axis.plot(
            mean.index,
            mean.values,
            "o-",
            color=color,
            lw=2,
            ms=3,
            label=f"{task_type} ({situations})",
        )
    axis.axhline(1 / actions, color="0.4", ls="--", lw=1, label=f"uniform (1/{actions})")
    axis.set_ylim(-0.02, 1.02)
    axis.set_xlabel("update")
    axis.set_ylabel("probability of the right action")
    axis.set_title(title)
    axis.grid(alpha=0.3)
    axis.legend(fontsize="small", title="task type (situations)")
    figure.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(
        out, dpi=120, metadata=png_metadata(WRITER) if out.suffix.lower() == ".png" else None
    )
    plt.close(figure)


WRITER = "scripts/plot_probe.py"
"""The mark of the PNG this script writes (`glam.outputs.png_metadata`)."""


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run_dir", type=Path, help="run folder holding probe.csv")
    add_output_file_options(parser, help="PNG path (default RUN_DIR/probe.png)")
    args = parser.parse_args(argv)
    path = args.run_dir / PROBE_CSV
    if not path.is_file():
        return report(
            f"{args.run_dir} has no {PROBE_CSV}: train with train.probe_every=N "
            "(an LLM policy) to probe every N updates"
        )
    out = args.out or args.run_dir / "probe.png"
    try:
        check_output_file(
            out, key="--out", writer=WRITER, overwrite=args.overwrite, suffixes=PLOT_SUFFIXES
        )
        probe = pd.read_csv(path)
    except pd.errors.EmptyDataError:
        probe = pd.DataFrame()
    except (OSError, UnicodeDecodeError, ValueError) as error:  # OutputDirError is a ValueError
        return report(error)
    if probe.empty:
        return report(f"{path} is empty: no update has been probed yet")
    plot(probe, f"{args.run_dir.name}: action-probability probe", out)
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
