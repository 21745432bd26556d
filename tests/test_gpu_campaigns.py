"""`scripts/gpu_campaigns.sh`: campaigns on a borrowed GPU machine across device calls, run here
on the CPU with the `tiny` preset (the script does not care which device the jobs use).

    .venv/bin/python -m pytest tests/test_gpu_campaigns.py
"""

from __future__ import annotations

import os
import subprocess
import sys
import tarfile
from pathlib import Path

import yaml

REPO_ROOT = Path(__file__).resolve().parent.parent
SCRIPT = REPO_ROOT / "scripts" / "gpu_campaigns.sh"


def run_script(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {
        **os.environ,
        "OUT": str(tmp_path / "out"),
        "GLAM_GPU_STATE": str(tmp_path / "state"),
        "GLAM_OUTPUT_ROOT": str(tmp_path / "runs"),
        "GLAM_PY": sys.executable,
        "OMP_NUM_THREADS": "1",
    }
    return subprocess.run(
        ["bash", str(SCRIPT), *args], cwd=REPO_ROOT, env=env, capture_output=True, text=True
    )


def test_a_campaign_started_in_one_call_is_waited_for_and_collected_in_the_next(
    tmp_path: Path,
) -> None:
    campaign = tmp_path / "c.yaml"
    campaign.write_text(
        yaml.safe_dump(
            {"name": "c", "preset": "tiny", "seeds": [1, 2], "local": {"torch_threads": 1}}
        )
    )
    first = run_script(tmp_path, "0", f"{campaign}:2")
    assert first.returncode == 3, first.stdout + first.stderr  # started, still running
    assert "c: started (--jobs 2" in first.stdout

    second = run_script(tmp_path, "300", str(campaign))
    assert second.returncode == 0, second.stdout + second.stderr
    assert "c: its launcher is running" in second.stdout  # not started twice
    assert "2 job(s): 2 done" in second.stdout

    with tarfile.open(tmp_path / "out" / "c.tar.gz") as archive:
        names = archive.getnames()
    for seed in (1, 2):
        assert f"c/seed-{seed}/metrics.csv" in names
        assert f"c/seed-{seed}/config.yaml" in names
    assert "c/local/jobs.tsv" in names
    assert not [name for name in names if "checkpoints" in name]  # left on the machine
    assert (tmp_path / "runs" / "c" / "seed-1" / "checkpoints" / "latest").is_file()
    assert "done: 256 frames" in (tmp_path / "out" / "progress.txt").read_text()


def test_bad_arguments_are_named(tmp_path: Path) -> None:
    campaign = tmp_path / "c.yaml"
    campaign.write_text(yaml.safe_dump({"name": "c", "preset": "tiny", "seeds": [1]}))
    bad_level = tmp_path / "bad.yaml"
    bad_level.write_text(
        yaml.safe_dump(
            {
                "name": "b",
                "preset": "tiny",
                "seeds": [1],
                "overrides": {"env.name": "BabyAI-Nowhere-v0"},
            }
        )
    )
    cases = {
        ("soon", str(campaign)): "WAIT_S must be a whole number",
        ("0", str(tmp_path / "missing.yaml")): "no campaign file",
        ("0", f"{campaign}:0"): "JOBS must be a positive number",
        ("0",): "usage:",
        # every job's config is checked before any launcher starts
        ("0", str(bad_level)): "env.name='BabyAI-Nowhere-v0' is not a BabyAI level",
    }
    for args, message in cases.items():
        result = run_script(tmp_path, *args)
        assert result.returncode == 2, (args, result.stdout, result.stderr)
        assert message in result.stderr, (args, result.stderr)
    assert not (tmp_path / "runs").exists()  # nothing started


def test_a_launcher_that_ends_without_finishing_its_jobs_is_a_failure(tmp_path: Path) -> None:
    campaign = tmp_path / "c.yaml"
    campaign.write_text(yaml.safe_dump({"name": "c", "preset": "tiny", "seeds": [1]}))
    # A valid campaign whose run folder holds another script's output: the job refuses it.
    taken = tmp_path / "runs" / "c" / "seed-1"
    taken.mkdir(parents=True)
    (taken / "results.json").write_text("{}")
    result = run_script(tmp_path, "120", str(campaign))
    assert result.returncode == 1, result.stdout + result.stderr
    assert "c: ended with jobs not done" in result.stdout
    assert "holds an evaluation" in (tmp_path / "out" / "progress.txt").read_text()
