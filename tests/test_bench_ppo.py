"""scripts/bench_ppo.py as a subprocess: the training script's config checks and accelerator."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from helpers_launch import accelerate_launch

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "bench_ppo.py"


def _env() -> dict[str, str]:
    return {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}


def bench(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(SCRIPT), "--config-name", "tiny", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=_env(),
        cwd=ROOT,
    )


def test_bench_measures_the_tiny_preset(tmp_path: Path) -> None:
    out = tmp_path / "bench.json"
    result = bench("--updates", "1", "--out", str(out), "train.torch_threads=1")
    assert result.returncode == 0, result.stderr
    measured = json.loads(out.read_text())
    assert measured["updates_measured"] == 1 and measured["frames_per_update"] == 64
    assert measured["rollout_env_steps_per_s"] > 0 and measured["update_env_steps_per_s"] > 0
    assert measured["distributed"].startswith("1 process(es)")


def test_bench_refuses_unknown_keys_with_or_without_plus() -> None:
    """Hydra's compose + `OmegaConf.to_object` used to drop a `+key` silently and benchmark
    the config without it."""
    for override in ("+ppo.lrr=1e-3", "ppo.lrr=1e-3"):
        result = bench(override, timeout=120)
        assert result.returncode == 1, result.stdout + result.stderr
        assert "unknown key ppo.lrr (did you mean ppo.lr?)" in result.stderr


def test_bench_refuses_a_multi_process_launch() -> None:
    """The figures are one process's. (With a plain `Accelerator()`, this launch on a machine
    without CUDA ran two independent benchmarks side by side, each reporting its own.)"""
    result = subprocess.run(
        [
            *accelerate_launch("multi_gpu", 2),
            str(SCRIPT),
            "--config-name",
            "tiny",
            "--updates",
            "1",
        ],
        capture_output=True,
        text=True,
        timeout=300,
        env=_env(),
        cwd=ROOT,
    )
    assert result.returncode != 0
    assert "error: bench_ppo measures one process, not 2" in result.stderr
