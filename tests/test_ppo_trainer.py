"""The trainer's parts in-process: env runner, LR schedule, checkpoint files and their checks,
resumes, the run folder, stop signals, bf16 ratio check."""

from __future__ import annotations

import csv
import errno
import hashlib
import json
import math
import os
import random
import re
import shutil
import signal
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from accelerate import Accelerator
from omegaconf import OmegaConf
from torch import nn

from glam.config import AdapterConfig, EnvConfig, ModelConfig, PolicyConfig, PPOConfig, TrainConfig
from glam.envs import EnvRunner, env_seed, resolve_action_space
from glam.llm.chat import ChatClientError
from glam.policy.llm_policy import LLMActorCritic
from glam.ppo.buffer import RolloutBuffer
from glam.ppo.entry import _train_and_report
from glam.ppo.gae import compute_gae
from glam.ppo.hooks import TrainerHook
from glam.ppo.learner import StopSignal
from glam.ppo.logger import MetricsLogger
from glam.ppo.setup import (
    Training,
    _check_layout,
    build_policy,
    build_training,
    lr_factor,
    open_logs,
)
from glam.ppo.trainer import collect_rollout, train
from glam.ppo.update import ppo_update
from glam.run_config import TrainingRunConfig
from glam.runs.checkpoint import (
    CheckpointWriteError,
    TrainerState,
    UnusableCheckpoint,
    load_training_state,
    remove_temporaries,
    resume_checkpoint,
    save_checkpoint,
)
from glam.runs.errors import SetupError
from glam.runs.folder import latest_checkpoint, policy_dir

NAV = ["turn left", "turn right", "go forward"]


def tiny_config(**model_overrides: object) -> TrainingRunConfig:
    return TrainingRunConfig(
        model=ModelConfig(
            name_or_path="tiny-random-llama",
            lora=AdapterConfig(enabled=False),
            **{"autocast_bf16": False, **model_overrides},  # fp32 unless a test asks
        ),
        policy=PolicyConfig(value_hidden_sizes=[32], value_activation="tanh"),
        env=EnvConfig(
            name="BabyAI-GoToRedBallNoDists-v0", num_envs=4, nbr_obs=2, action_space="nav"
        ),
        ppo=PPOConfig(frames_per_env=8, minibatch_size=16, epochs=1),
        train=TrainConfig(total_frames=64),
    )


@pytest.fixture(scope="module")
def accelerator() -> Accelerator:
    return Accelerator(cpu=True)


def test_env_runner_keeps_histories_in_step() -> None:
    cfg = tiny_config()
    runner = EnvRunner(cfg.env, cfg.policy, num_envs=2, seed=123)
    runner.reset()
    first = runner.prompts()
    assert len(first) == 2 and first[0].startswith("Possible action of the agent: turn left")
    assert first[0].rstrip().endswith("Action 0:")
    assert runner.candidates() == [NAV, NAV]
    rewards, dones, episodes = runner.step([0, 2])
    second = runner.prompts()
    assert "Action 0: turn left" in second[0] and second[0].endswith("Action 1:")
    assert "Action 0: go forward" in second[1]
    assert rewards.shape == (2,) and episodes == [None, None] and not dones.any()
    # The schedule resumes after the episodes already started.
    assert runner.state_dict()["episodes_started"] == [1, 1]
    runner.close()


def test_env_runner_reports_ended_episodes_and_restarts_history() -> None:
    cfg = tiny_config()
    runner = EnvRunner(cfg.env, cfg.policy, num_envs=1, seed=5)
    runner.reset()
    ended = None
    for _ in range(200):  # turning in place never succeeds: the episode times out
        _, dones, episodes = runner.step([0])
        if dones[0]:
            ended = episodes[0]
            break
    assert ended is not None and ended["success"] is False and ended["seed"] == 5
    assert runner.prompts()[0].endswith("Action 0:")  # a fresh history
    runner.close()


def test_env_runner_records_finished_episodes_as_demonstrations(tmp_path) -> None:
    from glam.demos import load_demos, write_demos

    cfg = tiny_config()
    runner = EnvRunner(cfg.env, cfg.policy, num_envs=2, seed=5)
    runner.recording = True
    runner.reset()
    rng = np.random.default_rng(0)
    taken: list[list[tuple[str, int]]] = [[], []]  # (prompt, action) of env i's first episode
    ended: list[dict | None] = [None, None]
    while ended[0] is None:
        prompts, actions = runner.prompts(), rng.integers(0, 3, size=2).tolist()
        _, _, episodes = runner.step(actions)
        for i in range(2):
            if ended[i] is None:
                taken[i].append((prompts[i], actions[i]))
                ended[i] = episodes[i]
    records = runner.pop_records()
    assert runner.pop_records() == []
    first = [r for r in records if r["seed"] == ended[0]["seed"]]
    assert [(r["prompt"], r["action_index"]) for r in first] == taken[0]
    assert [r["step"] for r in first] == list(range(ended[0]["length"]))
    assert {r["action"] for r in first} <= set(NAV) and {r["source"] for r in first} == {"ppo"}
    assert all(r["success"] == ended[0]["success"] for r in first)
    # Env 1's episode, still running unless it ended too, is not recorded until it ends.
    assert {r["seed"] for r in records} == {e["seed"] for e in ended if e is not None}
    # Written in parts, read back as one dataset.
    half = len(records) // 2
    write_demos(records[:half], tmp_path / "rollouts" / "rank_0" / "update_000001")
    write_demos(records[half:], tmp_path / "rollouts" / "rank_1" / "update_000001")
    assert load_demos(tmp_path / "rollouts")["prompt"] == [r["prompt"] for r in records]
    runner.close()


