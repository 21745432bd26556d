"""Reading comparisons of training runs: curves over seeds, frames to thresholds, final success.

Run folders (`scripts/train_language_agent.py`'s `train.output_dir`) are grouped by a label, by
default `train.label` of their `config.yaml` (empty: the preset named by `--config-name` in
`launch.command`, else the folder's name); the runs of one label are its seeds (`train.seed`).

- **Smoothing.** `metrics.csv` has one row per update, whose success rate and return are over
  the episodes that ended during that update's rollout (blank when none did). The smoothed
  success after update u is the success rate of all the episodes that ended in updates
  u - N + 1 .. u (a trailing window of N updates, each update weighted by its episodes, so an
  update in which one episode ended counts for one episode); the smoothed return likewise. A
  window given in frames (`FrameWindow`) is, for each run, the number of its updates that hold
  about that many frames: runs whose updates differ in size are smoothed over the same
  experience.
  With `min_episodes`, a window holding fewer episodes gives no value: at the start of a run only
  episodes that succeeded quickly have ended (a time-out takes the level's whole step limit),
  so the first few ended episodes overstate the policy's success.
- **Curves.** Each run's smoothed curves are interpolated linearly onto a common grid of frames
  (evenly spaced from the earliest first logged frame to the latest last one), never before the
  run's first smoothed value nor after its last: a run says nothing past its last frame. A
  group's curve is drawn where all of its seeds have a value: its mean over seeds and a 95%
  Student-t interval over seeds (mean +- t(0.975, n - 1) * sd / sqrt(n); none for one seed).
- **Frames to a threshold.** Per seed, the first logged frame at which the smoothed success is
  at least the threshold; per group, the median and mean over the seeds that reached it, and
  how many of them did.
- **Final success.** A run's held-out evaluation, found by convention in the run folder:
  `RUN/eval/**/results.json` as written by `scripts/post_training_tests.py` with
  `eval.output_dir=RUN/eval/<name>`; its `no_change` suite (or another one) gives the success
  rate with its 95% Wilson interval over episodes. A run without one is reported with its last
  smoothed training success instead, marked as such. Over several seeds: the mean of the
  seeds' rates with a t-interval over seeds, and the Wilson interval of the pooled episodes.
- **Costs beside success.** A run's training wall time is the trainer's clock at its last
  logged update (`elapsed_seconds` of metrics.csv, carried over resumes; the time a killed run
  waited is not counted); a group's is the mean over its seeds. An evaluation's agent figures
  (`agent_figures` of its suite in results.json: a mediator's queries per episode, `ask/*`) are
  read with its success; a group's is the mean over the seeds that have it.
- **Training metrics** (`metrics`: columns of metrics.csv, by default a writing policy's
  `answers/invalid_share`, shown where some run has them): per run the mean over the last N
  updates (trailing, each update counting once), on the same grid; per group the mean and
  t-band over seeds, one more panel of the plot, and in the Markdown the first and last window's
  value. A held-out evaluation's share of invalid answers (`invalid_action_rate`, a writing
  policy's) is shown beside its success where some row has one above 0.
- **Baselines** (random, BabyAI's bot...) are evaluation results only: a row in the final table
  and a horizontal line on the curves.

`scripts/compare_runs.py` writes `comparison.csv` (tidy: one row per run and grid frame),
`final.csv` (one row per seed of each final row, with its wall time and agent figures),
`comparison.md` (the runs, the thresholds and the final success) and `comparison.png`.
"""

from __future__ import annotations

import dataclasses
import difflib
import hashlib
import json
import math
import shlex
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from omegaconf import OmegaConf

from glam.eval.report import AGENT_FIGURES
from glam.eval.stats import seed_interval, t_interval, t_quantile, wilson_interval
from glam.outputs import COMPARISON, EPISODES_JSONL
from glam.runs.summary import DIAGNOSTICS

__all__ = [
    "COMPARISON_FILES",
    "DEFAULT_FIGURES",
    "DEFAULT_LABEL_KEY",
    "DEFAULT_METRICS",
    "DIAGNOSTICS",
    "Band",
    "ComparisonError",
    "FinalRow",
    "FrameWindow",
    "Outcome",
    "Run",
    "ThresholdRow",
    "Window",
    "band_over_seeds",
    "baseline_rows",
    "check_distinct_seeds",
    "comparison_markdown",
    "config_value",
    "final_rows",
    "final_table",
    "find_results",
    "frame_grid",
    "frames_to_threshold",
    "group_bands",
    "group_runs",
    "interpolate",
    "load_run",
    "metric_bands",
    "plot_comparison",
    "preset_from_command",
    "read_evaluation",
    "run_label",
    "smooth",
    "t_interval",
    "t_quantile",
    "threshold_rows",
    "tidy_curves",
    "window_text",
    "window_updates",
    "write_comparison",
]

METRICS_CSV = "metrics.csv"
CONFIG_YAML = "config.yaml"
EVAL_DIR = "eval"
"""Folder of a run that holds its evaluations (`RUN/eval/**/results.json`)."""
RESULTS_JSON = "results.json"
SUCCESS, RETURN, EPISODES = "charts/success_rate", "charts/episode_return", "charts/episodes"
ELAPSED = "elapsed_seconds"
DEFAULT_LABEL_KEY = "train.label"
DEFAULT_FIGURES = ("ask/queries_per_episode",)
"""Agent figures shown beside success in the final table, when some row has them."""
DEFAULT_METRICS = ("answers/invalid_share",)
"""Training metrics drawn beside success, when some run has them."""
COMPARISON_FILES = {
    "csv": "comparison.csv",
    "final": "final.csv",
    "md": "comparison.md",
    "png": "comparison.png",
}
"""What `write_comparison` writes, by the key of its returned paths."""
assert tuple(COMPARISON_FILES.values()) == COMPARISON.files  # what `check_output_dir` looks for
HELD_OUT, TRAINING, BASELINE = "held-out evaluation", "training", "baseline"
"""`FinalRow.source`."""


class ComparisonError(ValueError):
    """Input that cannot be compared (a folder that is not a run, an unknown key...): the
    message names it and says why."""


