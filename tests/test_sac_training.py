"""Discrete SAC's training loop (glam/offpolicy/trainer.py) through the training scripts: the run
folder and checkpoint (Q heads, targets, temperature, replay), resuming, a real two-process
launch, the tiny language model's run evaluated by the harness, bad settings, and the symbolic
network learning GoToRedBallNoDists.

    .venv/bin/python -m pytest tests/test_sac_training.py
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml
from helpers_launch import accelerate_launch
from safetensors.torch import load_file

from glam.baselines.loading import load_policy
from glam.envs import EnvRunner
from glam.policy.llm_policy import LLMActorCritic
from glam.ppo.logger import read_metrics
from glam.ppo.rollout import play_episodes
from glam.run_config import compose_run
from glam.runs.checkpoint import check_checkpoint
from glam.runs.folder import policy_dir

ROOT = Path(__file__).resolve().parents[1]
BASELINE = ROOT / "scripts" / "train_baseline.py"
LANGUAGE = ROOT / "scripts" / "train_language_agent.py"

SMALL = [
    "symbolic.image_dim=8",
    "symbolic.instr_dim=8",
    "symbolic.hidden_dim=8",
    "env.num_envs=4",
    "sac.log_every=32",
    "sac.learning_starts=32",
    "sac.batch_size=16",
    "sac.update_every=2",
    "sac.critic_hidden_sizes=[16]",
    "train.progress_bar=false",
]
"""A symbolic SAC run of a few seconds: 4 envs, a row every 8 env steps."""


def _env() -> dict[str, str]:
    return {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}


def _train(
    run_dir: Path, *overrides: str, script: Path = BASELINE, config: str = "sac_symbolic",
    launcher: tuple[str, ...] | list[str] = (),
) -> subprocess.CompletedProcess[str]:  # fmt: skip
    command = [*(launcher or [sys.executable]), str(script), "--config-name", config]
    return subprocess.run(
        [*command, f"train.output_dir={run_dir}", *overrides],
        capture_output=True,
        text=True,
        timeout=600,
        env=_env(),
        cwd=ROOT,
    )


def _latest(run_dir: Path) -> Path:
    return run_dir / "checkpoints" / (run_dir / "checkpoints" / "latest").read_text().strip()


def test_a_run_folder_holds_the_policy_the_heads_the_temperature_and_the_replay(
    tmp_path: Path,
) -> None:
    run_dir = tmp_path / "run"
    done = _train(run_dir, *SMALL, "train.total_frames=96", "train.save_every=1")
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert "done: 96 frames in 3 updates" in done.stdout
    rows = read_metrics(run_dir)
    assert [row["frames"] for row in rows] == [32, 64, 96]
    # 4 envs: bursts every 2 env steps (8 frames) of the steps due at 0.25 per frame after 32
    assert [row["charts/gradient_steps"] for row in rows] == [0, 8, 16]
    assert rows[-1]["charts/replay_size"] == 96 and rows[-1]["charts/updates_per_frame"] == 16 / 96
    for name in ("losses/critic", "losses/actor", "losses/td_error", "losses/entropy"):
        assert rows[-1][name] == rows[-1][name]  # a number (NaN only before the first step)
    assert rows[0]["losses/critic"] != rows[0]["losses/critic"]  # no step in the first row
    assert 0 < rows[-1]["charts/alpha"] < 1 and rows[0]["charts/alpha"] == pytest.approx(0.1)
    checkpoint = _latest(run_dir)
    check_checkpoint(checkpoint)
    heads = load_file(checkpoint / "sac_heads.safetensors")
    assert {"critics.q1.0.weight", "target.q2.2.bias", "log_alpha"} <= set(heads)
    assert not torch.equal(heads["critics.q1.0.weight"], heads["target.q1.0.weight"])  # Polyak
    state = json.loads((checkpoint / "sac_state.json").read_text())
    assert state["gradient_steps"] == 16
    replay = json.loads((checkpoint / "rank_0" / "replay" / "replay.json").read_text())
    assert (replay["size"], replay["num_envs"], replay["kind"]) == (24, 4, "GridObservations")
    # The policy folder is the symbolic policy's own: evaluation reads it unchanged.
    policy = load_policy(checkpoint / "policy")
    assert type(policy).__name__ == "SymbolicActorCritic"


def test_a_resumed_run_goes_on_with_its_heads_temperature_and_replay(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    first = _train(run_dir, *SMALL, "train.total_frames=64", "train.save_every=1")
    assert first.returncode == 0, first.stderr[-2000:]
    before = load_file(_latest(run_dir) / "sac_heads.safetensors")
    again = _train(run_dir, *SMALL, "train.total_frames=128", "train.resume=true")
    assert again.returncode == 0, again.stdout[-2000:] + again.stderr[-2000:]
    assert "resumed from" in again.stdout and "(update 2, frames 64)" in again.stdout
    assert "the replay buffer goes on from the checkpoint: 64 transitions" in again.stdout
    rows = read_metrics(run_dir)
    assert [row["frames"] for row in rows] == [32, 64, 96, 128]
    # The counts go on: 0.25 per frame after 32, in bursts every 8 frames.
    assert [row["charts/gradient_steps"] for row in rows] == [0, 8, 16, 24]
    assert rows[-1]["charts/replay_size"] == 128
    after = load_file(_latest(run_dir) / "sac_heads.safetensors")
    assert not torch.equal(before["critics.q1.0.weight"], after["critics.q1.0.weight"])
    # Another network or another algorithm is refused, naming what changed.
    other = _train(run_dir, *SMALL, "train.total_frames=160", "train.resume=true",
                   "sac.critic_hidden_sizes=[32]")  # fmt: skip
    assert other.returncode == 2, other.stderr[-2000:]
    assert "sac.critic_hidden_sizes: [16] -> [32]" in other.stderr


def test_bad_settings_are_named_before_anything_runs(tmp_path: Path) -> None:
    cases = [
        (["sac.tau=0"], "sac.tau must be in (0, 1]"),
        (["sac.target_entropy_scale=1.5"], "a share of the uniform policy's entropy"),
        (["symbolic.memory=true", "ppo.recurrence=4"], "set symbolic.memory=false"),
    ]
    for overrides, message in cases:
        with pytest.raises(ValueError, match=re.escape(message)):
            compose_run("sac_symbolic", [*SMALL, *overrides])
    done = _train(tmp_path / "bad", *SMALL, "sac.tau=0")  # as a user meets it: exit 1
    assert done.returncode == 1 and "sac.tau must be in (0, 1]" in done.stderr
    drrn = _train(tmp_path / "drrn", "algorithm.name=sac", config="drrn")
    assert drrn.returncode == 1 and "policy.kind=llm or symbolic" in drrn.stderr
    with pytest.raises(ValueError, match="a policy that scores its actions"):
        compose_run("drrn", ["algorithm.name=sac"])
    assert not (tmp_path / "bad").exists()


def test_two_processes_each_keep_their_envs_and_replay_and_share_one_network(
    tmp_path: Path,
) -> None:
    run_dir = tmp_path / "two"
    launcher = accelerate_launch("multi_cpu", 2)
    done = _train(run_dir, *SMALL, "train.total_frames=64", "train.save_every=1", launcher=launcher)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    assert "2 process(es) (MULTI_CPU, cpu)" in done.stdout
    launch = yaml.safe_load((run_dir / "config.yaml").read_text())["launch"]
    assert launch["world_size"] == 2 and launch["envs_per_process"] == 2
    checkpoint = _latest(run_dir)
    check_checkpoint(checkpoint)
    replays = [
        json.loads((checkpoint / f"rank_{r}" / "replay" / "replay.json").read_text())
        for r in (0, 1)
    ]
    assert [(r["size"], r["num_envs"]) for r in replays] == [(16, 2), (16, 2)]
    rows = read_metrics(run_dir)
    assert rows[-1]["charts/replay_size"] == 64  # summed over the processes
    assert rows[-1]["charts/gradient_steps"] == 8  # counted on the global frames


def test_the_tiny_language_model_trains_by_sac_and_is_evaluated(tmp_path: Path) -> None:
    run_dir = tmp_path / "tiny"
    done = _train(
        run_dir,
        "algorithm.name=sac",
        "env.num_envs=2",
        "sac.log_every=8",
        "sac.learning_starts=8",
        "sac.batch_size=4",
        "sac.update_every=2",
        "sac.critic_hidden_sizes=[16]",
        "train.total_frames=24",
        script=LANGUAGE,
        config="tiny",
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    rows = read_metrics(run_dir)
    assert rows[-1]["charts/gradient_steps"] == 4 and rows[-1]["losses/grad_norm"] > 0
    policy = LLMActorCritic.from_pretrained(policy_dir(run_dir))
    assert policy.action_words and len(policy.action_words) >= 3
    evaluated = subprocess.run(
        [
            sys.executable,
            str(ROOT / "scripts" / "post_training_tests.py"),
            "agent.kind=checkpoint",
            f"agent.path={run_dir}",
            "eval.episodes=2",
            "eval.num_envs=2",
            "eval.max_steps=4",
            "eval.progress_bar=false",
            "eval.suites=[no_change]",
            f"eval.output_dir={tmp_path / 'eval'}",
        ],
        capture_output=True,
        text=True,
        timeout=300,
        env=_env(),
        cwd=ROOT,
    )
    assert evaluated.returncode == 0, evaluated.stderr[-2000:]
    assert json.loads((tmp_path / "eval" / "results.json").read_text())["suites"]


EVAL_EPISODES = 32
EVAL_SEED = 10**9  # far from the training seeds


@pytest.mark.slow
def test_sac_learns_to_go_to_the_red_ball(tmp_path: Path) -> None:
    """The preset's network on GoToRedBallNoDists: 8,192 frames of SAC, then greedy on 32
    held-out episodes, where a uniformly random policy succeeds about half the time."""
    run_dir = tmp_path / "learn"
    done = _train(run_dir, "train.total_frames=8192", "train.progress_bar=false")
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    cfg = compose_run("sac_symbolic", [])
    runner = EnvRunner(
        cfg.env, cfg.policy, num_envs=EVAL_EPISODES, seed=EVAL_SEED, observation_kind="grid"
    )
    policy = load_policy(policy_dir(run_dir)).eval()
    episodes = play_episodes(policy, runner, greedy=True)
    runner.close()
    success = sum(bool(e["success"]) for e in episodes) / len(episodes)
    assert success >= 0.8, success
    rows = read_metrics(run_dir)
    assert (
        rows[-1]["losses/entropy"] < rows[0]["losses/entropy"]
        or rows[0]["losses/entropy"] != (rows[0]["losses/entropy"])
    )
