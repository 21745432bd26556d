"""Hindsight relabelling for SAC (`sac.her`, glam/offpolicy/hindsight.py): the goals a step
achieved (checked against minigrid's grid), the relabelled observations, the n-step transitions
of a relabelled episode by hand, the buffer, and a SAC run that uses it.

.venv/bin/python -m pytest tests/test_hindsight.py
"""

from __future__ import annotations

import os
import random
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
import torch

import babyai_text
from glam.config import EnvConfig, PolicyConfig
from glam.envs import EnvRunner
from glam.offpolicy.hindsight import (
    HindsightBuffer,
    Step,
    achieved_goals,
    cat_batches,
    hindsight_transitions,
    is_goto,
    with_mission,
)
from glam.offpolicy.trainer import _hindsight_buffer
from glam.policy.observations import GridObservations, TextObservations
from glam.run_config import compose_run
from glam.runs.errors import SetupError

ROOT = Path(__file__).resolve().parents[1]


def test_goto_missions_and_the_goal_of_the_object_in_front() -> None:
    assert is_goto("go to the red ball") and is_goto("go to a grey key")
    assert not is_goto("pick up the red ball") and not is_goto("go to the red ball and open it")
    seen = ["You see a wall 2 steps left", "You see a red ball 1 step forward"]
    assert achieved_goals(seen) == ["go to the red ball"]
    assert achieved_goals(["You see a red ball 1 step right and 1 step forward"]) == []
    assert achieved_goals(["You see a red ball 2 steps forward"]) == []


def test_the_goal_read_from_the_words_is_the_object_the_grid_puts_in_front() -> None:
    """On random play of GoToLocal, a step achieves "go to the COLOR TYPE" exactly when
    minigrid's cell in front of the agent holds such an object."""
    env = babyai_text.make("BabyAI-GoToLocal-v0", action_space="nav")
    rng = random.Random(0)
    checked = facing = 0
    for seed in range(6):
        env.reset(seed=seed)
        for _ in range(40):
            _, _, terminated, truncated, info = env.step(rng.randrange(3))
            base = env.unwrapped
            cell = base.grid.get(*base.front_pos)
            truth = (
                [f"go to the {cell.color} {cell.type}"]
                if cell is not None and cell.type not in ("wall", "door")
                else []
            )
            assert achieved_goals(info["descriptions"]) == truth
            checked, facing = checked + 1, facing + bool(truth)
            if terminated or truncated:
                break
    assert checked > 100 and facing > 5


def _text_step(prompt: str, action: int, *seen: str) -> Step:
    return Step(
        TextObservations([prompt], [["turn left", "turn right", "go forward"]]), action, seen
    )


def test_relabelled_transitions_by_hand() -> None:
    mission = "go to the red ball"
    prompt = "Goal of the agent: go to the red ball\nObservation {}: ...\nAction {}:"
    blue = "You see a blue key 1 step forward"
    steps = [
        _text_step(prompt.format(0, 0), 2),
        _text_step(prompt.format(1, 1), 0),
        _text_step(prompt.format(2, 2), 2, blue),  # the blue key is in front after step 2
        _text_step(prompt.format(3, 3), 1, blue),  # still: its first achievement counts
        _text_step(prompt.format(4, 4), 2, "You see a red ball 1 step forward"),  # its own goal
    ]
    gamma, max_steps = 0.9, 64
    found = hindsight_transitions(steps, mission, goals=4, gamma=gamma, n=2, max_steps=max_steps)
    reward = 1 - 0.9 * 3 / max_steps  # reached at the 3rd step
    assert len(found) == 3  # steps 0..2, for the one other goal
    first, second, third = found
    assert all("go to the blue key" in t.obs.prompts[0] for t in found)
    assert all("red ball" not in t.obs.prompts[0] for t in found)
    # step 0: a window of 2 steps (0, 1) without reward, bootstrapped from step 2's view
    assert (first.action, first.ret, first.bootstrap) == (2, 0.0, True)
    assert first.discount == pytest.approx(gamma**2)
    assert (
        first.next_obs.prompts[0]
        == with_mission(steps[2].obs, mission, "go to the blue key").prompts[0]
    )
    # step 1: its window reaches the goal at step 2: gamma * reward, terminated
    assert second.ret == pytest.approx(gamma * reward)
    assert (second.discount, second.bootstrap) == (0.0, False)
    # step 2: the goal's own step
    assert third.ret == pytest.approx(reward) and not third.bootstrap
    # a reward scale multiplies the reward; the goals drawn are at most `goals`
    scaled = hindsight_transitions(
        steps, mission, goals=4, gamma=gamma, n=2, max_steps=max_steps, reward_scale=20.0
    )
    assert scaled[2].ret == pytest.approx(20 * reward)
    many = [
        _text_step(prompt.format(k, k), 0, f"You see a {c} box 1 step forward")
        for k, c in enumerate(["blue", "green", "grey", "purple"])
    ]
    few = hindsight_transitions(many, mission, goals=2, gamma=gamma, n=3, max_steps=max_steps)
    assert len({t.obs.prompts[0].split("\n")[0] for t in few}) == 2


