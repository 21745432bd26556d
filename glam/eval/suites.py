"""The post-training test suites: what each one changes, defined once in a table.

A suite changes one thing against the `no_change` baseline, and only that thing:

- a *prompt rewrite*: whole-word substitutions on the full text the model reads (the env, the
  mission it checks and the actions it accepts are untouched; only the words shown change);
- an *env change*: another language of the mission, descriptions, action words and prompt
  header on the evaluated level itself (`french`: same rooms, same seeds), other words for the
  agent's own actions (`renamed_actions`), or another level (`new_composition`).

Substitutions match whole words only ("red" becomes "vermilion", "reddish" or "bored" stay), keep
a leading capital ("Red" becomes "Vermilion"), and cover the plural of each noun ("keys" becomes
"chairs"), so a mission or description that used one would be rewritten too.

A suite may not apply to an agent; `plan_suite` says what a suite plays for an agent on the
evaluated level, or why it is *not applicable*:

- the suite's words must cover every action of the agent (no renamed word for "sleep");
- the agent's actions must be able to complete the suite's level (picking up two objects in turn
  needs "pick up" and "drop");
- the French suite needs a prompt with French headers (GLAM's text or chat format, not BALROG's)
  and missions that can be said in French;
- an agent that reads the grid instead of the prompt (`prompt_format="grid"`, BabyAI's symbolic
  actor-critic) is not evaluated on a suite that changes only words (prompt rewrites, French,
  renamed actions): they test how an agent reads the prompt, which it never sees; a suite that
  changes the env (another level) applies to it;
- a suite that brings its own level tests a *new composition* of what the evaluated level asks:
  every part of its missions (each action, the sequence of two) must be asked by the evaluated
  level, and none of its task types.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from functools import cached_property
from types import MappingProxyType
from typing import Any

from minigrid.core.actions import Actions

import babyai_text
from babyai_text.actions import ActionSpace, get_action_space, reworded

__all__ = [
    "SUITES",
    "Suite",
    "SuitePlan",
    "TASK_FAMILIES",
    "get_suites",
    "level_task_types",
    "plan_suite",
    "rewrite",
    "task_parts",
]

_OTHER_NOUNS = {"key": "chair", "ball": "table", "box": "car"}
_ADJ_SYNONYMS = {
    "red": "vermilion",
    "green": "jade",
    "blue": "cyan",
    "purple": "violet",
    "yellow": "golden",
    "grey": "silver",
}
_INVENTED_NOUNS = {"key": "dax", "ball": "xolo", "box": "afze"}
_INVENTED_ADJECTIVES = {
    "red": "faze",
    "green": "jatu",
    "blue": "croh",
    "purple": "vurst",
    "yellow": "gakul",
    "grey": "sil",
}
_GOAL_HEADER = "Goal of the agent"


def _plural(noun: str) -> str:
    return noun + ("es" if noun.endswith(("s", "x", "z", "ch", "sh")) else "s")


def _with_plurals(nouns: Mapping[str, str]) -> dict[str, str]:
    return {**nouns, **{_plural(old): _plural(new) for old, new in nouns.items()}}


@dataclass(frozen=True)
class Suite:
    """One post-training test: the changes it makes to the `no_change` set-up."""

    name: str
    """Name used to select the suite (`eval.suites`)."""
    description: str
    """One line for tables and reports."""
    substitutions: Mapping[str, str] = field(default_factory=dict)
    """Whole-word (or whole-phrase) replacements applied to the prompt text, old -> new."""
    level: str | None = None
    """Level played instead of `eval.level`; None keeps it."""
    action_space: str | None = None
    """Action space (a name in `babyai_text.ACTION_SPACES`); None keeps the level's own."""
    language: str = "en"
    """Language of the mission, the descriptions and the prompt headers."""
    needs_actions: tuple[str, ...] = ()
    """Minigrid actions (`Actions` names) without which the suite's level cannot be completed;
    an agent lacking one of them is not evaluated on it."""

    @cached_property
    def _pattern(self) -> re.Pattern[str] | None:
        if not self.substitutions:
            return None
        # Longest first, so that "keys" wins over "key" and a phrase over its words.
        words = sorted(self.substitutions, key=len, reverse=True)
        alternatives = "|".join(re.escape(word) for word in words)
        return re.compile(rf"\b({alternatives})\b", flags=re.IGNORECASE)

    @property
    def changes_words_only(self) -> bool:
        """The suite changes only words (of the prompt, the mission or the actions) and plays
        the evaluated level's rooms as they are."""
        changes_words = bool(self.substitutions) or self.language != "en" or bool(self.action_space)
        return changes_words and self.level is None

    def rewrite(self, text: str) -> str:
        """Apply the suite's substitutions to `text` (the whole prompt the model reads)."""
        if self._pattern is None:
            return text
        lowered = {old.lower(): new for old, new in self.substitutions.items()}

        def replace(match: re.Match[str]) -> str:
            found = match.group(0)
            new = lowered[found.lower()]
            return new[:1].upper() + new[1:] if found[:1].isupper() else new

        return self._pattern.sub(replace, text)


