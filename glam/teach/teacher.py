"""The teacher's action distribution in the current state of each env.

LLM4Teach's teacher (../shared/REFERENCE.md): a language model weighs the candidate subgoals of
the situation; each subgoal's skill says what it would do next; the teacher's action
distribution is the mix of those actions, weighted by the subgoals' probabilities. Here the
probabilities are exact: `softmax(log P(subgoal | situation) / temperature)` from one scoring
pass (the authors sample the model several times and count answers).

The situation is abstracted as LLM4Teach does, so that the model is asked once per distinct
situation, not once per state: the mission, the objects in view (no distances), what the agent
carries, and the candidates. `SubgoalTeacher` caches the probabilities per situation text.

Teachers:
- `SubgoalTeacher` with a `SubgoalScorer`: the LLM teacher;
- `SubgoalTeacher` without one: every applicable subgoal equally (the uniform control);
- `BotTeacher`: BabyAI's bot's next action (the oracle control).

Each keeps per-slot episode state (the skills' map, the bot's plan); a slot is an env position,
stable over an episode and reused by the next one (the trainer's env index, the evaluation
harness's slot).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
from minigrid.core.actions import Actions
from minigrid.utils.baby_ai_bot import BabyAIBot

from glam.skills import SkillMap, candidate_subgoals

if TYPE_CHECKING:
    from glam.teach.scorers import SubgoalScorer

__all__ = ["BotTeacher", "SubgoalTeacher", "Teacher", "TeacherCounts", "situation_prompt"]


def situation_prompt(mission: str, candidates: Sequence[str], carrying: str | None) -> str:
    """The abstracted situation the language model reads, ending where a subgoal follows.

    The objects in view are those the candidates go to ("go to the red ball" -> "a red ball").
    The candidates themselves are not listed: every token of the prompt costs a forward pass
    per distinct situation, and the subgoals are scored as continuations anyway.
    """
    seen = [c.removeprefix("go to the ") for c in candidates if c.startswith("go to the ")]
    return (
        f"Goal: {mission}\n"
        f"You see: {', '.join(f'a {thing}' for thing in seen) or 'nothing'}\n"
        f"You carry: {f'a {carrying}' if carrying else 'nothing'}\n"
        "Next subgoal:"
    )


@dataclass
class TeacherCounts:
    """What the teacher did since the last `pop_counts` (summable over processes)."""

    states: int = 0
    """States it was asked about."""
    llm_calls: int = 0
    """Situations the language model scored."""
    cache_hits: int = 0
    """Situations answered from the cache."""

    def as_list(self) -> list[float]:
        return [float(self.states), float(self.llm_calls), float(self.cache_hits)]


class Teacher(ABC):
    """An action distribution over an action space, per env, from the env's true state."""

    def __init__(self, minigrid_actions: Sequence[int]) -> None:
        """`minigrid_actions[i]` is minigrid's action for action index i of the space."""
        self.minigrid_actions = tuple(int(a) for a in minigrid_actions)
        self.counts = TeacherCounts()

    @abstractmethod
    def distributions(
        self, envs: Sequence[Any], slots: Sequence[int], new_episode: Sequence[bool]
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The teacher's action distribution in the current state of each env.

        Args:
            envs: `babyai_text.TextEnv`s (their minigrid env is `env.unwrapped`).
            slots: each env's slot (see the module docstring).
            new_episode: True at the first state of an episode in that slot.

        Returns:
            `(probs, valid)`: `(n, actions)` probabilities and `(n,)` True where the teacher
            has advice (a row without advice is uniform).
        """

    def record_actions(self, slots: Sequence[int], actions: Sequence[int]) -> None:  # noqa: B027
        """The actions (indices of the space) the agent took in those slots' last states."""

    def pop_counts(self) -> TeacherCounts:
        """The counts since the last call."""
        counts, self.counts = self.counts, TeacherCounts()
        return counts

    def close(self) -> None:  # noqa: B027 (nothing to release by default)
        """Release the scorer's model or connections."""

    def _index(self, minigrid_action: int | None) -> int | None:
        """The space's index of a minigrid action (None if the space lacks it)."""
        if minigrid_action is None or minigrid_action not in self.minigrid_actions:
            return None
        return self.minigrid_actions.index(minigrid_action)


class SubgoalTeacher(Teacher):
    """Candidate subgoals weighed by a language model (or equally), executed by skills."""

    def __init__(
        self,
        minigrid_actions: Sequence[int],
        scorer: SubgoalScorer | None = None,
        *,
        temperature: float = 1.0,
        cache: bool = True,
    ) -> None:
        """
        Args:
            minigrid_actions: the action space, as minigrid actions.
            scorer: log-likelihoods of subgoals after a situation; None: uniform weights.
            temperature: subgoal probabilities are `softmax(log-likelihood / temperature)`.
            cache: keep each situation's probabilities (the model is asked once per situation).
        """
        super().__init__(minigrid_actions)
        self.scorer = scorer
        self.temperature = temperature
        self.cache: dict[tuple[str, tuple[str, ...]], torch.Tensor] | None = {} if cache else None
        self._maps: dict[int, SkillMap] = {}

    def distributions(
        self, envs: Sequence[Any], slots: Sequence[int], new_episode: Sequence[bool]
    ) -> tuple[torch.Tensor, torch.Tensor]:
        situations, all_candidates = [], []
        for env, slot, new in zip(envs, slots, new_episode, strict=True):
            if new or slot not in self._maps:
                self._maps[slot] = SkillMap(env.unwrapped)
            self._maps[slot].observe()
            candidates = candidate_subgoals(env.unwrapped)
            carried = env.unwrapped.carrying
            carrying = f"{carried.color} {carried.type}" if carried is not None else None
            all_candidates.append(candidates)
            situations.append(situation_prompt(env.unwrapped.mission, candidates, carrying))
        weights = self.subgoal_probabilities(situations, all_candidates)
        probs = torch.zeros(len(envs), len(self.minigrid_actions))
        valid = torch.zeros(len(envs), dtype=torch.bool)
        for row, (slot, candidates, subgoal_probs) in enumerate(
            zip(slots, all_candidates, weights, strict=True)
        ):
            for subgoal, p in zip(candidates, subgoal_probs.tolist(), strict=True):
                action = self._index(self._maps[slot].next_action(subgoal))
                if action is not None:
                    probs[row, action] += p
            total = probs[row].sum()
            valid[row] = total > 0
            probs[row] = probs[row] / total if total > 0 else 1.0 / len(self.minigrid_actions)
        self.counts.states += len(envs)
        return probs, valid

    def subgoal_probabilities(
        self, situations: Sequence[str], candidates: Sequence[Sequence[str]]
    ) -> list[torch.Tensor]:
        """Each situation's probabilities over its candidate subgoals (from the cache, or one
        batched scoring of the situations it lacks).

        A situation is its text and its candidates: the same text can come with other
        candidates (an open and a closed door read alike; only the closed one can be opened).
        """
        if self.scorer is None:
            return [torch.full((len(c),), 1.0 / len(c)) for c in candidates]
        keys = [(s, tuple(c)) for s, c in zip(situations, candidates, strict=True)]
        answers: dict[tuple[str, tuple[str, ...]], torch.Tensor] = {}
        missing: list[tuple[str, tuple[str, ...]]] = []
        for key in keys:
            if self.cache is not None and key in self.cache:
                answers[key] = self.cache[key]
                self.counts.cache_hits += 1
            elif key not in missing:
                missing.append(key)
        if missing:
            scores = self.scorer.log_likelihoods(
                [situation for situation, _ in missing], [list(c) for _, c in missing]
            )
            self.counts.llm_calls += len(missing)
            for key, score in zip(missing, scores, strict=True):
                answers[key] = torch.softmax(score.double() / self.temperature, -1).float()
                if self.cache is not None:
                    self.cache[key] = answers[key]
        return [answers[key] for key in keys]

    def close(self) -> None:
        if self.scorer is not None:
            self.scorer.close()


class BotTeacher(Teacher):
    """BabyAI's bot, advising: it replans after the agent's actual action (the oracle)."""

    def __init__(self, minigrid_actions: Sequence[int]) -> None:
        super().__init__(minigrid_actions)
        self._bots: dict[int, BabyAIBot | None] = {}
        self._last: dict[int, int | None] = {}

    def distributions(
        self, envs: Sequence[Any], slots: Sequence[int], new_episode: Sequence[bool]
    ) -> tuple[torch.Tensor, torch.Tensor]:
        n_actions = len(self.minigrid_actions)
        probs = torch.full((len(envs), n_actions), 1.0 / n_actions)
        valid = torch.zeros(len(envs), dtype=torch.bool)
        for row, (env, slot, new) in enumerate(zip(envs, slots, new_episode, strict=True)):
            if new or slot not in self._bots:
                self._bots[slot], self._last[slot] = _new_bot(env), None
            bot = self._bots[slot]
            if bot is None:
                continue
            try:
                suggestion = int(bot.replan(self._last[slot]))
            except Exception:  # the bot gives up by raising (assertions, a box opened...)
                self._bots[slot] = None
                continue
            # Until the agent's action is known the bot assumes it takes its suggestion.
            self._last[slot] = None
            action = self._index(suggestion if suggestion != Actions.done else None)
            if action is not None:
                probs[row] = 0.0
                probs[row, action] = 1.0
                valid[row] = True
        self.counts.states += len(envs)
        return probs, valid

    def record_actions(self, slots: Sequence[int], actions: Sequence[int]) -> None:
        for slot, action in zip(slots, actions, strict=True):
            if slot in self._last:
                self._last[slot] = self.minigrid_actions[action]


def _new_bot(env: Any) -> BabyAIBot | None:
    try:
        return BabyAIBot(env.unwrapped)
    except (AssertionError, AttributeError):  # an instruction the bot does not know
        return None
