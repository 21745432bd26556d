"""BabyAI's symbolic agent through the PPO trainer: the same run folder, checkpoints and resume as
the language model, and a seeded run that learns what BabyAI agents learn.

The learning test trains the `symbolic_ppo` preset (BabyAI's FiLM actor-critic, 32 channels) on
BabyAI-GoToRedBallNoDists-v0 with the three navigation actions for 12 updates of 2,048 frames,
then plays 48 held-out episodes greedily; the untrained network and a uniformly random policy
play the same episodes. Random play succeeds about half the time on this level (the ball is in a
small empty room), so the bar is set well above it.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml
from accelerate import Accelerator
from helpers_launch import accelerate_launch

from glam.baselines.loading import load_policy
from glam.baselines.symbolic import SymbolicActorCritic, build_symbolic_policy
from glam.envs import EnvRunner
from glam.ppo.rollout import play_episodes
from glam.ppo.trainer import train
from glam.run_config import compose_run
from glam.runs.checkpoint import read_trainer_state
from glam.runs.folder import latest_checkpoint, policy_dir

ROOT = Path(__file__).resolve().parents[1]
EVAL_EPISODES = 48
EVAL_SEED = 10**9  # far from the training seeds (run seed s: s * 10**8 and up)


class UniformPolicy(torch.nn.Module):
    """Every action equally likely."""

    observation_kind = "grid"

    def __init__(self, actions: int) -> None:
        super().__init__()
        self.actions = actions

    def forward(self, images, directions, missions):
        from glam.policy.llm_policy import PolicyOutput

        logits = torch.zeros(len(missions), self.actions)
        return PolicyOutput(logits, torch.zeros(len(missions)), torch.ones_like(logits).bool())


def success_rate(policy: torch.nn.Module, cfg, *, greedy: bool) -> float:
    runner = EnvRunner(
        cfg.env, cfg.policy, num_envs=EVAL_EPISODES, seed=EVAL_SEED, observation_kind="grid"
    )
    with torch.random.fork_rng():
        torch.manual_seed(0)
        episodes = play_episodes(policy.eval(), runner, greedy=greedy)
    runner.close()
    return sum(bool(e["success"]) for e in episodes) / len(episodes)


SMALL = [
    "symbolic.image_dim=8",
    "symbolic.instr_dim=8",
    "symbolic.hidden_dim=8",
    "env.num_envs=4",
    "ppo.frames_per_env=16",
    "ppo.minibatch_size=32",
    "ppo.epochs=1",
    "train.total_frames=128",
    "train.save_every=1",
    "train.progress_bar=false",
]
"""A symbolic run of a few seconds: 8 channels, 4 envs x 16 frames."""


def small(overrides: list[str] = ()) -> object:
    """The `SMALL` run's config, with `overrides` after its settings."""
    return compose_run("symbolic_ppo", [*SMALL, *overrides])


def test_a_symbolic_run_writes_the_run_folder_and_resumes(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    cfg = small()
    cfg.train.output_dir = str(run_dir)
    accelerator = Accelerator(cpu=True)
    first = train(cfg, accelerator, run_dir, make_policy=build_symbolic_policy)
    assert first.state.update == 2 and first.state.frames == 128
    for name in ("config.yaml", "metrics.csv", "checkpoints"):
        assert (run_dir / name).exists()
    saved = load_policy(policy_dir(run_dir))
    assert isinstance(saved, SymbolicActorCritic) and saved.training_env["name"] == cfg.env.name
    # Resume to twice the frames: the counters go on and the weights start from the saved ones.
    more = small(["train.total_frames=256", "train.resume=true"])
    more.train.output_dir = str(run_dir)
    second = train(more, accelerator, run_dir, make_policy=build_symbolic_policy)
    assert second.state.update == 4 and second.state.frames == 256
    assert read_trainer_state(latest_checkpoint(run_dir)).update == 4
    rows = (run_dir / "metrics.csv").read_text().splitlines()
    assert [row.split(",")[0] for row in rows[1:]] == ["1", "2", "3", "4"]


@pytest.mark.slow
def test_symbolic_ppo_learns_go_to_red_ball(tmp_path: Path) -> None:
    cfg = compose_run(
        "symbolic_ppo", ["train.total_frames=24576", "train.progress_bar=false", "train.seed=1"]
    )
    run_dir = tmp_path / "learn"
    cfg.train.output_dir = str(run_dir)
    torch.manual_seed(0)
    untrained = build_symbolic_policy(cfg, None)
    result = train(cfg, Accelerator(cpu=True), run_dir, make_policy=build_symbolic_policy)
    assert result.state.update == 12
    trained = load_policy(policy_dir(run_dir))
    random_play = success_rate(UniformPolicy(3), cfg, greedy=False)
    before = success_rate(untrained, cfg, greedy=True)
    after = success_rate(trained, cfg, greedy=True)
    print(
        f"held-out success: random {random_play:.2f}, untrained {before:.2f}, trained {after:.2f}"
    )
    assert 0.25 <= random_play <= 0.75  # the level is as easy as it should be, no easier
    assert after >= 0.9 and after >= random_play + 0.25 and after > before


def _script(
    run_dir: Path, *launcher: str, extra: tuple[str, ...] = ()
) -> subprocess.CompletedProcess:
    command = [
        *(launcher or (sys.executable,)),
        str(ROOT / "scripts" / "train_baseline.py"),
        "--config-name",
        "symbolic_ppo",
        f"train.output_dir={run_dir}",
        *SMALL,
        *extra,
    ]
    return subprocess.run(command, capture_output=True, text=True, timeout=900, cwd=ROOT)


@pytest.mark.slow
@pytest.mark.parametrize("processes", [1, 2])
def test_train_baseline_trains_the_symbolic_agent(tmp_path: Path, processes: int) -> None:
    """The script, as one process and as a real 2-process `accelerate launch` (world size read
    back from the run's own record)."""
    run_dir = tmp_path / "run"
    launcher = ()
    if processes == 2:
        launcher = accelerate_launch("multi_cpu", 2)
    result = _script(run_dir, *launcher)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
    assert f"{processes} process(es)" in result.stdout and "policy.kind=symbolic" in result.stdout
    assert "done: 128 frames in 2 updates" in result.stdout
    config = yaml.safe_load((run_dir / "config.yaml").read_text())
    assert config["launch"]["world_size"] == processes
    assert config["train"]["label"] == "symbolic_ppo"
    assert read_trainer_state(latest_checkpoint(run_dir)).world_size == processes
    assert isinstance(load_policy(policy_dir(run_dir)), SymbolicActorCritic)