SUITES: Mapping[str, Suite] = MappingProxyType(
    {
        suite.name: suite
        for suite in (
            Suite("no_change", "the training set-up, unchanged"),
            Suite(
                "other_nouns",
                "other nouns of the same categories",
                _with_plurals(_OTHER_NOUNS),
            ),
            Suite("adj_synonyms", "colour synonyms", _ADJ_SYNONYMS),
            Suite("invented_nouns", "invented nouns", _with_plurals(_INVENTED_NOUNS)),
            Suite("invented_adjectives", "invented colour words", _INVENTED_ADJECTIVES),
            Suite(
                "invented_words",
                "invented nouns and colour words",
                {**_with_plurals(_INVENTED_NOUNS), **_INVENTED_ADJECTIVES},
            ),
            Suite(
                "intro_speaker",
                "goal introduced by a speaker",
                {_GOAL_HEADER: "I would like the agent to"},
            ),
            Suite("intro_agent", "goal addressed to the agent", {_GOAL_HEADER: "You have to"}),
            Suite(
                "french",
                "the same level in French: mission, descriptions, action words, prompt headers",
                action_space="french",
                language="fr",
            ),
            Suite(
                "renamed_actions",
                "synonyms of the action words",
                action_space="renamed",
            ),
            Suite(
                "new_composition",
                "pick up X, then pick up Y (never trained)",
                level="BabyAI-PickUpSeqPickUpLocal-v0",
                # The agent carries one object at a time: the first must be dropped.
                needs_actions=("left", "right", "forward", "pickup", "drop"),
            ),
        )
    }
)
"""Every post-training test suite, by name, in the paper's order."""


def get_suites(names: list[str] | tuple[str, ...]) -> list[Suite]:
    """The suites called `names`, in that order.

    Raises:
        ValueError: for an unknown or repeated name; the message lists the known ones.
    """
    unknown = [name for name in names if name not in SUITES]
    if unknown:
        raise ValueError(f"unknown suite(s) {unknown}; known suites: {', '.join(SUITES)}")
    repeated = sorted({name for name in names if list(names).count(name) > 1})
    if repeated:
        raise ValueError(f"suite(s) {repeated} listed more than once")
    if not names:
        raise ValueError(f"no suite given; known suites: {', '.join(SUITES)}")
    return [SUITES[name] for name in names]


def rewrite(suite_name: str, text: str) -> str:
    """Rewrite `text` as the suite called `suite_name` would show it to the model."""
    return get_suites([suite_name])[0].rewrite(text)


# ---------------------------------------------------------------------------------------------
# What a suite plays for one agent, or why it cannot
# ---------------------------------------------------------------------------------------------

