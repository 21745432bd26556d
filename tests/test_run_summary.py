"""A run's end-of-run summary: the diagnostics at the start and the end, and the probe."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from glam.runs.summary import format_summary, summarize_run, write_summary


def _write_run(folder: Path) -> None:
    folder.mkdir()
    rows = [
        # update, frames, success, episodes, entropy, value share
        (1, 256, "", 0, 1.0, 0.9),
        (2, 512, 0.5, 2, 0.9, 0.8),
        (3, 768, 1.0, 2, 0.8, ""),
        (4, 1024, 0.0, 1, 0.5, 0.2),
    ]
    lines = ["update,frames,charts/success_rate,charts/episodes,losses/entropy,grad/value_share"]
    lines += [",".join(str(v) for v in row) for row in rows]
    (folder / "metrics.csv").write_text("\n".join(lines) + "\n")
    probe = ["update,probe,task_type,action,probability,is_right"]
    for update, p_right in ((0, 0.2), (4, 0.9)):
        probe.append(f"{update},goto-left,goto,turn left,{p_right},True")
        probe.append(f"{update},goto-left,goto,go forward,{1 - p_right:.1f},False")
    (folder / "probe.csv").write_text("\n".join(probe) + "\n")


def test_the_summary_holds_each_end_by_hand(tmp_path: Path) -> None:
    _write_run(tmp_path / "run")
    summary = summarize_run(tmp_path / "run", window=2)
    assert (summary["updates"], summary["frames"]) == (4, 1024)
    # Success is the rate of the window's episodes: (0.5 * 2) / 2, then (1.0 * 2 + 0) / 3.
    assert summary["start"]["charts/success_rate"] == pytest.approx(0.5)
    assert summary["end"]["charts/success_rate"] == pytest.approx(2 / 3)
    assert summary["start"]["losses/entropy"] == pytest.approx(0.95)
    assert summary["end"]["losses/entropy"] == pytest.approx(0.65)
    assert summary["end"]["grad/value_share"] == pytest.approx(0.2)  # a blank is skipped
    assert "losses/approx_kl" not in summary["start"]  # not logged: not made up
    situation = summary["probe"]["situations"]["goto-left"]
    assert situation["right"] == ["turn left"]
    assert situation["first"] == {"turn left": 0.2, "go forward": 0.8}
    assert situation["last"]["turn left"] == 0.9
    text = format_summary(summary)
    assert "losses/entropy" in text and "turn left* 0.20->0.90" in text


def test_the_summary_file_is_json_with_nan_as_null(tmp_path: Path) -> None:
    _write_run(tmp_path / "run")
    (tmp_path / "run" / "probe.csv").unlink()
    summary, path = write_summary(tmp_path / "run", window=1)
    assert math.isnan(summary["start"]["charts/success_rate"])  # no episode in update 1
    written = json.loads(path.read_text())
    assert written["start"]["charts/success_rate"] is None and written["probe"] is None
