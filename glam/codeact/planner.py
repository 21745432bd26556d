"""The slow agent: which sub-actions of a mission family to write as code, and which to leave
to RL (the primitive actions stay in the policy's action set in any case).

The candidates (`candidate_actions`) are the library's skills (`glam.codeact.library`) over the
objects of the family: those its sample missions name ("go to the red ball" -> the red ball),
the key of each door they name (a door may be locked), and those in view at the episodes' start
(`glam.skills.candidate_subgoals`); for each object
"go to the ...", "pick up the ..." (balls, boxes, keys) or "open the ... door"; then "explore",
and the skills that take their object from the mission ("go to the object in the mission",
"pick up the object in the mission").

A chooser picks `k` of them (`ActionChooser.choose`). What the critic carries over from the
previous iteration (kept actions, and those to be rewritten) stays chosen and counts towards
`k`; what it dropped, and names whose code was refused, are not proposed again; the chooser fills
the remaining places among the other candidates:

- `ScoredChooser`: a language model scores each candidate as the continuation of a prompt that
  describes the family and the feedback (`family_prompt`), log-likelihood summed over the
  candidate's tokens, as the LLM teacher scores subgoals (`glam.teach.scorers`: in this process
  or behind an OpenAI-compatible endpoint); the best `k` are chosen.
- `ChatChooser`: a chat model is asked in words, with the candidates listed; the names are read
  from its answer line by line (`parse_names`), lines that name no candidate ignored and reported.
- `RandomChooser`: the control, as many candidates drawn at random (seeded).
- `FixedChooser`: names written by hand, in order (a reference, or a user's own action set).
"""

from __future__ import annotations

import random
import re
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

import babyai_text
from glam.codeact.critic import Feedback
from glam.codeact.library import MISSION_SKILLS, skill_source
from glam.llm.chat import ChatClient, Message
from glam.skills import candidate_subgoals, parse_subgoal
from glam.teach.scorers import SubgoalScorer

__all__ = [
    "ActionChooser",
    "ChatChooser",
    "FixedChooser",
    "MissionFamily",
    "Plan",
    "RandomChooser",
    "ScoredChooser",
    "candidate_actions",
    "family_prompt",
    "parse_names",
    "sample_family",
]

_COLORS = ("red", "green", "blue", "purple", "yellow", "grey")
_TYPES = ("ball", "box", "key", "door")
_VERBS = ("go to", "pick up", "open")
_OBJECT = re.compile(rf"\b(?:the|a) (?:({'|'.join(_COLORS)}) )?({'|'.join(_TYPES)})\b")
_BULLET = re.compile(r"^(?:[-*+\u2022]|\d+[.)]|\(\d+\))\s*")


@dataclass(frozen=True)
class MissionFamily:
    """What the slow agent knows of a level: sample missions and the actions."""

    level: str
    missions: tuple[str, ...]
    """A few missions of the level (distinct, in the order drawn)."""
    action_words: tuple[str, ...]
    """The primitive actions (they stay in the action set whatever is coded)."""
    in_view: tuple[str, ...] = ()
    """Subgoals of the objects in view at the sample episodes' start."""


def sample_family(level: str, episodes: int = 8, seed: int = 0) -> MissionFamily:
    """The family of `level` from `episodes` episodes reset with seeds `seed`, `seed + 1`..."""
    env = babyai_text.make(level)
    missions, in_view = [], []
    for offset in range(episodes):
        obs, _ = env.reset(seed=seed + offset)
        missions.append(obs["mission"])
        in_view.extend(candidate_subgoals(env))
    env.close()
    return MissionFamily(
        level,
        tuple(dict.fromkeys(missions)),
        tuple(env.action_words),
        tuple(dict.fromkeys(in_view)),
    )


