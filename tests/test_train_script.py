"""scripts/train_language_agent.py as users run it: subprocesses with the `tiny` preset.

Covers the run folder, checkpoints (peft adapter, pickle-free state), resume (from an older
checkpoint too), SIGKILL mid-run, SIGTERM/SIGUSR1/SIGINT preemption and signals during the exit,
a full disk, and bad input (multi-process launchers: tests/test_distributed.py).
"""

from __future__ import annotations

import csv
import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import yaml

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "train_language_agent.py"
FRAMES_PER_UPDATE = 64  # tiny preset: 4 envs x 16 frames


def _env() -> dict[str, str]:
    return {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}


def train(run_dir: Path, *overrides: str, timeout: float = 240) -> subprocess.CompletedProcess:
    """Run the script to completion with the tiny preset."""
    return subprocess.run(
        [sys.executable, str(SCRIPT), "--config-name", "tiny", f"train.output_dir={run_dir}"]
        + list(overrides),
        capture_output=True,
        text=True,
        timeout=timeout,
        env=_env(),
        cwd=ROOT,
    )


def start(run_dir: Path, *overrides: str) -> subprocess.Popen:
    """Start a long tiny run in the background (its output unbuffered, line by line)."""
    return subprocess.Popen(
        [sys.executable, str(SCRIPT), "--config-name", "tiny", f"train.output_dir={run_dir}"]
        + ["train.total_frames=1000000", *overrides],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**_env(), "PYTHONUNBUFFERED": "1"},
        cwd=ROOT,
    )


def wait_for(condition, process: subprocess.Popen, timeout: float = 180) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if process.poll() is not None:
            raise AssertionError(f"run ended early:\n{process.stdout.read()}")
        if time.monotonic() > deadline:
            process.kill()
            raise AssertionError("timed out waiting for the run")
        time.sleep(0.2)


def metric_updates(run_dir: Path) -> list[int]:
    lines = (run_dir / "metrics.csv").read_text().splitlines()[1:]
    return [int(line.split(",")[0]) for line in lines]


def _metric_rows(run_dir: Path) -> list[dict[str, str]]:
    with (run_dir / "metrics.csv").open() as handle:
        return list(csv.DictReader(handle))


def latest_update(run_dir: Path) -> int:
    pointer = run_dir / "checkpoints" / "latest"
    return int(pointer.read_text().strip().split("_")[1]) if pointer.is_file() else 0


