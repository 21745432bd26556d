"""Gymnasium registration of the GLAM levels: one table of lazy entry points.

Registering imports nothing heavy: gymnasium imports ``babyai_text.levels`` (and minigrid) the
first time one of these ids is made.
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym

__all__ = ["LEVELS", "MIXED_TASKS", "register_levels"]

_ENTRY_POINT = "babyai_text.levels:GlamLevel"
MIXED_TASKS: dict[str, float] = {
    "goto": 1.0,
    "pickup": 1.0,
    "putnext": 1.0,
    "open": 1.0,
    "pickup_then_goto": 0.5,
    "goto_after_pickup": 0.5,
}
"""Task weights of the GLAM mix: five tasks drawn evenly, pick up then go to in either
phrasing."""

_LEVEL_TABLE: dict[str, tuple[str, dict[str, Any]]] = {
    "BabyAI-MixedTrainLocal-v0": (_ENTRY_POINT, {"tasks": MIXED_TASKS, "split": "train"}),
    "BabyAI-MixedTestLocal-v0": (_ENTRY_POINT, {"tasks": MIXED_TASKS, "split": "test"}),
    "BabyAI-PickUpSeqPickUpLocal-v0": (_ENTRY_POINT, {"tasks": ("pickup_then_pickup",)}),
    "BabyAI-PickUpThenGoToLocal-v0": (_ENTRY_POINT, {"tasks": ("pickup_then_goto",)}),
    "BabyAI-GoToAfterPickUpLocal-v0": (_ENTRY_POINT, {"tasks": ("goto_after_pickup",)}),
    "BabyAI-GoToLocalFrench-v0": (_ENTRY_POINT, {"tasks": ("goto",), "language": "fr"}),
}

LEVELS: tuple[str, ...] = tuple(_LEVEL_TABLE)
"""Ids of the levels this package registers."""


def register_levels() -> None:
    """Register every id of :data:`LEVELS` with gymnasium (ids already registered are kept)."""
    for level_id, (entry_point, kwargs) in _LEVEL_TABLE.items():
        if level_id not in gym.registry:
            gym.register(id=level_id, entry_point=entry_point, kwargs=kwargs)