# ---------------------------------------------------------------------------------------------
# Runs and their labels
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Run:
    """One training run: its label, seed and per-update metrics."""

    path: Path
    label: str
    label_source: str
    """Where the label came from: the key(s), `--config-name`, or `folder name`."""
    seed: int
    level: str
    """`env.name` of the run."""
    frames: np.ndarray
    """(updates,) frames collected at the end of each update, increasing."""
    success: np.ndarray
    """(updates,) success rate of the episodes that ended in the update; NaN when none did."""
    returns: np.ndarray
    """(updates,) mean return of those episodes; NaN when none ended."""
    episodes: np.ndarray
    """(updates,) episodes that ended in the update."""
    wall_seconds: float = math.nan
    """The trainer's wall clock at the last logged update (NaN: metrics.csv has no clock)."""
    metrics: Mapping[str, np.ndarray] = field(default_factory=dict)
    """(updates,) values of the training metrics asked for that metrics.csv has."""

    @property
    def seconds_per_update(self) -> float:
        """The trainer's wall clock per logged update (NaN without a clock)."""
        return self.wall_seconds / len(self.frames)


@dataclass(frozen=True)
class FrameWindow:
    """A smoothing window of about `frames` frames: for each run, the number of its updates
    that hold that many frames (its median frames per update; at least 1). Agents whose updates
    differ in size (the language model's 256 frames, symbolic PPO's 2,048) are then smoothed over
    the same stretch of experience, where a window of N updates would not be."""

    frames: int

    def __post_init__(self) -> None:
        if self.frames < 1:
            raise ValueError(f"the smoothing window must be >= 1 frame, got {self.frames}")

    def updates(self, run: Run) -> int:
        """The window in `run`'s updates."""
        steps = np.diff(np.concatenate([[0.0], np.asarray(run.frames, float)]))
        per_update = float(np.median(steps)) if len(steps) else float(self.frames)
        return max(1, round(self.frames / max(per_update, 1.0)))

    def __str__(self) -> str:
        return f"{self.frames:,} frames"


Window = int | FrameWindow
"""A smoothing window: a number of updates, or about a number of frames (`FrameWindow`)."""


def window_updates(window: Window, run: Run) -> int:
    """The window in `run`'s updates."""
    return window.updates(run) if isinstance(window, FrameWindow) else int(window)


def window_text(window: Window) -> str:
    """`10 update(s)` or `10,240 frames`, for the reports."""
    return str(window) if isinstance(window, FrameWindow) else f"{window} update(s)"


def config_value(config: Mapping[str, Any], key: str) -> Any:
    """`config["a"]["b"]` for `key` "a.b".

    Raises:
        KeyError: the key is not in the config (the message suggests close ones).
    """
    node: Any = config
    for part in key.split("."):
        if not isinstance(node, Mapping) or part not in node:
            known = _flat_keys(config)
            close = difflib.get_close_matches(key, known, n=3)
            hint = f" (did you mean {', '.join(close)}?)" if close else ""
            raise KeyError(f"{key!r} is not a key of config.yaml{hint}")
        node = node[part]
    return node


def _flat_keys(config: Mapping[str, Any], prefix: str = "") -> list[str]:
    keys = []
    for name, value in config.items():
        keys.append(prefix + str(name))
        if isinstance(value, Mapping):
            keys += _flat_keys(value, f"{prefix}{name}.")
    return keys


def preset_from_command(command: str) -> str | None:
    """The Hydra preset a training command names (`--config-name X`, `-cn X`, `--config-name=X`)."""
    try:
        words = shlex.split(command)
    except ValueError:  # unbalanced quotes: read it word by word
        words = command.split()
    for i, word in enumerate(words):
        for flag in ("--config-name", "-cn"):
            if word == flag and i + 1 < len(words):
                return words[i + 1]
            if word.startswith(flag + "="):
                return word[len(flag) + 1 :]
    return None


def run_label(
    config: Mapping[str, Any], run_dir: Path, label_by: Sequence[str] = (DEFAULT_LABEL_KEY,)
) -> tuple[str, str]:
    """`(label, where it came from)` of a run.

    `train.label` alone: its value; when empty (or from before the key existed), the preset
    named by `--config-name` in `launch.command`, else the folder's name. Other keys: `key=value`
    pairs joined by ", " (`ppo.lr=0.001, model.lora.r=8`).

    Raises:
        KeyError: a key of `label_by` is not in the config.
    """
    if list(label_by) == [DEFAULT_LABEL_KEY]:
        train = config.get("train") or {}
        if train.get("label"):
            return str(train["label"]), DEFAULT_LABEL_KEY
        preset = preset_from_command(str((config.get("launch") or {}).get("command", "")))
        if preset:
            return preset, "--config-name"
        return run_dir.name, "folder name"
    values = [config_value(config, key) for key in label_by]
    label = ", ".join(f"{key}={value}" for key, value in zip(label_by, values, strict=True))
    return label, ", ".join(label_by)


