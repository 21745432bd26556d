"""Play exactly N seeded evaluation episodes of one suite, batched over many envs.

What the suite plays (level, action words, language) is `glam.eval.suites.plan_suite`'s; a
suite that is not applicable to the agent plays no episode and says why.

Episode k (k = 0 .. N-1) is reset with seed `seed_base + k`, whichever env slot plays it, and
its sampling RNG is seeded from that seed too; so an episode's outcome depends only on its seed
and the agent, not on `num_envs` or on which slot freed up first. Slots with no episode left to
play stop being stepped: no extra episode is started, none is counted twice.

A suite can continue an earlier, interrupted run of it (`SuiteProgress`, from
`glam.eval.journal`): its finished episodes are kept and their seeds not played again.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

import babyai_text
from glam.eval.agents import ActRequest, Agent, Decision, History
from glam.eval.generation import BalrogDialogue
from glam.eval.journal import SuiteProgress
from glam.eval.stats import EpisodeResult
from glam.eval.suites import TASK_FAMILIES, Suite, SuitePlan, plan_suite
from glam.llm.chat import Message, render_transcript
from glam.policy.balrog import NO_OP_NAME

__all__ = [
    "PROBE_SEEDS",
    "TASK_FAMILIES",
    "SuiteRun",
    "plan_for",
    "prompt_format_of",
    "run_suite",
]

PROBE_SEEDS = 20
"""First seeds of a suite whose missions `plan_suite` checks before any episode is played."""


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
    rewritten: int = 0
    """Prompts of the episode that the suite's rewrite changed."""
    invalid_actions: int = 0
    actions: list[str] = field(default_factory=list)
    """The actions played so far (`EpisodeResult.actions`)."""


@dataclass
class SuiteRun(SuiteProgress):
    """Episodes of one suite, what it played, and how often the rewrite changed the prompt."""

    plan: SuitePlan = field(kw_only=True)
    """Level, action words, language and prompt format played; or why the suite was not."""

    @property
    def suite(self) -> Suite:
        return self.plan.suite

    @property
    def level(self) -> str:
        """Level id the suite played."""
        return self.plan.level


def plan_for(
    agent: Agent, suite: Suite, *, level: str, action_space: str | None, seed_base: int
) -> SuitePlan:
    """What `suite` plays for `agent` on `level` (`plan_suite`), its first seeds probed."""
    return plan_suite(
        suite,
        level=level,
        action_space=action_space,
        prompt_format=prompt_format_of(agent),
        probe_seeds=range(seed_base, seed_base + PROBE_SEEDS),
    )