def test_env_seeds_are_disjoint_between_ranks() -> None:
    assert env_seed(1, 0) != env_seed(1, 1)
    assert env_seed(1, 1) - env_seed(1, 0) >= 10**6
    assert env_seed(2, 0) - env_seed(1, 0) >= 10**8


def test_training_seeds_never_reach_evaluation_seeds() -> None:
    from glam.config import MAX_RUN_SEED
    from glam.envs import MAX_PROCESSES, SEEDS_PER_RANK
    from glam.eval.config import SEED_BASE

    # The largest seed any run can play: last run seed, last rank, its last reserved seed.
    highest = env_seed(MAX_RUN_SEED - 1, MAX_PROCESSES - 1) + SEEDS_PER_RANK - 1
    assert highest < SEED_BASE
    with pytest.raises(ValueError, match=r"train.seed must be in \[0, 10000\)"):
        TrainConfig(seed=MAX_RUN_SEED)


@pytest.mark.parametrize(
    "schedule,expected",
    [("constant", [1.0, 1.0, 1.0, 1.0]), ("linear", [1.0, 0.75, 0.5, 0.25])],
)
def test_lr_factor(schedule: str, expected: list[float]) -> None:
    ppo = PPOConfig(lr_schedule=schedule)
    assert [lr_factor(u, ppo, 4) for u in range(4)] == pytest.approx(expected)


def test_lr_factor_warmup_then_cosine() -> None:
    ppo = PPOConfig(lr_schedule="cosine", warmup_updates=2)
    factors = [lr_factor(u, ppo, 6) for u in range(6)]
    assert factors[:3] == pytest.approx([0.5, 1.0, 1.0])
    assert factors[4] == pytest.approx(0.5 * (1 + math.cos(math.pi * 0.5)))


def test_layout_checks_name_the_problem() -> None:
    cfg = tiny_config()
    cfg.env.num_envs = 3
    with pytest.raises(SetupError, match="env.num_envs=3 is not divisible by the 2 processes"):
        _check_layout(cfg, world=2)
    _check_layout(cfg, world=1)
    with pytest.raises(ValueError, match="minibatch_size"):
        TrainingRunConfig(env=EnvConfig(num_envs=3), ppo=PPOConfig(frames_per_env=5))


TRAINING_PRESETS = sorted(
    path.stem
    for path in (Path(__file__).resolve().parent.parent / "configs").glob("*.yaml")
    if "training_run_schema" in path.read_text()
)


def test_every_training_preset_is_checked() -> None:
    assert {"smollm2_lora_cpu", "glam_paper", "tiny", "aflan", "npae", "symbolic_ppo"} <= set(
        TRAINING_PRESETS
    )


@pytest.mark.parametrize("preset", TRAINING_PRESETS)
def test_training_presets_are_valid_and_their_layout_holds(preset: str) -> None:
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf

    from glam.config import register_configs

    register_configs()
    configs = Path(__file__).resolve().parent.parent / "configs"
    with initialize_config_dir(config_dir=str(configs), version_base="1.3"):
        cfg = OmegaConf.to_object(compose(preset))
    assert isinstance(cfg, TrainingRunConfig)
    _check_layout(cfg, world=1)


def test_a_baseline_kind_needs_its_policy_factory(tmp_path: Path, accelerator: Accelerator) -> None:
    cfg = tiny_config()
    cfg.policy.kind = "symbolic"
    with pytest.raises(SetupError, match="policy.kind='symbolic' is a baseline: train it with "):
        train(cfg, accelerator, tmp_path / "run")


def test_missing_model_and_bad_values_are_clear_errors() -> None:
    cfg = tiny_config()
    cfg.model.name_or_path = "/no/such/model"
    with pytest.raises(SetupError, match="model.name_or_path='/no/such/model': could not resolve"):
        build_policy(cfg, None)
    with pytest.raises(ValueError, match=r"ppo.gamma must be in \[0, 1\]"):
        PPOConfig(gamma=1.5)
    with pytest.raises(ValueError, match="env.num_envs must be > 0"):
        EnvConfig(num_envs=0)
    with pytest.raises(ValueError, match="ppo.entropy_coef must be >= 0, got -0.01"):
        PPOConfig(entropy_coef=-0.01)


class _Saveable(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(2, 2)

    def save_pretrained(self, path: Path) -> None:
        path.mkdir(parents=True)
        (path / "weights.json").write_text(json.dumps(self.linear.weight.tolist()))


def test_checkpoint_files_are_pickle_free_and_restore_rng(
    tmp_path: Path, accelerator: Accelerator
) -> None:
    model = _Saveable()
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.1)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda u: 0.5**u)
    model.linear.weight.sum().backward()
    optimizer.step()
    scheduler.step()
    (tmp_path / "checkpoints" / ".tmp-update_000003").mkdir(parents=True)  # a killed save
    random.seed(1), np.random.seed(1), torch.manual_seed(1)

    def save(update: int) -> Path:
        return save_checkpoint(
            accelerator,
            tmp_path,
            model=model,
            optimizer=optimizer,
            scheduler=scheduler,
            env_state={"seed": 7, "num_envs": 1, "episodes_started": [4]},
            state=TrainerState(update=update, frames=10 * update),
            config_yaml="a: 1\n",
            keep=2,
        )

    for update in (1, 2, 3):
        path = save(update)
    assert path.name == "update_000003" and latest_checkpoint(tmp_path) == path
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == [
        "latest",
        "update_000002",
        "update_000003",
    ]
    assert policy_dir(tmp_path) == path / "policy"
    expected = (random.random(), np.random.rand(), torch.rand(1).item())

    fresh_optimizer = torch.optim.AdamW(_Saveable().parameters(), lr=0.1)
    fresh_scheduler = torch.optim.lr_scheduler.LambdaLR(fresh_optimizer, lambda u: 0.5**u)
    state, env_state = load_training_state(
        accelerator, path, model=model, optimizer=fresh_optimizer, scheduler=fresh_scheduler
    )
    assert (state.update, state.frames) == (3, 30)
    assert env_state["episodes_started"] == [4]
    assert fresh_scheduler.get_last_lr() == pytest.approx([0.05])
    assert torch.equal(
        fresh_optimizer.state_dict()["state"][0]["exp_avg"],
        optimizer.state_dict()["state"][0]["exp_avg"],
    )
    assert (random.random(), np.random.rand(), torch.rand(1).item()) == expected
    # A folder of the same update is from an abandoned branch: moved aside, never kept as ours.
    before = _digest(path)
    save(3)
    (aside,) = (tmp_path / "checkpoints").glob("abandoned-*/update_000003")
    assert _digest(aside) == before and (path / "manifest.json").is_file()


