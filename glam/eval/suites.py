"""The post-training test suites: what each one changes, defined once in a table.

A suite changes one thing against the `no_change` baseline, and only that thing:

- a *prompt rewrite*: whole-word substitutions on the full text the model reads (the env, the
  mission it checks and the actions it accepts are untouched; only the words shown change);
- an *env change*: another level (`new_composition`, `french`), another action space
  (`renamed_actions`) or another language of the descriptions and prompt header (`french`).

Substitutions match whole words only ("red" becomes "vermilion", "reddish" or "bored" stay), keep
a leading capital ("Red" becomes "Vermilion"), and cover the plural of each noun ("keys" becomes
"chairs"), so a mission or description that used one would be rewritten too.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cached_property
from types import MappingProxyType

__all__ = ["SUITES", "Suite", "get_suites", "rewrite"]

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
    """Language of the descriptions and of the prompt header."""

    @cached_property
    def _pattern(self) -> re.Pattern[str] | None:
        if not self.substitutions:
            return None
        # Longest first, so that "keys" wins over "key" and a phrase over its words.
        words = sorted(self.substitutions, key=len, reverse=True)
        alternatives = "|".join(re.escape(word) for word in words)
        return re.compile(rf"\b({alternatives})\b", flags=re.IGNORECASE)

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
                "French mission, descriptions, actions and prompt (GoTo)",
                level="BabyAI-GoToLocalFrench-v0",
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
