"""BALROG's BabyAI protocol, the parts a model reads and writes: the instruction, the dialogue,
the agent types' requests, how an answer is read, and the invalid-answer feedback.

Shared by the zero-shot evaluation (`glam.eval.generation`, which documents the protocol) and by
the policy that writes its action in training (`glam.policy.writer`), so both read a model's
answer the same way and tell it the same thing after an invalid one. Word for word BALROG's
(balrog-ai/BALROG), its spelling included.
"""

from __future__ import annotations

import re
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from glam.llm.chat import Message, render_transcript

__all__ = [
    "AGENT_TYPES",
    "DEFAULT_ACTION",
    "FEEDBACK",
    "NO_OP_NAME",
    "AgentType",
    "BalrogDialogue",
    "feedback_sentence",
    "instruction_prompt",
    "THINK_MARKER",
    "last_action",
]

DEFAULT_ACTION = "go forward"
"""BALROG's replacement for an invalid answer."""
NO_OP_NAME = "do nothing"
"""How the feedback names the no-op (`babyai_text.NO_OP`) that a writing policy's invalid answer
plays with `generate.invalid_action=noop` ("Defaulted to action: do nothing")."""
_ACTION_HELP = (
    "turn to the left",
    "turn to the right",
    "take one step forward",
    "pick up the object below you",
    "drop the object that you are holding",
    "manipulate the object in front of you",
)
"""BALROG's description of each action, in minigrid's order (every action space keeps it)."""
FEEDBACK = (
    "\n\nYour previous output did not contain a valid action. Defaulted to action: {action}"
    "\n\nObservation:\n"
)
"""What BALROG puts before the observation that follows an invalid answer."""


def instruction_prompt(mission: str, action_words: Sequence[str]) -> str:
    """BALROG's first message: the goal, the actions and what they do, the tips."""
    helps = [*_ACTION_HELP, *["do nothing"] * max(0, len(action_words) - len(_ACTION_HELP))]
    actions = ",\n".join(
        f"{word}: {help_}" for word, help_ in zip(action_words, helps, strict=False)
    )
    return (
        f"You are an agent playing a simple navigation game. Your goal is to {mission}. "
        "The following are the possible actions you can take in the game, followed by a short "
        f"description of each action:\n\n{actions}.\n\n"
        "In a moment I will present you an observation.\n\n"
        "Tips:\n"
        "- Once the desired object you want to interact or pickup in front of you, you can use "
        "the 'toggle' action to interact with it.\n"
        "- It doesn't make sense to repeat the same action over and over if the observation "
        "doesn't change.\n\n"
        "PLAY!"
    )


THINK_MARKER = "ACTION:"
"""What introduces the action in BALROG's chain-of-thought answer."""


def last_action(text: str) -> str:
    """cot's answer: after the last "ACTION:", once all but letters, spaces and colons go."""
    return re.sub(r"[^a-zA-Z\s:]", "", text).split(THINK_MARKER)[-1].strip()


@dataclass(frozen=True)
class AgentType:
    """One of BALROG's agent types: what it asks for, and how its answer is read."""

    name: str
    request: str
    """Appended (after an empty line) to the last user turn."""
    answer: Callable[[str], str]
    """The action the agent names in its (stripped) answer."""
    reasons: bool
    """Whether the whole answer is a plan kept in the dialogue ("Previous plan:")."""


AGENT_TYPES: dict[str, AgentType] = {
    "naive": AgentType(
        "naive",
        "You can only output one of the above actions at a time, and always have to output an "
        "action until the episode terminates.\nAction:",
        answer=lambda text: text,
        reasons=False,
    ),
    "cot": AgentType(
        "cot",
        "First think about what's the best course of action step by step.\n"
        "Finally, provide a single output action at the end of the message in the form of: "
        "ACTION: <action>",
        answer=last_action,
        reasons=True,
    ),
}
"""BALROG's agent types that fit the harness (its few-shot and in-context ones need recorded
demonstrations of its own)."""


class BalrogDialogue:
    """One episode's dialogue as BALROG keeps it: the last observations and answers."""

    def __init__(
        self,
        agent_type: str = "naive",
        *,
        max_history: int = 16,
        max_cot_history: int = 1,
        feedback_on_invalid_action: bool = True,
    ) -> None:
        """
        Args:
            agent_type: a key of `AGENT_TYPES`.
            max_history: observations kept, and as many actions (BALROG: 16).
            max_cot_history: cot: latest actions shown with their whole reasoning (BALROG: 1).
            feedback_on_invalid_action: tell the model when its answer was not an action.
        """
        self.agent_type = AGENT_TYPES[agent_type]
        self.max_cot_history = max_cot_history
        self.feedback_on_invalid_action = feedback_on_invalid_action
        # ("observation", text, None) or ("action", answer, reasoning or None)
        self._events: deque[tuple[str, str, str | None]] = deque(maxlen=2 * max_history)
        self._feedback = ""

    def add_observation(self, descriptions: Sequence[str]) -> None:
        text = "\n".join(d.replace("You see ", "") for d in descriptions)
        self._events.append(("observation", self._feedback + text, None))
        self._feedback = ""

    def add_action(self, action: str) -> None:
        """An action taken without an answer of the model's (the action word stands for it)."""
        self._events.append(("action", action, None))

    def add_answer(
        self, answer: str, action: str, *, invalid: bool, reasoning: str | None = None
    ) -> None:
        """The model's answer; `action` is the word played (the default one when `invalid`)."""
        if answer:  # BALROG records no turn for an empty answer
            self._events.append(("action", answer, reasoning))
        if invalid and self.feedback_on_invalid_action:
            self._feedback = FEEDBACK.format(action=action)

    def messages(self, mission: str, action_words: Sequence[str]) -> list[Message]:
        """The chat turns the model reads, its agent type's request at the end."""
        events = list(self._events)
        planned = [k for k, event in enumerate(events) if event[0] == "action" and event[2]]
        with_plan = set(planned[len(planned) - self.max_cot_history :] if planned else ())
        messages = [{"role": "user", "content": instruction_prompt(mission, action_words)}]
        for k, (kind, text, reasoning) in enumerate(events):
            if kind == "observation":
                # BALROG: "Current Observation:\n" + the short-term context ("" in BabyAI) + "\n"
                header = "Current Observation:\n\n" if k == len(events) - 1 else "Obesrvation:\n"
                messages.append({"role": "user", "content": header + text})
            else:
                content = f"Previous plan:\n{reasoning}" if k in with_plan else text
                messages.append({"role": "assistant", "content": content})
        messages[-1]["content"] += "\n\n" + self.agent_type.request
        return messages

    def prompt(self, mission: str, action_words: Sequence[str], language: str = "en") -> str:
        """The dialogue as readable text (reports); the model reads `messages`."""
        return render_transcript(self.messages(mission, action_words))


def feedback_sentence(action: str) -> str:
    """BALROG's notice after an invalid answer, as one sentence (no blank lines around it): what
    a GLAM-format prompt puts first in the observation that follows."""
    return FEEDBACK.format(action=action).strip().split("\n\n")[0]
