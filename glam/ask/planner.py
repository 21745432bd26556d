"""Planners: the subgoal to pursue next in an env's current state, among the view's candidates.

- `LLMPlanner`: a language model scores each candidate subgoal (`glam.skills.candidate_subgoals`)
  as a continuation of the situation text of LLM4Teach's teacher (`situation_prompt`: mission,
  objects in view, carried object); the planner's answer is the best-scored candidate (argmax),
  the others follow in score order. The scorer runs in this process (`LocalScorer`) or behind
  an OpenAI-compatible endpoint (`OpenAIScorer`); one scorer serves every planner of a process.
- `BotPlanner`: BabyAI's bot, following the episode, names the subgoal it pursues in the same
  words (`glam.skills.expert_subgoal`): the oracle planner.

A planner serves one env at a time: `reset` at each episode's start, `observe` after each of the
agent's actions (the bot keeps its plan and map of seen cells in step with the episode), `plan`
when asked. The ranking beyond the first subgoal is the fallback of the caller when the best
subgoal's skill cannot act (`glam.ask.mediated`).

The planner's choice is the LLM teacher's most probable subgoal, so its accuracy against the bot
is the teacher's subgoal agreement (`scripts/teacher_agreement.py`, `glam.eval.teacher_agreement`).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any

import torch
from minigrid.utils.baby_ai_bot import BabyAIBot

from glam.skills import candidate_subgoals, expert_subgoal
from glam.teach.scorers import SubgoalScorer
from glam.teach.teacher import SubgoalTeacher, TeacherCounts, situation_prompt

__all__ = ["BotPlanner", "LLMPlanner", "Planner"]


class Planner(ABC):
    """Subgoals for an env's current state, best first."""

    def reset(self, env: Any) -> None:  # noqa: B027 (stateless planners need nothing)
        """A new episode has started in `env` (a BabyAI env, possibly wrapped)."""

    def observe(self, action: int) -> None:  # noqa: B027
        """The agent took minigrid action `action`, and the episode goes on."""

    @abstractmethod
    def plan(self, env: Any) -> list[str]:
        """The candidate subgoals of `env`'s view, best first (the planner's answer first)."""

    def pop_counts(self) -> TeacherCounts:
        """Situations the language model scored and answered from the cache since the last
        call (zeros for planners without a model)."""
        return TeacherCounts()


class LLMPlanner(Planner):
    """The argmax of a language model's scores of the candidate subgoals (module docstring)."""

    def __init__(self, scorer: SubgoalScorer, *, cache: bool = False) -> None:
        """`scorer` is shared, not owned (its owner closes it); `cache`: one scoring per distinct
        situation (off: every query runs the model)."""
        # The teacher's scoring path: the same prompt, cache key and counts; its temperature
        # does not change the order.
        self._chooser = SubgoalTeacher((), scorer, cache=cache)

    def plan(self, env: Any) -> list[str]:
        base = env.unwrapped
        candidates = candidate_subgoals(base)
        carried = base.carrying
        carrying = f"{carried.color} {carried.type}" if carried is not None else None
        prompt = situation_prompt(base.mission, candidates, carrying)
        probs = self._chooser.subgoal_probabilities([prompt], [candidates])[0]
        order = torch.sort(probs, descending=True, stable=True).indices  # ties: listed order
        return [candidates[i] for i in order.tolist()]

    def pop_counts(self) -> TeacherCounts:
        return self._chooser.pop_counts()


class BotPlanner(Planner):
    """BabyAI's bot's current subgoal, then the other candidates in listed order.

    The bot replans after every action of the agent (whatever the agent did), as the oracle
    teacher does (`glam.teach.teacher.BotTeacher`). Where it gives up (it raises on some
    states) or names no subgoal, the candidates come in listed order ("explore" last).
    """

    def __init__(self) -> None:
        self._bot: BabyAIBot | None = None

    def reset(self, env: Any) -> None:
        try:
            self._bot = BabyAIBot(env.unwrapped)
        except (AssertionError, AttributeError):  # an instruction the bot does not know
            self._bot = None
        self._replan(None)

    def observe(self, action: int) -> None:
        self._replan(action)

    def _replan(self, action: int | None) -> None:
        if self._bot is None:
            return
        try:
            self._bot.replan(action)
        except Exception:  # the bot gives up by raising (assertions, a box opened...)
            self._bot = None

    def plan(self, env: Any) -> list[str]:
        candidates = candidate_subgoals(env.unwrapped)
        subgoal = expert_subgoal(self._bot) if self._bot is not None else None
        if subgoal is None:
            return candidates
        # The bot may name an object out of view (a door it saw before): still its answer.
        return [subgoal, *(c for c in candidates if c != subgoal)]
