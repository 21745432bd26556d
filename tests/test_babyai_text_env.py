"""The text env on every level this package registers and on a few of minigrid's."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.error import ResetNeeded
from minigrid.envs.babyai.core.roomgrid_level import RoomGridLevel
from minigrid.envs.babyai.core.verifier import (
    AfterInstr,
    AndInstr,
    BeforeInstr,
    GoToInstr,
    ObjDesc,
    OpenInstr,
    PickupInstr,
)
from minigrid.utils.baby_ai_bot import BabyAIBot

import babyai_text
from babyai_text.describe import describe_env
from babyai_text.levels import TASK_TYPES, task_type_of

MINIGRID_LEVELS = {
    "BabyAI-GoToLocal-v0": "goto",
    "BabyAI-PutNextLocal-v0": "putnext",
    "BabyAI-OpenDoor-v0": "open",
}
ALL_LEVELS = [*babyai_text.LEVELS, *MINIGRID_LEVELS]


def test_package_registers_the_glam_levels() -> None:
    assert set(babyai_text.LEVELS) == {
        "BabyAI-MixedTrainLocal-v0",
        "BabyAI-MixedTestLocal-v0",
        "BabyAI-PickUpSeqPickUpLocal-v0",
        "BabyAI-PickUpThenGoToLocal-v0",
        "BabyAI-GoToAfterPickUpLocal-v0",
        "BabyAI-GoToLocalFrench-v0",
    }


@pytest.mark.parametrize("level_id", ALL_LEVELS)
def test_reset_and_step_api(level_id: str) -> None:
    env = babyai_text.make(level_id)
    assert isinstance(env.unwrapped, RoomGridLevel)
    assert env.action_words == env.action_space_def.words
    assert env.action_space.n == len(env.action_words)

    obs, info = env.reset(seed=3)
    assert isinstance(obs["mission"], str) and obs["mission"]
    assert obs["image"].shape == (7, 7, 3)
    assert info["descriptions"] == describe_env(env, env.language)
    assert all(isinstance(s, str) for s in info["descriptions"])
    assert info["task_type"] in TASK_TYPES
    assert info["task_type"] == task_type_of(env.unwrapped.instrs)
    if level_id in MINIGRID_LEVELS:
        assert info["task_type"] == MINIGRID_LEVELS[level_id]
    assert info["success"] is False

    obs, reward, terminated, truncated, info = env.step(env.action_words[2])
    assert isinstance(terminated, bool) and isinstance(truncated, bool)
    assert float(reward) >= 0.0
    assert info["descriptions"] == describe_env(env, env.language)
    assert env.unwrapped.step_count == 1


@pytest.mark.parametrize("level_id", ALL_LEVELS)
def test_same_seed_same_episode(level_id: str) -> None:
    first, second = babyai_text.make(level_id), babyai_text.make(level_id)
    second.reset(seed=12345)  # a different history must not matter
    missions = set()
    for seed in range(8):
        obs_a, info_a = first.reset(seed=seed)
        obs_b, info_b = second.reset(seed=seed)
        assert obs_a["mission"] == obs_b["mission"]
        assert info_a["descriptions"] == info_b["descriptions"]
        assert info_a["task_type"] == info_b["task_type"]
        np.testing.assert_array_equal(obs_a["image"], obs_b["image"])
        for action in (2, 0, 2, 1, 2):
            step_a, step_b = first.step(action), second.step(action)
            assert step_a[1:4] == step_b[1:4]
            assert step_a[4]["descriptions"] == step_b[4]["descriptions"]
            if step_a[2] or step_a[3]:  # ended: a further step needs a reset
                break
        missions.add(obs_a["mission"])
    assert len(missions) > 1, "every seed gave the same mission"


@pytest.mark.parametrize("level_id", ["BabyAI-MixedTrainLocal-v0", "BabyAI-GoToLocal-v0"])
def test_action_by_word_equals_action_by_index(level_id: str) -> None:
    by_index, by_word = babyai_text.make(level_id), babyai_text.make(level_id)
    by_index.reset(seed=7)
    by_word.reset(seed=7)
    for i in [2, 2, 0, 2, 3, 1, 2, 5, 4]:
        _, r_i, te_i, tr_i, info_i = by_index.step(i)
        _, r_w, te_w, tr_w, info_w = by_word.step(by_word.action_words[i])
        assert (r_i, te_i, tr_i) == (r_w, te_w, tr_w)
        assert info_i["descriptions"] == info_w["descriptions"]
        assert tuple(by_index.unwrapped.agent_pos) == tuple(by_word.unwrapped.agent_pos)
        if te_i or tr_i:  # ended: a further step needs a reset
            break


@pytest.mark.parametrize("level_id", ALL_LEVELS)
@pytest.mark.parametrize("bad", ["fly", 6, -1, "toggle "])
def test_bad_action_raises_naming_allowed_actions(level_id: str, bad: int | str) -> None:
    env = babyai_text.make(level_id)
    env.reset(seed=0)
    with pytest.raises(ValueError, match="allowed actions are") as error:
        env.step(bad)
    assert all(repr(word) in str(error.value) for word in env.action_words)
    assert env.unwrapped.step_count == 0


def test_unknown_level_id_lists_known_ids() -> None:
    for bad in ("BabyAI-NoSuchLevel-v0", "CartPole-v1"):
        with pytest.raises(ValueError, match="unknown BabyAI level id") as error:
            babyai_text.make(bad)
        message = str(error.value)
        assert "BabyAI-GoToLocal-v0" in message
        assert all(level_id in message for level_id in babyai_text.LEVELS)


@pytest.mark.parametrize(
    ("level_id", "kwargs", "message"),
    [
        ("BabyAI-GoToLocal-v0", {"max_steps": -3}, "max_steps must be an integer >= 1, got -3"),
        ("BabyAI-MixedTrainLocal-v0", {"max_steps": 0}, "max_steps must be an integer >= 1"),
        ("BabyAI-GoToLocal-v0", {"max_steps": 2.5}, "max_steps must be an integer >= 1"),
        ("BabyAI-GoToLocal-v0", {"max_steps": True}, "max_steps must be an integer >= 1"),
        ("BabyAI-GoToLocal-v0", {"distractors": 0}, "distractors is for the GLAM levels"),
        ("BabyAI-MixedTrainLocal-v0", {"distractors": "a"}, "distractors must be an integer"),
        ("BabyAI-GoToLocal-v0", {"colour": "red"}, "does not take the argument(s) 'colour'"),
    ],
)
def test_make_refuses_arguments_out_of_range_naming_them(
    level_id: str, kwargs: dict, message: str
) -> None:
    """`max_steps=-3` was accepted: every episode ended after one step and a success paid 1.3,
    above BabyAI's 1; `max_steps=0` divided by zero on a success."""
    with pytest.raises(ValueError) as refused:
        babyai_text.make(level_id, **kwargs)
    assert message in str(refused.value)