TASK_FAMILIES = {"goto_after_pickup": "pickup_then_goto"}
"""Task types reported together: "go to Y after you pick up X" is "pick up X, then go to Y" in
its other phrasing, so MixedTrainLocal reports the paper's (and BALROG's) five task types."""

_SEQUENCE = "two actions in sequence"
_JOINERS = (("_then_", _SEQUENCE), ("_after_", _SEQUENCE), ("_and_", "two actions joined by and"))
_DEFAULT_SPACE = get_action_space("default")
_ENGLISH_WORDS = dict(zip(_DEFAULT_SPACE.minigrid_actions, _DEFAULT_SPACE.words, strict=True))
"""The usual English word of each minigrid action, for messages."""


@dataclass(frozen=True)
class SuitePlan:
    """What one suite plays for one agent on the evaluated level, or why it is not applicable."""

    suite: Suite
    level: str
    """Level id played: the suite's own, else the evaluated level."""
    action_space: ActionSpace
    """Action words offered to the agent, and the minigrid actions they stand for."""
    language: str
    """Language of the mission, descriptions and prompt headers."""
    prompt_format: str
    """How the agent's prompt is written: `glam`, `chat`, `balrog`, `none` (reads no text), or
    `grid` (reads the grid and the mission, not the prompt)."""
    not_applicable: str = ""
    """Why the suite cannot be played by this agent; empty when it can."""

    @property
    def applies(self) -> bool:
        return not self.not_applicable

    def make_kwargs(self) -> dict[str, Any]:
        """Keyword arguments of `babyai_text.make` for the suite's envs."""
        return {"action_space": self.action_space, "language": self.language}


def task_parts(task_type: str) -> set[str]:
    """What a task type is made of: its actions, and how two actions are joined.

    `pickup_then_goto` and `goto_after_pickup` are {pickup, goto, two actions in sequence};
    `goto` is {goto}.
    """
    for joiner, part in _JOINERS:
        if joiner in task_type:
            first, second = task_type.split(joiner, 1)
            return {*task_parts(first), *task_parts(second), part}
    return {task_type}


def level_task_types(level_id: str, seeds: Iterable[int] = ()) -> set[str]:
    """Task types a level asks: a GLAM level's own list, else those of its missions at `seeds`.

    Missions of no simple shape (some of BossLevel's) are left out; a level that is not a GLAM
    level, probed with no seed, gives the empty set (unknown).
    """
    env = babyai_text.make(level_id)
    declared = getattr(env.unwrapped, "task_types", None)
    types = set(declared) if declared else {env.reset(seed=s)[1]["task_type"] for s in seeds}
    env.close()
    return {task_type for task_type in types if task_type}


def plan_suite(
    suite: Suite,
    *,
    level: str,
    action_space: str | ActionSpace | None = None,
    prompt_format: str = "glam",
    probe_seeds: Sequence[int] = (),
) -> SuitePlan:
    """What `suite` plays for an agent evaluated on `level`, or why it is not applicable.

    Args:
        suite: the suite.
        level: the evaluated level (what `no_change` plays).
        action_space: the agent's action space; None: unknown, the level's default is played
            (and a suite's action space whole).
        prompt_format: how the agent's prompts are written (`glam`, `chat`, `balrog`, `none`,
            `grid`).
        probe_seeds: the evaluation's first seeds: their missions must be expressible in the
            suite's language, and they give the task types of a level that does not list them.
    """
    agent_space = get_action_space(action_space) if action_space else None
    words, reason = _suite_words(suite, agent_space)
    level_id = suite.level or level
    env = babyai_text.make(level_id, action_space=words, language=suite.language)
    plan = SuitePlan(suite, level_id, env.action_space_def, suite.language, prompt_format)
    reason = _reader_problem(plan) or reason or _missing_actions(plan) or _prompt_problem(plan)
    if not reason and suite.level:
        reason = _composition_problem(suite.level, level, probe_seeds)
    if not reason and suite.language != "en":
        reason = _translation_problem(env, probe_seeds)
    env.close()
    return replace(plan, not_applicable=reason)