def candidate_actions(family: MissionFamily) -> list[str]:
    """The sub-actions that could be coded, in a fixed order (module docstring): by verb, then
    object type, then color (objects without a color first), then "explore" and the mission's
    skills."""
    objects = {(color or None, kind) for m in family.missions for color, kind in _OBJECT.findall(m)}
    # A door may be locked: its key (same color) is worth fetching.
    objects |= {(color, "key") for color, kind in list(objects) if kind == "door"}
    for subgoal in map(parse_subgoal, family.in_view):
        if subgoal.type is not None:
            objects.add((subgoal.color, subgoal.type))
    ordered = sorted(
        objects, key=lambda o: (_TYPES.index(o[1]), -1 if o[0] is None else _COLORS.index(o[0]))
    )
    names = []
    for verb in _VERBS:
        for color, kind in ordered:
            if (verb == "open" and kind != "door") or (verb == "pick up" and kind == "door"):
                continue
            names.append(f"{verb} the {color} {kind}" if color else f"{verb} the {kind}")
    names += ["explore", *MISSION_SKILLS]
    return [name for name in names if _is_skill(name)]


def _is_skill(name: str) -> bool:
    try:
        skill_source(name)
    except ValueError:
        return False
    return True


def family_prompt(family: MissionFamily, feedback: Feedback | None) -> str:
    """The text the scoring model continues with a sub-action's name."""
    lines = [
        f"Level: {family.level}",
        "Missions of this level, for example:",
        *(f"- {mission}" for mission in family.missions),
        f"Primitive actions: {', '.join(family.action_words)}",
    ]
    if feedback is not None and (report := feedback.lines()):
        lines += ["Coded actions of the last phase:", *(f"- {line}" for line in report)]
    lines.append("A sub-action worth writing as code:")
    return "\n".join(lines)


@dataclass(frozen=True)
class Plan:
    """The slow agent's answer for one iteration."""

    coded: list[str]
    """The sub-actions to write as code: those carried over first, then the new ones."""
    carried: list[str]
    """Those of `coded` the critic carried over from the previous iteration."""
    left_to_rl: list[str]
    """The other candidates: left to the RL policy's primitive actions."""
    ignored: list[str] = field(default_factory=list)
    """Lines of a chat answer that chose nothing, each with the reason."""
    answer: str | None = None
    """The chat model's answer, as written."""


class ActionChooser(ABC):
    """Chooses the sub-actions to code (module docstring)."""

    name: str = ""
    """`local` (the scored chooser), `chat`, `random` or `fixed`: in the iteration records."""

    def choose(self, family: MissionFamily, k: int, feedback: Feedback | None = None) -> Plan:
        """At most `k` sub-actions to code, given the family and the previous feedback."""
        if k < 0:
            raise ValueError(f"k must be >= 0, got {k}")
        candidates = self.candidates(family)
        feedback = feedback or Feedback()
        carried = feedback.carried()[:k]
        excluded = feedback.excluded() | set(carried)
        open_ = [name for name in candidates if name not in excluded]
        wanted = min(k - len(carried), len(open_))
        picked, ignored, answer = (
            self._pick(family, feedback, open_, wanted) if wanted else ([], [], None)
        )
        coded = carried + picked
        left = [name for name in candidates if name not in coded]
        return Plan(coded, carried, left, ignored, answer)

    def candidates(self, family: MissionFamily) -> list[str]:
        """What may be coded: `candidate_actions(family)`."""
        return candidate_actions(family)

    @abstractmethod
    def _pick(
        self, family: MissionFamily, feedback: Feedback, candidates: list[str], count: int
    ) -> tuple[list[str], list[str], str | None]:
        """`count` of `candidates` (fewer if a chat answer names fewer), the ignored lines of
        an answer, and the answer."""


