"""What the last action just did, in words: ``you pick up the yellow key``, ``nothing happens``.

:class:`TextEnv` takes a :class:`Snapshot` of the agent's surroundings before each minigrid
step and another after it; :func:`describe_events` compares the two, knowing the action, and
returns the sentences of ``info["events"]``. A turn, a plain move forward and ``done`` say
nothing (an empty list). The sentences, by action (``{obj}`` is the object with its colour,
``yellow key``; a wall is just ``wall``; :data:`TEMPLATES` puts the article in ``{obj}``):

- pick up: ``you pick up the {obj}``, ``there is nothing to pick up``, ``your hands are full``
  (a pickable object in front, something already carried), ``you cannot pick up the {obj}``;
- drop: ``you drop the {obj}``, ``you have nothing to drop``,
  ``there is no room to drop the {obj}`` (the cell in front is taken);
- toggle: ``you unlock the {obj}`` (a locked door and its key: minigrid unlocks and opens it),
  ``the {obj} is locked`` (no matching key), ``you open the {obj}`` (a closed door, or a box,
  which minigrid replaces by its contents), ``you close the {obj}`` (an open door),
  ``nothing happens`` (an empty cell, a wall, a key, a ball);
- go forward: ``you bump into the {obj}`` (anything the agent cannot step on, a closed door
  included), ``you walk through the {obj}`` (an open door).

French (``language="fr"``) uses the nouns and colours of :mod:`babyai_text.describe`:
``tu ramasses la clé jaune``, ``la porte rouge est verrouillée``, ``tu te cognes contre le mur``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from minigrid.core.actions import Actions

from babyai_text.describe import definite_noun_phrase

if TYPE_CHECKING:
    import gymnasium as gym
    from minigrid.core.world_object import WorldObj

__all__ = ["TEMPLATES", "Snapshot", "Thing", "describe_events", "take_snapshot"]

TEMPLATES: dict[str, dict[str, str]] = {
    "pick_up": {"en": "you pick up {obj}", "fr": "tu ramasses {obj}"},
    "nothing_to_pick_up": {
        "en": "there is nothing to pick up",
        "fr": "il n'y a rien à ramasser",
    },
    "hands_full": {"en": "your hands are full", "fr": "tes mains sont pleines"},
    "cannot_pick_up": {"en": "you cannot pick up {obj}", "fr": "tu ne peux pas ramasser {obj}"},
    "drop": {"en": "you drop {obj}", "fr": "tu lâches {obj}"},
    "nothing_to_drop": {"en": "you have nothing to drop", "fr": "tu n'as rien à lâcher"},
    "no_room_to_drop": {
        "en": "there is no room to drop {obj}",
        "fr": "il n'y a pas de place pour lâcher {obj}",
    },
    "unlock": {"en": "you unlock {obj}", "fr": "tu déverrouilles {obj}"},
    "locked": {"en": "{obj} is locked", "fr": "{obj} est verrouillée"},
    "open": {"en": "you open {obj}", "fr": "tu ouvres {obj}"},
    "close": {"en": "you close {obj}", "fr": "tu fermes {obj}"},
    "nothing_happens": {"en": "nothing happens", "fr": "il ne se passe rien"},
    "bump": {"en": "you bump into {obj}", "fr": "tu te cognes contre {obj}"},
    "walk_through": {"en": "you walk through {obj}", "fr": "tu franchis {obj}"},
}
"""Every event sentence by name and language; ``{obj}`` is the object with its article
(``the yellow key``, ``la clé jaune``). The ``locked`` sentence is only said of doors, whose
French noun is feminine."""


@dataclass(frozen=True)
class Thing:
    """A grid object as the sentences need it, frozen at the time of the snapshot."""

    type: str
    """minigrid's object type: ``"key"``, ``"door"``, ``"wall"``..."""
    color: str
    door_state: str | None
    """``"open"``, ``"closed"`` or ``"locked"`` for a door, else None."""
    pickable: bool
    """minigrid's ``can_pickup()``."""

    @classmethod
    def of(cls, obj: WorldObj | None) -> Thing | None:
        if obj is None:
            return None
        door_state = None
        if obj.type == "door":
            door_state = "open" if obj.is_open else "locked" if obj.is_locked else "closed"
        return cls(obj.type, obj.color, door_state, obj.can_pickup())

    def phrase(self, language: str) -> str:
        """``the yellow key``, ``the wall``; ``la clé jaune``, ``le mur``."""
        color = None if self.type == "wall" else self.color
        return definite_noun_phrase(self.type, color, language)


@dataclass(frozen=True)
class Snapshot:
    """What an action can change or depends on: the cell in front, the load, the position."""

    front: Thing | None
    """The object in the cell in front of the agent, None when the cell is empty."""
    carrying: Thing | None
    agent_pos: tuple[int, int]


def take_snapshot(env: gym.Env) -> Snapshot:
    """The :class:`Snapshot` of a minigrid env (or a wrapper of one) right now."""
    base = env.unwrapped
    return Snapshot(
        front=Thing.of(base.grid.get(*base.front_pos)),
        carrying=Thing.of(base.carrying),
        agent_pos=(int(base.agent_pos[0]), int(base.agent_pos[1])),
    )


def describe_events(before: Snapshot, after: Snapshot, action: int, language: str) -> list[str]:
    """The sentences saying what minigrid's ``action`` did between ``before`` and ``after``.

    Objects are named as they were before the action (the box just opened, the door just
    unlocked); whether the action worked is read from ``after``.
    """
    event, thing = _event(before, after, action)
    if event is None:
        return []
    template = TEMPLATES[event][language]
    return [template.format(obj=thing.phrase(language)) if thing is not None else template]


def _event(before: Snapshot, after: Snapshot, action: int) -> tuple[str | None, Thing | None]:
    """The name of the event in :data:`TEMPLATES` (None for no event) and the object it names."""
    front = before.front
    if action == Actions.pickup:
        if front is None:
            return "nothing_to_pick_up", None
        if before.carrying is None and after.carrying is not None:
            return "pick_up", front
        if not front.pickable:
            return "cannot_pick_up", front
        return "hands_full", None
    if action == Actions.drop:
        if before.carrying is None:
            return "nothing_to_drop", None
        if after.carrying is None:
            return "drop", before.carrying
        return "no_room_to_drop", before.carrying
    if action == Actions.toggle:
        if front is None or front.type not in ("door", "box"):
            return "nothing_happens", None
        if front.type == "box":
            return "open", front
        if front.door_state == "locked":
            opened = after.front is not None and after.front.door_state == "open"
            return ("unlock" if opened else "locked"), front
        return ("close" if front.door_state == "open" else "open"), front
    if action == Actions.forward:
        moved = after.agent_pos != before.agent_pos
        if not moved and front is not None:
            return "bump", front
        if moved and front is not None and front.door_state == "open":
            return "walk_through", front
    return None, None