def prompt_format_of(agent: Agent) -> str:
    """How `agent`'s prompts are written: `glam`, `chat`, `balrog`; `none` if it reads no text,
    `grid` if it reads the grid and the mission instead of the prompt."""
    if agent.prompt_format is not None:
        return agent.prompt_format
    history = agent.new_history(1)
    if isinstance(history, BalrogDialogue):
        return "balrog"
    return getattr(history, "prompt_format", "glam")


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
    distractors: int | None = None,
    earlier: SuiteProgress | None = None,
    on_episode_end: Callable[[EpisodeResult, SuiteRun], None] | None = None,
    on_step: Callable[[int], None] | None = None,
) -> SuiteRun:
    """Play `episodes` episodes of `suite` with `agent` and return them in seed order.

    A suite that is not applicable to the agent (`plan_suite`) plays none: its run holds the
    reason (`run.plan.not_applicable`) and no episode.

    Args:
        agent: the agent; it reads the rewritten prompts (or the envs, for the bot).
        suite: the suite; its level, action space and language override the defaults.
        level: the evaluated level: played unless the suite brings its own.
        episodes: number of episodes, each counted once.
        num_envs: env slots stepped together (capped at `episodes`).
        seed_base: seed of episode 0; episode k uses `seed_base + k`.
        nbr_obs: observations kept in the prompt.
        action_space: the agent's action space; None: the level's default. A suite's action
            space (renamed, French) gives its words for these actions (`reworded`); lacking
            one, the suite is not applicable.
        max_steps: episode step limit; None keeps BabyAI's.
        per_task_type: instead of `episodes` in the level's mix, play this many episodes of each
            task type: the first seeds from `seed_base` on that draw it (`stratified_seeds`).
        distractors: objects in the room besides those the task needs (GLAM levels only,
            `babyai_text.levels.GlamLevel`); None keeps the level's own.
        earlier: what an interrupted run of this suite finished (`glam.eval.journal`): kept,
            its seeds not played again.
        on_episode_end: called with each finished episode and the run so far, its counters
            updated (progress bars, the journal).
        on_step: called after each step of the envs, with the number of envs it stepped.
    """
    plan = plan_for(agent, suite, level=level, action_space=action_space, seed_base=seed_base)
    run = SuiteRun(plan=plan)
    if earlier is not None:
        run.episodes = list(earlier.episodes)
        run.prompts_seen = earlier.prompts_seen
        run.prompts_rewritten = earlier.prompts_rewritten
        run.example_prompt = earlier.example_prompt
    if not plan.applies:
        return run
    make_kwargs: dict[str, Any] = plan.make_kwargs()
    if max_steps is not None:
        make_kwargs["max_steps"] = max_steps
    if distractors is not None:
        make_kwargs["distractors"] = distractors
    if per_task_type is not None:
        seeds = stratified_seeds(plan.level, per_task_type, seed_base, **make_kwargs)
    else:
        seeds = [seed_base + k for k in range(episodes)]
    finished = {episode.seed for episode in run.episodes}
    seeds = [seed for seed in seeds if seed not in finished]
    episodes = len(seeds)
    if not episodes:  # an interrupted run that had finished them all
        run.episodes.sort(key=lambda result: result.seed)
        return run
    text_envs = [
        babyai_text.make(plan.level, **make_kwargs) for _ in range(min(num_envs, episodes))
    ]
    envs = [agent.wrap_env(env) for env in text_envs]  # what the agent plays (the same by default)
    action_words = tuple(envs[0].action_words)
    next_episode = 0

    def start(slot_index: int) -> _Slot | None:
        nonlocal next_episode
        if next_episode >= episodes:
            return None
        seed = seeds[next_episode]
        next_episode += 1
        _, info = envs[slot_index].reset(seed=seed)
        history = agent.new_history(nbr_obs)
        history.add_observation(info["descriptions"])
        return _Slot(
            seed=seed,
            mission=text_envs[slot_index].mission,  # the env's, whatever a wrapper shows
            task_type=info.get("task_type"),
            history=history,
            rng=np.random.default_rng(seed),
        )

    slots = [start(i) for i in range(len(envs))]
    while any(slot is not None for slot in slots):
        active = [i for i, slot in enumerate(slots) if slot is not None]
        prompts, dialogues = [], []
        for i in active:
            original, prompt, messages = _render(slots[i], action_words, plan.language, suite)
            slots[i].rewritten += prompt != original
            prompts.append(prompt)
            dialogues.append(messages)
        if not run.example_prompt:
            run.example_prompt = prompts[0]
        request = ActRequest(
            prompts=prompts,
            action_words=action_words,
            envs=[envs[i] for i in active],
            slots=active,
            new_episode=[slots[i].new_episode for i in active],
            rngs=[slots[i].rng for i in active],
            messages=dialogues if all(m is not None for m in dialogues) else None,
        )
        decisions = agent.act(request)
        for i, decision in zip(active, decisions, strict=True):
            slot = slots[i]
            slot.new_episode = False
            action = babyai_text.NO_OP if decision.action is None else decision.action
            _, reward, terminated, truncated, info = envs[i].step(action)
            slot.episode_return += float(reward)
            slot.length += 1
            slot.invalid_actions += decision.invalid
            slot.actions.append("-" if decision.action is None else str(decision.action))
            _record(slot.history, decision, action_words)
            if terminated or truncated:
                result = EpisodeResult(
                    seed=slot.seed,
                    mission=slot.mission,
                    task_type=slot.task_type,
                    success=bool(info["success"]),
                    episode_return=slot.episode_return,
                    length=slot.length,
                    invalid_actions=slot.invalid_actions,
                    actions=" ".join(slot.actions),
                    figures=agent.episode_figures(envs[i]),
                )
                run.episodes.append(result)
                run.prompts_seen += slot.length  # one prompt a step
                run.prompts_rewritten += slot.rewritten
                if on_episode_end is not None:
                    on_episode_end(result, run)
                slots[i] = start(i)
            else:
                slot.history.add_observation(info["descriptions"])
        if on_step is not None:
            on_step(len(active))
    run.episodes.sort(key=lambda result: result.seed)
    return run


def _render(
    slot: _Slot, action_words: tuple[str, ...], language: str, suite: Suite
) -> tuple[str, str, list[Message] | None]:
    """`(original, prompt, messages)` of a slot: its prompt text before and after the suite's
    rewrite, and for a dialogue its rewritten chat turns (the prompt is then their transcript)."""
    if isinstance(slot.history, BalrogDialogue):
        turns = slot.history.messages(slot.mission, action_words)
        rewritten = [{**turn, "content": suite.rewrite(turn["content"])} for turn in turns]
        return render_transcript(turns), render_transcript(rewritten), rewritten
    original = slot.history.prompt(slot.mission, action_words, language)
    return original, suite.rewrite(original), None


def _record(history: History, decision: Decision, action_words: tuple[str, ...]) -> None:
    """Add the step's action to the history: a history that keeps answers (a dialogue, a writing
    policy's) keeps the agent's answer as said."""
    word = NO_OP_NAME if decision.action is None else action_words[decision.action]
    add_answer = getattr(history, "add_answer", None)
    if add_answer is not None and decision.answer is not None:
        add_answer(decision.answer, word, invalid=decision.invalid, reasoning=decision.reasoning)
    else:
        history.add_action(word)


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
