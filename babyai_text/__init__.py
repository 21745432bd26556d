"""BabyAI-Text: BabyAI levels whose missions, observations and actions are words.

Importing the package registers the GLAM levels (:data:`LEVELS`) with gymnasium.

>>> import babyai_text
>>> env = babyai_text.make("BabyAI-MixedTrainLocal-v0")
>>> obs, info = env.reset(seed=0)
>>> obs, reward, terminated, truncated, info = env.step("go forward")
"""

from __future__ import annotations

from babyai_text.actions import ACTION_SPACES, NO_OP, ActionSpace, get_action_space
from babyai_text.env import TextEnv, TextEnvWrapper, make
from babyai_text.registration import LEVELS, register_levels
from babyai_text.vector import TextVectorEnv

__all__ = [
    "ACTION_SPACES",
    "LEVELS",
    "NO_OP",
    "ActionSpace",
    "TextEnv",
    "TextEnvWrapper",
    "TextVectorEnv",
    "get_action_space",
    "make",
]

register_levels()
