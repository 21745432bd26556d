"""Play exactly N seeded evaluation episodes of one suite, batched over many envs.

Episode k (k = 0 .. N-1) is reset with seed `seed_base + k`, whichever env slot plays it, and
its sampling RNG is seeded from that seed too; so an episode's outcome depends only on its seed
and the agent, not on `num_envs` or on which slot freed up first. Slots with no episode left to
play stop being stepped: no extra episode is started, none is counted twice.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

import babyai_text
from babyai_text.actions import reworded
from glam.eval.agents import ActRequest, Agent, History
from glam.eval.stats import EpisodeResult
from glam.eval.suites import Suite

TASK_FAMILIES = {"goto_after_pickup": "pickup_then_goto"}
"""Task types reported together: "go to Y after you pick up X" is "pick up X, then go to Y" in
its other phrasing, so MixedTrainLocal reports the paper's (and BALROG's) five task types."""

__all__ = ["SuiteRun", "run_suite"]


@dataclass
class _Slot:
    """The episode an env slot is playing."""

    seed: int
    mission: str
    task_type: str | None
    history: History
    rng: np.random.Generator
    new_episode: bool = True
    episode_return: float = 0.0
    length: int = 0
    invalid_actions: int = 0


@dataclass
class SuiteRun:
    """Episodes of one suite, and how often the rewrite changed the prompt."""

    suite: Suite
    level: str
    episodes: list[EpisodeResult]
    prompts_seen: int = 0
    """Prompts built (one per step)."""
    prompts_rewritten: int = 0
    """Prompts the suite's rewrite changed."""
    example_prompt: str = ""
    """The first prompt the agent read, after the rewrite."""


def run_suite(
    agent: Agent,
    suite: Suite,
    *,
    level: str,
    episodes: int,
    num_envs: int,
    seed_base: int,
    nbr_obs: int,
    action_space: str | None = None,
    max_steps: int | None = None,
    per_task_type: int | None = None,
    on_episode_end: Callable[[EpisodeResult], None] | None = None,
) -> SuiteRun:
    """Play `episodes` episodes of `suite` with `agent` and return them in seed order.

    Args:
        agent: the agent; it reads the rewritten prompts (or the envs, for the bot).
        suite: the suite; its level, action space and language override the defaults.
        level: level id when the suite brings none.
        episodes: number of episodes, each counted once.
        num_envs: env slots stepped together (capped at `episodes`).
        seed_base: seed of episode 0; episode k uses `seed_base + k`.
        nbr_obs: observations kept in the prompt.
        action_space: the agent's action space; None: the level's default. A suite's action
            space (renamed, French) gives its words for these actions (`reworded`).
        max_steps: episode step limit; None keeps BabyAI's.
        per_task_type: instead of `episodes` in the level's mix, play this many episodes of each
            task type: the first seeds from `seed_base` on that draw it (`stratified_seeds`).
        on_episode_end: called with each finished episode (progress bars).
    """
    level_id = suite.level or level
    make_kwargs: dict[str, Any] = {"language": suite.language}
    if suite.action_space and action_space:  # the suite's words for the agent's actions
        make_kwargs["action_space"] = reworded(suite.action_space, action_space)
    elif suite.action_space or action_space:
        make_kwargs["action_space"] = suite.action_space or action_space
    if max_steps is not None:
        make_kwargs["max_steps"] = max_steps
    if per_task_type is not None:
        seeds = stratified_seeds(level_id, per_task_type, seed_base, **make_kwargs)
    else:
        seeds = [seed_base + k for k in range(episodes)]
    episodes = len(seeds)
    envs = [babyai_text.make(level_id, **make_kwargs) for _ in range(min(num_envs, episodes))]
    action_words = tuple(envs[0].action_words)
    run = SuiteRun(suite=suite, level=level_id, episodes=[])
    next_episode = 0

    def start(slot_index: int) -> _Slot | None:
        nonlocal next_episode
        if next_episode >= episodes:
            return None
        seed = seeds[next_episode]
        next_episode += 1
        obs, info = envs[slot_index].reset(seed=seed)
        history = agent.new_history(nbr_obs)
        history.add_observation(info["descriptions"])
        return _Slot(
            seed=seed,
            mission=obs["mission"],
            task_type=info.get("task_type"),
            history=history,
            rng=np.random.default_rng(seed),
        )

    slots = [start(i) for i in range(len(envs))]
    while any(slot is not None for slot in slots):
        active = [i for i, slot in enumerate(slots) if slot is not None]
        prompts = []
        for i in active:
            original = slots[i].history.prompt(slots[i].mission, action_words, suite.language)
            prompt = suite.rewrite(original)
            run.prompts_seen += 1
            run.prompts_rewritten += prompt != original
            prompts.append(prompt)
        if not run.example_prompt:
            run.example_prompt = prompts[0]
        request = ActRequest(
            prompts=prompts,
            action_words=action_words,
            envs=[envs[i] for i in active],
            slots=active,
            new_episode=[slots[i].new_episode for i in active],
            rngs=[slots[i].rng for i in active],
        )
        decisions = agent.act(request)
        for i, decision in zip(active, decisions, strict=True):
            slot = slots[i]
            slot.new_episode = False
            _, reward, terminated, truncated, info = envs[i].step(decision.action)
            slot.episode_return += float(reward)
            slot.length += 1
            slot.invalid_actions += decision.invalid
            slot.history.add_action(action_words[decision.action])
            if terminated or truncated:
                result = EpisodeResult(
                    seed=slot.seed,
                    mission=slot.mission,
                    task_type=slot.task_type,
                    success=bool(info["success"]),
                    episode_return=slot.episode_return,
                    length=slot.length,
                    invalid_actions=slot.invalid_actions,
                )
                run.episodes.append(result)
                if on_episode_end is not None:
                    on_episode_end(result)
                slots[i] = start(i)
            else:
                slot.history.add_observation(info["descriptions"])
    run.episodes.sort(key=lambda result: result.seed)
    return run


def task_families(env: Any) -> set[str]:
    """The task types a GLAM level draws from (phrasings merged); empty for other levels."""
    return {TASK_FAMILIES.get(t, t) for t in getattr(env.unwrapped, "task_types", ())}


def stratified_seeds(level_id: str, per_type: int, seed_base: int, **make_kwargs: Any) -> list[int]:
    """The first `per_type` seeds from `seed_base` on that draw each task type of the level.

    The task types are the level's (`task_types` of a GLAM level, phrasings of one task
    counted together, see `TASK_FAMILIES`), or the one task of any other level. Seeds are
    returned in increasing order; the same arguments give the same seeds.
    """
    env = babyai_text.make(level_id, **make_kwargs)
    counts: dict[str, int] = dict.fromkeys(task_families(env), 0)
    seeds: list[int] = []
    seed = seed_base
    while not counts or min(counts.values()) < per_type:
        _, info = env.reset(seed=seed)
        family = TASK_FAMILIES.get(info["task_type"], info["task_type"])
        counts.setdefault(family, 0)  # a level with one task and no `task_types`
        if counts[family] < per_type:
            counts[family] += 1
            seeds.append(seed)
        seed += 1
        if seed - seed_base > 1000 * per_type * len(counts):
            raise RuntimeError(f"{level_id}: no {per_type} episodes of each of {sorted(counts)}")
    env.close()
    return seeds
