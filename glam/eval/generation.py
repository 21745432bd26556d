"""The BALROG-style zero-shot protocol: the model writes its action as free text.

BALROG (Paglieri et al., 2024) evaluates BabyAI-Text this way: an instruction message (goal,
action list with a short description each, tips), then the recent observations and actions as
chat turns, the last observation followed by a request for exactly one action. The answer is
generated greedily; an answer that is not one of the actions is replaced by "go forward".
Figures under this protocol line up with BALROG's published BabyAI ones; figures under GLAM's
scoring protocol (the policy is a softmax over the likelihood of each action) do not, since
scoring can never produce an invalid action.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

import torch
from minigrid.core.actions import Actions
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from glam.eval.agents import ActRequest, Agent, Decision

__all__ = ["BalrogHistory", "GenerationAgent", "parse_action"]

DEFAULT_ACTION = "go forward"
"""BALROG's replacement for an invalid answer."""
_ACTION_HELP = (
    "turn to the left",
    "turn to the right",
    "take one step forward",
    "pick up the object in front of you",
    "drop the object that you are holding",
    "manipulate the object in front of you (open a door)",
)
"""What the actions do, in the order every action space lists them (minigrid's 0-5)."""
_CLOSING = (
    "You can only output one of the above actions at a time, and always have to output an "
    "action until the episode terminates.\nAction:"
)


def _instruction(mission: str, action_words: Sequence[str]) -> str:
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
        "- Once the object you want to interact with or pick up is in front of you, use "
        "'toggle' to interact with it.\n"
        "- It does not make sense to repeat the same action over and over if the observation "
        "does not change.\n\n"
        "PLAY!"
    )


class BalrogHistory:
    """The last `nbr_obs` observations and the actions between them, as BALROG's chat turns."""

    def __init__(self, nbr_obs: int, tokenizer: PreTrainedTokenizerBase | None = None) -> None:
        """
        Args:
            nbr_obs: observations kept (BALROG keeps 16).
            tokenizer: its chat template renders the turns; None (or a tokenizer without a
                template) joins them as plain text.
        """
        self.nbr_obs = nbr_obs
        self.tokenizer = tokenizer
        self._observations: list[list[str]] = []
        self._actions: list[str] = []

    def add_observation(self, descriptions: Sequence[str]) -> None:
        self._observations.append(list(descriptions))
        del self._observations[: -self.nbr_obs]
        # Keep only the actions taken between the kept observations.
        del self._actions[: max(0, len(self._actions) - (len(self._observations) - 1))]

    def add_action(self, action: str) -> None:
        self._actions.append(action)

    def messages(self, mission: str, action_words: Sequence[str]) -> list[dict[str, str]]:
        """The chat turns: instruction, then observations (user) and actions (assistant)."""
        messages = [{"role": "user", "content": _instruction(mission, action_words)}]
        last = len(self._observations) - 1
        for k, descriptions in enumerate(self._observations):
            text = "\n".join(d.removeprefix("You see ") for d in descriptions)
            header = "Current Observation:" if k == last else "Observation:"
            messages.append({"role": "user", "content": f"{header}\n{text}"})
            if k < last:
                messages.append({"role": "assistant", "content": self._actions[k]})
        messages[-1]["content"] += "\n\n" + _CLOSING
        return messages

    def prompt(self, mission: str, action_words: Sequence[str], language: str = "en") -> str:
        """The text the model continues (the chat template applied, generation prompt added)."""
        messages = self.messages(mission, action_words)
        if self.tokenizer is not None and self.tokenizer.chat_template:
            return self.tokenizer.apply_chat_template(
                messages, tokenize=False, add_generation_prompt=True
            )
        return "\n\n".join(message["content"] for message in messages)


def parse_action(answer: str, action_words: Sequence[str]) -> int | None:
    """Index of the action `answer` names, or None when it names none.

    The first line of the answer is compared with each action after lower-casing and removing
    surrounding spaces, quotes and punctuation (so `"Turn left."` is `turn left`); anything
    longer or different is invalid, as in BALROG.
    """
    lines = answer.strip().splitlines()
    first = lines[0] if lines else ""
    cleaned = re.sub(r"\s+", " ", first).strip(" \t'\"`*.,;:!").lower()
    lowered = [word.lower() for word in action_words]
    return lowered.index(cleaned) if cleaned in lowered else None


def _default_action(request: ActRequest) -> int:
    """Index of "go forward", or of the action standing for it in a renamed action space."""
    if DEFAULT_ACTION in request.action_words:
        return request.action_words.index(DEFAULT_ACTION)
    return request.envs[0].action_space_def.minigrid_actions.index(int(Actions.forward))


class GenerationAgent(Agent):
    """A language model that writes its action (greedy decoding, a few tokens)."""

    def __init__(
        self,
        name: str,
        model: PreTrainedModel,
        tokenizer: PreTrainedTokenizerBase,
        *,
        max_new_tokens: int = 8,
        batch_size: int = 0,
    ) -> None:
        self.name = name
        self.model = model.eval()
        self.tokenizer = tokenizer
        self.max_new_tokens = max_new_tokens
        self.batch_size = batch_size
        self.answers: list[str] = []
        """Every raw answer, in order (for inspection)."""

    def new_history(self, nbr_obs: int) -> BalrogHistory:
        return BalrogHistory(nbr_obs, self.tokenizer)

    @torch.no_grad()
    def generate(self, prompts: list[str]) -> list[str]:
        """Greedy continuations of `prompts`, decoded without special tokens."""
        encoder_decoder = self.model.config.is_encoder_decoder
        # Decoder-only models continue the text: pad on the left so every prompt ends the row.
        self.tokenizer.padding_side = "right" if encoder_decoder else "left"
        # The chat template already holds the special tokens (BOS...): do not add them twice.
        templated = bool(self.tokenizer.chat_template)
        batch = self.tokenizer(
            prompts, return_tensors="pt", padding=True, add_special_tokens=not templated
        ).to(self.model.device)
        output = self.model.generate(
            **batch,
            max_new_tokens=self.max_new_tokens,
            do_sample=False,
            pad_token_id=self.tokenizer.pad_token_id,
        )
        new_tokens = output if encoder_decoder else output[:, batch["input_ids"].shape[1] :]
        return self.tokenizer.batch_decode(new_tokens, skip_special_tokens=True)

    def act(self, request: ActRequest) -> list[Decision]:
        size = self.batch_size or len(request.prompts)
        answers = [
            answer
            for start in range(0, len(request.prompts), size)
            for answer in self.generate(request.prompts[start : start + size])
        ]
        self.answers.extend(answers)
        fallback = _default_action(request)
        decisions = []
        for answer in answers:
            action = parse_action(answer, request.action_words)
            decisions.append(
                Decision(fallback if action is None else action, invalid=action is None)
            )
        return decisions