def test_latest_pointer_to_a_missing_checkpoint_is_an_error(tmp_path: Path) -> None:
    (tmp_path / "checkpoints").mkdir()
    assert latest_checkpoint(tmp_path) is None
    (tmp_path / "checkpoints" / "latest").write_text("update_000009\n")
    with pytest.raises(FileNotFoundError, match="update_000009"):
        latest_checkpoint(tmp_path)


def _rollout_batch(
    cfg: TrainingRunConfig, accelerator: Accelerator, *, lr: float = 0.0, sample_seed: int = 0
):
    """A tiny policy (drawn with seed 0, SGD at `lr`) and one rollout of `cfg` with its GAE."""
    torch.manual_seed(0)
    policy = LLMActorCritic.from_config(cfg.model, cfg.policy, NAV)
    optimizer = torch.optim.SGD(policy.trainable_parameters(), lr=lr)
    model, optimizer = accelerator.prepare(policy, optimizer)
    runner = EnvRunner(cfg.env, cfg.policy, num_envs=cfg.env.num_envs, seed=0)
    runner.reset()
    buffer = RolloutBuffer(cfg.ppo.frames_per_env, cfg.env.num_envs)
    torch.manual_seed(sample_seed)
    stop = StopSignal()
    try:
        rollout = collect_rollout(model, runner, buffer, cfg, accelerator, stop)
    finally:
        stop.restore()
    advantages, returns = compute_gae(
        buffer.rewards,
        buffer.values,
        buffer.dones,
        rollout.last_values,
        gamma=0.99,
        gae_lambda=0.95,
    )
    return model, optimizer, buffer, advantages, returns


def test_bf16_rollout_first_ratio_is_exactly_one_with_recomputed_logprobs(
    accelerator: Accelerator,
) -> None:
    cfg = tiny_config(autocast_bf16=True)
    cfg.ppo = PPOConfig(frames_per_env=4, minibatch_size=8, epochs=1)
    model, optimizer, buffer, advantages, returns = _rollout_batch(cfg, accelerator)
    stored = buffer.logprobs.clone()
    exact = ppo_update(
        model, optimizer, buffer.transitions(advantages, returns), cfg.ppo, accelerator, True
    )
    assert exact["debug/first_ratio_deviation"] == 0.0
    # The recomputed log-probs replaced the rollout's; they agree to bf16 precision.
    assert torch.allclose(buffer.logprobs, stored, atol=5e-2)
    assert math.isfinite(exact["losses/value"]) and exact["charts/epochs"] == 1.0


def test_bf16_rollout_first_ratio_drifts_without_the_recompute(accelerator: Accelerator) -> None:
    # The negative control of the test above: the same bf16 rollout, log-probs kept as rolled
    # out. The update's micro-batches pad differently from the rollout's batches, so the first
    # ratio moves away from 1 before any step.
    cfg = tiny_config(autocast_bf16=True)
    cfg.ppo = PPOConfig(frames_per_env=4, minibatch_size=8, micro_batch_size=2, epochs=1)
    model, optimizer, buffer, advantages, returns = _rollout_batch(cfg, accelerator)
    kept = ppo_update(
        model, optimizer, buffer.transitions(advantages, returns), cfg.ppo, accelerator, False
    )
    assert kept["debug/first_ratio_deviation"] > 1e-4


def _trainable_after_one_update(cfg: TrainingRunConfig, micro: int | None) -> list[torch.Tensor]:
    accelerator = Accelerator(cpu=True)  # default: no accumulation; ppo_update sets its own
    # SGD: the weights move by exactly lr * the accumulated gradient, nothing magnifies noise.
    model, optimizer, buffer, advantages, returns = _rollout_batch(
        cfg, accelerator, lr=0.1, sample_seed=1
    )
    ppo = PPOConfig(
        frames_per_env=cfg.ppo.frames_per_env, minibatch_size=64, micro_batch_size=micro, epochs=2
    )
    torch.manual_seed(2)  # the same minibatch order in both calls
    ppo_update(model, optimizer, buffer.transitions(advantages, returns), ppo, accelerator, False)
    return [p.detach().clone() for p in model.parameters() if p.requires_grad]


def test_micro_batches_accumulate_into_one_step_per_minibatch() -> None:
    # 64 transitions, one minibatch: 4 chunks of 16 must give the update of one chunk of 64
    # (the accumulated mean gradient, one optimizer step), whatever the caller's Accelerator.
    cfg = tiny_config()
    cfg.env.num_envs, cfg.ppo = 8, PPOConfig(frames_per_env=8, minibatch_size=64)
    whole = _trainable_after_one_update(cfg, None)
    chunked = _trainable_after_one_update(cfg, 16)
    torch.manual_seed(0)
    start = [p for p in LLMActorCritic.from_config(cfg.model, cfg.policy, NAV).parameters()]
    moved = max((a - s).abs().max().item() for a, s in zip(whole, start, strict=True))
    assert moved > 1e-3  # far above the tolerance: four steps instead of two would show
    for a, b in zip(whole, chunked, strict=True):
        # Only the fp32 summation order of the gradient differs (~1e-7 relative).
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


