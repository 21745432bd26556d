"""Action spaces: the words the agent chooses among and the minigrid actions they stand for.

Every action space of the project is defined here, once. An agent acts either by an index into
``ActionSpace.words`` or by the word itself; :meth:`ActionSpace.to_minigrid` turns both into
minigrid's integer action (``minigrid.core.actions.Actions``: 0 left, 1 right, 2 forward,
3 pickup, 4 drop, 5 toggle, 6 done).
"""

from __future__ import annotations

import numbers
from dataclasses import dataclass

from minigrid.core.actions import Actions

__all__ = ["ACTION_SPACES", "NO_OP", "ActionSpace", "get_action_space", "reworded"]

NO_OP = "<no-op>"
"""The action every text env takes besides its words (`TextEnv.step`): minigrid's `done`, which
does nothing in BabyAI's levels (unless BABYAI_DONE_ACTIONS is set). Never shown in a prompt: it
is what a policy that writes its action plays for an answer that names no action."""


@dataclass(frozen=True)
class ActionSpace:
    """A list of action words and the minigrid action each one maps to."""

    name: str
    """Short name used to look the space up in :data:`ACTION_SPACES`."""
    words: tuple[str, ...]
    """The action strings shown to the agent, in index order."""
    minigrid_actions: tuple[int, ...]
    """``minigrid_actions[i]`` is minigrid's action for ``words[i]``."""

    def __post_init__(self) -> None:
        if len(self.words) != len(self.minigrid_actions):
            raise ValueError(
                f"action space {self.name!r}: {len(self.words)} words but "
                f"{len(self.minigrid_actions)} minigrid actions"
            )
        if not self.words:
            raise ValueError(f"action space {self.name!r} has no actions")
        if len(set(self.words)) != len(self.words):
            raise ValueError(f"action space {self.name!r} repeats a word: {self.words}")
        known = {int(a) for a in Actions}
        bad = [a for a in self.minigrid_actions if a not in known]
        if bad:
            raise ValueError(
                f"action space {self.name!r}: {bad} are not minigrid actions {sorted(known)}"
            )

    def __len__(self) -> int:
        return len(self.words)

    def index(self, action: int | str) -> int:
        """Return the index in ``words`` of ``action``, given as an index or as a word.

        Raises:
            ValueError: if ``action`` is not one of ``words`` nor an index in range.
        """
        if isinstance(action, str) and action in self.words:
            return self.words.index(action)
        is_integer = isinstance(action, numbers.Integral) and not isinstance(action, bool)
        if is_integer and 0 <= int(action) < len(self.words):
            return int(action)
        allowed = ", ".join(repr(w) for w in self.words)
        raise ValueError(
            f"invalid action {action!r} for action space {self.name!r}; allowed actions are "
            f"{allowed} (or their index, 0 to {len(self.words) - 1})"
        )

    def to_minigrid(self, action: int | str) -> int:
        """Return minigrid's integer action for ``action`` (an index or a word)."""
        return self.minigrid_actions[self.index(action)]


_NAVIGATION = (
    Actions.left,
    Actions.right,
    Actions.forward,
    Actions.pickup,
    Actions.drop,
    Actions.toggle,
)


def _space(name: str, words: tuple[str, ...], actions: tuple[int, ...]) -> ActionSpace:
    return ActionSpace(name=name, words=words, minigrid_actions=tuple(int(a) for a in actions))


ACTION_SPACES: dict[str, ActionSpace] = {
    space.name: space
    for space in (
        _space(
            "default",
            ("turn left", "turn right", "go forward", "pick up", "drop", "toggle"),
            _NAVIGATION,
        ),
        # Navigation only: for levels with nothing to pick up or open (quick learning checks).
        _space("nav", ("turn left", "turn right", "go forward"), _NAVIGATION[:3]),
        # The paper's larger action space: the extra words do nothing (minigrid's `done`
        # action is a no-op unless BABYAI_DONE_ACTIONS is set).
        _space(
            "noop",
            (
                "turn left",
                "turn right",
                "go forward",
                "pick up",
                "drop",
                "toggle",
                "sleep",
                "do nothing",
                "think",
            ),
            (*_NAVIGATION, Actions.done, Actions.done, Actions.done),
        ),
        # Synonyms, for the generalisation test with renamed actions.
        _space(
            "renamed",
            ("rotate left", "rotate right", "move ahead", "take", "release", "switch"),
            _NAVIGATION,
        ),
        _space(
            "french",
            (
                "tourner à gauche",
                "tourner à droite",
                "avancer",
                "ramasser",
                "lâcher",
                "basculer",
            ),
            _NAVIGATION,
        ),
    )
}
"""Every action space of the project, by name."""


def get_action_space(name: str | ActionSpace) -> ActionSpace:
    """Return the action space called ``name`` (an :class:`ActionSpace` is returned as is).

    Raises:
        ValueError: if no action space has that name; the message lists the known names.
    """
    if isinstance(name, ActionSpace):
        return name
    try:
        return ACTION_SPACES[name]
    except (KeyError, TypeError):
        known = ", ".join(repr(n) for n in ACTION_SPACES)
        raise ValueError(f"unknown action space {name!r}; known action spaces: {known}") from None


def reworded(words_from: str | ActionSpace, actions_of: str | ActionSpace) -> ActionSpace:
    """The actions of ``actions_of`` in the words of ``words_from``, in ``actions_of``'s order.

    ``reworded("renamed", "nav")`` is rotate left, rotate right, move ahead: the renamed-action
    test for an agent trained on the navigation actions only. When ``words_from`` has no word
    for one of the actions (the no-op words), ``words_from`` is returned whole.
    """
    source, target = get_action_space(words_from), get_action_space(actions_of)
    word_of = dict(zip(source.minigrid_actions, source.words, strict=True))
    if len(word_of) < len(source.words) or any(a not in word_of for a in target.minigrid_actions):
        return source
    if target.minigrid_actions == source.minigrid_actions:
        return source
    return ActionSpace(
        name=f"{source.name}[{target.name}]",
        words=tuple(word_of[a] for a in target.minigrid_actions),
        minigrid_actions=target.minigrid_actions,
    )
