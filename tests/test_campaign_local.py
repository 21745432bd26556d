"""Campaigns on one machine: `scripts/launch_campaign.py CAMPAIGN --local --jobs N`.

    .venv/bin/python -m pytest tests/test_campaign_local.py

The first tests are in-process (threads, devices, commands, what a job needs, validation). The
next three run the real training script (`tiny` preset) through the launcher as a subprocess: a
2 x 2 grid that finishes and is skipped on a rerun; two arms, each in its folder with its label,
skipped on a rerun; and a run SIGKILLed, then stopped with the launcher's SIGTERM, resumed each
time to the right frame count with one metrics row per update, next to a run that fails at run
time while the other goes on, and an evaluation that waits for its training.
"""

from __future__ import annotations

import csv
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml

import glam.campaign as glam_campaign
from glam.campaign import local as glam_local
from glam.eval.config import RESULT_FILES
from glam.eval.journal import JOURNAL

REPO_ROOT = Path(__file__).resolve().parent.parent
SCRIPT = REPO_ROOT / "scripts" / "launch_campaign.py"
TINY = {"name": "c", "preset": "tiny", "seeds": [1]}


def write_yaml(path: Path, data: object) -> Path:
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def fake_checkpoint(run_dir: Path, update: int, frames: int) -> None:
    """What `glam.campaign.local` reads of a run: the `latest` pointer and trainer_state.json."""
    name = f"update_{update:06d}"
    (run_dir / "checkpoints" / name).mkdir(parents=True)
    state = {"update": update, "frames": frames, "episodes": 0, "elapsed_seconds": 1.0}
    (run_dir / "checkpoints" / name / "trainer_state.json").write_text(json.dumps(state))
    (run_dir / "checkpoints" / "latest").write_text(name)


def state_rows(campaign_dir: Path) -> dict[str, dict[str, str]]:
    with (campaign_dir / "local" / "jobs.tsv").open(newline="") as file:
        return {row["job"]: row for row in csv.DictReader(file, delimiter="\t")}


def newest_frames(run_dir: Path) -> int:
    pointer = run_dir / "checkpoints" / "latest"
    if not pointer.is_file():
        return 0
    state = run_dir / "checkpoints" / pointer.read_text().strip() / "trainer_state.json"
    return json.loads(state.read_text())["frames"] if state.is_file() else 0


def launch(campaign: Path, output_root: Path, *extra: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, str(SCRIPT), str(campaign), "--output-root", str(output_root), *extra],
        cwd=REPO_ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(REPO_ROOT)},
    )


def finish(process: subprocess.Popen, timeout: float = 240) -> tuple[int, str, str]:
    out, err = process.communicate(timeout=timeout)
    return process.returncode, out, err


def wait_for(condition: Callable[[], bool], what: str, process: subprocess.Popen) -> None:
    deadline = time.monotonic() + 150
    while not condition():
        if process.poll() is not None:
            out, err = process.communicate()
            pytest.fail(f"the launcher exited ({process.returncode}) before {what}:\n{out}\n{err}")
        if time.monotonic() > deadline:
            process.kill()
            pytest.fail(f"timed out waiting for {what}")
        time.sleep(0.1)


# ------------------------------------------------------------------------------------------
# In-process: settings, commands, decisions, validation
# ------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("cores", "jobs", "processes", "threads"),
    [(2, 2, 1, 1), (8, 2, 2, 2), (16, 3, 1, 5), (3, 4, 1, 1), (1, 1, 1, 1)],
)
def test_threads_share_the_cores_between_concurrent_processes(
    cores: int, jobs: int, processes: int, threads: int
) -> None:
    assert glam_local.threads_per_process(cores, jobs, processes) == threads


def test_each_concurrent_job_gets_its_own_gpus() -> None:
    gpus = ["0", "1", "2", "3"]
    assert glam_local.device_groups(gpus, 2, 2) == [["0", "1"], ["2", "3"]]
    assert glam_local.device_groups(gpus, 4, 1) == [["0"], ["1"], ["2"], ["3"]]
    # One-process jobs share the devices in turn; several-process ones cannot.
    assert glam_local.device_groups(["0", "1"], 3, 1) == [["0"], ["1"], ["0"]]
    with pytest.raises(glam_campaign.CampaignError, match="needs 6 GPUs, 4 visible"):
        glam_local.device_groups(gpus, 3, 2)
    assert glam_local.device_groups([], 2, 2) == [[], []]