def test_time_outs_are_bootstrapped_from_their_final_observation(accelerator: Accelerator) -> None:
    from babyai_text import TextVectorEnv

    cfg = tiny_config()
    torch.manual_seed(0)
    policy = LLMActorCritic.from_config(cfg.model, cfg.policy, NAV)
    results = {}
    for bootstrap in (False, True):
        cfg.ppo = PPOConfig(frames_per_env=8, minibatch_size=16, bootstrap_truncated=bootstrap)
        runner = EnvRunner(cfg.env, cfg.policy, num_envs=4, seed=3)
        runner.envs = TextVectorEnv(
            cfg.env.name, 4, seed=3, action_space=resolve_action_space("nav"), max_steps=3
        )
        runner.reset()
        buffer = RolloutBuffer(8, 4)
        torch.manual_seed(1)
        stop = StopSignal()
        try:
            collect_rollout(policy, runner, buffer, cfg, accelerator, stop)
        finally:
            stop.restore()
        results[bootstrap] = buffer
    off, on = results[False], results[True]
    truncated = on.final_values != 0
    assert truncated.any() and not off.final_values.any()
    assert (off.dones[truncated]).all()  # only at episode ends
    # The extra rows ride along without changing what the policy did (the batch's padding
    # changes, so log-probs agree to fp32 rounding).
    assert torch.equal(off.actions, on.actions)
    torch.testing.assert_close(off.logprobs, on.logprobs, rtol=0, atol=1e-5)
    # Each bootstrap value is the value of the episode's last prompt (history + final view).
    step, env = map(int, truncated.nonzero()[0])
    assert on.observations[step].prompts[env].count("Observation") <= cfg.env.nbr_obs
    final_runner = EnvRunner(cfg.env, cfg.policy, num_envs=4, seed=3)
    final_runner.envs = TextVectorEnv(
        cfg.env.name, 4, seed=3, action_space=resolve_action_space("nav"), max_steps=3
    )
    final_runner.reset()
    for t in range(step + 1):
        final_runner.step(on.actions[t].tolist())
    prompt = final_runner.final_prompts[env]
    assert prompt is not None and prompt.startswith(
        on.observations[step].prompts[env].split("Observation")[0]
    )
    with torch.no_grad():
        value = policy([prompt], [NAV]).values.float()
    torch.testing.assert_close(on.final_values[step, env], value[0], rtol=1e-5, atol=1e-5)


def _saved_rollouts(run_dir: Path, total_frames: int, stop_at_call: int | None, monkeypatch):
    """Train the tiny config in-process with `train.save_rollouts`, answering "stop" to the
    `stop_at_call`-th check of the stop signal; return the saved decisions of update 1."""
    from glam.ppo.trainer import train

    cfg = tiny_config()
    cfg.train = TrainConfig(total_frames=total_frames, save_every=1, save_rollouts=True, seed=3)
    calls = {"n": 0}

    def requested(self, accelerator):
        calls["n"] += 1
        return calls["n"] == stop_at_call

    monkeypatch.setattr(StopSignal, "requested", requested)
    run_dir.mkdir()
    result = train(cfg, Accelerator(cpu=True), run_dir)
    assert result.state.update == 1
    folder = run_dir / "rollouts" / "rank_0" / "update_000001"
    return {p.name: p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def test_a_stop_mid_rollout_keeps_the_saved_decisions_of_the_last_update(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Update 1 (8 steps, a stop check after each, one after the update), then a stop signal at
    # the last step of update 2's rollout: that partial rollout is dropped, and with it the
    # decisions of the episodes it finished; update 1's saved decisions stay as they were.
    reference = _saved_rollouts(tmp_path / "reference", 32, None, monkeypatch)
    stopped = _saved_rollouts(tmp_path / "stopped", 10**6, 8 + 1 + 8, monkeypatch)
    assert reference and stopped == reference


# --------------------------------------------------------------------------------------------
# Checkpoints: completeness, failed saves, resumes
# --------------------------------------------------------------------------------------------


def _digest(folder: Path) -> dict[str, str]:
    return {
        str(path.relative_to(folder)): hashlib.sha256(path.read_bytes()).hexdigest()
        for path in sorted(folder.rglob("*"))
        if path.is_file()
    }


def _save_updates(run_dir: Path, accelerator: Accelerator, updates: tuple[int, ...]) -> Path:
    """Checkpoints of a small model for `updates`; returns the `checkpoints/` folder."""
    model = _Saveable()
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.1)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda u: 1.0)
    for update in updates:
        save_checkpoint(
            accelerator,
            run_dir,
            model=model,
            optimizer=optimizer,
            scheduler=scheduler,
            env_state={"seed": 7, "num_envs": 1, "episodes_started": [update]},
            state=TrainerState(update=update, frames=10 * update),
            config_yaml="a: 1\n",
        )
    return run_dir / "checkpoints"


def _truncate(path: Path) -> None:
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


def _drop_manifest(checkpoint: Path) -> None:
    (checkpoint / "manifest.json").unlink()


def _same_size(path: Path, content: bytes) -> None:
    """Replace `path`'s content keeping its size (padded with spaces): the manifest agrees."""
    size = path.stat().st_size
    assert len(content) <= size
    path.write_bytes(content + b" " * (size - len(content)))


def _claim_two_processes(checkpoint: Path) -> None:
    state = checkpoint / "trainer_state.json"  # the same size: the manifest still agrees
    state.write_text(json.dumps({**json.loads(state.read_text()), "world_size": 2}, indent=1))


