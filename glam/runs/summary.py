"""A run's health at its start and its end, printed when training ends and kept in summary.json.

Success alone does not say why a run did not learn. Beside it, the summary gives each
diagnostic of `DIAGNOSTICS` over the run's first and last `window` updates (the mean of the
updates that logged it), and, for a run probed with `train.probe_every`, the probability each
probe situation's policy gives each action at the first and the last probe (`glam.probe`): a
policy that learned only how often to take each action gives every situation the same numbers.

Reads metrics.csv and probe.csv only (no torch): `summarize_run(run_dir)` works on any run
folder, finished or not.
"""

from __future__ import annotations

import csv
import json
import math
from collections import defaultdict
from pathlib import Path
from typing import Any

__all__ = ["DIAGNOSTICS", "SUMMARY_JSON", "format_summary", "summarize_run", "write_summary"]

SUMMARY_JSON = "summary.json"
SUCCESS = "charts/success_rate"
EPISODES = "charts/episodes"
PROBE_CSV = "probe.csv"
"""`glam.probe.PROBE_CSV`, named again here so that reading a run needs no torch."""
DIAGNOSTICS = (
    "losses/entropy",
    "losses/approx_kl",
    "losses/clip_fraction",
    "losses/explained_variance",
    "losses/grad_norm",
    "grad/value_share",
    "probe/right_action_prob",
    "losses/td",
    "charts/q_mean",
    "charts/demo_agreement",
)
"""A run's health: the policy's entropy, PPO's approximate KL and clip fraction, the value
head's explained variance, the gradient norm before clipping, the value loss's share of the
gradient (`glam.ppo.diagnostics`) and the probe's probability of the right action
(`glam.probe`); for DRRN, its TD loss, mean max Q and, learning from demonstrations, the share
of the demonstrated states where its greedy action is the demonstrated one. A run reports those
it logs."""


def _number(text: str | None) -> float:
    try:
        return float(text) if text not in (None, "") else math.nan
    except ValueError:
        return math.nan


def _mean(values: list[float]) -> float:
    finite = [v for v in values if math.isfinite(v)]
    return sum(finite) / len(finite) if finite else math.nan


def summarize_run(run_dir: str | Path, window: int = 5) -> dict[str, Any]:
    """The summary of the run in `run_dir` (see the module docstring) as a JSON-ready dict.

    Raises:
        FileNotFoundError: the folder has no metrics.csv.
    """
    run_dir = Path(run_dir)
    with open(run_dir / "metrics.csv", newline="") as handle:
        rows = list(csv.DictReader(handle))
    first, last = rows[:window], rows[-window:]

    def success(part: list[dict[str, str]]) -> float:
        # Weighted by the episodes each update ended: the rate of the window's episodes.
        pairs = [(_number(r.get(SUCCESS)), _number(r.get(EPISODES))) for r in part]
        pairs = [(s, n) for s, n in pairs if math.isfinite(s) and math.isfinite(n) and n > 0]
        episodes = sum(n for _, n in pairs)
        return sum(s * n for s, n in pairs) / episodes if episodes else math.nan

    ends = {"charts/success_rate": (success(first), success(last))}
    for key in DIAGNOSTICS:
        if rows and key in rows[0]:
            ends[key] = (
                _mean([_number(r.get(key)) for r in first]),
                _mean([_number(r.get(key)) for r in last]),
            )
    summary: dict[str, Any] = {
        "updates": int(_number(rows[-1]["update"])) if rows else 0,
        "frames": int(_number(rows[-1]["frames"])) if rows else 0,
        "window": window,
        "start": {key: pair[0] for key, pair in ends.items()},
        "end": {key: pair[1] for key, pair in ends.items()},
        "probe": _probe_ends(run_dir / PROBE_CSV),
    }
    return summary


def _probe_ends(path: Path) -> dict[str, Any] | None:
    """Per probe situation, its right actions and each action's probability at the first and
    the last probed update; None without a probe.csv."""
    if not path.is_file():
        return None
    with open(path, newline="") as handle:
        rows = list(csv.DictReader(handle))
    if not rows:
        return None
    updates = sorted({int(row["update"]) for row in rows})
    ends = {"first": updates[0], "last": updates[-1]}
    situations: dict[str, dict[str, Any]] = defaultdict(
        lambda: {"right": [], "first": {}, "last": {}}
    )
    for row in rows:
        situation = situations[row["probe"]]
        for end, update in ends.items():
            if int(row["update"]) == update:
                situation[end][row["action"]] = float(row["probability"])
        if row["is_right"] == "True" and row["action"] not in situation["right"]:
            situation["right"].append(row["action"])
    return {"first_update": ends["first"], "last_update": ends["last"], "situations": situations}


def format_summary(summary: dict[str, Any]) -> str:
    """The summary as a few lines for the end of a run."""
    window = summary["window"]
    lines = [f"health over the first and the last {window} updates (start -> end):"]
    for key, start in summary["start"].items():
        lines.append(f"  {key:28s} {start:8.4f} -> {summary['end'][key]:8.4f}")
    probe = summary["probe"]
    if probe is not None:
        lines.append(
            f"probe, update {probe['first_update']} -> {probe['last_update']}: "
            "each action's probability (* the right one)"
        )
        for name, situation in probe["situations"].items():
            cells = [
                f"{action}{'*' if action in situation['right'] else ''} "
                f"{p:.2f}->{situation['last'].get(action, math.nan):.2f}"
                for action, p in situation["first"].items()
            ]
            lines.append(f"  {name:28s} " + "  ".join(cells))
    return "\n".join(lines)


def write_summary(run_dir: str | Path, window: int = 5) -> tuple[dict[str, Any], Path]:
    """`summarize_run`, written to the run's summary.json (NaN as null); returns both."""
    summary = summarize_run(run_dir, window)
    path = Path(run_dir) / SUMMARY_JSON
    text = json.dumps(_nan_to_none(summary), indent=2)
    temporary = path.with_suffix(".json.tmp")
    temporary.write_text(text + "\n")
    temporary.replace(path)
    return summary, path


def _nan_to_none(value: Any) -> Any:
    if isinstance(value, dict):
        return {key: _nan_to_none(item) for key, item in value.items()}
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value
