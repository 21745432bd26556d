"""Action spaces: words, indices and their minigrid actions."""

from __future__ import annotations

import numpy as np
import pytest

from babyai_text import ACTION_SPACES, ActionSpace, get_action_space


def test_default_space_is_glam_order_and_minigrid_indices() -> None:
    space = get_action_space("default")
    assert space.words == ("turn left", "turn right", "go forward", "pick up", "drop", "toggle")
    assert space.minigrid_actions == (0, 1, 2, 3, 4, 5)


def test_noop_space_adds_three_words_for_minigrid_done() -> None:
    space = get_action_space("noop")
    assert space.words[:6] == get_action_space("default").words
    assert space.words[6:] == ("sleep", "do nothing", "think")
    assert [space.to_minigrid(w) for w in ("sleep", "do nothing", "think")] == [6, 6, 6]


@pytest.mark.parametrize("name", ["renamed", "french"])
def test_synonym_spaces_map_word_by_word_onto_default(name: str) -> None:
    space = get_action_space(name)
    assert len(space) == 6
    assert set(space.words).isdisjoint(get_action_space("default").words)
    assert [space.to_minigrid(w) for w in space.words] == [0, 1, 2, 3, 4, 5]


def test_renamed_and_french_words() -> None:
    assert get_action_space("renamed").words == (
        "rotate left",
        "rotate right",
        "move ahead",
        "take",
        "release",
        "switch",
    )
    assert get_action_space("french").to_minigrid("avancer") == 2
    assert get_action_space("french").index("tourner à gauche") == 0


def test_reworded_gives_a_spaces_words_for_another_spaces_actions() -> None:
    from babyai_text.actions import reworded

    nav = reworded("renamed", "nav")
    assert nav.words == ("rotate left", "rotate right", "move ahead")
    assert nav.minigrid_actions == get_action_space("nav").minigrid_actions
    assert reworded("french", "nav").words == ("tourner à gauche", "tourner à droite", "avancer")
    assert reworded("renamed", "default") is get_action_space("renamed")
    # No renamed word for the no-op actions: the renamed space is kept whole.
    assert reworded("renamed", "noop") is get_action_space("renamed")


@pytest.mark.parametrize("space", list(ACTION_SPACES.values()), ids=list(ACTION_SPACES))
def test_index_accepts_words_and_indices(space: ActionSpace) -> None:
    for i, word in enumerate(space.words):
        assert space.index(word) == i
        assert space.index(i) == i
        assert space.index(np.int64(i)) == i
        assert space.to_minigrid(word) == space.to_minigrid(i) == space.minigrid_actions[i]


@pytest.mark.parametrize("bad", ["fly", "Turn Left", "", -1, 6, 2.0, True, None])
def test_bad_action_names_the_allowed_ones(bad: object) -> None:
    space = get_action_space("default")
    with pytest.raises(ValueError, match="allowed actions are 'turn left', 'turn right'"):
        space.index(bad)  # type: ignore[arg-type]


def test_unknown_space_lists_known_names() -> None:
    with pytest.raises(ValueError, match="'default', 'nav', 'noop', 'renamed', 'french'"):
        get_action_space("klingon")
    assert get_action_space(ACTION_SPACES["noop"]) is ACTION_SPACES["noop"]


def test_inconsistent_definitions_are_refused() -> None:
    with pytest.raises(ValueError, match="2 words but 1 minigrid actions"):
        ActionSpace("x", ("a", "b"), (0,))
    with pytest.raises(ValueError, match="repeats a word"):
        ActionSpace("x", ("a", "a"), (0, 1))
    with pytest.raises(ValueError, match="not minigrid actions"):
        ActionSpace("x", ("a",), (7,))