class ScoredChooser(ActionChooser):
    """The best-scored candidates after `family_prompt` (module docstring)."""

    name = "local"

    def __init__(self, scorer: SubgoalScorer) -> None:
        """`scorer` is shared, not owned (its owner closes it)."""
        self.scorer = scorer

    def _pick(self, family, feedback, candidates, count):
        prompt = family_prompt(family, feedback)
        scores = self.scorer.log_likelihoods([prompt], [candidates])[0]
        order = torch.sort(scores, descending=True, stable=True).indices  # ties: listed order
        return [candidates[i] for i in order[:count].tolist()], [], None


class RandomChooser(ActionChooser):
    """Candidates drawn uniformly without replacement: the control (module docstring)."""

    name = "random"

    def __init__(self, seed: int) -> None:
        self._rng = random.Random(seed)

    def _pick(self, family, feedback, candidates, count):
        return self._rng.sample(candidates, count), [], None


class FixedChooser(ActionChooser):
    """A list of sub-actions written by hand, taken in its order: a reference (an expert's
    choice) or a user's own action set. Any skill name is allowed, candidate or not."""

    name = "fixed"

    def __init__(self, names: Sequence[str]) -> None:
        if not names:
            raise ValueError("the fixed chooser needs at least one sub-action name")
        self.names = list(dict.fromkeys(names))

    def candidates(self, family: MissionFamily) -> list[str]:
        return list(self.names)

    def _pick(self, family, feedback, candidates, count):
        return candidates[:count], [], None


class ChatChooser(ActionChooser):
    """A chat model's choice, asked in words (module docstring)."""

    name = "chat"

    def __init__(self, client: ChatClient, *, seed: int | None = None) -> None:
        """`client` is shared, not owned; `seed`: the sampling seed of each question."""
        self.client = client
        self.seed = seed

    def _pick(self, family, feedback, candidates, count):
        messages = chooser_messages(family, feedback, candidates, count)
        seeds = None if self.seed is None else [self.seed]
        (completion,) = self.client.complete([messages], seeds)
        picked, ignored = parse_names(completion.text, candidates, count)
        return picked, ignored, completion.text


def chooser_messages(
    family: MissionFamily, feedback: Feedback, candidates: Sequence[str], count: int
) -> list[Message]:
    """The question a chat model answers with the names to code."""
    context = family_prompt(family, feedback).rsplit("\n", 1)[0]  # without the open last line
    system = (
        "You plan for a reinforcement-learning agent in a BabyAI grid world. Some sub-actions "
        "are written as code and added to the agent's actions; the rest it learns with its "
        "primitive actions. Code the sub-actions that are easy to program and save the most "
        "learning; leave to learning what code does badly."
    )
    user = (
        f"{context}\n\nCandidate sub-actions:\n"
        + "\n".join(f"- {name}" for name in candidates)
        + f"\n\nChoose {count} of the candidates to write as code. Answer with their names "
        "exactly as written, one per line, and nothing else."
    )
    return [{"role": "system", "content": system}, {"role": "user", "content": user}]


def parse_names(text: str, candidates: Sequence[str], count: int) -> tuple[list[str], list[str]]:
    """The candidates an answer names, one per line, in order, at most `count`; and the lines
    ignored, each with the reason.

    A line may carry a bullet or a number ("- ", "2. "), quotes, backticks, a trailing period,
    capitals, or "a" for "the"; empty lines and code fences are skipped silently.
    """
    allowed = set(candidates)
    picked: list[str] = []
    ignored: list[str] = []
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith("```"):
            continue
        name = _BULLET.sub("", line).strip().strip("\"'`*").rstrip(".,;:!").strip().lower()
        name = re.sub(r"\s+", " ", name)
        if name not in allowed:
            name = re.sub(r"^(go to|pick up|open) an? ", r"\1 the ", name)
        if name not in allowed:
            ignored.append(f"{line!r}: not a candidate")
        elif name in picked:
            ignored.append(f"{line!r}: repeated")
        elif len(picked) >= count:
            ignored.append(f"{line!r}: beyond the {count} asked")
        else:
            picked.append(name)
    return picked, ignored
