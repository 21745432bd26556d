"""Descriptions of hand-built views, in English and French, and French missions."""

from __future__ import annotations

import numpy as np
import pytest
from minigrid.core.grid import Grid
from minigrid.core.mission import MissionSpace
from minigrid.core.world_object import Ball, Box, Door, Key, WorldObj
from minigrid.minigrid_env import MiniGridEnv

from babyai_text.describe import describe_env, describe_view, translate_mission

RIGHT, DOWN, LEFT, UP = range(4)  # minigrid's agent_dir


class EmptyRoom(MiniGridEnv):
    """A square room of side ``size`` (walls included) with nothing in it."""

    def __init__(self, size: int) -> None:
        super().__init__(
            mission_space=MissionSpace(mission_func=lambda: "describe"),
            grid_size=size,
            max_steps=10,
            see_through_walls=False,
        )

    def _gen_grid(self, width: int, height: int) -> None:
        self.grid = Grid(width, height)
        self.grid.wall_rect(0, 0, width, height)
        self.agent_pos, self.agent_dir = (1, 1), RIGHT
        self.mission = "describe"


def view_of(
    size: int,
    agent_pos: tuple[int, int],
    agent_dir: int,
    objects: dict[tuple[int, int], WorldObj] | None = None,
    carrying: WorldObj | None = None,
    language: str = "en",
) -> list[str]:
    """Describe a room where each object stands ``(dx, dy)`` = (steps right, steps forward)
    of the agent."""
    env = EmptyRoom(size)
    env.reset(seed=0)
    env.agent_pos, env.agent_dir = np.array(agent_pos), agent_dir
    for (dx, dy), obj in (objects or {}).items():
        x, y = env.agent_pos + dy * env.dir_vec + dx * env.right_vec
        env.grid.set(int(x), int(y), obj)
    env.carrying = carrying
    return describe_env(env, language)


# In a 7x7 room (inside 1..5) from (2, 2): walls 2 cells away on two sides, 4 on the others; the
# view reaches 6 cells forward but only 3 to each side.
@pytest.mark.parametrize(
    ("agent_dir", "expected"),
    [
        (RIGHT, ["You see a wall 4 steps forward", "You see a wall 2 steps left"]),
        (DOWN, ["You see a wall 4 steps forward", "You see a wall 2 steps right"]),
        (LEFT, ["You see a wall 2 steps forward", "You see a wall 2 steps right"]),
        (UP, ["You see a wall 2 steps forward", "You see a wall 2 steps left"]),
    ],
)
def test_walls_in_each_direction(agent_dir: int, expected: list[str]) -> None:
    assert view_of(7, (2, 2), agent_dir) == expected


def test_walls_on_three_sides_singular_and_plural() -> None:
    assert view_of(7, (3, 3), UP) == [
        "You see a wall 3 steps forward",
        "You see a wall 3 steps left",
        "You see a wall 3 steps right",
    ]
    # In a corridor one cell wide every wall is one step away.
    assert view_of(3, (1, 1), UP) == [
        "You see a wall 1 step forward",
        "You see a wall 1 step left",
        "You see a wall 1 step right",
    ]


def test_objects_at_known_offsets_scan_left_to_right_then_top_to_bottom() -> None:
    objects = {
        (0, 2): Ball("red"),
        (-1, 0): Key("green"),
        (2, 0): Box("blue"),
        (-2, 3): Ball("purple"),
        (1, 1): Key("yellow"),
        (1, 4): Box("grey"),
    }
    assert view_of(11, (5, 5), UP, objects) == [
        "You see a purple ball 2 steps left and 3 steps forward",
        "You see a green key 1 step left",
        "You see a red ball 2 steps forward",
        "You see a grey box 1 step right and 4 steps forward",
        "You see a yellow key 1 step right and 1 step forward",
        "You see a blue box 2 steps right",
    ]


def test_objects_hide_walls_on_their_line() -> None:
    objects = {(0, 1): Ball("red"), (-2, 0): Key("green")}
    assert view_of(7, (3, 3), RIGHT, objects) == [
        "You see a wall 3 steps right",
        "You see a green key 2 steps left",
        "You see a red ball 1 step forward",
    ]


@pytest.mark.parametrize(
    ("door", "sentence"),
    [
        (Door("red", is_open=True), "You see an open red door 3 steps forward"),
        (Door("red"), "You see a closed red door 3 steps forward"),
        (Door("red", is_locked=True), "You see a locked red door 3 steps forward"),
    ],
)
def test_door_states(door: Door, sentence: str) -> None:
    # The door replaces the wall straight ahead, so no wall is seen forward.
    assert view_of(7, (3, 3), UP, {(0, 3): door}) == [
        "You see a wall 3 steps left",
        "You see a wall 3 steps right",
        sentence,
    ]