def load_run(
    run_dir: str | Path,
    label_by: Sequence[str] = (DEFAULT_LABEL_KEY,),
    metrics: Sequence[str] = DEFAULT_METRICS,
) -> Run:
    """Read a run folder's `config.yaml` and `metrics.csv`, with the columns of `metrics` and
    `DIAGNOSTICS` it has.

    Raises:
        ComparisonError: not a folder, no config.yaml or metrics.csv, no logged update, a
            metrics.csv without frames or success, or a label key the config lacks.
    """
    path = Path(run_dir)
    if not path.is_dir():
        raise ComparisonError(f"{path} is not a folder")
    metrics_file, config_file = path / METRICS_CSV, path / CONFIG_YAML
    if not metrics_file.is_file():
        raise ComparisonError(
            f"{path} has no {METRICS_CSV}: not a run folder, or the run has no logged update yet"
        )
    if not config_file.is_file():
        raise ComparisonError(f"{path} has no {CONFIG_YAML}: not a training run folder")
    try:
        metrics_table = pd.read_csv(metrics_file)
    except pd.errors.EmptyDataError:
        metrics_table = pd.DataFrame()
    except (OSError, UnicodeDecodeError, ValueError) as error:  # binary, ragged, unreadable
        message = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        raise ComparisonError(f"{metrics_file} is not a readable CSV file ({message})") from None
    if metrics_table.empty:
        raise ComparisonError(f"{metrics_file} is empty: the run has no logged update yet")
    missing = [column for column in ("frames", SUCCESS) if column not in metrics_table]
    if missing:
        raise ComparisonError(f"{metrics_file} has no column {', '.join(missing)}")
    try:
        config = OmegaConf.to_container(OmegaConf.load(config_file))
    except Exception as error:  # OmegaConf and YAML raise many kinds; any is a bad file
        raise ComparisonError(f"{config_file} is not a readable config: {error}") from None
    if not isinstance(config, dict):
        raise ComparisonError(f"{config_file} is not a config (a YAML mapping)")
    try:
        label, source = run_label(config, path, label_by)
        seed = int(config_value(config, "train.seed"))
    except KeyError as error:
        raise ComparisonError(f"{config_file}: {error.args[0]}") from None
    metrics_table = metrics_table.sort_values("frames")
    columns = {
        "frames": "frames",
        "success": SUCCESS,
        "returns": RETURN,
        "episodes": EPISODES,
        "elapsed": ELAPSED,
    }
    try:
        values = {
            name: metrics_table[column].to_numpy(dtype=float) if column in metrics_table else None
            for name, column in columns.items()
        }
    except (ValueError, TypeError) as error:
        raise ComparisonError(
            f"{metrics_file} holds a value that is not a number: {error}"
        ) from None
    try:
        extra = {
            key: metrics_table[key].to_numpy(dtype=float)
            for key in dict.fromkeys([*metrics, *DIAGNOSTICS])
            if key in metrics_table
        }
    except (ValueError, TypeError) as error:
        raise ComparisonError(
            f"{metrics_file} holds a value that is not a number: {error}"
        ) from None
    finite = np.isfinite(values["success"])
    return Run(
        path=path,
        label=label,
        label_source=source,
        seed=seed,
        level=str((config.get("env") or {}).get("name", "")),
        frames=values["frames"],
        success=values["success"],
        returns=values["returns"]
        if values["returns"] is not None
        else np.full(len(finite), np.nan),
        # Logs without the count: each update with a success rate counts as one episode.
        episodes=np.nan_to_num(values["episodes"])
        if values["episodes"] is not None
        else finite.astype(float),
        wall_seconds=float(np.nanmax(values["elapsed"]))
        if values["elapsed"] is not None and np.isfinite(values["elapsed"]).any()
        else math.nan,
        metrics=extra,
    )


def check_distinct_seeds(runs: Sequence[Run]) -> None:
    """Two runs of one label with the same seed would be averaged as two seeds.

    Raises:
        ComparisonError: naming both runs.
    """
    seen: dict[tuple[str, int], Path] = {}
    for run in runs:
        key = (run.label, run.seed)
        if key in seen:
            raise ComparisonError(
                f"{seen[key]} and {run.path} are both label {run.label!r}, seed {run.seed}: "
                "group them apart with --label-by (or set train.label), or leave one out"
            )
        seen[key] = run.path


# ---------------------------------------------------------------------------------------------
# Curves: smoothing, the common grid, bands over seeds
# ---------------------------------------------------------------------------------------------


def _window_sums(
    values: np.ndarray, episodes: np.ndarray, window: int
) -> tuple[np.ndarray, np.ndarray]:
    """Trailing sums over `window` updates of `values * episodes` and of `episodes`."""
    if window < 1:
        raise ValueError(f"the smoothing window must be >= 1 update, got {window}")
    weights = np.where(np.isfinite(values), episodes, 0.0)
    weighted = np.where(weights > 0, np.nan_to_num(values) * weights, 0.0)
    total = pd.Series(weighted).rolling(window, min_periods=1).sum().to_numpy()
    count = pd.Series(weights).rolling(window, min_periods=1).sum().to_numpy()
    return total, count


def smooth(
    values: np.ndarray, episodes: np.ndarray, window: int, min_episodes: int = 1
) -> np.ndarray:
    """Per update, the mean of `values` over the episodes that ended in the last `window`
    updates (trailing; NaN when fewer than `min_episodes`, at least 1, ended in them)."""
    total, count = _window_sums(np.asarray(values, float), np.asarray(episodes, float), window)
    enough = count >= max(1, min_episodes)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(enough, total / np.where(enough, count, 1), np.nan)


def interpolate(frames: np.ndarray, values: np.ndarray, grid: np.ndarray) -> np.ndarray:
    """`values` (logged at `frames`) at the `grid` frames: linear between the finite values,
    NaN before the first finite one and after the last (never extrapolated)."""
    frames, values, grid = (np.asarray(a, float) for a in (frames, values, grid))
    finite = np.isfinite(values)
    out = np.full(grid.shape, np.nan)
    if not finite.any():
        return out
    known_frames, known = frames[finite], values[finite]
    inside = (grid >= known_frames[0]) & (grid <= known_frames[-1])
    out[inside] = np.interp(grid[inside], known_frames, known)
    return out


def frame_grid(runs: Sequence[Run], points: int) -> np.ndarray:
    """`points` whole frame counts, evenly spaced from the earliest first logged frame of
    `runs` to the latest last one (fewer if rounding merges some)."""
    if points < 2:
        raise ValueError(f"the frame grid needs at least 2 points, got {points}")
    start = min(run.frames[0] for run in runs)
    end = max(run.frames[-1] for run in runs)
    return np.unique(np.round(np.linspace(start, end, points)))


@dataclass(frozen=True)
class Band:
    """A group's curve on the grid: mean over seeds and its 95% t-interval, with the seeds'
    own curves."""

    mean: np.ndarray
    low: np.ndarray
    high: np.ndarray
    curves: np.ndarray
    """(seeds, grid): each seed's curve (NaN where it has no value)."""

    @property
    def seeds(self) -> int:
        return self.curves.shape[0]


