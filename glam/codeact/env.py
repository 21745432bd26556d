"""The env with coded actions: the primitive actions, then named coded actions that each run a
`step(view, memory)` program (`glam.codeact.api`) for several primitive steps.

`CodedActionsEnv` wraps a `babyai_text.TextEnv` and keeps its interface (`action_words`,
`action_space_def`, `mission`, `task_type`, `language`, `reset`, `step`). Its `action_words` are
the env's primitive words followed by the coded actions' names ("go to the red ball", ...).

Stepping a primitive word takes that one primitive step. Stepping a coded action starts an
execution with an empty memory and calls its `step` in the sandbox (`glam.codeact.sandbox`)
before each primitive step, taking the word it returns, until it returns "done", the episode
ends, a call fails (compile error, exception, timeout, line budget, a word that is not an
action), or `max_steps_per_action` primitive steps ran. The reward is the sum of the primitive
steps' rewards; `info` is the last primitive step's, with the events of all of them.

Frames are counted per primitive step, honestly: `info["primitive_steps"]` is the number this
step took. A coded action that takes none (it says "done" at once, or fails at its first call)
still costs one frame: it counts as one no-op step, as minigrid's own `done` action is one (the
episode's step counter advances, so the time limit and BabyAI's time-discounted reward see it;
the observation is unchanged and the reward is 0). An agent cannot loop on an empty coded
action for free, and the episode still ends by its time limit.

`info["codeact"]` records the step: `action` (the word or name), `outcome` ("primitive",
"done", "failed", "episode_end", "step_limit") and, when it failed, `error_kind` and `error`.
Per-action statistics (`CodedActionStats`) accumulate until `pop_stats()`: what the critic loop
reads to keep, drop or rewrite coded actions.
"""

from __future__ import annotations

import numbers
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, SupportsFloat

import gymnasium as gym
from gymnasium import spaces
from gymnasium.error import ResetNeeded

from babyai_text import TextEnvWrapper
from glam.codeact.api import build_view
from glam.codeact.config import CodeactConfig
from glam.codeact.sandbox import DONE, Sandbox, SandboxConfig

__all__ = ["OUTCOMES", "CodedActionStats", "CodedActionsEnv", "open_sandbox"]

OUTCOMES: tuple[str, ...] = ("done", "failed", "episode_end", "step_limit")
"""How an execution of a coded action ends."""
_KEPT_ERRORS = 5


@dataclass
class CodedActionStats:
    """One coded action's executions since the last `pop_stats` (summable over envs)."""

    uses: int = 0
    outcomes: Counter[str] = field(default_factory=Counter)
    """Executions by how they ended (`OUTCOMES`)."""
    failures: Counter[str] = field(default_factory=Counter)
    """Failed executions by error kind (`glam.codeact.sandbox.ERROR_KINDS`)."""
    errors: list[str] = field(default_factory=list)
    """The last few distinct error messages, oldest first."""
    primitive_steps: int = 0
    """Frames the executions took (empty executions count one each)."""
    reward: float = 0.0
    """Sum of the executions' rewards."""

    @property
    def finished(self) -> int:
        """Executions that ended with "done"."""
        return self.outcomes["done"]

    def record(self, outcome: str, frames: int, reward: float, error: tuple[str, str] | None):
        self.uses += 1
        self.outcomes[outcome] += 1
        self.primitive_steps += frames
        self.reward += reward
        if error is not None:
            kind, message = error
            self.failures[kind] += 1
            self._remember(message)

    def add(self, other: CodedActionStats) -> None:
        self.uses += other.uses
        self.outcomes.update(other.outcomes)
        self.failures.update(other.failures)
        self.primitive_steps += other.primitive_steps
        self.reward += other.reward
        for message in other.errors:
            self._remember(message)

    def _remember(self, message: str) -> None:
        if message in self.errors:
            self.errors.remove(message)
        self.errors.append(message)
        del self.errors[:-_KEPT_ERRORS]


