"""Campaign jobs under a real SLURM started on localhost (slurm/local/start_local_slurm.sh).

    .venv/bin/python -m pytest tests/test_slurm_local.py -m slurm

The daemons (munged, slurmctld, slurmd) run as root from a temporary folder, with no systemd or
cgroups; Debian's slurm-wlm and munge are installed by the helper when missing. Every test skips,
saying why, when SLURM cannot start here. The requeue path is tested twice: with
slurm/local/fake_trainer.py (a counter with the training script's run-folder and signal contract)
under the real `--signal=B:USR1@...` of a one-minute job, and with the real
scripts/train_language_agent.py (preset `tiny`) signalled by `scancel --signal=USR1 --batch`.
"""

from __future__ import annotations

import csv
import os
import re
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import yaml

REPO_ROOT = Path(__file__).resolve().parent.parent
TRAIN_SCRIPT = REPO_ROOT / "scripts" / "train_language_agent.py"
TINY_CAMPAIGN = REPO_ROOT / "configs" / "campaign" / "tiny_local.yaml"

pytestmark = [pytest.mark.slurm, pytest.mark.slow]

needs_train_script = pytest.mark.skipif(
    not TRAIN_SCRIPT.is_file(), reason=f"{TRAIN_SCRIPT.relative_to(REPO_ROOT)} does not exist yet"
)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _tail(path: Path, lines: int = 8) -> str:
    if not path.is_file():
        return f"({path.name} missing)"
    return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])


@pytest.fixture(scope="module")
def slurm_env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    """Start a one-node SLURM; yield the environment that points its clients at it."""
    if sys.platform != "linux":
        pytest.skip(f"SLURM test needs Linux, this is {sys.platform}")
    if os.geteuid() != 0:
        pytest.skip("SLURM test needs root: slurmd must start job steps as the submitting user")
    root = tmp_path_factory.mktemp("slurm")
    env = dict(
        os.environ,
        GLAM_SLURMCTLD_PORT=str(_free_port()),
        GLAM_SLURMD_PORT=str(_free_port()),
        # A requeued job may start again after the credential lifetime (120 s by default).
        GLAM_SLURM_CRED_EXPIRE="8",
        SLURM_CONF=str(root / "slurm.conf"),
    )
    start = subprocess.run(
        ["bash", str(REPO_ROOT / "slurm/local/start_local_slurm.sh"), str(root)],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    try:
        if start.returncode != 0:
            logs = "\n".join(
                f"--- {name}:\n{_tail(root / 'log' / name)}"
                for name in ("munged.log", "slurmctld.log", "slurmd.log")
            )
            pytest.skip(
                f"SLURM could not start here (start_local_slurm.sh exit {start.returncode}): "
                f"{start.stderr.strip()[-1500:]}\n{logs}"
            )
        yield env
    finally:
        subprocess.run(["scancel", "--full", "--user", "root"], env=env, check=False)
        subprocess.run(
            ["bash", str(REPO_ROOT / "slurm/local/stop_local_slurm.sh"), str(root)], check=False
        )


def _job(job_id: str, env: dict[str, str]) -> dict[str, str]:
    """`scontrol show job` fields (JobState, Restarts, ExitCode, ...)."""
    out = subprocess.run(
        ["scontrol", "show", "job", "-o", job_id], env=env, capture_output=True, text=True
    ).stdout
    return dict(re.findall(r"(\w+)=(\S*)", out))


def _wait_for(
    condition: Callable[[], bool], what: str, timeout: float, log: Path | None = None
) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            detail = f"\nlog:\n{_tail(log, 40)}" if log else ""
            raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}{detail}")
        time.sleep(0.5)


