"""The GLAM levels: task mix, train/test split, layouts, time limits, and BabyAI's bot."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator

import pytest
from minigrid.core.world_object import Door, Key
from minigrid.utils.baby_ai_bot import BabyAIBot

import babyai_text
from babyai_text.levels import HELD_OUT_PAIRS, GlamLevel, mentioned_pairs
from babyai_text.registration import MIXED_TASKS

HELD_OUT_WORDS = ("yellow box", "red key", "red door", "green ball", "grey door")
NUM_SPLIT_SEEDS = 1000


def _episodes(level_id: str, seeds: range) -> Iterator[tuple[str, str, GlamLevel]]:
    """(mission, task type, level) right after each reset; one env plays all the seeds."""
    env = babyai_text.make(level_id)
    for seed in seeds:
        obs, info = env.reset(seed=seed)
        yield obs["mission"], info["task_type"], env.unwrapped


def test_train_split_never_mentions_a_held_out_pair() -> None:
    task_types = Counter()
    door_colors = set()
    for mission, task_type, level in _episodes("BabyAI-MixedTrainLocal-v0", range(NUM_SPLIT_SEEDS)):
        assert not any(words in mission for words in HELD_OUT_WORDS), mission
        assert not mentioned_pairs(level.instrs) & HELD_OUT_PAIRS, mission
        task_types[task_type] += 1
        if task_type == "open":
            door_colors.add(level.instrs.desc.color)
    # All five tasks, the sequence one in both phrasings, in roughly the mix's proportions.
    assert set(task_types) == set(MIXED_TASKS)
    for task_type, weight in MIXED_TASKS.items():
        expected = NUM_SPLIT_SEEDS * weight / sum(MIXED_TASKS.values())
        assert 0.7 * expected < task_types[task_type] < 1.3 * expected, task_types
    assert door_colors == {"yellow", "green", "blue", "purple"}


def test_test_split_always_mentions_a_held_out_pair() -> None:
    task_types = Counter()
    for mission, task_type, level in _episodes("BabyAI-MixedTestLocal-v0", range(NUM_SPLIT_SEEDS)):
        assert any(words in mission for words in HELD_OUT_WORDS), mission
        assert mentioned_pairs(level.instrs) & HELD_OUT_PAIRS, mission
        task_types[task_type] += 1
    assert set(task_types) == set(MIXED_TASKS)


def test_mission_phrasings() -> None:
    patterns = {
        "goto": ("go to ",),
        "pickup": ("pick up ",),
        "putnext": ("put ", " next to "),
        "open": ("open the ", " door"),
        "pickup_then_goto": ("pick up ", ", then go to "),
        "goto_after_pickup": ("go to ", " after you pick up "),
    }
    seen = set()
    for mission, task_type, _ in _episodes("BabyAI-MixedTrainLocal-v0", range(60)):
        assert all(part in mission for part in patterns[task_type]), (task_type, mission)
        assert mission.startswith(patterns[task_type][0])
        seen.add(task_type)
    assert seen == set(patterns)
    for mission, task_type, _ in _episodes("BabyAI-PickUpSeqPickUpLocal-v0", range(20)):
        assert task_type == "pickup_then_pickup"
        assert mission.startswith("pick up ") and ", then pick up " in mission


def test_task_type_follows_the_seed_not_the_instance() -> None:
    """GLAM drew the task once per env instance; here it is drawn per episode from the seed."""
    level_id = "BabyAI-MixedTrainLocal-v0"
    forward = [(m, t) for m, t, _ in _episodes(level_id, range(30))]
    backward = [(m, t) for m, t, _ in _episodes(level_id, range(29, -1, -1))]
    assert forward == backward[::-1]
    assert len({t for _, t in forward}) > 3


def test_max_steps_and_layout_per_task() -> None:
    expected_max_steps = {
        "goto": 64,
        "pickup": 64,
        "putnext": 128,
        "open": 128,
        "pickup_then_goto": 128,
        "goto_after_pickup": 128,
    }
    for _, task_type, level in _episodes("BabyAI-MixedTrainLocal-v0", range(100)):
        assert level.max_steps == expected_max_steps[task_type]
        objects = [cell for cell in level.grid.grid if cell is not None and cell.type != "wall"]
        if task_type != "open":
            assert (level.width, level.height) == (8, 8)
            assert len(objects) == 8
            continue
        # Two rooms, one locked door between them, its key in the agent's room.
        assert (level.width, level.height) == (15, 8)
        doors = [obj for obj in objects if isinstance(obj, Door)]
        assert len(doors) == 1 and doors[0].is_locked
        assert doors[0].color == level.instrs.desc.color
        agent_room = level.room_from_pos(*level.agent_pos)
        assert agent_room is level.get_room(0, 0)
        keys = [obj for obj in agent_room.objs if isinstance(obj, Key)]
        assert doors[0].color in {key.color for key in keys}
        assert len(agent_room.objs) == 8 and not level.get_room(1, 0).objs


def test_level_arguments_are_checked() -> None:
    with pytest.raises(ValueError, match="unknown task types"):
        GlamLevel(tasks=("dance",))
    with pytest.raises(ValueError, match="unknown split"):
        GlamLevel(split="validation")
    with pytest.raises(ValueError, match="unknown language"):
        GlamLevel(language="de")
    with pytest.raises(ValueError, match="positive"):
        GlamLevel(tasks={"goto": 0.0})


def _bot_success(level_id: str, seeds: range) -> tuple[float, Counter]:
    """Success rate of minigrid's BabyAIBot acting through the text env, and failures by task."""
    env = babyai_text.make(level_id)
    failures = Counter()
    successes = 0
    for seed in seeds:
        obs, info = env.reset(seed=seed)
        bot = BabyAIBot(env)
        terminated = truncated = False
        while not (terminated or truncated):
            action = env.action_words[bot.replan()]
            obs, reward, terminated, truncated, info = env.step(action)
        assert info["success"] == (terminated and reward > 0)
        successes += info["success"]
        if not info["success"]:
            failures[info["task_type"]] += 1
    return successes / len(seeds), failures


@pytest.mark.parametrize(
    ("level_id", "num_seeds"),
    [
        ("BabyAI-MixedTrainLocal-v0", 500),
        ("BabyAI-MixedTestLocal-v0", 500),
        ("BabyAI-PickUpSeqPickUpLocal-v0", 50),
        ("BabyAI-PickUpThenGoToLocal-v0", 50),
        ("BabyAI-GoToAfterPickUpLocal-v0", 50),
        ("BabyAI-GoToLocalFrench-v0", 50),
    ],
)
def test_babyai_bot_solves_the_levels(level_id: str, num_seeds: int) -> None:
    rate, failures = _bot_success(level_id, range(1000, 1000 + num_seeds))
    assert rate >= 0.95, f"bot success {rate:.3f}, failures by task type: {dict(failures)}"