def test_french_level_defaults_to_french_words() -> None:
    env = babyai_text.make("BabyAI-GoToLocalFrench-v0")
    obs, info = env.reset(seed=0)
    assert env.language == "fr"
    assert env.action_words == babyai_text.ACTION_SPACES["french"].words
    assert obs["mission"].startswith("va à ")
    assert info["descriptions"] and all(s.startswith("Tu ") for s in info["descriptions"])
    _, _, _, _, info = env.step("tourner à gauche")
    assert all(s.startswith("Tu ") for s in info["descriptions"])

    english = babyai_text.make("BabyAI-GoToLocalFrench-v0", language="en")
    obs_en, info_en = english.reset(seed=0)
    assert english.action_words == babyai_text.ACTION_SPACES["default"].words
    assert obs_en["mission"] == env.unwrapped.surface
    assert obs_en["mission"].startswith("go to ")
    assert all(s.startswith("You ") for s in info_en["descriptions"])


def test_any_level_can_be_french_and_any_space_chosen() -> None:
    env = babyai_text.make("BabyAI-GoToLocal-v0", language="fr", action_space="renamed")
    obs, info = env.reset(seed=0)
    assert obs["mission"].startswith("va à ")
    assert env.unwrapped.mission.startswith("go to ")  # the level itself is untouched
    assert env.action_words[2] == "move ahead"
    with pytest.raises(ValueError, match="unknown action space"):
        babyai_text.make("BabyAI-GoToLocal-v0", action_space="klingon")
    with pytest.raises(ValueError, match="unknown language"):
        babyai_text.make("BabyAI-GoToLocal-v0", language="de")


def test_noop_words_leave_the_agent_in_place() -> None:
    env = babyai_text.make("BabyAI-MixedTrainLocal-v0", action_space="noop")
    env.reset(seed=1)
    pos, direction = tuple(env.unwrapped.agent_pos), env.unwrapped.agent_dir
    for word in ("sleep", "do nothing", "think"):
        _, reward, terminated, _, _ = env.step(word)
        assert (reward, terminated) == (0, False)
    assert (tuple(env.unwrapped.agent_pos), env.unwrapped.agent_dir) == (pos, direction)
    assert env.unwrapped.step_count == 3


