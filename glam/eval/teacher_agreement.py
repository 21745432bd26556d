"""How often a teacher chooses the subgoal BabyAI's bot pursues, on seeded situations.

A situation is a state of one of the bot's own episodes: level `level`, episode seed
`seed + i`, the bot played for a number of steps drawn uniformly from its episode's length (a
generator seeded with `seed`). In it the teacher weighs the candidate subgoals of the view
(`glam.skills.candidate_subgoals`); the reference is the bot's current subgoal in the same words
(`glam.skills.expert_subgoal`). Reported, with Wilson 95% intervals:

- coverage: the bot's subgoal is among the candidates (it is not when the bot walks to a cell,
  e.g. to put an object next to another);
- subgoal agreement: the teacher's most probable subgoal is the bot's (chance: the mean of
  1 / number of candidates, what picking a candidate at random scores; ties are broken at
  random, so the uniform teacher scores chance);
- action agreement: the most probable action of the teacher's mixture of the skills' next
  actions is the bot's action;
- the mean probability the teacher gives the bot's subgoal and the bot's action.
"""

from __future__ import annotations

import contextlib
import io
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from typing import Any

import gymnasium as gym
import minigrid  # noqa: F401 (registers the BabyAI levels)
import numpy as np
import torch
from minigrid.core.actions import Actions
from minigrid.utils.baby_ai_bot import BabyAIBot
from tqdm import tqdm

from glam.eval.stats import wilson_interval
from glam.skills import SkillMap, candidate_subgoals, expert_subgoal
from glam.teach.teacher import SubgoalTeacher, situation_prompt

__all__ = ["MINIGRID_ACTIONS", "Situation", "TeacherAgreement", "measure_agreement", "situations"]

MINIGRID_ACTIONS = tuple(int(a) for a in Actions if a != Actions.done)


@dataclass
class Situation:
    """One state of a bot episode, with what the bot does there."""

    episode_seed: int
    step: int
    prompt: str
    candidates: list[str]
    bot_subgoal: str
    bot_action: int
    next_actions: list[int | None]
    """Each candidate's skill's next action."""


def situations(level: str, count: int, seed: int) -> Iterator[Situation]:
    """`count` seeded situations of the level (see the module docstring)."""
    rng = np.random.default_rng(seed)
    episode = 0
    produced = 0
    while produced < count:
        episode_seed = seed + episode
        episode += 1
        length = _bot_episode_length(level, episode_seed)
        if length == 0:
            continue
        stop = int(rng.integers(0, length))
        env = _made(level, episode_seed)
        bot, skills = BabyAIBot(env.unwrapped), SkillMap(env.unwrapped)
        for step in range(stop + 1):
            skills.observe()
            action = int(bot.replan())
            if step == stop:
                break
            env.step(action)
        subgoal = expert_subgoal(bot)
        if subgoal is None:
            continue
        u = env.unwrapped
        candidates = candidate_subgoals(u)
        carried = f"{u.carrying.color} {u.carrying.type}" if u.carrying is not None else None
        situation = Situation(
            episode_seed=episode_seed,
            step=stop,
            prompt=situation_prompt(u.mission, candidates, carried),
            candidates=candidates,
            bot_subgoal=subgoal,
            bot_action=action,
            next_actions=[skills.next_action(c) for c in candidates],
        )
        env.close()
        produced += 1
        yield situation


def _made(level: str, episode_seed: int) -> gym.Env:
    """The level reset at `episode_seed`, without BabyAI's prints of rejected samples."""
    env = gym.make(level)
    with contextlib.redirect_stdout(io.StringIO()):
        env.reset(seed=episode_seed)
    return env


def _bot_episode_length(level: str, episode_seed: int) -> int:
    """Steps the bot takes to solve the episode (0: it fails or gives up)."""
    env = _made(level, episode_seed)
    bot = BabyAIBot(env.unwrapped)
    try:
        for step in range(env.unwrapped.max_steps):
            _, reward, terminated, truncated, _ = env.step(bot.replan())
            if terminated or truncated:
                return step + 1 if reward > 0 else 0
    except Exception:  # the bot gives up by raising
        return 0
    finally:
        env.close()
    return 0


def _argmax(probs: torch.Tensor, rng: np.random.Generator) -> int:
    """The most probable index; one of the tied ones at random."""
    best = torch.nonzero(probs >= probs.max() - 1e-9).flatten().tolist()
    return int(best[rng.integers(len(best))]) if len(best) > 1 else int(best[0])


@dataclass
class TeacherAgreement:
    """The measures of the module docstring, over `situations` situations."""

    teacher: str
    situations: int
    coverage: float
    subgoal_agreement: float
    subgoal_agreement_ci: tuple[float, float]
    chance: float
    action_agreement: float
    action_agreement_ci: tuple[float, float]
    bot_subgoal_probability: float
    bot_action_probability: float
    llm_calls: int

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def measure_agreement(
    teacher: SubgoalTeacher, cases: list[Situation], name: str, *, progress: bool = False
) -> tuple[TeacherAgreement, list[dict[str, Any]]]:
    """The teacher's agreement with the bot on the situations, and one record per situation
    (`progress`: a progress bar over the situations scored)."""
    probabilities: list[torch.Tensor] = []
    with tqdm(total=len(cases), desc=name, unit="situation", disable=not progress) as bar:
        for start in range(0, len(cases), 10):
            chunk = cases[start : start + 10]
            probabilities += teacher.subgoal_probabilities(
                [case.prompt for case in chunk], [case.candidates for case in chunk]
            )
            bar.update(len(chunk))
    rng = np.random.default_rng(0)  # ties (the uniform teacher's) are broken at random
    records = []
    covered = subgoal_hits = action_hits = 0
    subgoal_mass = action_mass = chance = 0.0
    for case, probs in zip(cases, probabilities, strict=True):
        chosen = case.candidates[_argmax(probs, rng)]
        mix = torch.zeros(len(MINIGRID_ACTIONS))
        for p, action in zip(probs.tolist(), case.next_actions, strict=True):
            if action is not None and action in MINIGRID_ACTIONS:
                mix[MINIGRID_ACTIONS.index(action)] += p
        mix = mix / mix.sum() if mix.sum() > 0 else torch.full_like(mix, 1 / len(mix))
        bot_action = MINIGRID_ACTIONS.index(case.bot_action)
        covered += case.bot_subgoal in case.candidates
        subgoal_hits += chosen == case.bot_subgoal
        teacher_action = _argmax(mix, rng)
        action_hits += teacher_action == bot_action
        if case.bot_subgoal in case.candidates:
            subgoal_mass += float(probs[case.candidates.index(case.bot_subgoal)])
        action_mass += float(mix[bot_action])
        chance += 1 / len(case.candidates)
        records.append(
            {
                **asdict(case),
                "teacher_subgoal": chosen,
                "subgoal_probabilities": [round(p, 4) for p in probs.tolist()],
                "teacher_action": MINIGRID_ACTIONS[teacher_action],
            }
        )
    n = len(cases)
    counts = teacher.pop_counts()
    return (
        TeacherAgreement(
            teacher=name,
            situations=n,
            coverage=covered / n,
            subgoal_agreement=subgoal_hits / n,
            subgoal_agreement_ci=wilson_interval(subgoal_hits, n),
            chance=chance / n,
            action_agreement=action_hits / n,
            action_agreement_ci=wilson_interval(action_hits, n),
            bot_subgoal_probability=subgoal_mass / n,
            bot_action_probability=action_mass / n,
            llm_calls=counts.llm_calls,
        ),
        records,
    )