class CodedActionsEnv(TextEnvWrapper):
    """A `TextEnv` whose actions include coded actions (see the module docstring)."""

    def __init__(
        self,
        env: gym.Env,
        coded: dict[str, str],
        sandbox: Sandbox,
        *,
        max_steps_per_action: int = 32,
    ) -> None:
        """
        Args:
            env: a `babyai_text.TextEnv`.
            coded: the coded actions, name -> source; names must differ from the primitive
                words. A source that does not compile stays an action: each use fails with
                its compile error, which the statistics report.
            sandbox: runs the sources; its words must be the env's primitive words.
            max_steps_per_action: primitive steps after which an execution is stopped.
        """
        super().__init__(env)
        primitives: tuple[str, ...] = env.action_words
        if tuple(sandbox.action_words) != primitives:
            raise ValueError(
                f"the sandbox's action words {sandbox.action_words} are not the env's {primitives}"
            )
        if max_steps_per_action < 1:
            raise ValueError(f"max_steps_per_action must be >= 1, got {max_steps_per_action}")
        self.primitive_words = primitives
        self.sandbox = sandbox
        self.max_steps_per_action = max_steps_per_action
        self.set_coded(coded)
        # `action_space_def` stays the primitive one (what bots and skills map to)
        self._last: tuple[dict[str, Any], dict[str, Any]] | None = None
        self._episode_over = True
        self.episode_counts: Counter[str] = Counter()
        """The current (or just ended) episode's `decisions`, `coded` (decisions that ran a
        coded action), `frames` (primitive steps) and `failed` (failed coded executions)."""

    def set_coded(self, coded: dict[str, str]) -> None:
        """Replace the coded actions (name -> source) from the next step on, and start their
        statistics afresh; the episode in progress goes on."""
        clashes = sorted(set(coded) & (set(self.primitive_words) | {DONE}))
        if clashes:
            raise ValueError(f"coded action names {clashes} clash with primitive action words")
        self.coded = dict(coded)
        self.action_words = (*self.primitive_words, *self.coded)
        self.action_space = spaces.Discrete(len(self.action_words))
        self.stats: dict[str, CodedActionStats] = {name: CodedActionStats() for name in coded}

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[dict[str, Any], dict[str, Any]]:
        obs, info = self.env.reset(seed=seed, options=options)
        self._last = (obs, info)
        self._episode_over = False
        self.episode_counts = Counter()
        return obs, {**info, "primitive_steps": 0, "codeact": None}

    def step(
        self, action: int | str
    ) -> tuple[dict[str, Any], SupportsFloat, bool, bool, dict[str, Any]]:
        """Take a primitive action or run a coded action (an index into `action_words` or the
        word / name); gymnasium's 5-tuple, the reward summed over the primitive steps.

        Raises:
            ValueError: `action` is not one of `action_words` (the learner's error; a coded
                action's own errors are reported in `info["codeact"]`, never raised).
            ResetNeeded: before `reset`, or after the episode ended.
        """
        if self._episode_over:
            raise ResetNeeded("call reset() before step() (and after an episode ended)")
        word = self.action_words[self._index(action)]
        if word not in self.coded:
            obs, reward, terminated, truncated, info = self.env.step(word)
            record = {"action": word, "outcome": "primitive", "error_kind": None, "error": None}
            return self._finish(obs, reward, terminated, truncated, info, 1, record)
        return self._run(word)

    def pop_stats(self) -> dict[str, CodedActionStats]:
        """Each coded action's statistics since the last call."""
        stats = self.stats
        self.stats = {name: CodedActionStats() for name in self.coded}
        return stats

    def _run(self, name: str) -> tuple[dict[str, Any], float, bool, bool, dict[str, Any]]:
        """One execution of a coded action."""
        source, memory = self.coded[name], {}
        obs, info = self._last
        total, frames, events = 0.0, 0, []
        terminated = truncated = False
        error = None
        while True:
            view = build_view(self.env, obs, info, self.primitive_words, frames)
            result = self.sandbox.call(source, view, memory)
            if not result.ok:
                outcome, error = "failed", (result.error_kind, result.error)
                break
            if result.action == DONE:
                outcome = "done"
                break
            memory = result.memory
            obs, reward, terminated, truncated, info = self.env.step(result.action)
            total += float(reward)
            frames += 1
            events.extend(info["events"])
            if terminated or truncated:
                outcome = "episode_end"
                break
            if frames >= self.max_steps_per_action:
                outcome = "step_limit"
                break
        if frames == 0:  # one no-op frame: the decision is not free (module docstring)
            frames, info = 1, {**info, "events": [], "success": False}
            truncated = self._count_noop()
        self.stats[name].record(outcome, frames, total, error)
        record = {
            "action": name,
            "outcome": outcome,
            "error_kind": None if error is None else error[0],
            "error": None if error is None else error[1],
        }
        info = {**info, "events": events}
        return self._finish(obs, total, terminated, truncated, info, frames, record)

    def _count_noop(self) -> bool:
        """Advance the episode's step counter by one, as minigrid's `done` action does;
        whether that reaches the time limit."""
        base = self.env.unwrapped
        base.step_count += 1
        return base.step_count >= base.max_steps

    def _finish(
        self,
        obs: dict[str, Any],
        reward: SupportsFloat,
        terminated: bool,
        truncated: bool,
        info: dict[str, Any],
        frames: int,
        record: dict[str, Any],
    ) -> tuple[dict[str, Any], float, bool, bool, dict[str, Any]]:
        self._last = (obs, info)
        self._episode_over = bool(terminated or truncated)
        self.episode_counts.update(
            decisions=1,
            coded=record["outcome"] != "primitive",
            frames=frames,
            failed=record["outcome"] == "failed",
        )
        info = {**info, "primitive_steps": frames, "codeact": record}
        return obs, float(reward), terminated, truncated, info

    def _index(self, action: int | str) -> int:
        if isinstance(action, str) and action in self.action_words:
            return self.action_words.index(action)
        is_integer = isinstance(action, numbers.Integral) and not isinstance(action, bool)
        if is_integer and 0 <= int(action) < len(self.action_words):
            return int(action)
        raise ValueError(
            f"invalid action {action!r}; allowed: {list(self.action_words)} or their index"
        )


def open_sandbox(action_words: tuple[str, ...], cfg: CodeactConfig) -> Sandbox:
    """A sandbox for coded actions over `action_words`, with the limits of `codeact.*`."""
    limits = SandboxConfig(
        line_budget=cfg.line_budget, timeout_s=cfg.call_timeout, memory_mb=cfg.memory_mb
    )
    return Sandbox(action_words, limits)