@pytest.mark.parametrize("space", ["default", "nav", "french"])
def test_every_env_takes_the_no_op_besides_its_words(space: str) -> None:
    env = babyai_text.make("BabyAI-GoToRedBall-v0", action_space=space)
    _, first = env.reset(seed=3)
    pos, direction = tuple(env.unwrapped.agent_pos), env.unwrapped.agent_dir
    _, reward, terminated, truncated, info = env.step(babyai_text.NO_OP)
    assert (reward, terminated, truncated) == (0, False, False)
    assert (tuple(env.unwrapped.agent_pos), env.unwrapped.agent_dir) == (pos, direction)
    assert env.unwrapped.step_count == 1 and info["descriptions"] == first["descriptions"]
    with pytest.raises(ValueError, match="allowed actions"):
        env.step(len(env.action_words))  # the no-op is a name, not one more index


@pytest.mark.parametrize("level_id", ["BabyAI-MixedTrainLocal-v0", "BabyAI-GoToLocal-v0"])
def test_max_steps_override_truncates(level_id: str) -> None:
    env = babyai_text.make(level_id, max_steps=5)
    env.reset(seed=0)
    assert env.unwrapped.max_steps == 5
    # Turning in place never completes a task: objects never start next to the agent.
    results = [env.step("turn left") for _ in range(5)]
    assert [truncated for _, _, _, truncated, _ in results] == [False] * 4 + [True]
    assert not any(terminated for _, _, terminated, _, _ in results)
    assert results[-1][4]["success"] is False


def _play_until_the_end(env: babyai_text.TextEnv, ending: str) -> float:
    """Play one episode to its end (the bot's success, or the time limit); return the reward."""
    bot = BabyAIBot(env)
    while True:
        action = env.action_words[bot.replan()] if ending == "terminated" else "turn left"
        _, reward, terminated, truncated, info = env.step(action)
        if terminated or truncated:
            assert (terminated, info["success"]) == (
                (True, True) if ending == "terminated" else (False, False)
            )
            return float(reward)


@pytest.mark.parametrize("ending", ["terminated", "truncated"])
def test_step_after_the_episode_ended_raises_until_reset(ending: str) -> None:
    env = babyai_text.make("BabyAI-GoToLocal-v0", max_steps=None if ending == "terminated" else 3)
    with pytest.raises(ResetNeeded, match=r"call reset\(\) before step\(\)"):
        env.step("turn left")
    env.reset(seed=0)
    reward = _play_until_the_end(env, ending)
    assert (reward > 0) == (ending == "terminated")
    steps = env.unwrapped.step_count
    for action in ("go forward", "turn left"):  # minigrid would play on and pay again
        with pytest.raises(ResetNeeded, match="episode has ended .* after an episode ended"):
            env.step(action)
    assert env.unwrapped.step_count == steps
    env.reset(seed=1)
    _, _, terminated, truncated, _ = env.step("turn left")
    assert not (terminated or truncated) and env.unwrapped.step_count == 1


def test_task_type_of_instructions() -> None:
    ball, key, door = ObjDesc("ball", "red"), ObjDesc("key", "blue"), ObjDesc("door", "grey")
    assert task_type_of(BeforeInstr(PickupInstr(key), GoToInstr(ball))) == "pickup_then_goto"
    assert task_type_of(AfterInstr(GoToInstr(ball), PickupInstr(key))) == "goto_after_pickup"
    assert task_type_of(AndInstr(GoToInstr(ball), OpenInstr(door))) == "goto_and_open"
    nested = BeforeInstr(AndInstr(GoToInstr(ball), OpenInstr(door)), PickupInstr(key))
    assert task_type_of(nested) is None
    assert task_type_of(None) is None


def test_reset_does_not_print_babyai_s_rejected_samples(capsys: pytest.CaptureFixture) -> None:
    """Seed 8 of GoToLocal draws a level BabyAI rejects (an unreachable object) before the one
    it keeps; minigrid prints each rejection, the text env keeps them off stdout."""
    gym.make("BabyAI-GoToLocal-v0").reset(seed=8)
    assert "Sampling rejected" in capsys.readouterr().out  # minigrid itself prints
    babyai_text.make("BabyAI-GoToLocal-v0").reset(seed=8)
    assert capsys.readouterr().out == ""