def test_local_dry_run_prints_commands_and_what_each_job_needs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(glam_local, "available_cores", lambda: 8)
    monkeypatch.setattr(glam_local, "visible_gpus", lambda: [])
    path = write_yaml(
        tmp_path / "c.yaml",
        {
            **TINY,
            "seeds": [1, 2, 3, 4, 5],
            "overrides": {"train.total_frames": 64},
            "evaluation": {"levels": ["BabyAI-GoToRedBallNoDists-v0"], "episodes": 4},
            "local": {"processes": 2, "env": {"HF_HUB_OFFLINE": "1"}},
        },
    )
    root = tmp_path / "runs"
    fake_checkpoint(root / "c" / "seed-1", update=1, frames=64)  # finished
    fake_checkpoint(root / "c" / "seed-2", update=1, frames=64)  # finished
    fake_checkpoint(root / "c" / "seed-3", update=1, frames=32)  # interrupted
    fake_checkpoint(root / "c" / "seed-5", update=1, frames=64)  # finished
    evaluations = [
        root / "c" / f"seed-{seed}/eval/BabyAI-GoToRedBallNoDists-v0" for seed in (1, 2, 5)
    ]
    for folder in evaluations:
        folder.mkdir(parents=True)
    for name in RESULT_FILES:
        (evaluations[0] / name).write_text("{}")
    (evaluations[1] / "results.json").write_text("{}")  # an evaluation killed while writing
    episode = json.dumps({"kind": "episode", "suite": "no_change"})  # killed while playing
    (evaluations[2] / JOURNAL).write_text(f'{{"kind": "start"}}\n{episode}\n{episode}\n')

    assert glam_campaign.launch(path, output_root=root, dry_run=True, local_jobs=2) == 0
    out = capsys.readouterr().out
    # 8 cores / (2 jobs x 2 processes): 2 threads per training process, 4 for an evaluation.
    assert "10 job(s), 2 at a time, 2 process(es) per run, 2 torch thread(s) per process" in out
    headers = [line for line in out.splitlines() if line.startswith("### ")]
    assert headers == [
        "### seed-1 train: skip: 64/64 frames",
        f"### seed-1 eval BabyAI-GoToRedBallNoDists-v0: skip: results in {evaluations[0]}",
        "### seed-2 train: skip: 64/64 frames",
        "### seed-2 eval BabyAI-GoToRedBallNoDists-v0: evaluate again with eval.overwrite=true: "
        "results incomplete (no results.csv, results.md, results.png, episodes.jsonl)",
        "### seed-3 train: resume from update_000001 at 32/64 frames",
        "### seed-3 eval BabyAI-GoToRedBallNoDists-v0: start after seed-3 train",
        "### seed-4 train: fresh start: no checkpoint yet",
        "### seed-4 eval BabyAI-GoToRedBallNoDists-v0: start after seed-4 train",
        "### seed-5 train: skip: 64/64 frames",
        "### seed-5 eval BabyAI-GoToRedBallNoDists-v0: resume from its journal (2 episodes "
        "finished)",
    ]
    commands = [line[2:] for line in out.splitlines() if line.startswith("$ ")]
    assert commands[6] == (
        f"{sys.executable} -m accelerate.commands.launch --num_processes 2 --main_process_port "
        "'<free port>' --config_file configs/accelerate/multi_cpu.yaml "
        "scripts/train_language_agent.py --config-name tiny train.total_frames=64 train.seed=4 "
        f"train.output_dir={root}/c/seed-4 train.resume=true train.torch_threads=2"
    )
    assert commands[7] == (
        f"{sys.executable} scripts/post_training_tests.py agent.kind=checkpoint "
        f"agent.path={root}/c/seed-4 eval.level=BabyAI-GoToRedBallNoDists-v0 eval.episodes=4 "
        f"eval.output_dir={root}/c/seed-4/eval/BabyAI-GoToRedBallNoDists-v0 eval.torch_threads=4"
    )
    assert "  env: PYTHONUNBUFFERED=1 OMP_NUM_THREADS=2 MKL_NUM_THREADS=2 " in out
    assert "HF_HUB_OFFLINE=1" in out
    assert f"  log: {root}/c/local/seed-4.train.log" in out
    assert commands[3].endswith(" eval.overwrite=true")  # seed-2's evaluation, again
    assert commands[9].endswith(" eval.torch_threads=4 eval.resume=true")  # seed-5's, continued
    assert "dry run: 10 job(s) checked, 6 to run, 4 already finished" in out
    assert not (root / "c" / "local").exists()