def band_over_seeds(curves: np.ndarray, bounds: tuple[float, float] | None = None) -> Band:
    """Mean and 95% t-interval of `curves` (seeds, grid), where every seed has a value (NaN
    elsewhere; NaN bounds for one seed), clipped to `bounds` when given (success: [0, 1])."""
    curves = np.atleast_2d(np.asarray(curves, float))
    seeds = curves.shape[0]
    everywhere = np.isfinite(curves).all(axis=0)
    mean, low, high = (np.full(curves.shape[1], np.nan) for _ in range(3))
    if everywhere.any():
        covered = curves[:, everywhere]
        mean[everywhere] = covered.mean(axis=0)
        if seeds > 1:
            half = t_quantile(0.975, seeds - 1) * covered.std(axis=0, ddof=1) / math.sqrt(seeds)
            low[everywhere] = mean[everywhere] - half
            high[everywhere] = mean[everywhere] + half
            if bounds is not None:
                low[everywhere] = np.maximum(low[everywhere], bounds[0])
                high[everywhere] = np.minimum(high[everywhere], bounds[1])
    return Band(mean, low, high, curves)


def group_runs(runs: Iterable[Run]) -> dict[str, list[Run]]:
    """Runs by label (labels in order of first appearance, runs by seed)."""
    groups: dict[str, list[Run]] = defaultdict(list)
    for run in runs:
        groups[run.label].append(run)
    return {label: sorted(members, key=lambda r: r.seed) for label, members in groups.items()}


def _smoothed_on_grid(
    run: Run, grid: np.ndarray, window: Window, min_episodes: int = 1
) -> tuple[np.ndarray, np.ndarray]:
    size = window_updates(window, run)
    success = interpolate(run.frames, smooth(run.success, run.episodes, size, min_episodes), grid)
    returns = interpolate(run.frames, smooth(run.returns, run.episodes, size, min_episodes), grid)
    return success, returns


def group_bands(
    runs: Sequence[Run], grid: np.ndarray, window: Window, min_episodes: int = 1
) -> dict[str, tuple[Band, Band]]:
    """Per label: the (success, return) bands of its seeds' smoothed curves on `grid`."""
    bands = {}
    for label, members in group_runs(runs).items():
        curves = [_smoothed_on_grid(run, grid, window, min_episodes) for run in members]
        bands[label] = (
            band_over_seeds(np.stack([c[0] for c in curves]), bounds=(0.0, 1.0)),
            band_over_seeds(np.stack([c[1] for c in curves])),
        )
    return bands


def metric_bands(
    runs: Sequence[Run], grid: np.ndarray, key: str, window: Window
) -> dict[str, Band]:
    """Per label whose runs all have training metric `key`: the band of their curves on `grid`,
    each the metric's mean over the last `window` updates (trailing, one weight per update)."""
    bands = {}
    for label, members in group_runs(runs).items():
        if all(key in run.metrics for run in members):
            curves = [_metric_on_grid(run, key, grid, window) for run in members]
            bands[label] = band_over_seeds(np.stack(curves))
    return bands


def _metric_on_grid(run: Run, key: str, grid: np.ndarray, window: Window) -> np.ndarray:
    values = run.metrics[key]
    size = window_updates(window, run)
    return interpolate(run.frames, smooth(values, np.ones_like(values), size), grid)


def tidy_curves(
    runs: Sequence[Run],
    grid: np.ndarray,
    window: Window,
    min_episodes: int = 1,
    metrics: Sequence[str] = (),
) -> pd.DataFrame:
    """One row per run and grid frame it covers: label, seed, run, frames, smoothed success and
    return (blank where no episode had ended yet), then the training metrics of `metrics` that
    some run has (blank for a run without it)."""
    shown = [key for key in metrics if any(key in run.metrics for run in runs)]
    tables = []
    for run in runs:
        success, returns = _smoothed_on_grid(run, grid, window, min_episodes)
        covered = (grid >= run.frames[0]) & (grid <= run.frames[-1])
        extra = {
            key: _metric_on_grid(run, key, grid, window)[covered]
            if key in run.metrics
            else np.full(int(covered.sum()), np.nan)
            for key in shown
        }
        tables.append(
            pd.DataFrame(
                {
                    "label": run.label,
                    "seed": run.seed,
                    "run": str(run.path),
                    "frames": grid[covered].astype(int),
                    "success": success[covered],
                    "return": returns[covered],
                    **extra,
                }
            )
        )
    return pd.concat(tables, ignore_index=True)


# ---------------------------------------------------------------------------------------------
# Frames to a success threshold
# ---------------------------------------------------------------------------------------------


def frames_to_threshold(frames: np.ndarray, smoothed: np.ndarray, threshold: float) -> float | None:
    """The first frame at which `smoothed` success is >= `threshold`; None if never."""
    reached = np.flatnonzero(np.nan_to_num(np.asarray(smoothed, float), nan=-1.0) >= threshold)
    return float(frames[reached[0]]) if reached.size else None


@dataclass(frozen=True)
class ThresholdRow:
    """Frames a group's seeds took to reach one success threshold."""

    label: str
    threshold: float
    per_seed: dict[int, float | None]
    """Seed -> first frame at or above the threshold (None: never)."""

    @property
    def reached(self) -> list[float]:
        return [f for f in self.per_seed.values() if f is not None]

    @property
    def median(self) -> float:
        return float(np.median(self.reached)) if self.reached else math.nan

    @property
    def mean(self) -> float:
        return float(np.mean(self.reached)) if self.reached else math.nan


def threshold_rows(
    runs: Sequence[Run], thresholds: Sequence[float], window: Window, min_episodes: int = 1
) -> list[ThresholdRow]:
    """Per label and threshold, each seed's frames to reach it (smoothed success)."""
    rows = []
    for label, members in group_runs(runs).items():
        smoothed = {
            run.seed: smooth(run.success, run.episodes, window_updates(window, run), min_episodes)
            for run in members
        }
        for threshold in thresholds:
            per_seed = {
                run.seed: frames_to_threshold(run.frames, smoothed[run.seed], threshold)
                for run in members
            }
            rows.append(ThresholdRow(label, threshold, per_seed))
    return rows


