"""scripts/bench_sac.py as a subprocess: the three modes of SAC's gradient step on the tiny
preset, and the refusal of a policy with no frozen trunk to keep."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "bench_sac.py"


def bench(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(SCRIPT), "--config-name", "tiny", *args, "train.torch_threads=1"],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
        cwd=ROOT,
    )


def test_bench_times_the_step_in_each_mode(tmp_path: Path) -> None:
    out = tmp_path / "bench.json"
    result = bench(
        "--steps", "1", "--fill", "16", "--out", str(out), "model.lora.layers=1",
        "sac.batch_size=8",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-2000:]
    measured = json.loads(out.read_text())
    assert measured["written_by"] == "scripts/bench_sac.py"
    for mode in ("whole model", "cache bfloat16", "cache as computed"):
        assert measured[f"{mode}: seconds per gradient step"] > 0
    # Filled from the replay: every lookup of the timed steps is held.
    assert measured["cache bfloat16: hit rate"] == measured["cache as computed: hit rate"] == 1
    bf16, exact = (
        measured[f"{m}: bytes per observation"] for m in ("cache bfloat16", "cache as computed")
    )
    assert bf16 * 2 == exact
    assert 0 < measured["bfloat16: max |log-prob difference|"] < 0.1


def test_bench_refuses_a_policy_without_a_frozen_trunk() -> None:
    result = bench("--steps", "1", "--fill", "8")  # the tiny preset adapts both of its layers
    assert result.returncode == 2, result.stdout[-2000:] + result.stderr[-2000:]
    assert "no frozen trunk to keep" in result.stderr
