"""Where training metrics go: `metrics.csv` and TensorBoard always, Weights & Biases on request,
and a rich progress bar on the terminal. Only the main process writes."""

from __future__ import annotations

import csv
import math
import os
from pathlib import Path
from typing import Any

from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)
from torch.utils.tensorboard import SummaryWriter

from glam.cli import describe_os_error
from glam.runs.errors import MetricsWriteError

METRICS_CSV = "metrics.csv"
TENSORBOARD_DIR = "tensorboard"
_INDEX_COLUMNS = ("update", "frames", "elapsed_seconds")


class MetricsLogger:
    """Appends one row per update to `metrics.csv` and the same scalars to TensorBoard (x-axis:
    frames) and, when asked, to wandb.

    On resume from the checkpoint of update `resume_update`, rows logged after it (by the run that
    was interrupted) are dropped from the CSV, and TensorBoard purges its later events, so the
    logs read as one uninterrupted run.
    """

    def __init__(
        self,
        run_dir: Path,
        *,
        enabled: bool,
        resume_update: int | None = None,
        resume_frames: int | None = None,
        wandb_project: str | None = None,
        config: dict[str, Any] | None = None,
    ) -> None:
        self.enabled = enabled
        self.csv_path = run_dir / METRICS_CSV
        self._columns: list[str] | None = None
        self._writer = None
        self._wandb = None
        if not enabled:
            return
        if resume_update is not None and self.csv_path.is_file():
            self._columns = _truncate_csv(self.csv_path, resume_update)
        purge_step = None if resume_frames is None else resume_frames + 1
        self._writer = SummaryWriter(str(run_dir / TENSORBOARD_DIR), purge_step=purge_step)
        if wandb_project is not None:
            try:
                import wandb  # an optional extra, imported only when asked for
            except ImportError as error:
                raise ImportError(
                    "train.wandb=true needs wandb: pip install 'glam[wandb]'"
                ) from error
            self._wandb = wandb.init(
                project=wandb_project,
                name=run_dir.name,
                dir=str(run_dir),
                config=config,
                resume="allow",
                id=_wandb_id(run_dir),
            )

    def log(self, update: int, frames: int, elapsed: float, metrics: dict[str, float]) -> None:
        """Record the metrics of one update (NaN where undefined, e.g. no episode ended).

        Raises:
            MetricsWriteError: metrics.csv could not be written (the run stops, status 2).
        """
        if not self.enabled:
            return
        row = {"update": update, "frames": frames, "elapsed_seconds": round(elapsed, 3)}
        row.update({key: _finite_or_blank(value) for key, value in metrics.items()})
        new_file = not self.csv_path.is_file()
        if self._columns is None:
            self._columns = [*_INDEX_COLUMNS, *sorted(metrics)]
        try:
            with self.csv_path.open("a", newline="") as file:
                writer = csv.DictWriter(file, fieldnames=self._columns, extrasaction="ignore")
                if new_file:
                    writer.writeheader()
                writer.writerow(row)
        except OSError as error:  # a full disk, a folder made read-only under the run
            raise MetricsWriteError(
                f"could not write {self.csv_path}: {describe_os_error(error)} (update {update})"
            ) from None
        for key, value in metrics.items():
            if math.isfinite(value):
                self._writer.add_scalar(key, value, global_step=frames)
        self._writer.flush()
        if self._wandb is not None:
            self._wandb.log({**metrics, "charts/update": update}, step=frames)

    def close(self) -> None:
        """Flush and close every sink."""
        if self._writer is not None:
            self._writer.close()
        if self._wandb is not None:
            self._wandb.finish()


def _finite_or_blank(value: float) -> float | str:
    return value if math.isfinite(value) else ""


def _wandb_id(run_dir: Path) -> str:
    # One wandb run per run folder, kept over resumes.
    path = run_dir / ".wandb_id"
    if not path.is_file():
        path.write_text(os.urandom(8).hex())
    return path.read_text().strip()


def _truncate_csv(path: Path, last_update: int) -> list[str]:
    """Drop rows after `last_update` (atomically); return the header."""
    with path.open(newline="") as file:
        reader = csv.DictReader(file)
        columns = list(reader.fieldnames or [])
        # A row cut by a failed write (a full disk) has no number: it goes with the later ones.
        rows = [row for row in reader if _update_of(row) <= last_update]
    tmp = path.with_name(f".{path.name}.tmp")
    with tmp.open("w", newline="") as file:
        writer = csv.DictWriter(file, fieldnames=columns)
        writer.writeheader()
        writer.writerows(rows)
    os.replace(tmp, path)
    return columns


def _update_of(row: dict[str, str | None]) -> float:
    """The update of a metrics.csv row, or infinity for a row that has none."""
    try:
        return int(row.get("update") or "")
    except ValueError:
        return math.inf


def read_metrics(run_dir: str | Path) -> list[dict[str, float]]:
    """The rows of a run's `metrics.csv` as floats (NaN for blanks)."""
    with (Path(run_dir) / METRICS_CSV).open(newline="") as file:
        return [
            {key: float(value) if value != "" else math.nan for key, value in row.items()}
            for row in csv.DictReader(file)
        ]


class ProgressBar:
    """Frames collected, env-steps per second and success rate (main process only), and a
    one-line summary per update (above the bar, or alone when the bar is off). `title` names the
    trainer at the bar's left."""

    def __init__(
        self,
        total_frames: int,
        start_frames: int,
        *,
        enabled: bool,
        bar: bool,
        title: str = "PPO",
    ) -> None:
        self.enabled = enabled
        self._progress = None
        if not (enabled and bar):
            return
        self._progress = Progress(
            TextColumn(f"[bold]{title}[/]"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("frames  {task.fields[fps]:>6.0f} fps  success {task.fields[success]}"),
            TimeElapsedColumn(),
            TimeRemainingColumn(),
        )
        self._task = self._progress.add_task(
            "train", total=total_frames, completed=start_frames, fps=0.0, success="  -  "
        )
        self._progress.start()

    def update(self, frames: int, fps: float, success_rate: float) -> None:
        """Move the bar to `frames` and refresh the figures."""
        if self._progress is None:
            return
        success = f"{success_rate:5.2f}" if math.isfinite(success_rate) else "  -  "
        self._progress.update(self._task, completed=frames, fps=fps, success=success)

    def print(self, line: str) -> None:
        """Print a line (above the bar when there is one)."""
        if self._progress is not None:
            self._progress.console.print(line, markup=False, highlight=False)
        elif self.enabled:
            print(line, flush=True)

    def close(self) -> None:
        """Stop refreshing (leaves the final bar on screen)."""
        if self._progress is not None:
            self._progress.stop()
