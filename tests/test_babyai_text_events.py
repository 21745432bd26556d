"""``info["events"]``: what the last action just did, one test per action and outcome.

Most tests put the agent of minigrid's empty 8x8 room at (2, 3) facing east, so that the cell in
front is (3, 3), fill that cell and the agent's hands, take one action and compare the exact
sentences. The empty room has no BabyAI instruction whose verifier could end the episode on the
way; the last tests play real BabyAI levels (French, the vector env, BabyAI's bot).
"""

from __future__ import annotations

import gymnasium as gym
import pytest
from minigrid.core.world_object import Ball, Box, Door, Key, Wall, WorldObj
from minigrid.utils.baby_ai_bot import BabyAIBot

import babyai_text
from babyai_text import TextEnv, TextVectorEnv
from babyai_text.events import TEMPLATES

FRONT = (3, 3)


def _set_up(
    env: TextEnv, front: WorldObj | None = None, carrying: WorldObj | None = None
) -> TextEnv:
    """Reset ``env``, empty its room, put the agent at (2, 3) facing east (towards ``FRONT``)."""
    env.reset(seed=0)
    base = env.unwrapped
    for x in range(1, base.grid.width - 1):
        for y in range(1, base.grid.height - 1):
            base.grid.set(x, y, None)
    base.agent_pos, base.agent_dir = (2, 3), 0
    assert tuple(base.front_pos) == FRONT
    base.grid.set(*FRONT, front)
    base.carrying = carrying
    return env


def _room(
    front: WorldObj | None = None, carrying: WorldObj | None = None, **text_env_kwargs: str
) -> TextEnv:
    env = TextEnv(gym.make("MiniGrid-Empty-8x8-v0"), **text_env_kwargs)
    return _set_up(env, front, carrying)


def _events(env: TextEnv, action: str) -> list[str]:
    *_, info = env.step(action)
    return info["events"]


# --- No event --------------------------------------------------------------------------------


def test_reset_has_no_event() -> None:
    _, info = babyai_text.make("BabyAI-GoToLocal-v0").reset(seed=0)
    assert info["events"] == []


@pytest.mark.parametrize("action", ["turn left", "turn right", "go forward", "sleep"])
def test_turns_plain_moves_and_done_have_no_event(action: str) -> None:
    env = _room(front=None, carrying=Key("yellow"), action_space="noop")  # "sleep" is done
    assert _events(env, action) == []
    moved = tuple(env.unwrapped.agent_pos) == FRONT
    assert moved == (action == "go forward")


# --- Pick up ---------------------------------------------------------------------------------


def test_pick_up() -> None:
    key = Key("yellow")
    env = _room(front=key)
    assert _events(env, "pick up") == ["you pick up the yellow key"]
    assert env.unwrapped.carrying is key and env.unwrapped.grid.get(*FRONT) is None


def test_pick_up_nothing() -> None:
    assert _events(_room(front=None), "pick up") == ["there is nothing to pick up"]


def test_pick_up_with_full_hands() -> None:
    key = Key("yellow")
    env = _room(front=Ball("grey"), carrying=key)
    assert _events(env, "pick up") == ["your hands are full"]
    assert env.unwrapped.carrying is key


@pytest.mark.parametrize(
    ("front", "expected"),
    [
        (Door("red"), "you cannot pick up the red door"),
        (Door("red", is_locked=True), "you cannot pick up the red door"),
        (Wall(), "you cannot pick up the wall"),
    ],
)
def test_pick_up_what_cannot_be_carried(front: WorldObj, expected: str) -> None:
    assert _events(_room(front=front), "pick up") == [expected]


def test_pick_up_the_border_wall() -> None:
    env = _room()
    env.unwrapped.agent_pos, env.unwrapped.agent_dir = (1, 3), 2  # facing west, the outer wall
    assert _events(env, "pick up") == ["you cannot pick up the wall"]


# --- Drop ------------------------------------------------------------------------------------


def test_drop() -> None:
    box = Box("purple")
    env = _room(front=None, carrying=box)
    assert _events(env, "drop") == ["you drop the purple box"]
    assert env.unwrapped.carrying is None and env.unwrapped.grid.get(*FRONT) is box


def test_drop_with_empty_hands() -> None:
    assert _events(_room(front=None), "drop") == ["you have nothing to drop"]


@pytest.mark.parametrize("front", [Ball("grey"), Wall(), Door("red", is_open=True)])
def test_drop_onto_a_taken_cell(front: WorldObj) -> None:
    key = Key("yellow")
    env = _room(front=front, carrying=key)
    assert _events(env, "drop") == ["there is no room to drop the yellow key"]
    assert env.unwrapped.carrying is key


# --- Toggle ----------------------------------------------------------------------------------


def test_toggle_a_locked_door_with_its_key_unlocks_it() -> None:
    door = Door("red", is_locked=True)
    env = _room(front=door, carrying=Key("red"))
    assert _events(env, "toggle") == ["you unlock the red door"]
    assert door.is_open and not door.is_locked


@pytest.mark.parametrize("carrying", [None, Key("blue"), Ball("red")])
def test_toggle_a_locked_door_without_its_key(carrying: WorldObj | None) -> None:
    door = Door("red", is_locked=True)
    env = _room(front=door, carrying=carrying)
    assert _events(env, "toggle") == ["the red door is locked"]
    assert door.is_locked and not door.is_open


def test_toggle_a_closed_door_opens_it() -> None:
    door = Door("green")
    env = _room(front=door)
    assert _events(env, "toggle") == ["you open the green door"]
    assert door.is_open
    assert _events(env, "toggle") == ["you close the green door"]
    assert not door.is_open


