"""The mediated env: the agent chooses between asking the planner and letting the skill act.

LLM4RL (../shared/REFERENCE.md): a planner gives subgoals that skills carry out; asking it is
costly, so a mediator policy trained by RL with a cost per query learns when asking pays.

`MediatedEnv` wraps a `babyai_text.TextEnv`. Its actions are `MEDIATOR_ACTIONS`:

- "ask" (0): the planner's subgoal replaces the current one, then its skill acts;
- "continue" (1): the current subgoal's skill acts.

Either way one primitive action is taken per step (the skill's next action, `glam.skills`).
When the current skill has nothing left to do or cannot act, the agent must ask: that query
is made right away, after the step that ended the skill (and at the start of every episode), so
that each decision the policy makes is a real choice between two skills. `ask.mode` says who
decides: the policy (`learned`), nobody but the forced queries (`skill_end`), every step
(`always`), a coin of probability `ask.probability` (`random`); `ask.budget` caps the queries by
choice per episode.

Reward of a step: BabyAI's, minus the cost of the queries since the last decision (that of the
step, and the forced one after it; the episode's first query, made at reset, is paid at its
first step), each `query_cost`: `lambda + 0.1 * f_rep`, f_rep = 1 when the planner repeats its
previous subgoal of the episode, -0.1 when it changes it, 0 on the episode's first query (the
authors' code).

What the policy reads. With `ask.show_subgoal` the mission becomes "<mission> | subgoal:
<current subgoal>". The symbolic network has no memory: from the view alone it cannot tell
"exploring, and the door just came into view" (asking pays) from "already going to the door"
(asking repeats the subgoal and costs 0.11). LLM4RL's mediator reads the change in observation
for the same reason. In the toy setting of tests/test_ask.py (asking pays only while a skill
spins with the target in view), the mediator learned to ask there with the subgoal shown, and
learned never to ask without it (seed 1, 3072 frames). Whether the skill is still running need not be shown: a skill that ends
forces a query before the policy is asked again.

A subgoal the planner gives whose skill cannot act now (already done, nothing to drop, an action
outside the env's action space) is passed over for the next in the planner's order; when no
candidate's skill can act, the env's first action (a turn) is taken and the next step asks again.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, fields
from typing import Any, SupportsFloat

import gymnasium as gym
import numpy as np
from gymnasium import spaces
from gymnasium.error import ResetNeeded

from glam.ask.config import AskConfig
from glam.ask.planner import Planner
from glam.skills import SkillMap

__all__ = ["ASK", "CONTINUE", "MEDIATOR_ACTIONS", "AskCounts", "MediatedEnv", "query_cost"]

MEDIATOR_ACTIONS: tuple[str, ...] = ("ask", "continue")
"""The mediator's action words, in index order."""
ASK, CONTINUE = 0, 1


def query_cost(previous: str | None, subgoal: str, cfg: AskConfig) -> float:
    """The cost of a query answered `subgoal` when the episode's previous answer was `previous`
    (None: the first query): `cfg.cost + cfg.repeat_cost * f_rep`."""
    if previous is None:
        repeat = 0.0
    elif subgoal == previous:
        repeat = 1.0
    else:
        repeat = -0.1
    return cfg.cost + cfg.repeat_cost * repeat


@dataclass
class AskCounts:
    """Sums over episodes (summable over envs and processes)."""

    episodes: int = 0
    decisions: int = 0
    """Steps (one decision of the mediator each)."""
    chosen: int = 0
    """Queries by choice (the policy's, or the mode's: always, random)."""
    forced: int = 0
    """Queries because the skill ended or could not act (and at each episode's start)."""
    cost: float = 0.0
    """Query costs subtracted from the rewards."""
    latency_s: float = 0.0
    """Seconds spent in the planner."""

    @property
    def queries(self) -> int:
        return self.chosen + self.forced

    def add(self, other: AskCounts) -> None:
        for item in fields(self):
            setattr(self, item.name, getattr(self, item.name) + getattr(other, item.name))

    def as_list(self) -> list[float]:
        return [float(getattr(self, item.name)) for item in fields(self)]