# ---------------------------------------------------------------------------------------------
# Final success: held-out evaluations, else the end of training; baselines
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Outcome:
    """One seed's (or one baseline file's) final success."""

    seed: int | None
    success_rate: float
    successes: int
    episodes: int
    mean_return: float
    source_file: Path
    wall_seconds: float = math.nan
    """Training wall time of the seed's run (NaN for a baseline)."""
    figures: Mapping[str, float] = field(default_factory=dict)
    """The agent's own figures in the evaluation (`agent_figures`), e.g. queries per episode."""
    invalid_share: float = math.nan
    """Share of the evaluation's steps whose answer named no action (`invalid_action_rate`: a
    writing policy's; 0 for an agent that scores its actions; NaN: the file has none)."""
    episodes_digest: str | None = None
    """A digest of the suite's episodes (seed, success, return, length, invalid answers and the
    actions played of each, from the `episodes.jsonl` beside the results; None without one). Equal digests are
    replays of one evaluation, e.g. a deterministic rule evaluated once per training seed:
    counted once. (Files written before the actions were recorded digest without them: two
    agents that fail every episode at the step limit look alike there.)"""


def episodes_digest(path: Path, suite: str) -> str | None:
    """The digest of `suite`'s episodes in the episodes.jsonl at `path` (see
    `Outcome.episodes_digest`); None when there is no such file or episode."""
    try:
        lines = path.read_text().splitlines()
    except OSError:
        return None
    rows = []
    for line in lines:
        try:
            record = json.loads(line)
        except ValueError:
            return None
        if record.get("suite") == suite:
            rows.append(
                [
                    record.get(key)
                    for key in (
                        "seed",
                        "success",
                        "episode_return",
                        "length",
                        "invalid_actions",
                        "actions",
                    )
                ]
            )
    if not rows:
        return None
    rows.sort(key=lambda row: json.dumps(row))
    return hashlib.sha256(json.dumps(rows).encode()).hexdigest()


def read_evaluation(path: Path, suite: str) -> tuple[str, str, Outcome] | None:
    """`(label, level, outcome)` of `suite` in one results.json; None when the file has no such
    suite or it was not applicable.

    Raises:
        ComparisonError: the file is not a results.json of `scripts/post_training_tests.py`.
    """
    try:
        results = json.loads(path.read_text())
        record = results["suites"].get(suite)
        level = (record.get("level") or results["eval"]["level"]) if record else None
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as error:
        raise ComparisonError(f"{path} is not an evaluation's results.json ({error})") from None
    if record is None or "success_rate" not in record:
        return None
    episodes = int(record["episodes"])
    figures = record.get(AGENT_FIGURES) or {}
    outcome = Outcome(
        seed=None,
        success_rate=float(record["success_rate"]),
        successes=round(float(record["success_rate"]) * episodes),
        episodes=episodes,
        mean_return=float(record["mean_return"]),
        source_file=path,
        figures={
            key: float(value)
            for key, value in figures.items()
            if isinstance(value, (int, float)) and not isinstance(value, bool)
        },
        invalid_share=float(record.get("invalid_action_rate", math.nan)),
        episodes_digest=episodes_digest(path.parent / EPISODES_JSONL, suite),
    )
    return str(results.get("label", path.parent.name)), str(level), outcome


def find_results(path: Path) -> list[Path]:
    """`path` itself if it is a file, else every results.json below it."""
    if path.is_file():
        return [path]
    return sorted(path.rglob(RESULTS_JSON)) if path.is_dir() else []


@dataclass(frozen=True)
class FinalRow:
    """A group's final success, from one source, on one level."""

    label: str
    source: str
    """`held-out evaluation`, `training` (the last smoothed window) or `baseline`."""
    level: str
    outcomes: list[Outcome]

    @property
    def distinct(self) -> list[Outcome]:
        """The outcomes less the replays of an earlier one (equal `episodes_digest`): a
        deterministic agent evaluated once per seed is one evaluation, not several."""
        seen: set[str] = set()
        kept = []
        for outcome in self.outcomes:
            if outcome.episodes_digest is not None:
                if outcome.episodes_digest in seen:
                    continue
                seen.add(outcome.episodes_digest)
            kept.append(outcome)
        return kept

    @property
    def mean(self) -> float:
        """Mean success rate over the distinct seeds (files)."""
        return float(np.mean([o.success_rate for o in self.distinct]))

    @property
    def seed_interval(self) -> tuple[float, float]:
        """95% t-interval over the distinct seeds, clipped to [0, 1] (NaN for one)."""
        _, low, high = seed_interval([o.success_rate for o in self.distinct])
        return low, high

    @property
    def episodes(self) -> int:
        """Episodes of the distinct evaluations (replays not counted again)."""
        return sum(o.episodes for o in self.distinct)

    @property
    def pooled_interval(self) -> tuple[float, float]:
        """95% Wilson interval of the distinct evaluations' episodes together (NaN without
        episodes)."""
        if not self.episodes:
            return math.nan, math.nan
        return wilson_interval(sum(o.successes for o in self.distinct), self.episodes)

    @property
    def mean_return(self) -> float:
        return float(np.mean([o.mean_return for o in self.outcomes]))

    @property
    def wall_seconds(self) -> float:
        """Mean training wall time over the seeds that logged one (NaN: none did)."""
        walls = [o.wall_seconds for o in self.outcomes if math.isfinite(o.wall_seconds)]
        return float(np.mean(walls)) if walls else math.nan

    @property
    def figure_keys(self) -> list[str]:
        """The agent figures any of the seeds' evaluations has, sorted."""
        return sorted({key for o in self.outcomes for key in o.figures})

    @property
    def invalid_share(self) -> float:
        """Mean share of invalid answers over the seeds whose evaluation has one (NaN: none)."""
        values = [o.invalid_share for o in self.outcomes if math.isfinite(o.invalid_share)]
        return float(np.mean(values)) if values else math.nan

    def figure(self, key: str) -> float:
        """Mean of an agent figure over the seeds whose evaluation has it (NaN: none has)."""
        values = [o.figures[key] for o in self.outcomes if key in o.figures]
        return float(np.mean(values)) if values else math.nan


def _training_outcome(run: Run, window: Window) -> Outcome:
    """The episodes that ended in the run's last `window` (its updates)."""
    size = window_updates(window, run)
    successes, episodes = _window_sums(run.success, run.episodes, size)
    returns, _ = _window_sums(run.returns, run.episodes, size)
    count = int(round(episodes[-1]))
    return Outcome(
        seed=run.seed,
        success_rate=successes[-1] / count if count else math.nan,
        successes=int(round(successes[-1])),
        episodes=count,
        mean_return=returns[-1] / count if count else math.nan,
        source_file=run.path / METRICS_CSV,
        wall_seconds=run.wall_seconds,
    )