@pytest.mark.parametrize(
    ("change", "jobs", "message"),
    [
        ({"grid": {"ppo.lrr": [1e-3]}}, 2, "unknown key ppo.lrr (did you mean ppo.lr?)"),
        ({"overrides": {"train.torch_threads": 4}}, 2, "use local.torch_threads"),
        ({"arms": {"a": {"train.torch_threads": 4}}}, 2, "use local.torch_threads"),
        ({"local": {"processes": 0}}, 2, "local.processes must be >= 1, got 0"),
        ({"local": {"threads": 2}}, 2, "unknown key(s) local.threads"),
        ({}, 0, "--jobs must be >= 1, got 0"),
    ],
)
def test_an_invalid_local_campaign_starts_nothing(
    change: dict, jobs: int, message: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = write_yaml(tmp_path / "bad.yaml", {**TINY, **change})
    assert glam_campaign.launch(path, output_root=tmp_path / "runs", local_jobs=jobs) == 2
    error = capsys.readouterr().err
    assert error.startswith(f"error: {path}: ") and message in error
    assert not (tmp_path / "runs").exists()


def test_jobs_needs_local(capsys: pytest.CaptureFixture[str]) -> None:
    sys.path.insert(0, str(SCRIPT.parent))
    try:
        import launch_campaign
    finally:
        sys.path.remove(str(SCRIPT.parent))
    with pytest.raises(SystemExit) as exit_info:
        launch_campaign.main(["configs/campaign/tiny_local.yaml", "--jobs", "2"])
    assert exit_info.value.code == 2
    assert "--jobs needs --local" in capsys.readouterr().err


# ------------------------------------------------------------------------------------------
# The real training script under the launcher
# ------------------------------------------------------------------------------------------


def test_a_grid_runs_two_at_a_time_and_a_rerun_skips_it(tmp_path: Path) -> None:
    path = write_yaml(
        tmp_path / "grid.yaml",
        {
            **TINY,
            "name": "grid",
            "seeds": [1, 2],
            "grid": {"ppo.lr": [1e-3, 1e-4]},
            "overrides": {"train.total_frames": 64},
        },
    )
    root = tmp_path / "runs"
    code, out, err = finish(launch(path, root, "--local", "--jobs", "2"))
    assert code == 0, out + err
    names = [f"ppo.lr-{lr}_seed-{seed}" for lr in ("0.001", "0.0001") for seed in (1, 2)]
    rows = state_rows(root / "grid")
    assert [(job, row["status"], row["exit_code"]) for job, row in rows.items()] == [
        (f"{name} train", "done", "0") for name in names
    ]
    for name in names:
        run_dir = root / "grid" / name
        assert newest_frames(run_dir) == 64
        config = yaml.safe_load((run_dir / "config.yaml").read_text())
        assert float(config["ppo"]["lr"]) == float(name.split("_")[0].split("-", 1)[1])
        assert config["train"]["torch_threads"] == 1  # 2 cores at most / 2 jobs
        assert rows[f"{name} train"]["log"] == str(root / "grid" / "local" / f"{name}.train.log")
    # Never more than 2 at once: the 3rd job starts after the 1st or 2nd has ended.
    events = [line.split()[1] for line in out.splitlines() if line[:2].isdigit()]
    assert events[:3] == ["start", "start", "done"], out
    assert "4 job(s): 4 done" in out

    logs = {name: (root / "grid" / "local" / f"{name}.train.log").stat().st_size for name in names}
    code, out, err = finish(launch(path, root, "--local", "--jobs", "2"))
    assert code == 0, out + err
    assert [row["status"] for row in state_rows(root / "grid").values()] == ["skipped"] * 4
    assert "4 job(s): 4 skipped" in out and "start" not in out
    assert logs == {
        name: (root / "grid" / "local" / f"{name}.train.log").stat().st_size for name in names
    }


def test_arms_train_into_their_folders_with_their_labels_and_a_rerun_skips_them(
    tmp_path: Path,
) -> None:
    arms = {"default": {}, "lr-high": {"ppo.lr": 1e-2}}
    path = write_yaml(
        tmp_path / "arms.yaml",
        {**TINY, "name": "arms", "overrides": {"train.total_frames": 64}, "arms": arms},
    )
    root = tmp_path / "runs"
    code, out, err = finish(launch(path, root, "--local", "--jobs", "2"))
    assert code == 0, out + err
    assert [(job, row["status"]) for job, row in state_rows(root / "arms").items()] == [
        ("default_seed-1 train", "done"),
        ("lr-high_seed-1 train", "done"),
    ]
    for arm, lr in (("default", 1e-3), ("lr-high", 1e-2)):  # the tiny preset's lr, the arm's
        run_dir = root / "arms" / f"{arm}_seed-1"
        assert newest_frames(run_dir) == 64
        config = yaml.safe_load((run_dir / "config.yaml").read_text())
        assert config["train"]["label"] == arm  # what scripts/compare_runs.py groups by
        assert float(config["ppo"]["lr"]) == lr

    # A relaunch finds both arms finished by their folders.
    code, out, err = finish(launch(path, root, "--local", "--jobs", "2"))
    assert code == 0, out + err
    assert "2 job(s): 2 skipped" in out and "start" not in out


def test_killed_and_stopped_runs_resume_and_failures_are_reported(tmp_path: Path) -> None:
    level = "BabyAI-GoToRedBallNoDists-v0"
    campaign = {
        **TINY,
        "name": "resume",
        # The second grid point passes every check but fails at start-up: the trunk cache
        # asked for where LoRA adapts the lowest layer (the tiny preset adapts every layer).
        "grid": {"ppo.cache_trunk": [False, True]},
        "overrides": {"train.total_frames": 320, "train.save_every": 1},
        "evaluation": {
            "levels": [level],
            "episodes": 4,
            "suites": ["no_change"],
            "overrides": {"eval.num_envs": 4},
        },
    }
    path = write_yaml(tmp_path / "resume.yaml", campaign)
    root = tmp_path / "runs"
    good, bad = "ppo.cache_trunk-false_seed-1", "ppo.cache_trunk-true_seed-1"
    run_dir = root / "resume" / good

    # 1. SIGKILL of the training process once it has a checkpoint: reported failed.
    launcher = launch(path, root, "--local", "--jobs", "2")
    wait_for(lambda: newest_frames(run_dir) > 0, "a first checkpoint", launcher)
    os.kill(int(state_rows(root / "resume")[f"{good} train"]["pid"]), signal.SIGKILL)
    code, out, err = finish(launcher)
    assert code == 1, out + err
    rows = state_rows(root / "resume")
    assert (rows[f"{good} train"]["status"], rows[f"{good} train"]["exit_code"]) == (
        "failed",
        "-9",
    )
    assert "killed by SIGKILL" in rows[f"{good} train"]["progress"]
    assert (rows[f"{bad} train"]["status"], rows[f"{bad} train"]["exit_code"]) == ("failed", "2")
    assert "ppo.cache_trunk=true" in rows[f"{bad} train"]["progress"]  # its error line
    assert rows[f"{good} eval {level}"]["status"] == "not run"
    assert "job(s) failed" in err and "run the same command again" in err
    killed_at = newest_frames(run_dir)
    assert 0 < killed_at < 320

    # The failing grid point is dropped from the campaign: the good run keeps its folder.
    write_yaml(path, {**campaign, "grid": {"ppo.cache_trunk": [False]}})

    # 2. SIGTERM of the launcher: the run saves a checkpoint and exits 0; the launcher 143.
    launcher = launch(path, root, "--local", "--jobs", "2")
    wait_for(
        lambda: state_rows(root / "resume")[f"{good} train"]["pid"] != "", "the resume", launcher
    )
    # Meanwhile a second launcher of the same campaign would train the same run twice: refused.
    code, out, err = finish(launch(path, root, "--local", "--jobs", "1"))
    assert code == 2 and "launcher.lock is held: another launcher" in err, out + err
    wait_for(lambda: newest_frames(run_dir) > killed_at, "a checkpoint after resuming", launcher)
    launcher.send_signal(signal.SIGTERM)
    code, out, err = finish(launcher)
    assert code == 128 + signal.SIGTERM, out + err
    assert f"start   {good} train: resume from update_" in out
    assert "stopped by SIGTERM" in err and "run the same command again to continue" in err
    row = state_rows(root / "resume")[f"{good} train"]
    assert (row["status"], row["exit_code"]) == ("stopped", "0"), row
    stopped_at = newest_frames(run_dir)
    assert killed_at < stopped_at < 320
    assert "preempted by SIGTERM" in (root / "resume" / "local" / f"{good}.train.log").read_text()

    # 3. The same command finishes the run from there, then evaluates it.
    code, out, err = finish(launch(path, root, "--local", "--jobs", "2"))
    assert code == 0, out + err
    rows = state_rows(root / "resume")
    assert list(rows) == [f"{good} train", f"{good} eval {level}"]
    assert rows[f"{good} train"]["status"] == "resumed"
    assert rows[f"{good} train"]["progress"] == "320/320 frames"
    assert rows[f"{good} eval {level}"]["status"] == "done"
    assert all((run_dir / "eval" / level / name).is_file() for name in RESULT_FILES)
    assert newest_frames(run_dir) == 320
    with (run_dir / "metrics.csv").open(newline="") as file:
        metrics = list(csv.DictReader(file))
    # One row per update over the three sessions: nothing lost, nothing logged twice.
    assert [int(row["update"]) for row in metrics] == list(range(1, 6))
    assert [int(row["frames"]) for row in metrics] == [64 * update for update in range(1, 6)]


def test_the_launcher_loads_without_torch() -> None:
    """The launcher only reads folders and starts processes: importing torch would add seconds
    to every launch (and to the refusal of a second launcher), before any job starts."""
    code = (
        "import sys; import glam.campaign, glam.campaign.local, glam.eval.journal; "
        "print(sorted(m for m in ('torch', 'transformers') if m in sys.modules))"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    )
    assert result.stdout.strip() == "[]", result.stderr