def tree_digest(folder: Path) -> dict[str, str]:
    """SHA-256 of every file under `folder`, by relative path (a diff names the changed file)."""
    return {
        str(path.relative_to(folder)): hashlib.sha256(path.read_bytes()).hexdigest()
        for path in sorted(folder.rglob("*"))
        if path.is_file()
    }


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A 2-update tiny run with a checkpoint after each update."""
    run_dir = tmp_path_factory.mktemp("runs") / "tiny"
    result = train(
        run_dir,
        f"train.total_frames={2 * FRAMES_PER_UPDATE}",
        "train.save_every=1",
        "train.save_rollouts=true",
    )
    assert result.returncode == 0, result.stderr
    assert "done: 128 frames in 2 updates" in result.stdout
    assert "health over the first and the last 5 updates" in result.stdout
    return run_dir


def test_run_folder_holds_config_logs_and_checkpoints(finished_run: Path) -> None:
    config = yaml.safe_load((finished_run / "config.yaml").read_text())
    assert config["launch"]["world_size"] == 1
    # tests/conftest.py pins OMP_NUM_THREADS, which a run without train.torch_threads follows.
    assert config["launch"]["torch_threads"] == int(os.environ["OMP_NUM_THREADS"])
    assert config["model"]["name_or_path"] == "tiny-random-llama"
    assert config["train"]["output_dir"] == str(finished_run.resolve())
    header = (finished_run / "metrics.csv").read_text().splitlines()[0].split(",")
    for metric in (
        "losses/policy",
        "losses/value",
        "losses/entropy",
        "losses/approx_kl",
        "losses/clip_fraction",
        "losses/explained_variance",
        "losses/grad_norm",
        "grad/policy_norm",
        "grad/value_norm",
        "grad/value_share",
        "grad/cosine",
        "charts/success_rate",
        "charts/episode_return",
        "charts/episode_length",
        "charts/rollout_fps",
        "charts/update_fps",
    ):
        assert metric in header
    assert metric_updates(finished_run) == [1, 2]
    summary = yaml.safe_load((finished_run / "summary.json").read_text())
    assert summary["updates"] == 2 and "grad/value_share" in summary["end"]
    assert list((finished_run / "tensorboard").glob("events.out.tfevents.*"))
    assert (finished_run / "checkpoints" / "latest").read_text().strip() == "update_000002"


def test_saved_rollouts_are_a_demonstrations_dataset(finished_run: Path) -> None:
    from glam.demos import demo_metadata, load_demos

    rollouts = load_demos(finished_run / "rollouts")
    episodes = sum(float(row["charts/episodes"] or 0) for row in _metric_rows(finished_run))
    assert len(set(rollouts["seed"])) == episodes > 0  # every finished episode, no other
    assert set(rollouts["source"]) == {"ppo"} and set(rollouts["action_space"]) == {"nav"}
    first_steps = rollouts.filter(lambda row: row["step"] == 0)["prompt"]
    assert first_steps and all(prompt.endswith("Action 0:") for prompt in first_steps)
    assert demo_metadata(rollouts)["nbr_obs"] == 1


def test_checkpoint_is_peft_format_and_pickle_free(finished_run: Path) -> None:
    from peft import PeftModel
    from safetensors.torch import load_file

    from glam.models.loading import load_model
    from glam.policy.llm_policy import LLMActorCritic

    checkpoint = finished_run / "checkpoints" / "update_000002"
    base, _ = load_model("tiny-random-llama")
    adapted = PeftModel.from_pretrained(base, checkpoint / "policy" / "adapter")
    assert any("lora_A" in name for name, _ in adapted.named_parameters())
    assert load_file(checkpoint / "policy" / "heads.safetensors")
    optimizer = torch.load(checkpoint / "optimizer.pt", weights_only=True)
    assert optimizer["state"] and optimizer["param_groups"][0]["lr"] == pytest.approx(1e-3)
    rng = torch.load(checkpoint / "rank_0" / "rng.pt", weights_only=True)
    assert set(rng) >= {"python", "numpy", "torch"}
    envs = json.loads((checkpoint / "rank_0" / "envs.json").read_text())
    assert sum(envs["episodes_started"]) >= 4
    state = json.loads((checkpoint / "trainer_state.json").read_text())
    assert (state["update"], state["frames"], state["world_size"]) == (2, 128, 1)
    policy = LLMActorCritic.from_pretrained(checkpoint / "policy")
    output = policy(["Possible action of the agent: turn left\nGoal of the agent: go\nAction 0:"])
    assert output.logits.shape == (1, 3)


def test_used_folder_is_not_overwritten_without_resume(finished_run: Path) -> None:
    before = tree_digest(finished_run)
    result = train(finished_run)
    assert result.returncode == 2
    assert "already holds a run" in result.stderr and "train.resume=true" in result.stderr
    assert tree_digest(finished_run) == before


def test_resume_continues_the_run(finished_run: Path, tmp_path: Path) -> None:
    run_dir = tmp_path / "copy"
    subprocess.run(["cp", "-r", str(finished_run), str(run_dir)], check=True)
    envs_before = json.loads(
        (run_dir / "checkpoints" / "update_000002" / "rank_0" / "envs.json").read_text()
    )
    result = train(run_dir, f"train.total_frames={4 * FRAMES_PER_UPDATE}", "train.resume=true")
    assert result.returncode == 0, result.stderr
    assert "resumed from" in result.stdout and "(update 2, frames 128)" in result.stdout
    assert metric_updates(run_dir) == [1, 2, 3, 4]
    assert latest_update(run_dir) == 4
    envs_after = json.loads(
        (run_dir / "checkpoints" / "update_000004" / "rank_0" / "envs.json").read_text()
    )
    # The seed schedule went on from where the checkpoint left it.
    assert min(envs_after["episodes_started"]) > min(envs_before["episodes_started"])


def test_resume_refuses_another_process_count_or_a_dangling_pointer(
    finished_run: Path, tmp_path: Path
) -> None:
    run_dir = tmp_path / "copy"
    subprocess.run(["cp", "-r", str(finished_run), str(run_dir)], check=True)
    checkpoint = run_dir / "checkpoints" / "update_000002"
    state_file = checkpoint / "trainer_state.json"
    before = tree_digest(run_dir)
    original = state_file.read_text()
    # As written by two processes: a world size of 2 and a second rank's files.
    state_file.write_text(json.dumps({**json.loads(original), "world_size": 2}, indent=1))
    shutil.copytree(checkpoint / "rank_0", checkpoint / "rank_1")
    result = train(run_dir, f"train.total_frames={4 * FRAMES_PER_UPDATE}", "train.resume=true")
    assert result.returncode == 2
    assert "written by 2 process(es), this run has 1" in result.stderr
    (run_dir / "checkpoints" / "latest").write_text("update_000009\n")
    result = train(run_dir, f"train.total_frames={4 * FRAMES_PER_UPDATE}", "train.resume=true")
    assert result.returncode == 2
    assert "latest names update_000009, which is missing" in result.stderr
    state_file.write_text(original)  # nothing else was touched by either attempt
    shutil.rmtree(checkpoint / "rank_1")
    (run_dir / "checkpoints" / "latest").write_text("update_000002\n")
    assert tree_digest(run_dir) == before


def test_incomplete_checkpoint_is_refused_then_an_older_one_resumed(
    finished_run: Path, tmp_path: Path
) -> None:
    run_dir = tmp_path / "copy"
    subprocess.run(["cp", "-r", str(finished_run), str(run_dir)], check=True)
    checkpoints = run_dir / "checkpoints"
    (checkpoints / "update_000002" / "optimizer.pt").unlink()
    incomplete = tree_digest(checkpoints / "update_000002")
    result = train(run_dir, f"train.total_frames={3 * FRAMES_PER_UPDATE}", "train.resume=true")
    assert result.returncode == 2, result.stderr
    assert result.stderr.startswith(
        f"error: cannot resume: {checkpoints / 'update_000002'}: optimizer.pt is missing; the "
        "newest complete checkpoint is update_000001: continue from it with "
        "train.resume_from=update_000001"
    )
    assert "Traceback" not in result.stderr
    result = train(
        run_dir, f"train.total_frames={3 * FRAMES_PER_UPDATE}", "train.resume_from=update_000001"
    )
    assert result.returncode == 0, result.stderr
    assert "(update 1, frames 64)" in result.stdout
    (aside,) = checkpoints.glob("abandoned-*")
    assert tree_digest(aside / "update_000002") == incomplete  # set aside, not deleted
    assert (aside / "rollouts" / "rank_0" / "update_000002").is_dir()
    assert metric_updates(run_dir) == [1, 2, 3] and latest_update(run_dir) == 3


def test_resume_without_checkpoint_starts_fresh(tmp_path: Path) -> None:
    result = train(tmp_path / "new", f"train.total_frames={FRAMES_PER_UPDATE}", "train.resume=true")
    assert result.returncode == 0, result.stderr
    assert "no checkpoint: fresh start" in result.stdout
    assert latest_update(tmp_path / "new") == 1


def test_sigkill_mid_run_then_resume(tmp_path: Path) -> None:
    run_dir = tmp_path / "killed"
    process = start(run_dir, "train.save_every=1")
    wait_for(lambda: latest_update(run_dir) >= 2, process)
    time.sleep(0.5)  # somewhere in the next rollout or update
    process.send_signal(signal.SIGKILL)
    process.wait(timeout=30)
    saved = latest_update(run_dir)
    checkpoint = run_dir / "checkpoints" / f"update_{saved:06d}"
    assert (checkpoint / "trainer_state.json").is_file()  # `latest` names a complete one

    target = saved + 1
    result = train(run_dir, f"train.total_frames={target * FRAMES_PER_UPDATE}", "train.resume=true")
    assert result.returncode == 0, result.stderr
    assert f"(update {saved}, frames {saved * FRAMES_PER_UPDATE})" in result.stdout
    assert metric_updates(run_dir) == list(range(1, target + 1))  # rows after the kill dropped
    assert latest_update(run_dir) == target


@pytest.mark.parametrize("stop_signal", [signal.SIGTERM, signal.SIGUSR1, signal.SIGINT])
def test_stop_signal_saves_a_checkpoint_and_exits_cleanly(
    tmp_path: Path, stop_signal: signal.Signals
) -> None:
    run_dir = tmp_path / "preempted"
    process = start(run_dir, "train.save_every=1000")
    wait_for(lambda: (run_dir / "metrics.csv").is_file(), process)
    process.send_signal(stop_signal)
    output, _ = process.communicate(timeout=120)
    assert process.returncode == 0, output
    assert f"preempted by {stop_signal.name}: checkpoint saved at update" in output
    assert "Traceback" not in output
    updates = metric_updates(run_dir)
    assert latest_update(run_dir) == updates[-1] >= 1


def test_a_signal_during_the_exit_is_not_fatal(tmp_path: Path) -> None:
    run_dir = tmp_path / "preempted"
    process = start(run_dir, "train.save_every=1000")
    wait_for(lambda: (run_dir / "metrics.csv").is_file(), process)
    process.send_signal(signal.SIGUSR1)
    lines = []
    for line in process.stdout:
        lines.append(line)
        if line.startswith("preempted by SIGUSR1"):
            # The checkpoint is saved; the process is on its way out. SLURM's SIGTERM now
            # must not kill it (status 143) half-way through its exit.
            process.send_signal(signal.SIGTERM)
            break
    output = "".join(lines) + process.communicate(timeout=120)[0]
    assert process.returncode == 0, output
    assert latest_update(run_dir) == metric_updates(run_dir)[-1] >= 1


def _mount_tmpfs(folder: Path, size: str) -> None:
    folder.mkdir()
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(folder)], capture_output=True
    )
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a small tmpfs here (needs root): {mounted.stderr.decode()}")


def test_a_full_disk_stops_with_a_clear_message_and_no_temporary(tmp_path: Path) -> None:
    disk = tmp_path / "disk"
    _mount_tmpfs(disk, "240k")  # room for one tiny checkpoint, not two
    try:
        run_dir = disk / "run"
        result = train(
            run_dir, f"train.total_frames={10 * FRAMES_PER_UPDATE}", "train.save_every=1"
        )
        assert result.returncode == 2, result.stderr
        assert "Traceback" not in result.stderr
        checkpoints = run_dir / "checkpoints"
        saved = latest_update(run_dir)
        assert result.stderr.strip() == (
            f"error: could not write checkpoint {checkpoints / f'update_{saved + 1:06d}'}: no "
            f"space left on device; the last complete checkpoint is "
            f"{checkpoints / f'update_{saved:06d}'}"
        )
        assert saved >= 1
        assert sorted(p.name for p in checkpoints.iterdir()) == [
            "latest",
            *(f"update_{u:06d}" for u in range(max(1, saved - 2), saved + 1)),
        ]
    finally:
        subprocess.run(["umount", str(disk)], check=True)


def test_output_dir_that_is_a_file_fails_clearly(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("a file")
    result = train(tmp_path / "file")
    assert result.returncode == 2, result.stderr
    assert result.stderr.strip() == (
        f"error: train.output_dir={str(tmp_path / 'file')!r} is a file, not a folder: choose "
        "another train.output_dir"
    )


@pytest.mark.parametrize(
    "overrides,status,message",
    [
        (["ppo.lrr=0.1"], 1, "unknown key ppo.lrr (did you mean ppo.lr?)"),
        (["env.name=BabyAI-NoSuchLevel-v0"], 2, "unknown BabyAI level id 'BabyAI-NoSuchLevel-v0'"),
    ],
)
def test_bad_input_fails_clearly(
    tmp_path: Path, overrides: list[str], status: int, message: str
) -> None:
    result = train(tmp_path / "bad", *overrides)
    assert result.returncode == status, result.stderr
    assert message in result.stderr
    assert not (tmp_path / "bad" / "checkpoints").exists()


def test_nan_loss_stops_and_keeps_the_last_good_checkpoint(
    finished_run: Path, tmp_path: Path
) -> None:
    run_dir = tmp_path / "nan"
    subprocess.run(["cp", "-r", str(finished_run), str(run_dir)], check=True)
    before = tree_digest(run_dir / "checkpoints")
    # A huge learning rate sends the weights to infinity within the first update.
    result = train(
        run_dir,
        "train.resume=true",
        f"train.total_frames={8 * FRAMES_PER_UPDATE}",
        "ppo.lr=1e30",
    )
    assert result.returncode == 3, result.stderr
    assert "NaN" in result.stderr and "update_000002" in result.stderr
    assert tree_digest(run_dir / "checkpoints") == before


def test_a_run_with_nothing_left_to_train_says_so(finished_run: Path, tmp_path: Path) -> None:
    run_dir = tmp_path / "copy"
    subprocess.run(["cp", "-r", str(finished_run), str(run_dir)], check=True)
    result = train(run_dir, f"train.total_frames={2 * FRAMES_PER_UPDATE}", "train.resume=true")
    assert result.returncode == 0, result.stderr
    assert "its 128 frames already reach train.total_frames=128: nothing left" in result.stdout
    assert metric_updates(run_dir) == [1, 2]


def test_a_run_that_stopped_before_its_first_update_is_started_again(
    finished_run: Path, tmp_path: Path
) -> None:
    # What a coupling's unreachable server leaves: config.yaml and empty logs, no checkpoint.
    run_dir = tmp_path / "stopped"
    (run_dir / "tensorboard").mkdir(parents=True)
    (run_dir / "config.yaml").write_text((finished_run / "config.yaml").read_text())
    result = train(run_dir, f"train.total_frames={2 * FRAMES_PER_UPDATE}")
    assert result.returncode == 0, result.stderr
    assert "stopped before its first update" in result.stdout
    assert metric_updates(run_dir) == [1, 2]


def test_resuming_with_another_algorithm_names_the_setting(
    finished_run: Path, tmp_path: Path
) -> None:
    run_dir = tmp_path / "copy"
    subprocess.run(["cp", "-r", str(finished_run), str(run_dir)], check=True)
    before = tree_digest(run_dir)
    result = train(
        run_dir,
        f"train.total_frames={4 * FRAMES_PER_UPDATE}",
        "train.resume=true",
        "algorithm.name=grpo",
        "algorithm.kl_coef=0",
        "algorithm.clip_level=sequence",
    )
    assert result.returncode == 2, result.stdout[-2000:] + result.stderr[-2000:]
    assert "algorithm.name: 'ppo' -> 'grpo'" in result.stderr
    assert "Traceback" not in result.stderr and "optimizer.pt" not in result.stderr
    assert tree_digest(run_dir) == before
