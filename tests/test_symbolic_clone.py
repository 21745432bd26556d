"""The symbolic network cloned on the language-model agents' demonstrations (glam/bc/choice.py,
`policy.kind=symbolic`) and PPO's warm start from it (`train.init_policy`): the replay finds the
grid each recorded prompt was written from, the clone's loss is the cross-entropy of the
network's own logits, the warm run acts as the clone with a critic of its own, and another
network or setting is refused."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from helpers_tiny import one_torch_thread  # noqa: F401  (autouse fixture: one torch thread)
from minigrid.core.constants import COLOR_TO_IDX, OBJECT_TO_IDX

from glam.baselines.config import SymbolicConfig
from glam.baselines.symbolic import SymbolicActorCritic, build_symbolic_policy
from glam.bc.choice import DecisionSet, clone_policy, replay_grids, split_decisions
from glam.bc.config import CloneConfig, CloneRunConfig
from glam.config import ConfigError, PolicyConfig, validate_config
from glam.demos import DemoDatasetError, load_demos
from glam.run_config import TrainingRunConfig, compose_run
from glam.runs.errors import SetupError

LEVEL = "BabyAI-GoToRedBall-v0"
SMALL = SymbolicConfig(image_dim=8, instr_dim=8, hidden_dim=8)
RED_BALL = re.compile(
    r"You see a red ball (?:(\d+) steps? (left|right))?(?: and )?(?:(\d+) steps? forward)?,"
)


def _run(redball_demos: Path, out: Path, **clone: object) -> CloneRunConfig:
    settings = {"epochs": 2, "batch_size": 8, "learning_rate": 1e-2, "progress": False, **clone}
    return CloneRunConfig(
        policy=PolicyConfig(kind="symbolic"),
        symbolic=SMALL,
        clone=CloneConfig(dataset=str(redball_demos), output_dir=str(out), **settings),
    )


def _warm_config(init_policy: Path, seed: int = 3, **symbolic: object) -> TrainingRunConfig:
    cfg = compose_run(
        "symbolic_ppo",
        [
            f"env.name={LEVEL}",
            "symbolic.image_dim=8",
            "symbolic.instr_dim=8",
            "symbolic.hidden_dim=8",
            *(f"symbolic.{key}={value}" for key, value in symbolic.items()),
            f"train.seed={seed}",
        ],
    )
    cfg.train.init_policy = str(init_policy)
    return cfg


def test_the_replay_finds_the_grid_each_prompt_was_written_from(redball_demos: Path) -> None:
    pairs = load_demos(redball_demos)
    grids = replay_grids(pairs)
    assert len(grids) == len(pairs) and grids.missions == list(pairs["mission"])
    ball = (OBJECT_TO_IDX["ball"], COLOR_TO_IDX["red"])
    checked = 0
    for image, prompt in zip(grids.images, pairs["prompt"], strict=True):
        # The agent stands at (3, 6) facing up: k steps left is x = 3 - k, j forward y = 6 - j.
        for sideways, side, forward in RED_BALL.findall(prompt):
            x = 3 + (int(sideways or 0) if side == "right" else -int(sideways or 0))
            y = 6 - int(forward or 0)
            assert tuple(image[x, y, :2].tolist()) == ball, prompt
            checked += 1
    assert checked > len(pairs) / 2  # the ball is in view at most decisions

    shifted = pairs.map(lambda row: {"seed": row["seed"] + 1})
    with pytest.raises(DemoDatasetError, match="does not reproduce its prompt"):
        replay_grids(shifted)
    with pytest.raises(DemoDatasetError, match="no \\['seed'\\] column"):
        replay_grids(pairs.remove_columns("seed"))


def test_the_clone_fits_the_network_and_ppo_starts_from_it(
    redball_demos: Path, tmp_path: Path
) -> None:
    result = clone_policy(_run(redball_demos, tmp_path / "clone"))
    summary = json.loads((tmp_path / "clone" / "clone.json").read_text())
    assert summary["final"]["train_loss"] < summary["zero_shot"]["eval_loss"]
    saved = SymbolicActorCritic.from_pretrained(tmp_path / "clone" / "policy")
    assert saved.training_env["name"] == LEVEL and saved.cfg == SMALL

    # The recorded held-out loss is the cross-entropy of the saved network's own logits.
    _, eval_pairs = split_decisions(load_demos(redball_demos), _run(redball_demos, tmp_path).clone)
    held_out = DecisionSet.grid_from_pairs(eval_pairs, tuple(saved.action_words))
    with torch.no_grad():
        logits = saved.eval()(**held_out.observations.inputs()).logits
    loss = F.cross_entropy(logits, held_out.targets).item()
    assert loss == pytest.approx(result.summary["final"]["eval_loss"], rel=1e-5)

    # PPO's warm start acts as the clone; its critic is the run's own fresh draw.
    cfg = _warm_config(tmp_path / "clone" / "policy")
    torch.manual_seed(cfg.train.seed)
    warm = build_symbolic_policy(cfg, None).eval()
    torch.manual_seed(cfg.train.seed)
    cfg.train.init_policy = ""
    fresh = build_symbolic_policy(cfg, None)
    with torch.no_grad():
        torch.testing.assert_close(warm(**held_out.observations.inputs()).logits, logits)
    for name, value in warm.state_dict().items():
        expected = fresh.state_dict() if name.startswith("critic.") else saved.state_dict()
        assert torch.equal(value, expected[name]), name
    assert not torch.equal(warm.critic[0].weight, saved.critic[0].weight)


def test_another_network_or_setting_is_refused(redball_demos: Path, tmp_path: Path) -> None:
    clone_policy(_run(redball_demos, tmp_path / "clone", epochs=1))
    wider = _warm_config(tmp_path / "clone" / "policy", image_dim=16)
    with pytest.raises(SetupError, match="symbolic.image_dim=8 there, 16 here"):
        build_symbolic_policy(wider, None)
    missing = _warm_config(tmp_path / "nothing")
    with pytest.raises(SetupError, match="train.init_policy: .*nothing"):
        build_symbolic_policy(missing, None)

    with pytest.raises(ValueError, match="symbolic.memory=true"):
        CloneRunConfig(policy=PolicyConfig(kind="symbolic"), symbolic=SymbolicConfig(memory=True))
    run = {"train": {"init_policy": "a/policy"}, "policy": {"kind": "drrn"}}
    with pytest.raises(ConfigError, match="leave it empty"):
        validate_config(run, TrainingRunConfig)