def final_rows(runs: Sequence[Run], window: Window, suite: str = "no_change") -> list[FinalRow]:
    """Per label: a held-out row per evaluated level (seeds with a `RUN/eval/**/results.json`
    holding `suite`), and a training row for the seeds without any.

    Raises:
        ComparisonError: a run holds two evaluations of `suite` on one level (which is final?).
    """
    rows = []
    for label, members in group_runs(runs).items():
        held_out: dict[str, list[Outcome]] = defaultdict(list)
        not_evaluated = []
        for run in members:
            found: dict[str, Outcome] = {}
            for path in find_results(run.path / EVAL_DIR):
                read = read_evaluation(path, suite)
                if read is None:
                    continue
                _, level, outcome = read
                if level in found:
                    raise ComparisonError(
                        f"{run.path} has two evaluations of {suite} on {level}: "
                        f"{found[level].source_file} and {path}; move the one that is not "
                        f"final out of {run.path / EVAL_DIR}"
                    )
                found[level] = dataclasses.replace(
                    outcome, seed=run.seed, wall_seconds=run.wall_seconds
                )
            for level, outcome in found.items():
                held_out[level].append(outcome)
            if not found:
                not_evaluated.append(run)
        for level, outcomes in sorted(held_out.items()):
            rows.append(FinalRow(label, HELD_OUT, level, outcomes))
        if not_evaluated:
            levels = sorted({run.level for run in not_evaluated})
            outcomes = [_training_outcome(run, window) for run in not_evaluated]
            rows.append(FinalRow(label, TRAINING, ", ".join(levels), outcomes))
    return rows


def baseline_rows(paths: Sequence[Path], suite: str = "no_change") -> list[FinalRow]:
    """Evaluation results of agents without a training curve (random, bot...), by label and
    level; several files of one label and level are its seeds.

    Raises:
        ComparisonError: a path holds no results.json, or none with `suite`.
    """
    groups: dict[tuple[str, str], list[Outcome]] = defaultdict(list)
    for path in paths:
        files = find_results(Path(path))
        if not files:
            raise ComparisonError(f"no {RESULTS_JSON} at {path}")
        read = [r for r in (read_evaluation(file, suite) for file in files) if r is not None]
        if not read:
            raise ComparisonError(f"no {RESULTS_JSON} at {path} has the suite {suite}")
        for label, level, outcome in read:
            groups[label, level].append(outcome)
    return [FinalRow(label, BASELINE, level, out) for (label, level), out in groups.items()]


# ---------------------------------------------------------------------------------------------
# Writing: the tidy CSV, the Markdown tables, the plot
# ---------------------------------------------------------------------------------------------


def _num(value: float, digits: int = 3) -> str:
    return "–" if value is None or not math.isfinite(value) else f"{value:.{digits}f}"


def _frames(value: float | None) -> str:
    return "–" if value is None or not math.isfinite(value) else f"{value:,.0f}"


def _interval(low: float, high: float) -> str:
    return "–" if not math.isfinite(low) else f"[{low:.3f}, {high:.3f}]"


def _seeds(row: FinalRow) -> str:
    """The row's seeds (files), saying how many are replays counted once."""
    distinct = len(row.distinct)
    if distinct == len(row.outcomes):
        return str(distinct)
    return f"{len(row.outcomes)} ({distinct} distinct: the rest replay its episodes)"


def _minutes(seconds: float) -> str:
    return "–" if not math.isfinite(seconds) else f"{seconds / 60:.1f} min"


def _figure_keys(finals: Sequence[FinalRow]) -> list[str]:
    """Every agent figure some row's evaluations hold, sorted."""
    return sorted({key for row in finals for key in row.figure_keys})


def _shows_invalid(finals: Sequence[FinalRow]) -> bool:
    """Some evaluation played invalid answers (a writing policy's): its share is shown."""
    return any(o.invalid_share > 0 for row in finals for o in row.outcomes)


def final_table(finals: Sequence[FinalRow]) -> pd.DataFrame:
    """One row per seed (file) of each final row: its success, episodes, return, training wall
    time, share of invalid answers (where some evaluation has invalid answers) and agent figures
    (blank where it has none)."""
    keys = _figure_keys(finals)
    invalid = _shows_invalid(finals)
    records = [
        {
            "label": row.label,
            "source": row.source,
            "level": row.level,
            "seed": outcome.seed,
            "success_rate": outcome.success_rate,
            "successes": outcome.successes,
            "episodes": outcome.episodes,
            "mean_return": outcome.mean_return,
            "train_wall_seconds": outcome.wall_seconds,
            **({"invalid_action_rate": outcome.invalid_share} if invalid else {}),
            **{key: outcome.figures.get(key, math.nan) for key in keys},
            "source_file": str(outcome.source_file),
        }
        for row in finals
        for outcome in row.outcomes
    ]
    return pd.DataFrame.from_records(records)