def _edit_state(checkpoint: Path, **values: object) -> None:
    state = checkpoint / "trainer_state.json"
    _same_size(state, json.dumps({**json.loads(state.read_text()), **values}).encode())


# (damage done to checkpoints/, expected problem, the checkpoint then proposed)
DAMAGES = {
    "optimizer missing": (
        lambda c: (c / "update_000002" / "optimizer.pt").unlink(),
        "update_000002: optimizer.pt is missing",
        "update_000001",
    ),
    "state truncated": (
        lambda c: _truncate(c / "update_000002" / "trainer_state.json"),
        "update_000002: trainer_state.json is truncated (",
        "update_000001",
    ),
    "state garbage": (
        lambda c: _same_size(c / "update_000002" / "trainer_state.json", b"{garbage"),
        "update_000002: trainer_state.json is not valid JSON",
        "update_000001",
    ),
    # A counter's value is checked, not only its key: negative frames once resumed with exit 0,
    # trained the wrong number of updates and reported wrong frame counts.
    "negative frames": (
        lambda c: _edit_state(c / "update_000002", frames=-20),
        "update_000002: trainer_state.json: frames is -20, it must be an integer >= 0",
        "update_000001",
    ),
    "frames as text": (
        lambda c: _edit_state(c / "update_000002", frames="20"),
        "trainer_state.json: frames is '20', it must be an integer >= 0",
        "update_000001",
    ),
    "update not the folder's": (
        lambda c: _edit_state(c / "update_000002", update=3),
        "trainer_state.json: update is 3, but the folder is update_000002",
        "update_000001",
    ),
    "manifest missing": (
        lambda c: _drop_manifest(c / "update_000002"),
        "update_000002: manifest.json is missing",
        "update_000001",
    ),
    "rng truncated": (
        lambda c: _truncate(c / "update_000002" / "rank_0" / "rng.pt"),
        "update_000002: rank_0/rng.pt is truncated (",
        "update_000001",
    ),
    "rng garbage": (
        lambda c: _same_size(c / "update_000002" / "rank_0" / "rng.pt", b"garbage"),
        "update_000002: rank_0/rng.pt is unreadable (",
        "update_000001",
    ),
    "envs missing": (
        lambda c: (c / "update_000002" / "rank_0" / "envs.json").unlink(),
        "update_000002: rank_0/envs.json is missing",
        "update_000001",
    ),
    "policy file missing": (
        lambda c: (c / "update_000002" / "policy" / "weights.json").unlink(),
        "update_000002: policy/weights.json is missing",
        "update_000001",
    ),
    "a rank missing": (
        lambda c: _claim_two_processes(c / "update_000002"),
        "update_000002: rank_1/rng.pt is missing",
        "update_000001",
    ),
    "latest empty": (
        lambda c: (c / "latest").write_text(""),
        "checkpoints/latest is empty",
        "update_000002",
    ),
    "latest garbage": (
        lambda c: (c / "latest").write_bytes(b"\xff\xfe\x00garbage"),
        "checkpoints/latest is unreadable (",
        "update_000002",
    ),
    "latest not a name": (
        lambda c: (c / "latest").write_text("hello\n"),
        "checkpoints/latest holds 'hello', not a checkpoint name",
        "update_000002",
    ),
    "latest dangling": (
        lambda c: (c / "latest").write_text("update_000009\n"),
        "checkpoints/latest names update_000009, which is missing",
        "update_000002",
    ),
    "latest missing": (
        lambda c: (c / "latest").unlink(),
        "checkpoints/latest is missing",
        "update_000002",
    ),
}


@pytest.mark.parametrize("damage", DAMAGES)
def test_an_unusable_checkpoint_is_refused_naming_the_file_and_an_older_one(
    tmp_path: Path, accelerator: Accelerator, damage: str
) -> None:
    checkpoints = _save_updates(tmp_path, accelerator, (1, 2))
    assert resume_checkpoint(tmp_path) == checkpoints / "update_000002"
    harm, problem, fallback = DAMAGES[damage]
    harm(checkpoints)
    with pytest.raises(UnusableCheckpoint) as error:
        resume_checkpoint(tmp_path)
    message = str(error.value)
    assert problem in message
    assert f"the newest complete checkpoint is {fallback}" in message
    assert f"train.resume_from={fallback}" in message
    # The proposed way out works.
    assert resume_checkpoint(tmp_path, fallback) == checkpoints / fallback


class _NotATensor:
    """What a replaced optimizer.pt may hold: an object torch would need to unpickle."""


def test_an_optimizer_file_that_does_not_load_is_named_with_an_older_checkpoint(
    tmp_path: Path, accelerator: Accelerator
) -> None:
    """torch's message named no file, offered no older checkpoint and proposed
    `weights_only=False`, that is, running what the file holds."""
    checkpoints = _save_updates(tmp_path, accelerator, (1, 2))
    torch.save({"state": _NotATensor()}, checkpoints / "update_000002" / "optimizer.pt")
    model = _Saveable()
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.1)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda u: 1.0)
    with pytest.raises(UnusableCheckpoint) as refused:
        load_training_state(
            accelerator,
            checkpoints / "update_000002",
            model=model,
            optimizer=optimizer,
            scheduler=scheduler,
        )
    message = str(refused.value)
    assert message.startswith(
        "optimizer.pt does not load (it holds objects other than tensors and numbers, which are "
        "never unpickled); the newest complete checkpoint is update_000001: continue from it "
        "with train.resume_from=update_000001"
    )
    assert "weights_only" not in message and "\n" not in message