def test_grid_observations_are_relabelled_by_their_mission_and_refusals() -> None:
    grid = GridObservations(
        torch.zeros(1, 7, 7, 3, dtype=torch.uint8), torch.tensor([0]), ["go to the red ball"]
    )
    relabelled = with_mission(grid, "go to the red ball", "go to the blue key")
    assert relabelled.missions == ["go to the blue key"] and grid.missions == ["go to the red ball"]
    twice = TextObservations(["go to the red ball, go to the red ball"], [["go forward"]])
    with pytest.raises(ValueError, match="once"):
        with_mission(twice, "go to the red ball", "go to the blue key")


def test_the_buffer_keeps_a_ring_and_mixes_into_a_batch() -> None:
    mission = "go to the red ball"
    prompt = "Goal of the agent: go to the red ball\nStep {}"
    steps = [_text_step(prompt.format(k), k % 3) for k in range(3)]
    steps[1] = _text_step(prompt.format(1), 1, "You see a blue key 1 step forward")
    buffer = HindsightBuffer(3, goals=2, gamma=0.99, n=3, max_steps=64)
    assert buffer.add_episode(steps, mission) == 2 and len(buffer) == 2
    assert buffer.add_episode(steps, "pick up the red ball") == 0  # not a GoTo mission
    buffer.add_episode(steps, mission)
    assert len(buffer) == 3 and buffer.episodes == 2  # the ring keeps the newest 3
    batch = buffer.sample(5, generator=torch.Generator().manual_seed(0))
    assert len(batch.obs) == 5 and batch.actions.shape == (5,)
    both = cat_batches(batch, buffer.sample(2))
    assert len(both.obs) == 7 and both.returns.shape == (7,) and both.bootstrap.dtype == torch.bool


def test_the_runner_says_what_each_env_saw_after_its_step() -> None:
    runner = EnvRunner(
        EnvConfig(name="BabyAI-GoToLocal-v0", action_space="nav"),
        PolicyConfig(),
        num_envs=2,
        seed=0,
    )
    runner.reset()
    for _ in range(70):  # past the step limit: the final view of an ended episode is kept
        _, dones, _ = runner.step([2, 0])
        assert all(isinstance(seen, list) and seen for seen in runner.seen)
    runner.close()


def _train(tmp_path: Path, *overrides: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [
            sys.executable,
            str(ROOT / "scripts" / "train_baseline.py"),
            "--config-name",
            "sac_symbolic",
            "train.total_frames=1024",
            "sac.learning_starts=256",
            "sac.log_every=512",
            "train.torch_threads=1",
            "train.progress_bar=false",
            f"train.output_dir={tmp_path / 'run'}",
            *overrides,
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )


@pytest.mark.slow
def test_sac_with_hindsight_trains(tmp_path: Path) -> None:
    done = _train(tmp_path, "env.name=BabyAI-GoToLocal-v0", "sac.her=true", "sac.her_ratio=0.25")
    assert done.returncode == 0, done.stderr
    metrics = pd.read_csv(tmp_path / "run" / "metrics.csv")
    assert metrics["charts/her_size"].iloc[-1] > 0
    assert metrics["charts/her_share"].dropna().eq(0.25).all()


def test_hindsight_is_refused_on_other_missions() -> None:
    cfg = compose_run("sac_symbolic", ["env.name=BabyAI-PickupLoc-v0", "sac.her=true"])
    runner = EnvRunner(cfg.env, cfg.policy, num_envs=2, seed=0, observation_kind="grid")
    runner.reset()
    with pytest.raises(SetupError, match="sac.her relabels GoTo missions"):
        _hindsight_buffer(cfg, runner, rank=0)
    runner.close()