def _launch(campaign: Path, output_root: Path, env: dict[str, str]) -> list[str]:
    """Submit a campaign with scripts/launch_campaign.py; return the job ids it printed."""
    result = subprocess.run(
        [sys.executable, str(REPO_ROOT / "scripts/launch_campaign.py"), str(campaign)]
        + ["--output-root", str(output_root)],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    job_ids = re.findall(r"^submitted .*: job (\d+)$", result.stdout, flags=re.MULTILINE)
    assert job_ids, result.stdout
    return job_ids


def _write_campaign(path: Path, **changes: object) -> Path:
    """The tiny local campaign with some top-level keys replaced."""
    campaign = yaml.safe_load(TINY_CAMPAIGN.read_text())
    campaign.update(changes)
    path.write_text(yaml.safe_dump(campaign))
    return path


def _progress(run_dir: Path) -> list[int]:
    """The `frames` column of metrics.csv (one row per update; [] before the first one)."""
    path = run_dir / "metrics.csv"
    if not path.is_file():
        return []
    text = path.read_text()
    complete = text[: text.rfind("\n") + 1]  # the training may be writing the last row
    return [int(float(row["frames"])) for row in csv.DictReader(complete.splitlines())]


def _latest_checkpoint(run_dir: Path) -> Path:
    pointer = run_dir / "checkpoints" / "latest"
    assert pointer.is_file(), f"no {pointer}"
    checkpoint = run_dir / "checkpoints" / pointer.read_text().strip()
    assert checkpoint.is_dir(), f"{pointer} names {checkpoint}, which does not exist"
    return checkpoint


def test_time_limit_signal_checkpoints_requeues_and_resumes(
    slurm_env: dict[str, str], tmp_path: Path
) -> None:
    """`--signal=B:USR1@30` of a one-minute job -> checkpoint -> requeue -> resume, by itself."""
    env = dict(slurm_env, GLAM_FAKE_STEP_SECONDS="0.05")
    campaign = _write_campaign(
        tmp_path / "fake.yaml",
        name="fake",
        grid=None,
        overrides={"train.total_frames": 10**9},
        slurm={
            # The multi-node template on one node: the same code path as on a cluster.
            "template": "train_multi_node",
            "nodes": 1,
            "gpus_per_node": 0,
            "time": "1",
            # SLURM sends the signal at a periodic check up to 30 s early: here within 30 s of
            # the start, in both runs; the second run is not requeued (max_requeues).
            "signal_seconds": 30,
            "max_requeues": 1,
            "env": {
                "GLAM_TRAIN_SCRIPT": "slurm/local/fake_trainer.py",
                "GLAM_RESIGNAL_SECONDS": "3",
                # Two processes under torch's launcher, as on a 2-GPU node: the launcher must
                # survive USR1 while both ranks get it (the fake trainer needs no GPU).
                "GLAM_GPUS_PER_NODE": "2",
            },
        },
    )
    (job_id,) = _launch(campaign, tmp_path / "runs", env)
    run_dir = tmp_path / "runs" / "fake" / "seed-1"
    log = tmp_path / "runs" / "fake" / "slurm" / f"seed-1.train.{job_id}.log"

    _wait_for(lambda: _job(job_id, env).get("JobState") == "COMPLETED", "two runs", 150, log)

    text = log.read_text()
    saved = [int(n) for n in re.findall(r"preempted: checkpoint saved at frames (\d+)", text)]
    assert len(saved) == 2, text
    assert "restart 0 on" in text and "restart 1 on" in text
    assert "requeuing job" in text
    assert f"resumed from checkpoint at frames {saved[0]}" in text
    assert "not requeuing: restart 1 reached GLAM_MAX_REQUEUES=1" in text
    assert text.count("world size 2") == 2
    assert text.count("rank 1: stopped by signal 10") == 2
    assert text.count("training step exited with status 0") == 2
    frames = _progress(run_dir)
    assert saved[0] in frames and frames[-1] == saved[1] > saved[0]
    assert frames[frames.index(saved[0]) + 1] == saved[0] + 4, "the second run did not continue"
    assert all(later > earlier for earlier, later in zip(frames, frames[1:], strict=False))
    assert _latest_checkpoint(run_dir).name == f"frames_{saved[1]}"
    job = _job(job_id, env)
    assert (job["Restarts"], job["ExitCode"]) == ("1", "0:0")


@needs_train_script
def test_tiny_campaign_trains_under_sbatch(slurm_env: dict[str, str], tmp_path: Path) -> None:
    """configs/campaign/tiny_local.yaml as is: one job per grid point, each a finished run."""
    job_ids = _launch(TINY_CAMPAIGN, tmp_path / "runs", slurm_env)
    campaign = yaml.safe_load(TINY_CAMPAIGN.read_text())
    learning_rates = campaign["grid"]["ppo.lr"]
    assert len(job_ids) == len(learning_rates) * len(campaign["seeds"])

    slurm_dir = tmp_path / "runs" / "tiny_local" / "slurm"
    for job_id in job_ids:
        _wait_for(
            lambda job_id=job_id: (
                _job(job_id, slurm_env).get("JobState")
                in ("COMPLETED", "FAILED", "TIMEOUT", "CANCELLED")
            ),
            f"job {job_id}",
            timeout=150,
        )
    for job_id, lr in zip(job_ids, learning_rates, strict=True):
        name = f"ppo.lr-{lr!r}_seed-1"
        log = slurm_dir / f"{name}.train.{job_id}.log"
        assert _job(job_id, slurm_env)["JobState"] == "COMPLETED", _tail(log, 40)
        run_dir = tmp_path / "runs" / "tiny_local" / name
        config = yaml.safe_load((run_dir / "config.yaml").read_text())
        assert float(config["ppo"]["lr"]) == lr
        assert config["train"]["output_dir"] == str(run_dir)
        assert _progress(run_dir)[-1] >= config["train"]["total_frames"], "it did not finish"
        _latest_checkpoint(run_dir)


@needs_train_script
def test_tiny_training_resumes_after_usr1_and_requeue(
    slurm_env: dict[str, str], tmp_path: Path
) -> None:
    """USR1 to the batch shell -> the training checkpoints -> requeue -> it continues."""
    campaign = _write_campaign(
        tmp_path / "resume.yaml",
        name="resume",
        grid=None,
        overrides={"train.total_frames": 10**9},
        slurm={"nodes": 1, "gpus_per_node": 0, "time": "10", "max_requeues": 1},
    )
    (job_id,) = _launch(campaign, tmp_path / "runs", slurm_env)
    run_dir = tmp_path / "runs" / "resume" / "seed-1"
    log = tmp_path / "runs" / "resume" / "slurm" / f"seed-1.train.{job_id}.log"

    def resumed_at() -> int | None:
        match = re.search(
            r"\[glam\] resumed from \S+ \(update \d+, frames (\d+)\)", log.read_text()
        )
        return int(match.group(1)) if match else None

    _wait_for(lambda: len(_progress(run_dir)) >= 2, "two logged updates", 150, log)
    subprocess.run(["scancel", "--signal=USR1", "--batch", job_id], env=slurm_env, check=True)
    _wait_for(lambda: resumed_at() is not None, "the requeued run", 150, log)
    _wait_for(lambda: _progress(run_dir)[-1] > resumed_at(), "an update after resume", 150, log)
    subprocess.run(["scancel", "--signal=USR1", "--batch", job_id], env=slurm_env, check=True)
    _wait_for(lambda: _job(job_id, slurm_env).get("JobState") == "COMPLETED", "the end", 120, log)

    text = log.read_text()
    saved = re.findall(r"preempted by SIGUSR1: checkpoint saved .* in (\S+)", text)
    assert len(saved) == 2, text
    assert f"[glam] resumed from {saved[0]} " in text
    assert "restart 1 on" in text
    frames = _progress(run_dir)
    # A fresh start instead of a resume would log small frame counts again.
    assert resumed_at() in frames and frames[-1] > resumed_at()
    assert all(later > earlier for earlier, later in zip(frames, frames[1:], strict=False)), frames
    assert str(_latest_checkpoint(run_dir)) == saved[1]
    job = _job(job_id, slurm_env)
    assert (job["Restarts"], job["ExitCode"]) == ("1", "0:0")
