"""The oracle labeller: BabyAI's own notion of progress, as a control for the LLM's labels.

An event (`babyai_text`'s `info["events"]`) helps reach a goal (the mission) when it is:

- picking up a key (keys open the locked doors of BabyAI's key-and-door levels);
- unlocking or opening a door (it opens the way to another room, or is the mission itself);
- picking up an object the mission names ("pick up the red box", "put the red ball next to
  ...", "pick up a key then go to ...");
- dropping the object a "put ... next to ..." mission moves.

Everything else is worth 0: failed actions, bumping into things, closing doors, picking up or
dropping other objects, opening boxes, walking through doors. The rule reads only the two
texts, as the LLM does; it is exact on levels like BabyAI-UnlockPickup-v0 (fetch the key,
open the door, pick up the box) and a fair judge of the others. It reads English: the events
and missions of a French env (`env.language=fr`) are all worth 0 to it.
"""

from __future__ import annotations

import re

from minigrid.core.constants import COLOR_NAMES

__all__ = ["ObjectRef", "mission_objects", "oracle_label"]

_COLORS = "|".join(COLOR_NAMES)
_TYPES = "ball|box|key|door|object"
_OBJECT = re.compile(rf"\b(?:the|a|an)\s+(?:({_COLORS})\s+)?({_TYPES})\b")
_EVENT = re.compile(rf"^you (pick up|drop|unlock|open) the (?:({_COLORS}) )?(ball|box|key|door)$")

ObjectRef = tuple[str | None, str]
"""(color or None, type): an object as a mission or an event names it."""


def mission_objects(mission: str) -> list[ObjectRef]:
    """The objects a BabyAI mission names, in order ("a ball" -> (None, "ball"))."""
    return [(color or None, kind) for color, kind in _OBJECT.findall(mission.lower())]


def _matches(named: ObjectRef, color: str | None, kind: str) -> bool:
    named_color, named_kind = named
    return named_kind in (kind, "object") and named_color in (None, color)


def oracle_label(mission: str, event: str) -> float:
    """1.0 when `event` is progress towards `mission` by the rule of the module docstring."""
    match = _EVENT.match(event.strip().lower())
    if match is None:
        return 0.0
    verb, color, kind = match.groups()
    mission = mission.lower()
    named = mission_objects(mission)
    if verb in ("unlock", "open"):
        return float(kind == "door")
    if verb == "pick up":
        return float(kind == "key" or any(_matches(obj, color, kind) for obj in named))
    # drop: progress only for the object a "put X next to Y" mission moves
    moves = mission.startswith("put") or " put " in mission
    return float(moves and bool(named) and _matches(named[0], color, kind))
