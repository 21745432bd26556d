"""Skills (glam/skills.py): parsing, candidates, the bot's subgoal, and skills that act like the bot."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import gymnasium as gym
import minigrid  # noqa: F401 (registers the BabyAI levels)
import pytest
from minigrid.core.actions import Actions
from minigrid.utils.baby_ai_bot import BabyAIBot

from glam.skills import SkillMap, Subgoal, candidate_subgoals, expert_subgoal, parse_subgoal


def test_subgoal_texts_parse_and_print_back() -> None:
    for text in ("go to the red ball", "pick up the grey key", "open the blue door", "drop"):
        assert str(parse_subgoal(text)) == text
    assert parse_subgoal(" explore ") == Subgoal("explore")
    assert parse_subgoal("go to the green door") == Subgoal("go to", "green", "door")
    for bad in ("go to the ball", "pick up the red door", "open the red box", "jump", ""):
        with pytest.raises(ValueError, match="not a subgoal"):
            parse_subgoal(bad)


def _episodes(level: str, seeds: range) -> Iterator[tuple[int, Any]]:
    for seed in seeds:
        env = gym.make(level)
        env.reset(seed=seed)
        yield seed, env


def _mission_subgoal(env: Any, verb: str) -> str | None:
    """The subgoal a one-object mission names, when it names colour and type and no location."""
    desc = env.unwrapped.instrs.desc
    if desc.color is None or desc.type is None or desc.loc is not None:
        return None
    return f"{verb} the {desc.color} {desc.type}"


@pytest.mark.parametrize(
    ("level", "verb"),
    [
        ("BabyAI-GoToLocal-v0", "go to"),
        ("BabyAI-PickupLoc-v0", "pick up"),
        ("BabyAI-Open-v0", "open"),
    ],
)
def test_the_mission_s_skill_alone_solves_the_mission(level: str, verb: str) -> None:
    solved = tried = 0
    for _, env in _episodes(level, range(40)):
        subgoal = _mission_subgoal(env, verb)
        if subgoal is None:
            continue
        tried += 1
        skills = SkillMap(env.unwrapped)
        for _ in range(env.unwrapped.max_steps):
            skills.observe()
            action = skills.next_action(subgoal)
            assert action is not None and action != Actions.done
            _, reward, terminated, truncated, _ = env.step(action)
            if terminated or truncated:
                solved += reward > 0
                break
        if tried == 8:
            break
    assert tried == 8
    assert solved == tried


def _bot_walk(level: str, seeds: range) -> Iterator[tuple[Any, BabyAIBot, SkillMap, int]]:
    """Every state of the bot's own episodes, with the skills' map kept up to date."""
    for _, env in _episodes(level, seeds):
        bot, skills = BabyAIBot(env.unwrapped), SkillMap(env.unwrapped)
        for _ in range(env.unwrapped.max_steps):
            skills.observe()
            action = int(bot.replan())
            yield env, bot, skills, action
            _, _, terminated, truncated, _ = env.step(action)
            if terminated or truncated:
                break


def test_the_skill_of_the_bot_s_subgoal_takes_the_bot_s_action_on_gotolocal() -> None:
    states = 0
    for _, bot, skills, action in _bot_walk("BabyAI-GoToLocal-v0", range(15)):
        subgoal = expert_subgoal(bot)
        assert subgoal is not None
        assert skills.next_action(subgoal) == action, subgoal
        states += 1
    assert states > 40


@pytest.mark.parametrize("level", ["BabyAI-Open-v0", "BabyAI-GoTo-v0", "BabyAI-PutNextLocal-v0"])
def test_on_harder_levels_the_skills_mostly_take_the_bot_s_action(level: str) -> None:
    # Measured on seeds 0-19: Open 729/732, GoTo 1051/1054, PutNextLocal 242/243; the few misses
    # are walks the skills name differently (moving a blocker, a cell next to the target).
    agree = total = 0
    for _, bot, skills, action in _bot_walk(level, range(8)):
        subgoal = expert_subgoal(bot)
        parse_subgoal(subgoal)  # always one of the skills' words
        agree += skills.next_action(subgoal) == action
        total += 1
    assert total > 100
    assert agree / total > 0.97


def test_the_answer_depends_on_the_state_not_on_what_was_asked_before() -> None:
    checked = 0
    for env, _, skills, _ in _bot_walk("BabyAI-GoToLocal-v0", range(3)):
        subgoals = candidate_subgoals(env)
        forward = [skills.next_action(s) for s in subgoals]
        backward = [skills.next_action(s) for s in reversed(subgoals)][::-1]
        assert forward == backward
        checked += len(subgoals)
    assert checked > 50


def test_candidates_name_what_is_in_view() -> None:
    seen_target = seen_not = 0
    for env, bot, _, _ in _bot_walk("BabyAI-GoToLocal-v0", range(10)):
        candidates = candidate_subgoals(env)
        assert candidates == candidate_subgoals(env)  # deterministic
        assert candidates[-1] == "explore" and "drop" not in candidates
        assert all(parse_subgoal(c) for c in candidates)
        expert = expert_subgoal(bot)
        if expert == "explore":
            seen_not += 1
        else:
            # The bot walks to its target only once seen: the candidates then contain it.
            assert expert in candidates
            seen_target += 1
    assert seen_target > 10 and seen_not > 0


def test_carrying_changes_the_candidates_and_the_skills() -> None:
    for env, _, skills, action in _bot_walk("BabyAI-PickupLoc-v0", range(10)):
        if action != Actions.pickup:
            continue
        facing = env.unwrapped.grid.get(*env.unwrapped.front_pos)
        assert f"pick up the {facing.color} {facing.type}" in candidate_subgoals(env)
        assert skills.next_action(f"pick up the {facing.color} {facing.type}") == Actions.pickup
        assert skills.next_action("drop") is None  # empty hands
        env.step(Actions.pickup)
        skills.observe()
        candidates = candidate_subgoals(env)
        assert "drop" in candidates
        assert not any(c.startswith("pick up") for c in candidates)
        assert skills.next_action(f"pick up the {facing.color} {facing.type}") is None  # done
        assert skills.next_action("drop") == Actions.drop  # the cell in front is free now
        return
    pytest.fail("the bot never picked anything up")


def test_a_subgoal_about_nothing_in_the_world_has_no_action() -> None:
    _, env = next(_episodes("BabyAI-GoToLocal-v0", range(1)))
    skills = SkillMap(env.unwrapped)
    skills.observe()
    colours = {cell.color for cell in env.unwrapped.grid.grid if cell and cell.type == "ball"}
    missing = next(
        c for c in ("red", "green", "blue", "purple", "yellow", "grey") if c not in colours
    )
    assert skills.next_action(f"go to the {missing} ball") is None
    assert skills.next_action("open the red door") is None  # GoToLocal has no doors
    assert skills.next_action("explore") is not None