class MediatedEnv(gym.Wrapper):
    """A `TextEnv` played through a planner and skills (see the module docstring)."""

    def __init__(
        self,
        env: gym.Env,
        planner: Planner,
        cfg: AskConfig,
        *,
        make_skills: Callable[[Any], SkillMap] = SkillMap,
    ) -> None:
        """
        Args:
            env: a `babyai_text.TextEnv` (its `action_space_def` maps skills' actions).
            planner: this env's planner.
            cfg: the `ask` settings (`mode` other than `none`).
            make_skills: the skills of an episode, from the minigrid env at its start.
        """
        super().__init__(env)
        if cfg.mode == "none":
            raise ValueError("ask.mode='none' has no mediated env: the agent acts itself")
        self.cfg = cfg
        self.planner = planner
        self.make_skills = make_skills
        self.action_words: tuple[str, ...] = MEDIATOR_ACTIONS
        self.action_space = spaces.Discrete(len(MEDIATOR_ACTIONS))
        self._minigrid_actions: tuple[int, ...] = env.action_space_def.minigrid_actions
        self.subgoal: str | None = None
        """The subgoal whose skill acts at the next step."""
        self.totals = AskCounts()
        """The counts of the episodes that ended since the last `pop_counts`."""
        self._episode: AskCounts | None = None
        self._skills: SkillMap | None = None
        self._next_action: int | None = None
        self._previous: str | None = None
        self._unpaid = 0.0
        self._rng = np.random.default_rng()

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[dict[str, Any], dict[str, Any]]:
        """Start an episode and ask the planner for its first subgoal (paid at the first step)."""
        obs, info = self.env.reset(seed=seed, options=options)
        if seed is not None:  # `random` mode's coins: reproducible per episode seed
            self._rng = np.random.default_rng([seed, 1])
        self._episode = AskCounts(episodes=1)
        self._skills = self.make_skills(self.env.unwrapped)
        self._skills.observe()
        self.planner.reset(self.env)
        self._previous = self.subgoal = None
        self._unpaid = self._query(forced=True)
        return self._observation(obs), {**info, "ask": self._step_record(False, 1, 0.0)}

    def step(
        self, action: int | str
    ) -> tuple[dict[str, Any], SupportsFloat, bool, bool, dict[str, Any]]:
        """Ask or continue (an index of `MEDIATOR_ACTIONS` or the word), then take the skill's
        action; the reward is BabyAI's minus the queries' costs.

        `info["ask"]`: `chosen` (a query by choice at this step), `forced` (queries forced
        after it), `subgoal` (the subgoal now), `cost` (subtracted from this step's reward).
        """
        if self._episode is None:
            raise ResetNeeded("call reset() before step() (and after an episode ended)")
        episode = self._episode
        cost, self._unpaid = self._unpaid, 0.0
        chosen = self._chooses_to_ask(self._action_index(action))
        if chosen:
            cost += self._query(forced=False)
        minigrid_action = self._next_action
        index = 0 if minigrid_action is None else self._minigrid_actions.index(minigrid_action)
        obs, reward, terminated, truncated, info = self.env.step(index)
        episode.decisions += 1
        forced = 0
        if not (terminated or truncated):
            self._skills.observe()
            self.planner.observe(self._minigrid_actions[index])
            self._next_action = self._skill_action(self.subgoal)
            if self._next_action is None:
                cost += self._query(forced=True)
                forced = 1
        episode.cost += cost
        if terminated or truncated:
            self.totals.add(episode)
            self._episode = None
        info = {**info, "ask": self._step_record(chosen, forced, cost)}
        return self._observation(obs), float(reward) - cost, terminated, truncated, info

    def pop_counts(self) -> AskCounts:
        """The counts of the episodes that ended since the last call."""
        counts, self.totals = self.totals, AskCounts()
        return counts

    def _action_index(self, action: int | str) -> int:
        if isinstance(action, str) and action in MEDIATOR_ACTIONS:
            return MEDIATOR_ACTIONS.index(action)
        if action in (ASK, CONTINUE) and not isinstance(action, bool):
            return int(action)
        raise ValueError(
            f"invalid mediator action {action!r}; allowed: {list(MEDIATOR_ACTIONS)} or 0, 1"
        )

    def _chooses_to_ask(self, action: int) -> bool:
        """Whether this step asks by choice: the mode's rule, within the episode's budget."""
        mode = self.cfg.mode
        if mode == "learned":
            wants = action == ASK
        elif mode == "always":
            wants = True
        elif mode == "random":
            wants = bool(self._rng.random() < self.cfg.probability)
        else:  # skill_end
            wants = False
        return wants and not (self.cfg.budget and self._episode.chosen >= self.cfg.budget)

    def _query(self, *, forced: bool) -> float:
        """Ask the planner; adopt its first subgoal whose skill can act. Returns the cost."""
        start = time.perf_counter()
        ranked = self.planner.plan(self.env)
        self._episode.latency_s += time.perf_counter() - start
        self._episode.forced += int(forced)
        self._episode.chosen += int(not forced)
        subgoal, action = (ranked[0] if ranked else None), None
        for candidate in ranked:
            action = self._skill_action(candidate)
            if action is not None:
                subgoal = candidate
                break
        cost = query_cost(self._previous, subgoal, self.cfg)
        self._previous = self.subgoal = subgoal
        self._next_action = action
        return cost

    def _skill_action(self, subgoal: str | None) -> int | None:
        """The subgoal's skill's next minigrid action, if it has one in the env's actions."""
        if subgoal is None:
            return None
        action = self._skills.next_action(subgoal)
        return action if action in self._minigrid_actions else None

    @property
    def mission(self) -> str:
        """The mission the policy reads, as in the observations this env returns: with
        `show_subgoal`, "<mission> | subgoal: <current subgoal>" (a reader of the grid that
        takes `env.mission`, as the evaluation harness's does, sees what training showed)."""
        mission = self.env.mission
        if not self.cfg.show_subgoal:
            return mission
        return f"{mission} | subgoal: {self.subgoal or 'none'}"

    def _observation(self, obs: dict[str, Any]) -> dict[str, Any]:
        return {**obs, "mission": self.mission}

    def _step_record(self, chosen: bool, forced: int, cost: float) -> dict[str, Any]:
        return {"chosen": chosen, "forced": forced, "subgoal": self.subgoal, "cost": cost}