def test_resume_checks_need_the_files_of_the_run_layout(
    tmp_path: Path, accelerator: Accelerator
) -> None:
    assert resume_checkpoint(tmp_path) is None  # no checkpoint: a fresh start
    checkpoints = _save_updates(tmp_path, accelerator, (1,))
    with pytest.raises(UnusableCheckpoint, match="deepspeed/state/ is missing: the checkpoint was"):
        resume_checkpoint(tmp_path, deepspeed=True)
    with pytest.raises(UnusableCheckpoint, match="'update_000007' is not a checkpoint of this run"):
        resume_checkpoint(tmp_path, "update_000007")
    with pytest.raises(UnusableCheckpoint, match="is not a checkpoint of this run"):
        resume_checkpoint(tmp_path, str(tmp_path))
    (checkpoints / "update_000001" / "scheduler.json").unlink()
    with pytest.raises(UnusableCheckpoint, match="scheduler.json is missing; no older checkpoint"):
        resume_checkpoint(tmp_path)


class _DiskUsage:
    free = 0


def test_a_full_disk_while_writing_metrics_stops_the_run_with_a_message(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A full disk while writing metrics.csv was a raw traceback."""
    logger = MetricsLogger(tmp_path, enabled=True)
    real_open = Path.open

    def full_disk(path: Path, *args: object, **kwargs: object):
        if path.name == "metrics.csv":
            raise OSError(errno.ENOSPC, "No space left on device", str(path))
        return real_open(path, *args, **kwargs)

    monkeypatch.setattr(Path, "open", full_disk)
    with pytest.raises(RuntimeError) as stopped:
        logger.log(3, 96, 1.0, {"charts/success_rate": 0.5})
    logger.close()
    message = f"could not write {tmp_path / 'metrics.csv'}: no space left on device (update 3)"
    assert str(stopped.value) == message

    def trainer(*args: object) -> None:
        raise stopped.value

    assert _train_and_report(tiny_config(), trainer, None, tmp_path, None) == 2
    assert capsys.readouterr().err == f"error: {message}; no checkpoint had been written\n"


def test_a_server_a_coupling_cannot_reach_stops_the_run_with_status_4(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """teach/ask with an unreachable endpoint was a raw traceback."""

    def trainer(*args: object) -> None:
        raise ChatClientError("POST /completions at http://127.0.0.1:9/v1 failed 1 time(s)")

    assert _train_and_report(tiny_config(), trainer, None, tmp_path, None) == 4
    assert capsys.readouterr().err == (
        "error: stopping: POST /completions at http://127.0.0.1:9/v1 failed 1 time(s); "
        "no checkpoint had been written\n"
    )


@pytest.mark.parametrize(
    "failure,reason",
    [
        ("torch.save ENOSPC", "no space left on device"),
        ("torch C++ writer, full disk", "no space left on device"),
        ("policy write EDQUOT", "disk quota exceeded"),
    ],
)
def test_a_failed_save_leaves_no_temporary_and_says_why(
    tmp_path: Path,
    accelerator: Accelerator,
    monkeypatch: pytest.MonkeyPatch,
    failure: str,
    reason: str,
) -> None:
    checkpoints = _save_updates(tmp_path, accelerator, (1,))
    before = _digest(checkpoints)

    def fail(*args: object, **kwargs: object) -> None:
        if failure == "torch.save ENOSPC":
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        if failure == "policy write EDQUOT":
            raise OSError(errno.EDQUOT, os.strerror(errno.EDQUOT))
        raise RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 576 vs 534")

    if failure == "policy write EDQUOT":
        monkeypatch.setattr(_Saveable, "save_pretrained", fail)
    else:
        monkeypatch.setattr(torch, "save", fail)
    if failure == "torch C++ writer, full disk":
        monkeypatch.setattr(shutil, "disk_usage", lambda path: _DiskUsage())
    with pytest.raises(CheckpointWriteError) as error:
        _save_updates(tmp_path, accelerator, (2,))
    assert str(error.value) == (
        f"could not write checkpoint {checkpoints / 'update_000002'}: {reason}"
    )
    assert _digest(checkpoints) == before  # no .tmp-update_000002, `latest` unchanged


def test_temporaries_of_interrupted_saves_are_removed(tmp_path: Path, accelerator) -> None:
    checkpoints = _save_updates(tmp_path, accelerator, (1,))
    (checkpoints / ".tmp-update_000002" / "policy").mkdir(parents=True)
    (checkpoints / ".tmp-update_000002" / "optimizer.pt").write_bytes(b"x" * 1000)
    (checkpoints / ".latest.tmp").write_text("update_000002")
    kept = _digest(checkpoints / "update_000001")
    assert remove_temporaries(tmp_path) == [".latest.tmp", ".tmp-update_000002"]
    assert sorted(p.name for p in checkpoints.iterdir()) == ["latest", "update_000001"]
    assert _digest(checkpoints / "update_000001") == kept


def _train(
    run_dir: Path,
    accelerator: Accelerator,
    *,
    frames_per_env: int = 8,
    total_frames: int = 96,
    lr: float = 1e-3,
    resume: bool = False,
    resume_from: str = "",
):
    """A tiny run in this process (4 envs: 32 frames per update at 8 frames per env)."""
    cfg = tiny_config()
    cfg.ppo = PPOConfig(frames_per_env=frames_per_env, minibatch_size=16, epochs=1, lr=lr)
    cfg.train = TrainConfig(
        total_frames=total_frames,
        save_every=1,
        keep_checkpoints=0,
        resume=resume,
        resume_from=resume_from,
        progress_bar=False,
    )
    return train(cfg, accelerator, run_dir)


def test_a_total_below_one_update_is_said_to_be_rounded_up(
    tmp_path: Path, accelerator: Accelerator, capsys: pytest.CaptureFixture[str]
) -> None:
    """`train.total_frames` below one update was rounded up 4x without a word."""
    cfg = tiny_config()
    cfg.train = TrainConfig(total_frames=8, progress_bar=False)
    config_yaml, logger, progress = open_logs(
        cfg, accelerator, tmp_path, None, TrainerState(), 1, 32
    )
    logger.close()
    progress.close()
    assert (
        "[glam] train.total_frames=8 is not reached in whole updates of 32 frames: the run stops "
        "after update 1, at 32 frames"
    ) in capsys.readouterr().out
    assert (tmp_path / "config.yaml").read_text() == config_yaml
    assert OmegaConf.create(config_yaml).train.total_frames == 8


def _metric_rows(run_dir: Path) -> list[dict[str, str]]:
    with (run_dir / "metrics.csv").open() as handle:
        return list(csv.DictReader(handle))


def test_a_resume_with_other_frames_per_env_stops_at_total_frames(
    tmp_path: Path, accelerator: Accelerator
) -> None:
    first = _train(tmp_path, accelerator, frames_per_env=8, total_frames=96)
    assert (first.state.update, first.state.frames) == (3, 96)
    # 64 frames per update now: 96 + 64 = 160 < 192 <= 224, so two more updates, the last full.
    second = _train(tmp_path, accelerator, frames_per_env=16, total_frames=192, resume=True)
    assert (second.state.update, second.state.frames) == (5, 224)
    rows = _metric_rows(tmp_path)
    assert [int(row["frames"]) for row in rows] == [32, 64, 96, 160, 224]
    assert second.checkpoint == tmp_path / "checkpoints" / "update_000005"
    # Fewer frames per update: more updates, still stopping at the total.
    third = _train(tmp_path, accelerator, frames_per_env=4, total_frames=256, resume=True)
    assert (third.state.update, third.state.frames) == (7, 256)


def _scalars(run_dir: Path, tag: str) -> list[tuple[int, float]]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(run_dir / "tensorboard"))
    events.Reload()
    return [(event.step, event.value) for event in events.Scalars(tag)]


def test_resuming_an_older_checkpoint_sets_the_later_branch_aside(
    tmp_path: Path, accelerator: Accelerator, capsys: pytest.CaptureFixture[str]
) -> None:
    _train(tmp_path, accelerator, total_frames=128)
    checkpoints = tmp_path / "checkpoints"
    later = {name: _digest(checkpoints / name) for name in ("update_000003", "update_000004")}
    (checkpoints / "latest").write_text("update_000002\n")  # roll back, then another lr
    capsys.readouterr()
    result = _train(tmp_path, accelerator, total_frames=96, lr=5e-4, resume=True)
    assert result.state.update == 3
    # A changed setting was once taken in silence, and config.yaml kept the old value.
    out = capsys.readouterr().out
    assert (
        "[glam] resuming update_000002 with settings changed since it was written (config.yaml "
        "records the new ones):\n  "
    ) in out
    assert "\n  ppo.lr: 0.001 -> 0.0005\n" in out and "\n  train.total_frames: 128 -> 96" in out
    assert OmegaConf.load(tmp_path / "config.yaml").ppo.lr == 5e-4
    (aside,) = checkpoints.glob("abandoned-*")
    assert {name: _digest(aside / name) for name in later} == later  # byte for byte
    assert sorted(p.name for p in checkpoints.iterdir() if p.name.startswith("update_")) == [
        "update_000001",
        "update_000002",
        "update_000003",
    ]
    assert "lr: 0.0005" in (checkpoints / "update_000003" / "config.yaml").read_text()
    assert latest_checkpoint(tmp_path) == checkpoints / "update_000003"
    # The logs read as the new branch; the abandoned one keeps its rows.
    rows = _metric_rows(tmp_path)
    assert [(r["update"], float(r["charts/learning_rate"])) for r in rows] == [
        ("1", 1e-3),
        ("2", 1e-3),
        ("3", 5e-4),
    ]
    assert [r["update"] for r in _metric_rows(aside)] == ["1", "2", "3", "4"]
    assert _scalars(tmp_path, "charts/learning_rate") == [
        (32, pytest.approx(1e-3)),
        (64, pytest.approx(1e-3)),
        (96, pytest.approx(5e-4)),
    ]
    # train.resume_from does the same without editing `latest`.
    _train(tmp_path, accelerator, total_frames=96, resume_from="update_000001")
    assert len(list(checkpoints.glob("abandoned-*"))) == 2
    assert latest_checkpoint(tmp_path) == checkpoints / "update_000003"
    assert [r["update"] for r in _metric_rows(tmp_path)] == ["1", "2", "3"]


def test_an_unusable_checkpoint_stops_the_resume_before_any_model_is_built(
    tmp_path: Path, accelerator: Accelerator, monkeypatch: pytest.MonkeyPatch
) -> None:
    checkpoints = _save_updates(tmp_path, accelerator, (1, 2))
    (checkpoints / "update_000002" / "optimizer.pt").unlink()

    def no_model(*args: object) -> None:
        raise AssertionError("a model was prepared before the checks")

    monkeypatch.setattr("glam.ppo.setup.prepare_model_cache", no_model)
    cfg = tiny_config()
    cfg.train.resume = True
    with pytest.raises(SetupError, match="cannot resume: .*update_000002: optimizer.pt is missing"):
        build_training(cfg, accelerator, tmp_path)


@pytest.mark.parametrize("layout", ["a file", "under a file", "not writable"])
def test_an_unusable_output_dir_stops_before_any_model_is_built(
    tmp_path: Path, accelerator: Accelerator, monkeypatch: pytest.MonkeyPatch, layout: str
) -> None:
    (tmp_path / "file").write_text("not a folder")
    run_dir, message = {
        "a file": (tmp_path / "file", "is a file, not a folder"),
        "under a file": (tmp_path / "file" / "run", f"cannot be created: {tmp_path / 'file'} is a"),
        "not writable": (Path("/sys/kernel"), "is not writable ("),
    }[layout]
    if layout == "not writable" and (not run_dir.is_dir() or os.access(run_dir, os.W_OK)):
        try:  # root may write where access() says no: try for real
            (run_dir / ".glam-probe").write_text("")
            (run_dir / ".glam-probe").unlink()
            pytest.skip(f"{run_dir} is writable here")
        except OSError:
            pass

    def no_model(*args: object) -> None:
        raise AssertionError("a model was prepared before the output folder was checked")

    monkeypatch.setattr("glam.ppo.setup.prepare_model_cache", no_model)
    with pytest.raises(SetupError, match=re.escape(f"train.output_dir={str(run_dir)!r} {message}")):
        build_training(tiny_config(), accelerator, run_dir)


def test_sigint_stops_like_sigterm_and_a_second_one_aborts() -> None:
    stop = StopSignal()
    try:
        os.kill(os.getpid(), signal.SIGINT)
        assert stop.received == "SIGINT"
        os.kill(os.getpid(), signal.SIGTERM)
        os.kill(os.getpid(), signal.SIGINT)  # `accelerate launch` forwarding the same Ctrl-C
        assert stop.received == "SIGINT"  # the first signal is the one reported
        time.sleep(StopSignal.REPEAT_SECONDS)
        with pytest.raises(KeyboardInterrupt):
            os.kill(os.getpid(), signal.SIGINT)
    finally:
        stop.restore()


class _FakeDeepSpeedEngine(nn.Module):
    """The calls DeepSpeed's `save_checkpoint` makes around its final barrier."""

    def __init__(self) -> None:
        super().__init__()
        self.checkpoint_engine = _FakeCheckpointEngine()
        self.reached_barrier = False

    def save_checkpoint(self, save_dir: str, tag: str, **kwargs: object) -> bool:
        self.checkpoint_engine.makedirs(f"{save_dir}/{tag}", exist_ok=True)
        self.checkpoint_engine.save({"step": torch.zeros(1)}, f"{save_dir}/{tag}/shard.pt")
        self._copy_recovery_script(save_dir)
        self.reached_barrier = True  # where every process waits for the others
        return True

    def _copy_recovery_script(self, save_path: str) -> None:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


class _FakeCheckpointEngine:
    def makedirs(self, path: str, exist_ok: bool = False) -> None:
        os.makedirs(path, exist_ok=exist_ok)

    def save(self, state_dict: dict, path: str) -> None:
        torch.save(state_dict, path)


def test_a_failed_deepspeed_write_still_reaches_deepspeeds_barrier(tmp_path: Path) -> None:
    from glam.runs.checkpoint import _save_deepspeed_state

    engine = _FakeDeepSpeedEngine()
    assert _save_deepspeed_state(engine, tmp_path) == "no space left on device"
    assert engine.reached_barrier  # no process leaves the others waiting at it
    assert isinstance(engine.checkpoint_engine, _FakeCheckpointEngine)  # put back
    with pytest.raises(OSError):
        engine._copy_recovery_script(str(tmp_path))  # the class's method again


class _CountingHook(TrainerHook):
    """Records the calls it gets and reports the update number as a metric."""

    def __init__(self) -> None:
        self.started = self.observed = self.stepped = self.closed = 0
        self.updates: list[int] = []
        self.extras_seen: list[torch.Tensor] = []

    def start(self, training: Training) -> None:
        self.started += 1
        self.num_envs = training.runner.num_envs

    def observe(self, observations: object) -> dict[str, torch.Tensor]:
        self.observed += 1
        # A tensor per env that says which step and env it belongs to.
        return {"hook/tag": torch.arange(self.num_envs) + 100 * self.observed}

    def after_step(self, actions: torch.Tensor, rewards: object, dones: object) -> None:
        assert len(actions) == self.num_envs
        self.stepped += 1

    def loss(self, output: object, batch: object) -> None:
        self.extras_seen.append(batch.extras["hook/tag"])
        return None  # adds nothing

    def close(self) -> None:
        self.closed += 1

    def after_update(
        self, training: Training, model: nn.Module, metrics: dict[str, float]
    ) -> dict[str, float]:
        assert "losses/policy" in metrics  # called after the update, before logging
        self.updates.append(training.state.update)
        return {"hook/update_seen": float(training.state.update)}


def test_hooks_are_called_at_their_points_and_their_metrics_are_logged(
    tmp_path: Path, accelerator: Accelerator
) -> None:
    plain, hooked = tmp_path / "plain", tmp_path / "hooked"
    for run_dir, hooks in ((plain, ()), (hooked, (hook := _CountingHook(),))):
        cfg = tiny_config()
        cfg.train.output_dir = str(run_dir)
        train(cfg, accelerator, run_dir, hooks=hooks)
    assert hook.started == 1 and hook.updates == [1, 2] and hook.closed == 1
    # 2 updates of 8 steps: observed and stepped at each, before the actions are sampled.
    assert hook.observed == hook.stepped == 16
    # Each transition of update u carries the tensor its step's `observe` returned for its env:
    # 100 * (step of the run, 1-based) + env, all 32 of each update seen once (1 epoch).
    tags = sorted(torch.cat(hook.extras_seen).tolist())
    expected = sorted(100 * step + env for step in range(1, 17) for env in range(4))
    assert tags == expected
    with (hooked / "metrics.csv").open() as file:
        rows = list(csv.DictReader(file))
    assert [float(row["hook/update_seen"]) for row in rows] == [1.0, 2.0]
    # A hook that only reads leaves the run as it was: the same losses, update for update.
    with (plain / "metrics.csv").open() as file:
        plain_rows = list(csv.DictReader(file))
    for a, b in zip(plain_rows, rows, strict=True):
        assert a["losses/policy"] == b["losses/policy"] and a["losses/value"] == b["losses/value"]
