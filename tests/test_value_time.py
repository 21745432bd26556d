"""`policy.value_time`: the value head reads the share of its time limit an episode has used,
which the prompt does not show, from the env runner through the rollout to a saved policy."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from accelerate import Accelerator
from helpers_tiny import one_torch_thread  # noqa: F401  (autouse fixture: one torch thread)
from test_ppo_trainer import tiny_config

from glam.baselines.loading import load_policy
from glam.config import PolicyConfig, PPOConfig, TrainConfig
from glam.envs import EnvRunner
from glam.policy.heads import ValueHead
from glam.policy.llm_policy import LLMActorCritic
from glam.policy.observations import TextObservations
from glam.ppo.trainer import train
from glam.runs.folder import policy_dir

NAV = ["turn left", "turn right", "go forward"]


def test_the_head_reads_the_time_as_one_more_input() -> None:
    torch.manual_seed(0)
    head = ValueHead(4, [8], "tanh", time=True)
    assert head.net[0].in_features == 5
    hidden = torch.randn(3, 4)
    early, late = head(hidden, torch.zeros(3)), head(hidden, torch.ones(3))
    assert not torch.allclose(early, late)
    # By hand: the MLP on the state with the time appended.
    expected = head.net(torch.cat([hidden, torch.full((3, 1), 0.25)], 1)).squeeze(-1)
    torch.testing.assert_close(head(hidden, torch.full((3,), 0.25)), expected)
    with pytest.raises(ValueError, match="reads the episode's elapsed time"):
        head(hidden)
    assert ValueHead(4, [8], "tanh").net[0].in_features == 4  # off: as before


def test_the_runner_says_how_much_of_the_time_limit_each_episode_used() -> None:
    cfg = tiny_config()
    cfg.policy = PolicyConfig(value_time=True)
    runner = EnvRunner(cfg.env, cfg.policy, num_envs=2, seed=5)
    runner.reset()
    limit = runner.envs.envs[0].unwrapped.max_steps
    assert runner.observations().elapsed == [0.0, 0.0]
    runner.step([0, 0])
    runner.step([1, 0])
    assert runner.observations().elapsed == [2 / limit, 2 / limit]
    cut = None
    for _ in range(limit):  # turning in place never succeeds: the time limit cuts the episode
        _, dones, _ = runner.step([0, 0])
        if dones[0]:
            cut = runner.final_observations()
            break
    assert cut is not None and cut[0] == [0, 1] and cut[1].elapsed == [1.0, 1.0]
    assert runner.observations().elapsed == [0.0, 0.0]  # the next episodes start
    observations = runner.observations()
    assert observations.inputs()["elapsed"] == [0.0, 0.0]
    assert observations.select([1]).elapsed == [0.0]
    both = TextObservations.cat([observations, cut[1]])
    assert both.elapsed == [0.0, 0.0, 1.0, 1.0]
    runner.close()
    plain = EnvRunner(cfg.env, PolicyConfig(), num_envs=1, seed=5)
    plain.reset()
    assert plain.observations().elapsed is None and "elapsed" not in plain.observations().inputs()
    plain.close()


def test_only_the_scoring_agent_takes_it() -> None:
    with pytest.raises(ValueError, match="policy.value_time=true applies to the scoring agent"):
        PolicyConfig(kind="generate", value_time=True)


@pytest.mark.slow
def test_a_run_with_a_timed_critic_trains_and_saves_it(tmp_path: Path) -> None:
    cfg = tiny_config()
    cfg.policy = PolicyConfig(value_hidden_sizes=[16], value_activation="tanh", value_time=True)
    cfg.ppo = PPOConfig(frames_per_env=8, minibatch_size=16, epochs=1, lr=1e-3)
    cfg.train = TrainConfig(total_frames=64, progress_bar=False)
    train(cfg, Accelerator(cpu=True), tmp_path)
    policy = load_policy(policy_dir(tmp_path))
    assert isinstance(policy, LLMActorCritic) and policy.policy_cfg.value_time
    assert policy.value_head.time
    prompts = ["Goal of the agent: go to the red ball\nAction 0:"] * 2
    with torch.no_grad():
        at = [policy(prompts, elapsed=[e, e]).values for e in (0.0, 0.5)]
        default = policy(prompts).values
    assert not torch.allclose(at[0], at[1])  # the trained head reads the time
    torch.testing.assert_close(default, at[0])  # none given: an episode's first step