def comparison_markdown(
    runs: Sequence[Run],
    bands: Mapping[str, tuple[Band, Band]],
    grid: np.ndarray,
    thresholds: Sequence[ThresholdRow],
    finals: Sequence[FinalRow],
    *,
    window: Window,
    suite: str,
    min_episodes: int = 1,
    figures: Sequence[str] = DEFAULT_FIGURES,
    metrics: Sequence[str] = DEFAULT_METRICS,
) -> str:
    """The comparison as Markdown: how it was computed, the runs, thresholds, the training
    metrics `metrics` (those some run has) at the start and the end of training, final success
    with the training wall time, the share of invalid answers (where some evaluation has one)
    and the agent figures `figures` beside it (those some row has), then every agent figure the
    evaluations hold."""
    lines = [
        f"# Comparison of {len(runs)} runs in {len(bands)} groups",
        "",
        f"Success and return are smoothed over the episodes that ended in the last "
        f"{window_text(window)}{_per_run_updates(runs, window)} (trailing window, each update "
        f"weighted by its episodes), interpolated onto "
        f"{len(grid)} frames from {_frames(grid[0])} to {_frames(grid[-1])} (never past a run's "
        "last logged frame). A group's curve is its mean over seeds where every seed has a "
        "value, with a 95% Student-t interval over seeds (none for one seed)."
        + (
            f" A smoothed value needs at least {min_episodes} episodes in its window (blank "
            "before): early in training only the episodes that succeeded quickly have ended "
            "(a time-out takes the level's whole step limit), so the first few episodes "
            "overstate success."
            if min_episodes > 1
            else ""
        ),
        "",
        "## Runs",
        "",
        "| label | seed | run | level | updates | last frame | training wall time "
        "| s per update | label from |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for label, members in group_runs(runs).items():
        for run in members:
            lines.append(
                f"| {label} | {run.seed} | {run.path} | {run.level} | {len(run.frames)} "
                f"| {_frames(run.frames[-1])} | {_minutes(run.wall_seconds)} "
                f"| {_num(run.seconds_per_update, 1)} | {run.label_source} |"
            )
    ends = []
    for label, (success, _) in bands.items():
        covered = grid[np.isfinite(success.mean)]
        longest = max(run.frames[-1] for run in group_runs(runs)[label])
        if covered.size and covered[-1] < longest:
            ends.append(
                f"- {label}: the curve stops at {_frames(covered[-1])} frames, where its "
                f"shortest seed ends (longest: {_frames(longest)})."
            )
    if ends:
        lines += ["", *ends]
    lines += [
        "",
        "## Frames to reach a success rate",
        "",
        f"First logged frame at which a seed's smoothed success (window {window_text(window)}) "
        "is at least "
        "the threshold; median and mean over the seeds that reached it.",
        "",
        "| label | threshold | seeds reached | median frames | mean frames | per seed |",
        "|---|---|---|---|---|---|",
    ]
    for row in thresholds:
        per_seed = ", ".join(
            f"{seed}: {_frames(frames) if frames is not None else 'never'}"
            for seed, frames in row.per_seed.items()
        )
        lines.append(
            f"| {row.label} | {row.threshold:g} | {len(row.reached)} of {len(row.per_seed)} "
            f"| {_frames(row.median)} | {_frames(row.mean)} | {per_seed} |"
        )
    lines += _metrics_markdown(runs, metrics, window)
    keys = _figure_keys(finals)
    beside = [key for key in figures if key in keys]
    invalid = _shows_invalid(finals)
    lines += [
        "",
        "## Final success",
        "",
        f"Held-out evaluation: the `{suite}` suite of `RUN/eval/**/results.json`. Training: the "
        f"episodes of the last {window_text(window)} of training, NOT held out. Mean over seeds, "
        "its 95% t-interval over seeds (clipped to [0, 1]), and the 95% Wilson interval of all "
        "the episodes pooled; evaluations that replay the same episodes (a deterministic "
        "agent, once per seed) count once. "
        "Training wall time: the trainer's clock at the run's last update, mean over seeds."
        + (
            " Invalid answers: the evaluation's share of steps whose written answer named no "
            "action (played as in training), mean over seeds."
            if invalid
            else ""
        )
        + (
            f" {', '.join(f'`{key}`' for key in beside)}: the evaluation's own figure, mean "
            "over the seeds that have it."
            if beside
            else ""
        ),
        "",
        "| label | source | level | seeds | success (mean) | 95% CI over seeds | "
        "pooled episodes [Wilson] | episodes | mean return | training wall time | "
        + ("invalid answers | " if invalid else "")
        + "".join(f"{key} | " for key in beside)
        + "per seed |",
        "|---|---|---|---|---|---|---|---|---|---|" + "---|" * (len(beside) + invalid),
    ]
    for row in finals:
        per_seed = ", ".join(
            (f"{o.seed}: " if o.seed is not None else "") + _num(o.success_rate)
            for o in row.outcomes
        )
        lines.append(
            f"| {row.label} | {row.source} | {row.level} | {_seeds(row)} | {_num(row.mean)} "
            f"| {_interval(*row.seed_interval)} | {_interval(*row.pooled_interval)} "
            f"| {row.episodes} | {_num(row.mean_return)} | {_minutes(row.wall_seconds)} | "
            + (f"{_num(row.invalid_share)} | " if invalid else "")
            + "".join(f"{_num(row.figure(key), 2)} | " for key in beside)
            + f"{per_seed} |"
        )
    if keys:
        lines += [
            "",
            "## The agents' own figures",
            "",
            f"From the `{suite}` evaluations' `agent_figures` (mean over the seeds that have "
            "each; – where none has it). Per seed: final.csv.",
            "",
            "| label | source | level | seeds | " + " | ".join(keys) + " |",
            "|---|---|---|---|" + "---|" * len(keys),
        ]
        for row in finals:
            if row.figure_keys:
                lines.append(
                    f"| {row.label} | {row.source} | {row.level} | {len(row.outcomes)} | "
                    + " | ".join(_num(row.figure(key), 3) for key in keys)
                    + " |"
                )
    sources = sorted({str(o.source_file) for row in finals for o in row.outcomes})
    lines += ["", "Read from:", "", *(f"- {source}" for source in sources)]
    return "\n".join(lines) + "\n"


def _per_run_updates(runs: Sequence[Run], window: Window) -> str:
    """For a window in frames, each run's window in its updates (nothing for one in updates)."""
    if not isinstance(window, FrameWindow):
        return ""
    sizes = ", ".join(f"{run.label} seed {run.seed}: {window.updates(run)}" for run in runs)
    return f" (in each run's updates: {sizes})"


def _metrics_markdown(runs: Sequence[Run], metrics: Sequence[str], window: Window) -> list[str]:
    """The training metrics some run has: per group and metric, the mean over seeds of each
    seed's mean over its first and its last `window`."""
    shown = [key for key in metrics if any(key in run.metrics for run in runs)]
    if not shown:
        return []
    lines = [
        "",
        "## Training metrics",
        "",
        f"Each seed's mean over its first and its last {window_text(window)} (each update "
        "counting once), then the mean over the group's seeds that logged the metric.",
        "",
        "| label | metric | seeds | first window | last window | per seed (first -> last) |",
        "|---|---|---|---|---|---|",
    ]
    for key in shown:
        for label, members in group_runs(runs).items():
            logged = [run for run in members if key in run.metrics]
            if not logged:
                continue
            ends = [_ends(run.metrics[key], window_updates(window, run)) for run in logged]
            per_seed = ", ".join(
                f"{run.seed}: {_num(first)} -> {_num(last)}"
                for run, (first, last) in zip(logged, ends, strict=True)
            )
            first = float(np.mean([e[0] for e in ends]))
            last = float(np.mean([e[1] for e in ends]))
            lines.append(
                f"| {label} | {key} | {len(logged)} | {_num(first)} | {_num(last)} | {per_seed} |"
            )
    return lines


def _ends(values: np.ndarray, window: int) -> tuple[float, float]:
    """The mean of the first and of the last `window` finite values (NaN: none)."""
    finite = values[np.isfinite(values)]
    if not finite.size:
        return math.nan, math.nan
    return float(finite[:window].mean()), float(finite[-window:].mean())


def plot_comparison(
    path: Path,
    grid: np.ndarray,
    bands: Mapping[str, tuple[Band, Band]],
    baselines: Sequence[FinalRow],
    window: Window,
    metrics: Mapping[str, Mapping[str, Band]] | None = None,
) -> None:
    """Success and return against frames, then one panel per training metric of `metrics`
    (metric -> label -> band): per group its mean and 95% band over seeds (with few seeds the
    t-band is wide, so each seed's curve is drawn too, thin); each baseline a horizontal line on
    success and return."""
    # Imported here: pyplot takes about a second to load and only the plot needs it.
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    metrics = {key: by_label for key, by_label in (metrics or {}).items() if by_label}
    panels = 2 + len(metrics)
    figure, axes = plt.subplots(1, panels, figsize=(6 * panels, 4.8), sharex=True, squeeze=False)
    axes = axes[0]
    for k, (label, pair) in enumerate(bands.items()):
        color = f"C{k % 10}"
        drawn = [*pair, *(by_label.get(label) for by_label in metrics.values())]
        for axis, band, bounded in zip(
            axes, drawn, (True, False, *[False] * len(metrics)), strict=True
        ):
            if band is None:
                continue
            axis.plot(grid, band.mean, color=color, lw=2, label=f"{label} (n={band.seeds})")
            low, high = band.low, band.high
            if bounded:  # a success rate: draw the interval inside [0, 1]
                low, high = np.clip(low, 0, 1), np.clip(high, 0, 1)
            axis.fill_between(grid, low, high, color=color, alpha=0.2, lw=0)
            if band.seeds > 1:
                for curve in band.curves:
                    axis.plot(grid, curve, color=color, lw=0.7, alpha=0.6)
    for k, row in enumerate(baselines):
        style = {"color": f"0.{2 + 2 * (k % 4)}", "ls": (0, (4, 2 + k)), "lw": 1.2}
        name = f"{row.label} ({row.level.removeprefix('BabyAI-')})"
        axes[0].axhline(row.mean, **style, label=f"{name}: {row.mean:.2f}")
        axes[1].axhline(row.mean_return, **style, label=f"{name}: {row.mean_return:.2f}")
    axes[0].set_ylim(-0.02, 1.02)
    # The return axis fits the curves, not the bands: with two seeds t(0.975, 1) = 12.7 and a
    # band would squash every curve (it runs off the plot's edge instead).
    shown = [returns.curves[np.isfinite(returns.curves)] for _, returns in bands.values()]
    shown += [np.array([row.mean_return for row in baselines])]
    values = np.concatenate(shown)
    if values.size:
        low, high = float(values.min()), float(values.max())
        margin = 0.05 * (high - low) or 0.05
        axes[1].set_ylim(low - margin, high + margin)
    axes[0].set_title(f"success rate (the last {window_text(window)}' episodes)")
    axes[1].set_title("episode return (BabyAI reward)")
    for axis, key in zip(axes[2:], metrics, strict=True):
        axis.set_title(f"{key} (last {window_text(window)})")
        shown = [band.curves[np.isfinite(band.curves)] for band in metrics[key].values()]
        values = np.concatenate(shown)
        if values.size:  # fit the curves, not the t-bands (see the return axis)
            low, high = float(values.min()), float(values.max())
            margin = 0.05 * (high - low) or 0.05
            axis.set_ylim(low - margin, high + margin)
    for axis in axes:
        axis.set_xlabel("frames (environment steps, all processes)")
        axis.grid(alpha=0.3)
        axis.legend(fontsize="small")
    figure.suptitle("mean over seeds (thick), each seed (thin), 95% t-interval band")
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)


