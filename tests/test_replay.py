"""The off-policy replay buffer (glam/offpolicy/replay.py): n-step transitions sampled from the
steps as played, the ring's overwrite, and the round trip through a checkpoint folder (text and
grid observations), refusing a folder it cannot use.

    .venv/bin/python -m pytest tests/test_replay.py
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from glam.offpolicy.replay import ReplayBuffer, ReplayError
from glam.policy.observations import GridObservations, TextObservations

ACTIONS = ["turn left", "turn right", "go forward"]


def _text(step: int, envs: int = 2, tag: str = "") -> TextObservations:
    return TextObservations(
        [f"{tag}step {step} env {e}" for e in range(envs)], [list(ACTIONS) for _ in range(envs)]
    )


def _play(buffer: ReplayBuffer, steps: int, *, end_at: dict[int, str] | None = None) -> None:
    """Steps of 2 envs: env 0's rewards are the step number, env 1's ten times it; env 0's
    episode ends at the steps of `end_at` (terminated or truncated)."""
    for t in range(steps):
        ending = (end_at or {}).get(t)
        buffer.add(
            _text(t),
            torch.tensor([t % 3, (t + 1) % 3]),
            torch.tensor([float(t), 10.0 * t]),
            torch.tensor([ending == "terminated", False]),
            torch.tensor([ending == "truncated", False]),
            _text(t, tag="final " if ending == "truncated" else "next "),
        )


def _rows(batch) -> dict[str, tuple]:  # noqa: ANN001
    """Each sampled transition by its prompt: (action, return, discount, bootstrap, next)."""
    return {
        prompt: (int(a), float(r), float(d), bool(b), nxt)
        for prompt, a, r, d, b, nxt in zip(
            batch.obs.prompts,
            batch.actions,
            batch.returns,
            batch.discounts,
            batch.bootstrap,
            batch.next_obs.prompts,
            strict=True,
        )
    }


def test_sampled_transitions_are_the_n_step_returns_of_the_steps_played() -> None:
    buffer = ReplayBuffer(capacity=10, num_envs=2)
    _play(buffer, 5, end_at={1: "terminated"})
    assert len(buffer) == 10
    rows = _rows(buffer.sample(400, gamma=0.5, n=2, generator=torch.Generator().manual_seed(0)))
    assert len(rows) == 10  # every transition drawn at least once in 400
    # env 0: step 0 sums 0 + 0.5 * 1 and stops at the terminated step 1: no bootstrap
    assert rows["step 0 env 0"] == (0, 0.5, 0.0, False, "next step 1 env 0")
    assert rows["step 1 env 0"] == (1, 1.0, 0.0, False, "next step 1 env 0")
    # step 2 starts a new episode: 2 + 0.5 * 3, bootstrapped from what followed step 3
    assert rows["step 2 env 0"] == (2, 3.5, 0.25, True, "next step 3 env 0")
    # the newest step: one reward, bootstrapped from what followed it
    assert rows["step 4 env 0"] == (1, 4.0, 0.5, True, "next step 4 env 0")
    assert rows["step 0 env 1"] == (1, 5.0, 0.25, True, "next step 1 env 1")


def test_a_time_out_bootstraps_from_its_final_observation() -> None:
    buffer = ReplayBuffer(capacity=10, num_envs=2)
    _play(buffer, 4, end_at={1: "truncated"})
    rows = _rows(buffer.sample(400, gamma=0.5, n=3, generator=torch.Generator().manual_seed(1)))
    assert rows["step 0 env 0"] == (0, 0.5, 0.25, True, "final step 1 env 0")
    assert rows["step 1 env 0"] == (1, 1.0, 0.5, True, "final step 1 env 0")


def test_the_ring_keeps_the_newest_steps() -> None:
    buffer = ReplayBuffer(capacity=3, num_envs=2)
    _play(buffer, 5)
    assert (buffer.size, buffer.added, len(buffer)) == (3, 5, 6)
    rows = _rows(buffer.sample(300, gamma=1.0, n=5, generator=torch.Generator().manual_seed(2)))
    assert {prompt.split(" env")[0] for prompt in rows} == {"step 2", "step 3", "step 4"}
    # the window runs over the ring's wrap in the order played: 2 + 3 + 4
    assert rows["step 2 env 0"][1:4] == (9.0, 1.0, True)


def test_a_text_replay_round_trips_through_a_folder(tmp_path: Path) -> None:
    buffer = ReplayBuffer(capacity=3, num_envs=2)
    _play(buffer, 5, end_at={3: "truncated"})
    buffer.save(tmp_path / "replay")
    again = ReplayBuffer.load(tmp_path / "replay", capacity=3, num_envs=2)
    assert (again.size, again.added) == (3, 5)
    for name in ("actions", "rewards", "terminated", "truncated"):
        assert torch.equal(getattr(again, name)[:3], getattr(buffer, name)[buffer._order()])
    draw = {"batch_size": 50, "gamma": 0.9, "n": 2}
    one = buffer.sample(**draw, generator=torch.Generator().manual_seed(3))
    two = again.sample(**draw, generator=torch.Generator().manual_seed(3))
    assert one.obs.prompts == two.obs.prompts and one.next_obs.prompts == two.next_obs.prompts
    assert torch.equal(one.returns, two.returns) and torch.equal(one.bootstrap, two.bootstrap)
    # A smaller ring keeps the newest steps; the texts are JSON, the numbers safetensors.
    assert ReplayBuffer.load(tmp_path / "replay", capacity=2, num_envs=2).obs[1].prompts[0] == (
        "step 4 env 0"
    )
    first = json.loads((tmp_path / "replay" / "observations.jsonl").read_text().splitlines()[0])
    assert first["obs"]["prompts"] == ["step 2 env 0", "step 2 env 1"]


def test_a_grid_replay_round_trips_through_a_folder(tmp_path: Path) -> None:
    buffer = ReplayBuffer(capacity=4, num_envs=2)
    for t in range(3):
        grids = GridObservations(
            torch.full((2, 7, 7, 3), t, dtype=torch.uint8),
            torch.tensor([t % 4, (t + 1) % 4]),
            [f"go to the ball {t}", f"open the door {t}"],
        )
        buffer.add(
            grids, torch.tensor([0, 1]), torch.zeros(2), torch.zeros(2), torch.zeros(2), grids
        )
    buffer.save(tmp_path / "replay")
    again = ReplayBuffer.load(tmp_path / "replay", capacity=4, num_envs=2)
    for before, after in zip(buffer.obs[:3], again.obs[:3], strict=True):
        assert torch.equal(before.images, after.images)
        assert torch.equal(before.directions, after.directions)
        assert before.missions == after.missions


def test_a_replay_folder_it_cannot_use_is_named(tmp_path: Path) -> None:
    buffer = ReplayBuffer(capacity=3, num_envs=2)
    _play(buffer, 2)
    buffer.save(tmp_path / "replay")
    with pytest.raises(ReplayError, match="holds steps of 2 envs, this run has 4"):
        ReplayBuffer.load(tmp_path / "replay", capacity=3, num_envs=4)
    texts = tmp_path / "replay" / "observations.jsonl"
    texts.write_text(texts.read_text().splitlines()[0] + "\n")
    with pytest.raises(ReplayError, match="1 steps of 2: cut short"):
        ReplayBuffer.load(tmp_path / "replay", capacity=3, num_envs=2)
    with pytest.raises(ReplayError, match="cannot read the replay"):
        ReplayBuffer.load(tmp_path / "missing", capacity=3, num_envs=2)
    with pytest.raises(ValueError, match="no transition yet"):
        ReplayBuffer(capacity=3, num_envs=2).sample(4, gamma=0.9, n=1)
