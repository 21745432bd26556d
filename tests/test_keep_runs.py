"""A run's record (`scripts/keep_runs.py`): its logs and evaluations, never its weights."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from glam.runs.record import keep_record

ROOT = Path(__file__).resolve().parents[1]


def _run(folder: Path) -> Path:
    (folder / "checkpoints" / "update_000001").mkdir(parents=True)
    (folder / "checkpoints" / "update_000001" / "optimizer.pt").write_bytes(b"weights")
    (folder / "tensorboard").mkdir()
    (folder / "tensorboard" / "events.out.tfevents.1").write_bytes(b"events")
    (folder / "config.yaml").write_text("train: {seed: 1}\n")
    (folder / "metrics.csv").write_text("update,frames\n1,256\n")
    evaluation = folder / "eval" / "BabyAI-GoToRedBall-v0"
    evaluation.mkdir(parents=True)
    for name in ("results.json", "episodes.jsonl", "results.png"):
        (evaluation / name).write_text("{}")
    return folder


def test_the_record_keeps_logs_and_evaluations_only(tmp_path: Path) -> None:
    run = _run(tmp_path / "run")
    written = keep_record(run, tmp_path / "kept" / "run")
    kept = {path.relative_to(tmp_path / "kept" / "run").as_posix() for path in written}
    assert kept == {
        "config.yaml",
        "metrics.csv",
        "eval/BabyAI-GoToRedBall-v0/results.json",
        "eval/BabyAI-GoToRedBall-v0/episodes.jsonl",
    }
    assert (tmp_path / "kept" / "run" / "metrics.csv").read_text() == "update,frames\n1,256\n"
    with pytest.raises(FileExistsError, match="not empty"):
        keep_record(run, tmp_path / "kept" / "run")
    with pytest.raises(FileNotFoundError, match="holds no run or evaluation record"):
        keep_record(tmp_path / "kept" / "run" / "eval", tmp_path / "elsewhere")


def test_the_script_names_each_record_after_its_run(tmp_path: Path) -> None:
    runs = [_run(tmp_path / "a" / "seed-1"), _run(tmp_path / "b" / "seed-2")]
    command = [
        sys.executable,
        "scripts/keep_runs.py",
        *map(str, runs),
        "--into",
        str(tmp_path / "k"),
    ]
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert sorted(p.name for p in (tmp_path / "k").iterdir()) == ["seed-1", "seed-2"]
    again = subprocess.run(command, cwd=ROOT, capture_output=True, text=True)
    assert again.returncode == 2 and "not empty" in again.stderr
    twice = [
        sys.executable,
        "scripts/keep_runs.py",
        str(runs[0]),
        str(runs[0]),
        "--into",
        str(tmp_path / "t"),
    ]
    same = subprocess.run(twice, cwd=ROOT, capture_output=True, text=True)
    assert same.returncode == 2 and "same name" in same.stderr