def write_comparison(
    out_dir: str | Path,
    runs: Sequence[Run],
    *,
    thresholds: Sequence[float] = (0.5, 0.8, 0.9),
    window: Window = 10,
    min_episodes: int = 1,
    grid_points: int = 200,
    baselines: Sequence[FinalRow] = (),
    suite: str = "no_change",
    figures: Sequence[str] = DEFAULT_FIGURES,
    metrics: Sequence[str] = DEFAULT_METRICS,
) -> dict[str, Path]:
    """Compare `runs`; write `COMPARISON_FILES` into `out_dir` and return their paths by key.

    Raises:
        ComparisonError: no run, two runs of one label and seed, or a run with two final
            evaluations on one level.
    """
    if not runs:
        raise ComparisonError("no run to compare")
    check_distinct_seeds(runs)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = {key: out / name for key, name in COMPARISON_FILES.items()}
    grid = frame_grid(runs, grid_points)
    bands = group_bands(runs, grid, window, min_episodes)
    finals = [*final_rows(runs, window, suite), *baselines]
    metric_curves = {key: metric_bands(runs, grid, key, window) for key in metrics}
    tidy_curves(runs, grid, window, min_episodes, metrics).to_csv(paths["csv"], index=False)
    final_table(finals).to_csv(paths["final"], index=False)
    paths["md"].write_text(
        comparison_markdown(
            runs,
            bands,
            grid,
            threshold_rows(runs, thresholds, window, min_episodes),
            finals,
            window=window,
            min_episodes=min_episodes,
            suite=suite,
            figures=figures,
            metrics=list(dict.fromkeys([*metrics, *DIAGNOSTICS])),
        )
    )
    plot_comparison(paths["png"], grid, bands, baselines, window, metric_curves)
    return paths
