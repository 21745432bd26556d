"""A run's record: what stays of a run once its weights are gone.

A figure of the docs is redrawn from its runs' records: `config.yaml` and `metrics.csv` (what
`scripts/compare_runs.py` reads as a run), the probe and the end-of-run summary, and every
evaluation under `eval/` (its results and episodes, which the comparison reads as the run's
held-out success and pairs by seed). `keep_record` copies them, and nothing else (no checkpoint,
no TensorBoard events), into a folder that can be committed. Torch-free.
"""

from __future__ import annotations

import shutil
from pathlib import Path

__all__ = ["RECORD_FILES", "EVALUATION_FILES", "keep_record"]

RECORD_FILES = ("config.yaml", "metrics.csv", "probe.csv", "summary.json")
"""A run folder's own files that its record keeps (those the run has)."""
EVALUATION_FILES = ("results.json", "results.md", "episodes.jsonl", "ceiling_search.csv")
"""Files of each evaluation folder below the run (`RUN/eval/**`) that its record keeps."""


def keep_record(run_dir: str | Path, destination: str | Path) -> list[Path]:
    """Copy the record of the run (or evaluation) folder `run_dir` into `destination`, keeping
    the layout; return the files written.

    Raises:
        FileNotFoundError: `run_dir` has none of the record's files (not a run folder).
        FileExistsError: `destination` exists and is not empty.
    """
    source, target = Path(run_dir), Path(destination)
    files = [source / name for name in RECORD_FILES if (source / name).is_file()]
    files += [source / name for name in EVALUATION_FILES if (source / name).is_file()]
    files += sorted(
        path
        for path in (source / "eval").rglob("*")
        if path.is_file() and path.name in EVALUATION_FILES
    )
    if not files:
        raise FileNotFoundError(
            f"{source} holds no run or evaluation record ({', '.join(RECORD_FILES)})"
        )
    if target.exists() and any(target.iterdir()):
        raise FileExistsError(f"{target} exists and is not empty: choose another destination")
    written = []
    for path in files:
        copy = target / path.relative_to(source)
        copy.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(path, copy)
        written.append(copy)
    return written
