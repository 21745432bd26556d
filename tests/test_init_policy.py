"""`train.init_policy`: PPO starts from a saved policy's acting weights (model and action heads,
for an adapter or a whole model) with its own untrained critic, and refuses another kind of
policy."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from accelerate import Accelerator
from helpers_tiny import one_torch_thread  # noqa: F401  (autouse fixture: one torch thread)
from test_ppo_trainer import tiny_config

from glam.config import (
    AdapterConfig,
    ConfigError,
    ModelConfig,
    PolicyConfig,
    TrainConfig,
    validate_config,
)
from glam.policy.llm_policy import LLMActorCritic
from glam.ppo.setup import SetupError, build_policy
from glam.ppo.trainer import train
from glam.run_config import TrainingRunConfig
from glam.runs.folder import policy_dir

NO_LORA = AdapterConfig(enabled=False)
PROMPTS = [
    "Goal of the agent: go to the red ball\nObservation 0: You see a red ball 1 step left\n"
    "Action 0:",
    "Goal of the agent: go to the red ball\nObservation 0: You see a wall 2 steps forward\n"
    "Action 0:",
]


def _config(seed: int, **model: object) -> TrainingRunConfig:
    cfg = tiny_config()
    cfg.model = ModelConfig(
        name_or_path="tiny-random-llama", autocast_bf16=False, **{"lora": NO_LORA, **model}
    )
    cfg.policy = PolicyConfig(head="action_heads", value_hidden_sizes=[16], temperature=1.0)
    cfg.train = TrainConfig(total_frames=64, seed=seed, progress_bar=False)
    return cfg


def _saved_policy(cfg: TrainingRunConfig, folder: Path) -> LLMActorCritic:
    """A policy of `cfg` whose trainable weights are moved off their initialisation, saved."""
    torch.manual_seed(cfg.train.seed)
    policy = build_policy(cfg, None)
    with torch.no_grad():
        for parameter in policy.trainable_parameters():
            parameter.add_(0.3 * torch.randn_like(parameter))
    policy.save_pretrained(folder, training_env=cfg.env)
    return policy


def _outputs(policy: LLMActorCritic) -> tuple[torch.Tensor, torch.Tensor]:
    policy.eval()
    with torch.no_grad():
        output = policy(PROMPTS, [["turn left", "turn right", "go forward"]] * 2)
    return output.logits, output.values


@pytest.mark.parametrize(
    "model",
    [
        {"lora": AdapterConfig(layers=1)},  # AFlan's kind: an adapter and action heads
        # NPAE-top4's kind: random weights, the top layer fully trained
        {"pretrained": False, "lora": AdapterConfig(enabled=False), "trained_layers": 1},
    ],
    ids=["adapter", "whole-model"],
)
def test_the_run_acts_as_the_saved_policy_with_its_own_critic(model: dict, tmp_path: Path) -> None:
    saved = _saved_policy(_config(seed=7, **model), tmp_path / "clone")
    cfg = _config(seed=3, **model)
    cfg.train.init_policy = str(tmp_path / "clone")
    torch.manual_seed(cfg.train.seed)
    warm = build_policy(cfg, None)
    torch.manual_seed(cfg.train.seed)
    cold = build_policy(_config(seed=3, **model), None)

    saved_logits, saved_values = _outputs(saved)
    warm_logits, warm_values = _outputs(warm)
    cold_logits, cold_values = _outputs(cold)
    torch.testing.assert_close(warm_logits, saved_logits)
    assert not torch.allclose(cold_logits, saved_logits)
    # The critic is the run's own draw, not the saved one's.
    torch.testing.assert_close(warm.value_head.state_dict(), cold.value_head.state_dict())
    assert not torch.allclose(warm_values, saved_values)
    # Only what the run trains is trainable, as without a warm start.
    assert [n for n, p in warm.named_parameters() if p.requires_grad] == [
        n for n, p in cold.named_parameters() if p.requires_grad
    ]


def test_another_kind_of_policy_is_refused(tmp_path: Path) -> None:
    adapter = {"lora": AdapterConfig(layers=1)}
    _saved_policy(_config(seed=7, **adapter), tmp_path / "clone")

    def start(cfg: TrainingRunConfig) -> None:
        cfg.train.init_policy = str(tmp_path / "clone")
        build_policy(cfg, None)

    scoring = _config(seed=3, **adapter)
    scoring.policy.head = "scoring"
    with pytest.raises(SetupError, match="policy.head='action_heads' there, 'scoring' here"):
        start(scoring)
    hotter = _config(seed=3, **adapter)
    hotter.policy.temperature = 5.0
    with pytest.raises(SetupError, match="policy.temperature=1.0 there, 5.0 here"):
        start(hotter)
    whole = _config(seed=3, lora=AdapterConfig(enabled=False), trained_layers=1)
    with pytest.raises(SetupError, match="a LoRA adapter.*the whole model here"):
        start(whole)
    random = _config(seed=3, pretrained=False, **adapter)
    with pytest.raises(SetupError, match="model.pretrained=True there, False here"):
        start(random)
    wider = _config(seed=3, lora=AdapterConfig(layers=1, r=16))
    with pytest.raises(SetupError, match="do not fit this policy's model"):
        start(wider)
    missing = _config(seed=3, **adapter)
    missing.train.init_policy = str(tmp_path / "nothing")
    with pytest.raises(SetupError, match="train.init_policy: .*nothing"):
        build_policy(missing, None)


def test_the_settings_that_cannot_go_together_are_refused() -> None:
    run = {"model": {"name_or_path": "tiny-random-llama"}, "train": {"init_policy": "a/policy"}}
    with pytest.raises(ConfigError, match="leave it empty"):
        validate_config({**run, "policy": {"kind": "drrn"}}, TrainingRunConfig)
    with pytest.raises(ConfigError, match="keep one"):
        validate_config({**run, "model": {"lora": {"init": "a/policy/adapter"}}}, TrainingRunConfig)


@pytest.mark.slow
def test_a_run_starts_from_the_saved_policy_and_trains(tmp_path: Path) -> None:
    model = {"lora": AdapterConfig(layers=1)}
    saved = _saved_policy(_config(seed=7, **model), tmp_path / "clone")
    cfg = _config(seed=3, **model)
    cfg.train.init_policy = str(tmp_path / "clone")
    cfg.train.total_frames = 32  # one update of 4 envs x 8 frames
    cfg.ppo.lr = 1e-9  # a step too small to move the weights measurably
    train(cfg, Accelerator(cpu=True), tmp_path / "run")
    trained = LLMActorCritic.from_pretrained(policy_dir(tmp_path / "run"))
    torch.testing.assert_close(_outputs(trained)[0], _outputs(saved)[0], rtol=1e-4, atol=1e-5)
