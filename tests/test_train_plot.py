"""scripts/plot_learning_curve.py on a hand-written metrics.csv."""

from __future__ import annotations

import math
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))

import plot_learning_curve  # noqa: E402
from plot_learning_curve import moving_average  # noqa: E402


def test_moving_average_weights_by_episodes_and_skips_blanks() -> None:
    values = [0.0, math.nan, 1.0, 0.5]
    weights = [1.0, 0.0, 3.0, 1.0]
    smoothed = moving_average(values, weights, window=2)
    assert smoothed[0] == 0.0
    assert smoothed[1] == 0.0  # the blank point (no episode ended) adds nothing
    assert smoothed[2] == pytest.approx(1.0)
    assert smoothed[3] == pytest.approx((3 * 1.0 + 1 * 0.5) / 4)


def test_plot_writes_a_png(tmp_path: Path) -> None:
    header = "update,frames,elapsed_seconds,charts/episodes,charts/success_rate,"
    header += "charts/episode_return,losses/entropy,losses/value"
    rows = [
        f"{u},{64 * u},{u},{u % 3},{'' if u % 3 == 0 else u / 10},0.5,1.0,0.2" for u in range(1, 9)
    ]
    (tmp_path / "metrics.csv").write_text("\n".join([header, *rows]) + "\n")
    out = tmp_path / "curve.png"
    result = subprocess.run(
        [
            sys.executable,
            str(ROOT / "scripts" / "plot_learning_curve.py"),
            str(tmp_path),
            "--out",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and out.stat().st_size > 10_000


@pytest.mark.parametrize("metrics", [None, "", "update,frames,charts/success_rate\n"])
def test_plot_refuses_a_run_with_no_logged_update(metrics: str | None, tmp_path: Path) -> None:
    """No metrics.csv, an empty one, or a header only (a run killed before its first update)."""
    if metrics is not None:
        (tmp_path / "metrics.csv").write_text(metrics)
    result = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "plot_learning_curve.py"), str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 2
    assert "the run has no logged update yet" in result.stderr
    expected = "has no metrics.csv" if metrics is None else "metrics.csv is empty"
    assert expected in result.stderr
    assert not (tmp_path / "learning_curve.png").exists()


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (b"\x89PNG\r\n\x1a\n\x00\xff\xfe", "is not a metrics.csv of a training run ('utf-8' codec"),
        (b"update,frames\n1,abc\n", "is not a metrics.csv of a training run (could not convert"),
        (b"update,frames\n1,8,9,10\n", "is not a metrics.csv of a training run ("),
        (b"update,success\n1,0.5\n", "has no frames column: not a metrics.csv of a training run"),
    ],
    ids=["binary", "text_value", "ragged_row", "no_frames"],
)
def test_plot_names_a_metrics_file_it_cannot_read(
    content: bytes, message: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Wrong or binary input was a raw traceback (UnicodeDecodeError, ValueError, KeyError)."""
    (tmp_path / "metrics.csv").write_bytes(content)
    with pytest.raises(SystemExit) as stopped:
        plot_learning_curve.main([str(tmp_path)])
    assert stopped.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: {tmp_path / 'metrics.csv'}") and message in err
    assert not (tmp_path / "learning_curve.png").exists()


def test_plot_refuses_an_out_that_is_a_folder_before_reading(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as stopped:
        plot_learning_curve.main([str(tmp_path / "no-run"), "--out", str(tmp_path)])
    assert stopped.value.code == 2
    assert capsys.readouterr().err == f"error: --out='{tmp_path}' is a folder: name a file\n"