def test_toggle_an_open_door_closes_it() -> None:
    door = Door("green", is_open=True)
    assert _events(_room(front=door), "toggle") == ["you close the green door"]
    assert not door.is_open


def test_toggle_a_box_opens_it() -> None:
    ball = Ball("blue")
    env = _room(front=Box("purple", contains=ball))
    assert _events(env, "toggle") == ["you open the purple box"]
    assert env.unwrapped.grid.get(*FRONT) is ball


@pytest.mark.parametrize("front", [None, Wall(), Key("yellow"), Ball("grey")])
def test_toggle_what_does_not_toggle(front: WorldObj | None) -> None:
    assert _events(_room(front=front), "toggle") == ["nothing happens"]


# --- Go forward ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("front", "expected"),
    [
        (Ball("grey"), "you bump into the grey ball"),
        (Box("purple"), "you bump into the purple box"),
        (Key("yellow"), "you bump into the yellow key"),
        (Wall(), "you bump into the wall"),
        (Door("red"), "you bump into the red door"),
        (Door("red", is_locked=True), "you bump into the red door"),
    ],
)
def test_go_forward_into_an_obstacle(front: WorldObj, expected: str) -> None:
    env = _room(front=front)
    assert _events(env, "go forward") == [expected]
    assert tuple(env.unwrapped.agent_pos) == (2, 3)


def test_go_forward_through_an_open_door() -> None:
    env = _room(front=Door("blue", is_open=True))
    assert _events(env, "go forward") == ["you walk through the blue door"]
    assert tuple(env.unwrapped.agent_pos) == FRONT
    assert _events(env, "go forward") == []  # out of the door's cell: a plain move


# --- French, the vector env, real play -------------------------------------------------------


@pytest.mark.parametrize(
    ("front", "carrying", "action", "expected"),
    [
        (Key("yellow"), None, "ramasser", "tu ramasses la clé jaune"),
        (None, None, "ramasser", "il n'y a rien à ramasser"),
        (Ball("grey"), Key("yellow"), "ramasser", "tes mains sont pleines"),
        (Wall(), None, "ramasser", "tu ne peux pas ramasser le mur"),
        (None, Box("purple"), "lâcher", "tu lâches la boîte violette"),
        (None, None, "lâcher", "tu n'as rien à lâcher"),
        (Ball("grey"), Key("green"), "lâcher", "il n'y a pas de place pour lâcher la clé verte"),
        (Door("red", is_locked=True), Key("red"), "basculer", "tu déverrouilles la porte rouge"),
        (Door("red", is_locked=True), None, "basculer", "la porte rouge est verrouillée"),
        (Door("blue"), None, "basculer", "tu ouvres la porte bleue"),
        (Door("blue", is_open=True), None, "basculer", "tu fermes la porte bleue"),
        (Box("purple"), None, "basculer", "tu ouvres la boîte violette"),
        (Ball("grey"), None, "basculer", "il ne se passe rien"),
        (Wall(), None, "avancer", "tu te cognes contre le mur"),
        (Ball("grey"), None, "avancer", "tu te cognes contre la balle grise"),
        (Door("blue", is_open=True), None, "avancer", "tu franchis la porte bleue"),
    ],
)
def test_french_events(
    front: WorldObj | None, carrying: WorldObj | None, action: str, expected: str
) -> None:
    env = _set_up(babyai_text.make("BabyAI-GoToLocalFrench-v0"), front, carrying)
    assert env.language == "fr"
    assert _events(env, action) == [expected]


def test_every_event_has_an_english_and_a_french_sentence() -> None:
    assert all(set(sentences) == {"en", "fr"} for sentences in TEMPLATES.values())


def test_vector_env_keeps_the_events_of_the_step_that_ended_an_episode() -> None:
    envs = TextVectorEnv("BabyAI-GoToLocal-v0", 2, seed=0, max_steps=1)
    _, infos = envs.reset()
    assert [info["events"] for info in infos] == [[], []]
    for env in envs.envs:
        base = env.unwrapped
        base.grid.set(*base.front_pos, Key("yellow"))
        base.carrying = None
    _, _, terminated, truncated, infos = envs.step(["pick up", "turn left"])
    assert (terminated | truncated).all()  # one step is all the time allowed
    assert infos[0]["final_info"]["events"] == ["you pick up the yellow key"]
    assert infos[1]["final_info"]["events"] == []
    assert [info["events"] for info in infos] == [[], []]  # the new episodes' resets


def test_the_bot_solving_unlock_pickup_says_what_it_does() -> None:
    """Real play: BabyAI's bot fetches the key, unlocks the door, leaves the key, goes through
    and picks up the target; the turns and plain moves in between say nothing."""
    env = babyai_text.make("BabyAI-UnlockPickup-v0")
    env.reset(seed=1)
    color = next(obj.color for obj in env.unwrapped.grid.grid if obj and obj.type == "door")
    bot = BabyAIBot(env)
    said: list[str] = []
    terminated = truncated = False
    while not (terminated or truncated):
        *_, terminated, truncated, info = env.step(bot.replan())
        said += info["events"]
    assert info["success"]
    target = env.unwrapped.mission.removeprefix("pick up ")  # "the purple box"
    assert said == [
        f"you pick up the {color} key",
        f"you unlock the {color} door",
        f"you drop the {color} key",
        f"you walk through the {color} door",
        f"you pick up {target}",
    ]
