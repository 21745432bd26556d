"""The critic's own learning: `ppo.value_lr` (the value head's optimizer group) and
`ppo.value_warmup_updates` (updates in which only the value head learns), in real tiny runs."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest
import torch
from accelerate import Accelerator
from helpers_tiny import one_torch_thread  # noqa: F401  (autouse fixture: one torch thread)
from test_ppo_trainer import tiny_config

from glam.baselines.loading import load_policy
from glam.config import PPOConfig, TrainConfig
from glam.policy.llm_policy import LLMActorCritic
from glam.ppo.algorithm_config import AlgorithmConfig
from glam.ppo.algorithms import build_algorithm
from glam.ppo.setup import group_lr_factors, parameter_groups
from glam.ppo.trainer import train
from glam.runs.errors import SetupError
from glam.runs.folder import policy_dir

NAV = ["turn left", "turn right", "go forward"]


def _run(run_dir: Path, total_frames: int, *, resume: bool = False) -> None:
    """A tiny run (32 frames an update), the critic at 10x the policy's rate for 2 updates."""
    cfg = tiny_config()
    cfg.ppo = PPOConfig(
        frames_per_env=8, minibatch_size=16, epochs=1, lr=1e-3, value_lr=1e-2,
        value_warmup_updates=2,
    )  # fmt: skip
    cfg.train = TrainConfig(
        total_frames=total_frames, save_every=1, keep_checkpoints=0, resume=resume,
        progress_bar=False,
    )  # fmt: skip
    train(cfg, Accelerator(cpu=True), run_dir)


def _weights(run_dir: Path, update: int) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """The policy's language-model weights and value-head weights at checkpoint `update`."""
    policy = load_policy(policy_dir(run_dir / "checkpoints" / f"update_{update:06d}"))
    model = {k: v.clone() for k, v in policy.model.state_dict().items()}
    head = {k: v.clone() for k, v in policy.value_head.state_dict().items()}
    return model, head


def _same(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


@pytest.mark.slow
def test_only_the_critic_learns_during_its_warm_up_across_a_resume(tmp_path: Path) -> None:
    _run(tmp_path, 32)  # update 1 of the warm-up, then a resumed session for 2 and 3
    _run(tmp_path, 96, resume=True)
    (model_1, head_1), (model_2, head_2), (model_3, head_3) = (
        _weights(tmp_path, update) for update in (1, 2, 3)
    )
    assert _same(model_1, model_2)  # update 2 still warms the critic up, after the resume
    assert not _same(head_1, head_2)  # ... which learns
    assert not _same(model_2, model_3)  # then the policy moves too
    assert not _same(head_2, head_3)
    with (tmp_path / "metrics.csv").open() as handle:
        rows = list(csv.DictReader(handle))
    assert [float(row["charts/learning_rate"]) for row in rows] == [0.0, 0.0, 1e-3]
    assert [float(row["charts/value_learning_rate"]) for row in rows] == [1e-2] * 3
    # Its loss was the value's alone, so the policy's stats still come from the algorithm.
    assert all(row["losses/policy"] != "" for row in rows)


def test_the_critics_group_holds_exactly_the_value_head() -> None:
    cfg = tiny_config()
    torch.manual_seed(0)
    policy = LLMActorCritic.from_config(cfg.model, cfg.policy, NAV)
    ppo = PPOConfig(lr=1e-3, value_lr=5e-3, value_warmup_updates=3)
    groups = parameter_groups(policy, ppo, build_algorithm(AlgorithmConfig(), ppo))
    assert [(g["role"], g["lr"]) for g in groups] == [("policy", 1e-3), ("value", 5e-3)]
    assert {id(p) for p in groups[1]["params"]} == {id(p) for p in policy.value_head.parameters()}
    trainable = [p for p in policy.parameters() if p.requires_grad]
    assert len(groups[0]["params"]) + len(groups[1]["params"]) == len(trainable)
    policy_factor, value_factor = group_lr_factors(groups, ppo, num_updates=10)
    assert [policy_factor(u) for u in range(5)] == [0.0, 0.0, 0.0, 1.0, 1.0]
    assert [value_factor(u) for u in range(5)] == [1.0] * 5
    # Without either setting: one group, as before.
    plain = PPOConfig(lr=1e-3)
    groups = parameter_groups(policy, plain, build_algorithm(AlgorithmConfig(), plain))
    assert [(g["role"], len(g["params"])) for g in groups] == [("all", len(trainable))]


def test_a_critic_setting_without_a_critic_is_refused() -> None:
    cfg = tiny_config()
    policy = LLMActorCritic.from_config(cfg.model, cfg.policy, NAV)
    ppo = PPOConfig(value_lr=1e-3)
    grpo = build_algorithm(AlgorithmConfig(name="grpo"), ppo)
    with pytest.raises(SetupError, match="algorithm.name=grpo has no critic"):
        parameter_groups(policy, ppo, grpo)
    with pytest.raises(ValueError, match="ppo.value_lr must be > 0"):
        PPOConfig(value_lr=0.0)
    with pytest.raises(ValueError, match="ppo.value_warmup_updates must be >= 0"):
        PPOConfig(value_warmup_updates=-1)
