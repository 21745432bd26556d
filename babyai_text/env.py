"""BabyAI-Text: any BabyAI level, with missions and observations in words and actions as words.

>>> env = make("BabyAI-MixedTrainLocal-v0")
>>> obs, info = env.reset(seed=0)
>>> obs["mission"], info["descriptions"], info["task_type"]  # doctest: +SKIP
('go to the red ball', ['You see a wall 2 steps forward', ...], 'goto')
>>> obs, reward, terminated, truncated, info = env.step("turn left")  # or env.step(0)
"""

from __future__ import annotations

import contextlib
import io
from typing import Any, SupportsFloat

import gymnasium as gym
import minigrid  # noqa: F401  (registers minigrid's BabyAI levels with gymnasium)
from gymnasium import spaces
from gymnasium.error import ResetNeeded
from minigrid.core.actions import Actions

from babyai_text.actions import NO_OP, ActionSpace, get_action_space
from babyai_text.describe import LANGUAGES, describe_view, translate_mission
from babyai_text.events import describe_events, take_snapshot
from babyai_text.levels import task_type_of
from babyai_text.registration import LEVELS, register_levels

__all__ = ["TextEnv", "TextEnvWrapper", "known_level_ids", "make"]

_DEFAULT_ACTION_SPACES = {"en": "default", "fr": "french"}


class TextEnv(gym.Wrapper):
    """Wraps a minigrid BabyAI env so that it speaks text.

    ``reset`` and ``step`` return minigrid's observation dict, whose ``"mission"`` is in the
    env's language, and add to ``info``:

    - ``"descriptions"``: the sentences describing the agent's view
      (:func:`babyai_text.describe.describe_view`);
    - ``"task_type"``: the task type of the episode (``"goto"``, ``"pickup_then_goto"``...;
      inferred from the instruction for minigrid's levels, None when it fits no simple shape);
    - ``"events"``: short lowercase sentences saying what the last action just did (``"you
      pick up the yellow key"``, ``"the red door is locked"``, ``"you bump into the wall"``;
      :mod:`babyai_text.events` lists them all); empty at reset and after a turn, a plain move
      forward or ``done``;
    - ``"success"``: True when the episode has just ended with a positive reward.

    ``step`` takes an index into ``action_words`` or one of the words. Rewards are BabyAI's.
    Once an episode has ended (terminated or truncated), ``step`` raises ``ResetNeeded`` until
    ``reset`` is called: minigrid would otherwise play on in the finished episode and pay the
    success reward again. (``TextVectorEnv`` resets its envs itself.)
    """

    def __init__(
        self,
        env: gym.Env,
        *,
        action_space: str | ActionSpace | None = None,
        language: str | None = None,
    ) -> None:
        """
        Args:
            env: a minigrid env (possibly wrapped), e.g. ``gym.make("BabyAI-GoToLocal-v0")``.
            action_space: name of an action space in ``ACTION_SPACES`` (or one); by default
                ``"french"`` when the language is French, else ``"default"``.
            language: ``"en"`` or ``"fr"``; by default the level's own (French for
                ``BabyAI-GoToLocalFrench-v0``), else English.
        """
        super().__init__(env)
        language = language or getattr(env.unwrapped, "language", "en")
        if language not in LANGUAGES:
            raise ValueError(f"unknown language {language!r}; known languages: {LANGUAGES}")
        self.language: str = language
        self.action_space_def: ActionSpace = get_action_space(
            action_space or _DEFAULT_ACTION_SPACES[language]
        )
        self.action_words: tuple[str, ...] = self.action_space_def.words
        self.action_space = spaces.Discrete(len(self.action_words))
        self._episode_over: bool | None = None
        """None before the first reset; True once the episode has ended."""

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[dict[str, Any], dict[str, Any]]:
        """Start an episode; ``info`` holds the keys listed in :class:`TextEnv`, no events."""
        # BabyAI draws a level by rejection sampling and prints each rejection ("Sampling
        # rejected: unreachable object at (2, 2)"); that is not news, and it floods run logs.
        with contextlib.redirect_stdout(io.StringIO()):
            obs, info = self.env.reset(seed=seed, options=options)
        self._episode_over = False
        return self._textualise(obs, info, events=[], success=False)

    def step(
        self, action: int | str
    ) -> tuple[dict[str, Any], SupportsFloat, bool, bool, dict[str, Any]]:
        """Take ``action`` (an index into ``action_words``, a word, or ``NO_OP``: minigrid's
        ``done``, which does nothing); gymnasium's 5-tuple.

        Raises:
            ValueError: if ``action`` is not in the action space; the message lists the words.
            ResetNeeded: before the first ``reset``, or after the episode ended.
        """
        if self._episode_over is None:
            raise ResetNeeded("call reset() before step()")
        if self._episode_over:
            raise ResetNeeded(
                "the episode has ended (terminated or truncated): call reset() before step() "
                "after an episode ended"
            )
        if isinstance(action, str) and action == NO_OP and NO_OP not in self.action_words:
            minigrid_action = int(Actions.done)
        else:
            minigrid_action = self.action_space_def.to_minigrid(action)
        before = take_snapshot(self.env)
        obs, reward, terminated, truncated, info = self.env.step(minigrid_action)
        self._episode_over = bool(terminated or truncated)
        events = describe_events(before, take_snapshot(self.env), minigrid_action, self.language)
        obs, info = self._textualise(
            obs, info, events=events, success=bool(terminated and reward > 0)
        )
        return obs, reward, terminated, truncated, info

    @property
    def mission(self) -> str:
        """The current mission in the env's language."""
        base = self.env.unwrapped
        english = getattr(base, "surface", None) or base.mission
        return translate_mission(english, self.language)

    @property
    def task_type(self) -> str | None:
        """Task type of the current episode, or None."""
        base = self.env.unwrapped
        if hasattr(base, "task_type"):
            return base.task_type
        return task_type_of(getattr(base, "instrs", None))

    def _textualise(
        self, obs: dict[str, Any], info: dict[str, Any], *, events: list[str], success: bool
    ) -> tuple[dict[str, Any], dict[str, Any]]:
        obs = {**obs, "mission": self.mission}
        info = {
            **info,
            "descriptions": describe_view(obs["image"], self.language),
            "task_type": self.task_type,
            "events": events,
            "success": success,
        }
        return obs, info


