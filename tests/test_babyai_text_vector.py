"""The vector of text envs: lockstep steps, same-step auto-reset, seed schedule, resuming."""

from __future__ import annotations

import json

import numpy as np
import pytest
from minigrid.utils.baby_ai_bot import BabyAIBot

import babyai_text
from babyai_text import TextVectorEnv

LEVEL = "BabyAI-MixedTrainLocal-v0"


def _fresh_episode(seed: int, **make_kwargs: object) -> tuple[str, list[str]]:
    """Mission and first descriptions of a lone env reset with ``seed``."""
    obs, info = babyai_text.make(LEVEL, **make_kwargs).reset(seed=seed)
    return obs["mission"], info["descriptions"]


def test_reset_uses_base_seed_plus_env_index() -> None:
    envs = TextVectorEnv(LEVEL, 3, seed=100)
    obs_list, infos = envs.reset()
    assert envs.num_envs == len(envs.envs) == len(obs_list) == len(infos) == 3
    assert envs.action_words == envs.envs[0].action_words
    for i in range(3):
        assert (obs_list[i]["mission"], infos[i]["descriptions"]) == _fresh_episode(100 + i)


def test_auto_reset_and_seed_schedule() -> None:
    num_envs, seed, horizon = 3, 40, 4
    envs = TextVectorEnv(LEVEL, num_envs, seed=seed, max_steps=horizon)
    envs.reset()
    seeds_played = []
    for round_index in range(3):
        for step in range(horizon):
            obs_list, rewards, terminated, truncated, infos = envs.step(["turn left"] * num_envs)
            assert rewards.dtype == np.float32 and rewards.shape == (num_envs,)
            assert terminated.dtype == bool and truncated.dtype == bool
            if step < horizon - 1:
                assert not truncated.any() and all("episode" not in info for info in infos)
        # Every episode timed out on this step; the envs already play their next episode.
        assert truncated.all() and not terminated.any()
        for i, info in enumerate(infos):
            episode = info["episode"]
            expected_seed = seed + i + round_index * num_envs
            assert episode["seed"] == expected_seed
            assert episode["length"] == horizon
            assert episode["return"] == 0.0 and episode["success"] is False
            assert episode["mission"] == _fresh_episode(expected_seed)[0]
            assert episode["task_type"] == info["final_info"]["task_type"]
            assert info["final_obs"]["mission"] == episode["mission"]
            next_episode = _fresh_episode(expected_seed + num_envs, max_steps=horizon)
            assert (obs_list[i]["mission"], info["descriptions"]) == next_episode
            seeds_played.append(episode["seed"])
    assert sorted(seeds_played) == list(range(seed, seed + 3 * num_envs))


def test_episode_info_of_solved_episodes() -> None:
    envs = TextVectorEnv("BabyAI-GoToLocal-v0", 2, seed=0)
    envs.reset()
    bots = [BabyAIBot(env) for env in envs.envs]
    returns, lengths = np.zeros(2), np.zeros(2, dtype=int)
    finished = []
    while len(finished) < 6:
        actions = [envs.action_words[bot.replan()] for bot in bots]
        _, rewards, terminated, truncated, infos = envs.step(actions)
        returns += rewards
        lengths += 1
        for i, info in enumerate(infos):
            if "episode" not in info:
                continue
            episode = info["episode"]
            assert terminated[i] and not truncated[i]
            assert episode["success"] is True and episode["task_type"] == "goto"
            assert episode["return"] == pytest.approx(returns[i]) and returns[i] > 0
            assert episode["length"] == lengths[i]
            finished.append(episode["seed"])
            returns[i], lengths[i] = 0.0, 0
            bots[i] = BabyAIBot(envs.envs[i])  # the env is already in its next episode
    assert len(set(finished)) == len(finished)


def test_auto_reset_keeps_stepping_past_every_end() -> None:
    """The envs refuse a step after an ended episode; the vector env resets them first."""
    envs = TextVectorEnv("BabyAI-GoToLocal-v0", 2, seed=0, max_steps=8)
    envs.reset()
    bot = BabyAIBot(envs.envs[0])
    ended = {"terminated": 0, "truncated": 0}
    for _ in range(64):  # env 0 follows the bot (successes), env 1 turns (time-outs)
        action = envs.action_words[bot.replan()]
        _, rewards, terminated, truncated, infos = envs.step([action, "turn left"])
        ended["terminated"] += int(terminated.sum())
        ended["truncated"] += int(truncated.sum())
        for i in range(2):
            assert (rewards[i] > 0) == bool(terminated[i])  # paid once, when the episode ends
            if "episode" in infos[i]:
                assert envs.envs[i].unwrapped.step_count == 0  # already in the next episode
        if "episode" in infos[0]:
            bot = BabyAIBot(envs.envs[0])
    assert ended["terminated"] >= 2 and ended["truncated"] >= 8
    assert sum(envs.episodes_started) == 2 + ended["terminated"] + ended["truncated"]


def test_resume_continues_the_seed_schedule() -> None:
    envs = TextVectorEnv(LEVEL, 2, seed=7, max_steps=2)
    envs.reset()
    for _ in range(4):  # two episodes per env: seeds 7..10; the third ones are running
        envs.step([0, 0])
    state = envs.state_dict()
    assert json.loads(json.dumps(state)) == state
    assert state == {"seed": 7, "num_envs": 2, "episodes_started": [3, 3]}

    resumed = TextVectorEnv(LEVEL, 2, seed=0, max_steps=2)
    resumed.load_state_dict(state)
    obs_list, _ = resumed.reset()
    # Episodes 0-2 of each env (seeds 7..12) are spent; the resumed run starts at 13 and 14.
    assert [obs["mission"] for obs in obs_list] == [_fresh_episode(13)[0], _fresh_episode(14)[0]]
    assert resumed.state_dict()["episodes_started"] == [4, 4]


def test_misuse_raises() -> None:
    envs = TextVectorEnv(LEVEL, 2, seed=0)
    with pytest.raises(RuntimeError, match="reset"):
        envs.step([0, 0])
    envs.reset()
    with pytest.raises(ValueError, match="expected 2 actions"):
        envs.step([0])
    with pytest.raises(ValueError, match="allowed actions"):
        envs.step([0, "fly"])
    with pytest.raises(ValueError, match="num_envs"):
        TextVectorEnv(LEVEL, 0, seed=0)
    with pytest.raises(ValueError, match="3 envs"):
        envs.load_state_dict({"seed": 0, "num_envs": 3, "episodes_started": [0, 0, 0]})
