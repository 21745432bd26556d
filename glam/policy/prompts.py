"""Prompt formats: the original GLAM text, its observation history, and a chat-template variant.

The GLAM format (English; `language="fr"` translates the headers):

    Possible action of the agent: turn left, turn right, go forward, pick up, drop, toggle
    Goal of the agent: go to the red ball
    Observation 0: You see a wall 2 steps forward, You see a red ball 1 step left,
    Action 0: turn left
    Observation 1: You see a red ball 1 step forward,
    Action 1:

The prompt ends with "Action k:" and no trailing space: the scorer joins each candidate with a
leading space, so " turn" is scored as the single token a byte-level BPE model would produce.
(The original ended in "Action k: " and tokenised candidates alone, which the model reads as an
unlikely word without its space; scores came out around -10 per action.) Each description is
followed by a comma, as in the original; its trailing space before the newline is dropped.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

PROMPT_FORMATS = ("glam", "chat")


@dataclass(frozen=True)
class PromptHeaders:
    """The fixed words of the GLAM format in one language."""

    actions: str
    goal: str
    observation: str
    action: str
    instruction: str
    """Chat variant only: what the user asks the assistant to answer."""


HEADERS: dict[str, PromptHeaders] = {
    "en": PromptHeaders(
        actions="Possible action of the agent:",
        goal="Goal of the agent:",
        observation="Observation",
        action="Action",
        instruction="Reply with the agent's next action only, written exactly as one of the "
        "possible actions.",
    ),
    "fr": PromptHeaders(
        actions="Actions possibles de l'agent:",
        goal="But de l'agent:",
        observation="Observation",
        action="Action",
        instruction="Réponds uniquement par la prochaine action de l'agent, écrite exactement "
        "comme l'une des actions possibles.",
    ),
}


def _headers(language: str) -> PromptHeaders:
    if language not in HEADERS:
        raise ValueError(f"language={language!r} has no prompt headers; known: {sorted(HEADERS)}")
    return HEADERS[language]


def glam_prompt(
    mission: str,
    action_words: Sequence[str],
    observations: Sequence[Sequence[str]],
    actions: Sequence[str],
    *,
    language: str = "en",
) -> str:
    """The original GLAM prompt for `observations[0..k]` and the `k` actions taken between them.

    `observations[i]` is the list of sentences the env gave at step i; `actions[i]` the action
    taken after it. The prompt ends with "Action k:" (no trailing space), ready for a candidate.
    """
    if not observations:
        raise ValueError("observations is empty: a prompt needs the current observation")
    if len(actions) != len(observations) - 1:
        raise ValueError(
            f"{len(observations)} observations need {len(observations) - 1} actions between them, "
            f"got {len(actions)}"
        )
    headers = _headers(language)
    lines = [
        f"{headers.actions} {', '.join(action_words)}",
        f"{headers.goal} {mission}",
    ]
    for i, descriptions in enumerate(observations):
        if isinstance(descriptions, str):
            raise TypeError(f"observations[{i}] is a string; it must be a list of sentences")
        described = "".join(f" {sentence}," for sentence in descriptions)
        lines.append(f"{headers.observation} {i}:{described}")
        lines.append(f"{headers.action} {i}:" + (f" {actions[i]}" if i < len(actions) else ""))
    return "\n".join(lines)


def chat_prompt(
    tokenizer: PreTrainedTokenizerBase,
    mission: str,
    action_words: Sequence[str],
    observations: Sequence[Sequence[str]],
    actions: Sequence[str],
    language: str = "en",
) -> str:
    """The GLAM prompt as a user turn in the tokenizer's chat template, for instruct models.

    The result ends with the template's generation prompt (the assistant's turn), so a candidate
    is scored as the assistant's whole answer; the scorer adds no space after a prompt that ends
    in whitespace, as these templates do.
    """
    if not getattr(tokenizer, "chat_template", None):
        raise ValueError(
            f"{type(tokenizer).__name__} has no chat template; use prompt_format='glam'"
        )
    text = glam_prompt(mission, action_words, observations, actions, language=language)
    content = f"{_headers(language).instruction}\n\n{text}"
    return tokenizer.apply_chat_template(
        [{"role": "user", "content": content}], tokenize=False, add_generation_prompt=True
    )


def build_prompt(
    prompt_format: str,
    mission: str,
    action_words: Sequence[str],
    observations: Sequence[Sequence[str]],
    actions: Sequence[str],
    *,
    language: str = "en",
    tokenizer: PreTrainedTokenizerBase | None = None,
) -> str:
    """Dispatch on `PolicyConfig.prompt_format`: `glam` or `chat` (which needs the tokenizer)."""
    if prompt_format == "glam":
        return glam_prompt(mission, action_words, observations, actions, language=language)
    if prompt_format == "chat":
        if tokenizer is None:
            raise ValueError("prompt_format='chat' needs the tokenizer (for its chat template)")
        return chat_prompt(tokenizer, mission, action_words, observations, actions, language)
    raise ValueError(f"prompt_format={prompt_format!r} is not one of {list(PROMPT_FORMATS)}")


class PromptHistory:
    """The last `nbr_obs` observations of one env and the actions between them.

    Call `add_observation` after every reset and step, `prompt` to act, then `add_action` with the
    action taken; `reset` at episode end. Observations and actions must alternate.
    """

    def __init__(self, nbr_obs: int = 3) -> None:
        if nbr_obs < 1:
            raise ValueError(f"nbr_obs must be >= 1, got {nbr_obs}")
        self.nbr_obs = nbr_obs
        self._observations: deque[list[str]] = deque(maxlen=nbr_obs)
        self._actions: deque[str] = deque(maxlen=nbr_obs)
        self._awaiting_action = False

    def reset(self) -> None:
        """Forget the episode (the original clears the history when an episode ends)."""
        self._observations.clear()
        self._actions.clear()
        self._awaiting_action = False

    def add_observation(self, descriptions: list[str]) -> None:
        """Record the sentences describing the current observation."""
        if self._awaiting_action:
            raise RuntimeError("add_observation called twice in a row: add_action is missing")
        self._observations.append(list(descriptions))
        self._awaiting_action = True

    def add_action(self, action: str) -> None:
        """Record the action taken after the latest observation."""
        if not self._awaiting_action:
            raise RuntimeError("add_action called without a new observation before it")
        self._actions.append(action)
        self._awaiting_action = False

    @property
    def observations(self) -> list[list[str]]:
        return list(self._observations)

    @property
    def actions(self) -> list[str]:
        """The actions between the kept observations (one fewer than observations)."""
        kept = len(self._observations) - 1
        return list(self._actions)[len(self._actions) - kept :] if kept > 0 else []

    def prompt(
        self,
        mission: str,
        action_words: Sequence[str],
        language: str = "en",
        *,
        prompt_format: str = "glam",
        tokenizer: PreTrainedTokenizerBase | None = None,
    ) -> str:
        """The prompt for the current step (`prompt_format` `glam` or `chat`)."""
        if not self._awaiting_action:
            raise RuntimeError("no new observation since the last action: call add_observation")
        return build_prompt(
            prompt_format,
            mission,
            action_words,
            self.observations,
            self.actions,
            language=language,
            tokenizer=tokenizer,
        )