def test_carried_object_comes_first_and_only_once() -> None:
    sentences = view_of(7, (3, 3), UP, {(1, 1): Ball("blue")}, carrying=Key("red"))
    assert sentences == [
        "You carry a red key",
        "You see a wall 3 steps forward",
        "You see a wall 3 steps left",
        "You see a wall 3 steps right",
        "You see a blue ball 1 step right and 1 step forward",
    ]


def test_french_wording() -> None:
    objects = {
        (-2, 3): Ball("purple"),
        (-1, 0): Key("green"),
        (0, 3): Door("grey", is_locked=True),
        (1, 1): Box("blue"),
    }
    assert view_of(7, (3, 3), UP, objects, carrying=Box("yellow"), language="fr") == [
        "Tu portes une boîte jaune",
        "Tu vois un mur à 3 pas à droite",
        "Tu vois une balle violette à 2 pas à gauche et à 3 pas devant",
        "Tu vois une clé verte à 1 pas à gauche",
        "Tu vois une porte grise verrouillée à 3 pas devant",
        "Tu vois une boîte bleue à 1 pas à droite et à 1 pas devant",
    ]
    assert view_of(3, (1, 1), UP, language="fr") == [
        "Tu vois un mur à 1 pas devant",
        "Tu vois un mur à 1 pas à gauche",
        "Tu vois un mur à 1 pas à droite",
    ]
    assert view_of(7, (3, 3), UP, {(0, 3): Door("red", is_open=True)}, language="fr")[-1] == (
        "Tu vois une porte rouge ouverte à 3 pas devant"
    )


def test_describe_view_reads_minigrid_encoding_directly() -> None:
    image = np.zeros((3, 3, 3), dtype=np.uint8)  # everything unseen
    image[1, 2] = (1, 0, 0)  # the agent's cell, empty
    image[1, 1] = (1, 0, 0)  # empty, then a wall two steps ahead
    image[1, 0] = (2, 5, 0)
    image[0, 0] = (6, 4, 0)  # yellow ball, left and forward
    assert describe_view(image) == [
        "You see a wall 2 steps forward",
        "You see a yellow ball 1 step left and 2 steps forward",
    ]


@pytest.mark.parametrize(
    "image",
    [np.zeros((7, 7)), np.zeros((6, 6, 3)), np.zeros((7, 5, 3)), np.zeros((7, 7, 4))],
)
def test_bad_view_shape_raises(image: np.ndarray) -> None:
    with pytest.raises(ValueError, match="shape"):
        describe_view(image)


def test_bad_cell_and_language_raise() -> None:
    image = np.ones((3, 3, 3), dtype=np.uint8)
    image[0, 0] = (42, 0, 0)
    with pytest.raises(ValueError, match="not a minigrid encoding"):
        describe_view(image)
    with pytest.raises(ValueError, match="unknown language 'de'"):
        describe_view(np.ones((3, 3, 3), dtype=np.uint8), language="de")


@pytest.mark.parametrize(
    ("mission", "french"),
    [
        ("go to the red ball", "va à la balle rouge"),
        ("go to a blue key", "va à une clé bleue"),
        ("go to the grey box", "va à la boîte grise"),
        ("pick up the purple key", "ramasse la clé violette"),
        ("open the green door", "ouvre la porte verte"),
        ("put the yellow ball next to the green key", "mets la balle jaune à côté de la clé verte"),
        ("put a yellow ball next to a red box", "mets une balle jaune à côté d'une boîte rouge"),
        (
            "pick up the red key, then go to the blue ball",
            "ramasse la clé rouge, puis va à la balle bleue",
        ),
        (
            "go to the blue ball after you pick up the red key",
            "va à la balle bleue après avoir ramassé la clé rouge",
        ),
        ("pick up the key after you go to a ball", "ramasse la clé après être allé à une balle"),
        (
            "go to the red ball and open the door, then pick up a box",
            "va à la balle rouge et ouvre la porte, puis ramasse une boîte",
        ),
        ("go to the object on your left", "va à l'objet à ta gauche"),
        ("pick up a red object behind you", "ramasse un objet rouge derrière toi"),
        ("open the door in front of you", "ouvre la porte devant toi"),
    ],
)
def test_translate_mission_to_french(mission: str, french: str) -> None:
    assert translate_mission(mission, "fr") == french
    assert translate_mission(mission, "en") == mission


@pytest.mark.parametrize("mission", ["dance with the red ball", "go to the pink ball", ""])
def test_translate_mission_outside_babyai_grammar_raises(mission: str) -> None:
    with pytest.raises(ValueError, match="cannot translate mission"):
        translate_mission(mission, "fr")
