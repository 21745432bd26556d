"""The trainer's parts in-process: env runner, LR schedule, checkpoint files, bf16 ratio check."""

from __future__ import annotations

import json
import math
import random
from pathlib import Path

import numpy as np
import pytest
import torch
from accelerate import Accelerator
from torch import nn

from glam.config import (
    AdapterConfig,
    EnvConfig,
    ModelConfig,
    PolicyConfig,
    PPOConfig,
    TrainConfig,
    TrainingRunConfig,
)
from glam.ppo.buffer import RolloutBuffer
from glam.ppo.checkpoint import (
    TrainerState,
    latest_checkpoint,
    load_training_state,
    policy_dir,
    save_checkpoint,
)
from glam.ppo.gae import compute_gae
from glam.ppo.rollout import EnvRunner, env_seed, resolve_action_space
from glam.ppo.trainer import (
    SetupError,
    StopSignal,
    _check_layout,
    build_policy,
    collect_rollout,
    lr_factor,
    ppo_update,
)

NAV = ["turn left", "turn right", "go forward"]


def tiny_config(**model_overrides: object) -> TrainingRunConfig:
    return TrainingRunConfig(
        model=ModelConfig(
            name_or_path="tiny-random-llama",
            lora=AdapterConfig(enabled=False),
            **model_overrides,
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
    from glam.bc.demos import load_demos, write_demos

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
    from glam.eval.config import SEED_BASE
    from glam.ppo.rollout import MAX_PROCESSES, SEEDS_PER_RANK

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


@pytest.mark.parametrize("preset", ["smollm2_lora_cpu", "glam_paper", "tiny"])
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
    # Saving the same update again keeps what is there.
    before = (path / "trainer_state.json").stat().st_mtime_ns
    save(3)
    assert (path / "trainer_state.json").stat().st_mtime_ns == before


def test_latest_pointer_to_a_missing_checkpoint_is_an_error(tmp_path: Path) -> None:
    (tmp_path / "checkpoints").mkdir()
    assert latest_checkpoint(tmp_path) is None
    (tmp_path / "checkpoints" / "latest").write_text("update_000009\n")
    with pytest.raises(FileNotFoundError, match="update_000009"):
        latest_checkpoint(tmp_path)


def _rollout_batch(cfg: TrainingRunConfig, accelerator: Accelerator):
    from glam.policy.llm_policy import LLMActorCritic

    torch.manual_seed(0)
    policy = LLMActorCritic.from_config(cfg.model, cfg.policy, NAV)
    optimizer = torch.optim.SGD(policy.trainable_parameters(), lr=0.0)
    model, optimizer = accelerator.prepare(policy, optimizer)
    runner = EnvRunner(cfg.env, cfg.policy, num_envs=cfg.env.num_envs, seed=0)
    runner.reset()
    buffer = RolloutBuffer(cfg.ppo.frames_per_env, cfg.env.num_envs)
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
    from glam.policy.llm_policy import LLMActorCritic

    accelerator = Accelerator(cpu=True)  # default: no accumulation; ppo_update sets its own
    torch.manual_seed(0)
    policy = LLMActorCritic.from_config(cfg.model, cfg.policy, NAV)
    # SGD: the weights move by exactly lr * the accumulated gradient, nothing magnifies noise.
    optimizer = torch.optim.SGD(policy.trainable_parameters(), lr=0.1)
    model, optimizer = accelerator.prepare(policy, optimizer)
    runner = EnvRunner(cfg.env, cfg.policy, num_envs=cfg.env.num_envs, seed=0)
    runner.reset()
    buffer = RolloutBuffer(cfg.ppo.frames_per_env, cfg.env.num_envs)
    torch.manual_seed(1)
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
    ppo = PPOConfig(
        frames_per_env=cfg.ppo.frames_per_env, minibatch_size=64, micro_batch_size=micro, epochs=2
    )
    torch.manual_seed(2)  # the same minibatch order in both calls
    ppo_update(model, optimizer, buffer.transitions(advantages, returns), ppo, accelerator, False)
    return [p.detach().clone() for p in policy.parameters() if p.requires_grad]


def test_micro_batches_accumulate_into_one_step_per_minibatch() -> None:
    # 64 transitions, one minibatch: 4 chunks of 16 must give the update of one chunk of 64
    # (the accumulated mean gradient, one optimizer step), whatever the caller's Accelerator.
    cfg = tiny_config()
    cfg.env.num_envs, cfg.ppo = 8, PPOConfig(frames_per_env=8, minibatch_size=64)
    whole = _trainable_after_one_update(cfg, None)
    chunked = _trainable_after_one_update(cfg, 16)
    torch.manual_seed(0)
    from glam.policy.llm_policy import LLMActorCritic

    start = [p for p in LLMActorCritic.from_config(cfg.model, cfg.policy, NAV).parameters()]
    moved = max((a - s).abs().max().item() for a, s in zip(whole, start, strict=True))
    assert moved > 1e-3  # far above the tolerance: four steps instead of two would show
    for a, b in zip(whole, chunked, strict=True):
        # Only the fp32 summation order of the gradient differs (~1e-7 relative).
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


def test_time_outs_are_bootstrapped_from_their_final_observation(accelerator: Accelerator) -> None:
    from babyai_text import TextVectorEnv
    from glam.policy.llm_policy import LLMActorCritic

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
    assert on.prompts[step][env].count("Observation") <= cfg.env.nbr_obs
    final_runner = EnvRunner(cfg.env, cfg.policy, num_envs=4, seed=3)
    final_runner.envs = TextVectorEnv(
        cfg.env.name, 4, seed=3, action_space=resolve_action_space("nav"), max_steps=3
    )
    final_runner.reset()
    for t in range(step + 1):
        final_runner.step(on.actions[t].tolist())
    prompt = final_runner.final_prompts[env]
    assert prompt is not None and prompt.startswith(on.prompts[step][env].split("Observation")[0])
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