def _words(space: ActionSpace) -> str:
    return ", ".join(space.words)


def _suite_words(suite: Suite, agent_space: ActionSpace | None) -> tuple[ActionSpace | None, str]:
    """The suite's words for the agent's actions (None: the env's default), or why there are none."""
    if suite.action_space is None or agent_space is None:
        # The agent's own words; or, the agent's actions being unknown, the suite's whole space.
        name = suite.action_space or agent_space
        return (get_action_space(name) if name else None), ""
    suite_space = get_action_space(suite.action_space)
    missing = [
        word
        for word, action in zip(agent_space.words, agent_space.minigrid_actions, strict=True)
        if action not in suite_space.minigrid_actions
    ]
    if missing:
        return suite_space, (
            f"the agent acts with {agent_space.name!r} ({_words(agent_space)}) and the "
            f"{suite_space.name!r} words ({_words(suite_space)}) have no counterpart for "
            + ", ".join(repr(word) for word in missing)
        )
    return reworded(suite_space, agent_space), ""


def _missing_actions(plan: SuitePlan) -> str:
    """Why the plan's actions cannot complete its level ("" when they can)."""
    needed = {int(Actions[name]) for name in plan.suite.needs_actions}
    lacking = sorted(needed - set(plan.action_space.minigrid_actions))
    if not lacking:
        return ""
    names = ", ".join(repr(_ENGLISH_WORDS[action]) for action in lacking)
    return (
        f"{plan.level} cannot be completed without {names}, and the agent's actions "
        f"({_words(plan.action_space)}) have no such action"
    )


def _reader_problem(plan: SuitePlan) -> str:
    """Why the suite tests nothing of how the agent reads ("" when it does)."""
    if plan.prompt_format == "grid" and plan.suite.changes_words_only:
        return (
            "the agent reads the grid, not the prompt: the suite changes only words (of the "
            "prompt, the mission or the actions), not the env"
        )
    return ""


def _prompt_problem(plan: SuitePlan) -> str:
    """Why the agent's prompt cannot be written in the plan's language ("" when it can)."""
    if plan.language != "en" and plan.prompt_format == "balrog":
        return (
            "the BALROG prompt (instruction, action help, tips) is written in English only: "
            f"a {plan.language!r} run would mix two languages"
        )
    return ""


def _composition_problem(suite_level: str, level: str, seeds: Sequence[int]) -> str:
    """Why `suite_level` is not a new composition of what `level` asks ("" when it is)."""
    asked = level_task_types(level, seeds)
    if not asked:
        return ""  # unknown: nothing to hold against the suite
    composed = level_task_types(suite_level, seeds)
    families = {TASK_FAMILIES.get(t, t) for t in asked}
    already = sorted(t for t in composed if TASK_FAMILIES.get(t, t) in families)
    if already:
        return f"{level} already asks {', '.join(already)}: {suite_level} is nothing new to it"
    parts = set().union(*map(task_parts, composed))
    lacking = sorted(parts - set().union(*map(task_parts, asked)))
    if not lacking:
        return ""
    return (
        f"{suite_level} composes {', '.join(sorted(parts))}; {level} asks "
        f"{', '.join(sorted(asked))}, never {' nor '.join(lacking)}: the suite would test "
        "what the evaluated level never teaches, not a new composition of what it does"
    )


def _translation_problem(env: babyai_text.TextEnv, seeds: Sequence[int]) -> str:
    """Why the env's missions at `seeds` cannot be said in its language ("" when they can)."""
    for seed in seeds:
        try:
            env.reset(seed=seed)
        except ValueError as error:  # a mission outside what `translate_mission` covers
            return f"the mission of seed {seed} cannot be said in {env.language!r}: {error}"
    return ""