class TextEnvWrapper(gym.Wrapper):
    """A wrapper of a :class:`TextEnv` (or of another such wrapper) that keeps its interface:
    ``action_words``, ``action_space_def``, ``language``, ``mission`` and ``task_type`` are the
    wrapped env's, unless the subclass sets others (a coupling's env: more actions, other
    rewards)."""

    def __init__(self, env: gym.Env) -> None:
        super().__init__(env)
        self.action_words: tuple[str, ...] = env.action_words
        self.action_space_def: ActionSpace = env.action_space_def
        self.language: str = env.language

    @property
    def mission(self) -> str:
        """The current mission (the wrapped env's)."""
        return self.env.mission

    @property
    def task_type(self) -> str | None:
        """The current episode's task type (the wrapped env's)."""
        return self.env.task_type


def known_level_ids() -> list[str]:
    """Every BabyAI level id registered with gymnasium (minigrid's and this package's)."""
    register_levels()
    return sorted(env_id for env_id in gym.registry if env_id.startswith("BabyAI-"))


def make(
    level_id: str,
    *,
    action_space: str | ActionSpace | None = None,
    language: str | None = None,
    max_steps: int | None = None,
    **kwargs: Any,
) -> TextEnv:
    """Make the text env of any BabyAI level.

    Args:
        level_id: a BabyAI gymnasium id, minigrid's (``BabyAI-GoToLocal-v0``) or this
            package's (``BabyAI-MixedTrainLocal-v0``, see ``babyai_text.LEVELS``).
        action_space: see :class:`TextEnv`.
        language: see :class:`TextEnv`.
        max_steps: fixed episode length limit, a positive integer; by default BabyAI's, which
            depends on the task. (BabyAI pays ``1 - 0.9 * steps / max_steps`` on success: below
            1 step the payment would exceed 1, at 0 it divides by zero.)
        **kwargs: passed to ``gymnasium.make`` and on to the level (``render_mode``...);
            ``distractors`` (an integer >= 0) only to the GLAM levels (``LEVELS``), which take it.

    Raises:
        ValueError: for an unknown level id (the message lists the known ones), an unknown
            action space or language, a ``max_steps`` or ``distractors`` out of range, or an
            argument the level does not take.
    """
    known = known_level_ids()
    if level_id not in known:
        raise ValueError(f"unknown BabyAI level id {level_id!r}; known ids: {', '.join(known)}")
    if max_steps is not None:
        if not _is_int(max_steps) or max_steps < 1:
            raise ValueError(f"max_steps must be an integer >= 1, got {max_steps!r}")
        kwargs["max_steps"] = max_steps
    if "distractors" in kwargs and kwargs["distractors"] is not None:
        distractors = kwargs["distractors"]
        if level_id not in LEVELS:
            raise ValueError(
                f"distractors is for the GLAM levels ({', '.join(LEVELS)}); {level_id} sets its "
                "own number of objects"
            )
        if not _is_int(distractors) or distractors < 0:
            raise ValueError(f"distractors must be an integer >= 0, got {distractors!r}")
    try:
        env = gym.make(level_id, **kwargs)
    except TypeError as error:
        if "unexpected keyword argument" not in str(error):
            raise
        raise ValueError(
            f"{level_id} does not take the argument(s) {', '.join(map(repr, kwargs))}: "
            f"{str(error).split(' was raised from', 1)[0]}"
        ) from None
    return TextEnv(env, action_space=action_space, language=language)


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)
