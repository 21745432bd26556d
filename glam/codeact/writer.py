"""The fast agent: the source of each sub-action the slow agent chose to code.

- `LibraryWriter` selects and parameterises our skills (`glam.codeact.library.skill_source`):
  what the embedded model, which cannot write reliable code, relies on.
- `ChatWriter` asks a code-capable chat model (behind an OpenAI-compatible endpoint, or any
  `ChatClient`) for the function, the API's documentation (`glam.codeact.api`) in the prompt,
  and takes the code block of its answer (`extract_code`). An action to be rewritten is asked
  for again with its last errors.

Both paths end in the same gate, `admit`: the sandbox's `validate` (`glam.codeact.sandbox`),
then the same sandbox runs the admitted code in `CodedActionsEnv`. A name whose code does not
validate is dropped; its `Draft` keeps the code and the reason, which the slow agent hears
(`glam.codeact.critic.Feedback.refused`).
"""

from __future__ import annotations

import re
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass

from glam.codeact import api
from glam.codeact.critic import Feedback
from glam.codeact.library import skill_source
from glam.codeact.planner import MissionFamily
from glam.codeact.sandbox import validate
from glam.llm.chat import ChatClient, Message

__all__ = [
    "ActionWriter",
    "ChatWriter",
    "Draft",
    "LibraryWriter",
    "admit",
    "extract_code",
    "refusals",
    "sources",
]

_BLOCK = re.compile(r"```[A-Za-z0-9_+-]*[ \t]*\n(.*?)```", re.DOTALL)


@dataclass(frozen=True)
class Draft:
    """One sub-action's code, admitted or not."""

    name: str
    source: str | None
    """The code (None when there was none to take: no skill of that name, no code block)."""
    origin: str
    """`library` or `generated`."""
    problem: str | None = None
    """Why it was refused (None: admitted)."""
    answer: str | None = None
    """The chat model's answer, as written (generated code only)."""

    @property
    def admitted(self) -> bool:
        return self.problem is None


def admit(name: str, source: str, origin: str, answer: str | None = None) -> Draft:
    """The gate every coded action passes, whoever wrote it: the sandbox's `validate`."""
    return Draft(name, source, origin, validate(source), answer)


def sources(drafts: Sequence[Draft]) -> dict[str, str]:
    """The admitted coded actions, name -> source (what `CodedActionsEnv` takes)."""
    return {draft.name: draft.source for draft in drafts if draft.admitted}


def refusals(drafts: Sequence[Draft]) -> dict[str, str]:
    """The refused names, name -> the reason."""
    return {draft.name: draft.problem for draft in drafts if not draft.admitted}


class ActionWriter(ABC):
    """Writes the code of chosen sub-actions (module docstring)."""

    name: str = ""
    """`library` or `chat`: in the iteration records."""

    @abstractmethod
    def write(
        self, names: Sequence[str], family: MissionFamily, feedback: Feedback | None = None
    ) -> list[Draft]:
        """One draft per name, in order, each through `admit`."""


class LibraryWriter(ActionWriter):
    """Our skills, selected and parameterised by name."""

    name = "library"

    def write(self, names, family, feedback=None):
        drafts = []
        for name in names:
            try:
                source = skill_source(name)
            except ValueError as error:
                drafts.append(Draft(name, None, "library", str(error)))
                continue
            drafts.append(admit(name, source, "library"))
        return drafts


class ChatWriter(ActionWriter):
    """A chat model writes each function (module docstring); one request per name, sent
    together (the HTTP client sends a batch concurrently)."""

    name = "chat"

    def __init__(self, client: ChatClient, *, seed: int | None = None) -> None:
        """`client` is shared, not owned; `seed`: the sampling seed of each request."""
        self.client = client
        self.seed = seed

    def write(self, names, family, feedback=None):
        if not names:
            return []
        conversations = [writer_messages(name, family, feedback) for name in names]
        seeds = None if self.seed is None else [self.seed] * len(names)
        completions = self.client.complete(conversations, seeds)
        drafts = []
        for name, completion in zip(names, completions, strict=True):
            code = extract_code(completion.text)
            if code is None:
                problem = "the answer has no code block defining step(view, memory)"
                drafts.append(Draft(name, None, "generated", problem, completion.text))
            else:
                drafts.append(admit(name, code, "generated", completion.text))
        return drafts


def writer_messages(name: str, family: MissionFamily, feedback: Feedback | None) -> list[Message]:
    """The request for the code of `name`: the API, the missions, the last errors if any."""
    system = (
        "You write coded actions for an agent in a BabyAI grid world: Python functions over "
        "the API documented below, run in a restricted sandbox.\n\n" + (api.__doc__ or "")
    )
    missions = "\n".join(f"- {mission}" for mission in family.missions)
    user = f'Write the coded action "{name}".\nMissions of this level, for example:\n{missions}\n'
    report = feedback.actions.get(name) if feedback is not None else None
    if report is not None and report.errors:
        errors = "\n".join(f"- {error}" for error in report.errors)
        user += f"\nYour previous version failed ({report.reason}). Its last errors:\n{errors}\n"
    user += "\nAnswer with one Python code block that defines step(view, memory)."
    return [{"role": "system", "content": system}, {"role": "user", "content": user}]


def extract_code(text: str) -> str | None:
    """The code of an answer: the first fenced block that defines `step` (else the first
    block); an answer without fences that defines `step` is taken whole; None otherwise."""
    blocks = _BLOCK.findall(text)
    for block in blocks:
        if "def step" in block:
            return block
    if blocks:
        return blocks[0]
    return text if "def step" in text else None
