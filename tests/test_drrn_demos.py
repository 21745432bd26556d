"""DRRN from demonstrations, as DQfD learns (`drrn.demos`; Hester et al. 2018).

- The margin loss by hand, absent candidates included.
- The bot's episodes replayed into transitions: the recorded prompts where the run reads them
  as they were recorded, each step's next prompt the following step's, the reward and the
  termination at the episode's end only; another level and a shifted seed refused.
- A run through the trainer: the pre-training on demonstrations alone moves the network toward
  them, the demonstrations' share and margin are logged, the checkpoint counts the pre-training,
  and a resumed run does not pre-train again.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
from accelerate import Accelerator

from glam.baselines.demo_transitions import demonstrated_transitions, load_demo_transitions
from glam.baselines.drrn_trainer import margin_loss, train_drrn
from glam.config import EnvConfig
from glam.demos import DemoDatasetError, load_demos
from glam.ppo.logger import read_metrics
from glam.run_config import compose_run

LEVEL = "BabyAI-GoToRedBall-v0"
NAV = ["turn left", "turn right", "go forward"]


def test_the_margin_loss_by_hand() -> None:
    q = torch.tensor(
        [
            [1.0, 2.0, 0.0],  # another action leads: max(1, 2.8, 0.8) - 1 = 1.8
            [3.0, 1.0, 2.5],  # the demonstrated one leads by < 0.8: max(3, 1.8, 3.3) - 3 = 0.3
            [3.0, float("-inf"), 1.0],  # leads by 2, the absent candidate never counts: 0
        ]
    )
    actions = torch.tensor([0, 0, 0])
    assert margin_loss(q, actions, 0.8).item() == pytest.approx((1.8 + 0.3 + 0.0) / 3)
    assert margin_loss(q, actions, 0.0).item() == pytest.approx((1.0 + 0.0 + 0.0) / 3)
    # The gradient raises the demonstrated action's Q and lowers the one that beat it.
    q = q[:1].clone().requires_grad_(True)
    margin_loss(q, actions[:1], 0.8).backward()
    assert q.grad.tolist() == [[-1.0, 1.0, 0.0]]


def test_demonstrated_episodes_become_the_runs_transitions(redball_demos: Path) -> None:
    pairs = load_demos(redball_demos)
    env = EnvConfig(name=LEVEL, nbr_obs=1, action_space="nav", reward_scale=10.0)
    buffer = demonstrated_transitions(pairs, env)
    batch = buffer.select(range(len(buffer)))
    rows = pairs.to_list()  # the collector writes episode by episode, steps in order
    assert [(r["episode"], r["step"]) for r in rows] == sorted(
        (r["episode"], r["step"]) for r in rows
    )
    assert len(buffer) == len(rows)
    for i, row in enumerate(rows):
        # Recorded in the run's own format (one observation, GLAM's prompt): the same prompts.
        assert batch.prompts[i] == row["prompt"]
        assert (batch.actions[i].item(), batch.candidates[i]) == (row["action_index"], NAV)
        ends = i + 1 == len(rows) or rows[i + 1]["episode"] != row["episode"]
        if ends:  # the bot reaches the ball: BabyAI's reward, scaled, and the end
            assert batch.terminals[i] and 0 < batch.rewards[i].item() <= 10.0
        else:
            assert not batch.terminals[i] and batch.rewards[i].item() == 0.0
            assert batch.next_prompts[i] == batch.prompts[i + 1]
    # Read with three observations, the prompts are the run's own, not the recorded ones.
    longer = demonstrated_transitions(pairs, EnvConfig(name=LEVEL, nbr_obs=3, action_space="nav"))
    second = longer.select([1]).prompts[0]
    assert "Observation 0:" in second and "Action 0: " in second and second != batch.prompts[1]


def test_the_held_out_episodes_are_the_clones(redball_demos: Path) -> None:
    from glam.baselines.config import DRRNConfig
    from glam.demos import split_pairs

    drrn = DRRNConfig(demos=str(redball_demos), demo_held_out=0.25, demo_split_seed=3)
    env = EnvConfig(name=LEVEL, nbr_obs=1, action_space="nav")
    buffer, episodes = load_demo_transitions(drrn, env)
    kept, held_out = split_pairs(load_demos(redball_demos), 0.25, 3)
    assert episodes == len(set(kept["episode"])) == 6
    assert sorted(buffer.select(range(len(buffer))).prompts) == sorted(kept["prompt"])
    assert not set(held_out["prompt"]) & set(buffer.prompts)


def test_demonstrations_the_run_cannot_replay_are_refused(redball_demos: Path) -> None:
    pairs = load_demos(redball_demos)
    with pytest.raises(DemoDatasetError, match=r"level \['BabyAI-GoToRedBall-v0'\].*GoToLocal"):
        demonstrated_transitions(pairs, EnvConfig(name="BabyAI-GoToLocal-v0", action_space="nav"))
    shifted = pairs.map(lambda row: {"seed": row["seed"] + 1})
    with pytest.raises(DemoDatasetError, match="does not reproduce its prompt"):
        demonstrated_transitions(shifted, EnvConfig(name=LEVEL, nbr_obs=1, action_space="nav"))
    gap = pairs.filter(lambda row: row["step"] != 1)
    with pytest.raises(DemoDatasetError, match=r"not 0, 1, 2"):
        demonstrated_transitions(gap, EnvConfig(name=LEVEL, nbr_obs=1, action_space="nav"))


@pytest.fixture
def accelerator() -> Accelerator:
    return Accelerator(cpu=True)


SMALL = [
    f"env.name={LEVEL}",
    "env.num_envs=4",
    "drrn.log_every=64",
    "drrn.learning_starts=32",
    "drrn.batch_size=16",
    "drrn.embedding_dim=16",
    "drrn.hidden_dim=32",
    "drrn.demo_held_out=0",
    "train.progress_bar=false",
]


def test_a_run_pretrains_on_the_demonstrations_and_resumes_without_doing_it_again(
    redball_demos: Path, tmp_path: Path, accelerator, capsys: pytest.CaptureFixture[str]
) -> None:
    run_dir = tmp_path / "run"
    overrides = [
        *SMALL,
        f"drrn.demos={redball_demos}",
        "drrn.demo_pretrain_steps=150",
        "drrn.demo_share=0.25",
        f"train.output_dir={run_dir}",
        "train.save_every=1",
    ]
    cfg = compose_run("drrn", [*overrides, "train.total_frames=64"])
    train_drrn(cfg, accelerator, run_dir)
    out = capsys.readouterr().out
    transitions = len(load_demos(redball_demos))
    assert f"[glam] drrn.demos: {transitions} transitions of 8 demonstrated episodes" in out
    lines = [line for line in out.splitlines() if "pre-training step" in line]
    assert [line.split("step ")[1].split(" ")[0] for line in lines] == ["150/150"], out
    # What the pre-training minimises: the margin loss, 0.8 or so on a fresh network (every
    # action's Q near the others'), falls.
    assert float(lines[0].split("margin loss ")[1].split(",")[0]) < 0.7, lines[0]
    state = json.loads((run_dir / "checkpoints" / "update_000001" / "drrn_state.json").read_text())
    assert state["pretrained_steps"] == 150
    rate = cfg.drrn.updates_per_step  # TD steps per frame after drrn.learning_starts=32
    assert state["gradient_steps"] == 150 + int((64 - 32) * rate)
    row = read_metrics(run_dir)[-1]
    assert 0.0 <= row["charts/demo_agreement"] <= 1.0 and math.isfinite(row["losses/demo_margin"])
    # Resumed for one more row: no second pre-training, and the steps due count the first.
    cfg = compose_run("drrn", [*overrides, "train.total_frames=128", "train.resume=true"])
    train_drrn(cfg, accelerator, run_dir)
    assert "pre-training" not in capsys.readouterr().out
    state = json.loads((run_dir / "checkpoints" / "update_000002" / "drrn_state.json").read_text())
    assert state == {"gradient_steps": 150 + int((128 - 32) * rate), "pretrained_steps": 150}
