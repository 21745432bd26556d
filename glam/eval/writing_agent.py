"""A policy that writes its action (`policy.kind=generate`), played by the evaluation harness.

The checkpoint of a run trained with `glam.policy.writer.WritingActorCritic` plays every suite in
the prompt format it was trained with: GLAM's text or the chat template (the harness's own prompt
history, rewritten by the suite), or BALROG's dialogue (the harness's `BalrogDialogue`, whose
chat turns the agent renders with the model's template). It writes an answer per env, sampled at
its training temperature (or the likeliest tokens with `eval.greedy`), from a torch seed drawn
from the episodes' own RNGs, and the answer is read as in training (`read_answer`).

An invalid answer is played as in training: `generate.invalid_action=noop` plays the no-op
(`babyai_text.NO_OP`, which every suite's env takes), an action word plays that word when the
suite has it, and otherwise the action standing for BALROG's "go forward". The histories keep it
as training does: BALROG's dialogue the answer as said, GLAM's history the answer's first line
(`answer_line`); with `generate.feedback` the next observation starts with BALROG's notice. The
episode reports count invalid answers (`invalid_actions`).

This agent plays the checkpoint as it was trained (the default `agent.protocol=scoring`). Under
`agent.protocol=generation` its model, adapter folded in, answers BALROG's protocol instead, as
a zero-shot model does (`glam.eval.generation.GenerationAgent`, built by `glam.eval.builders`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import TYPE_CHECKING

import numpy as np
import torch

from glam.eval.agents import ActRequest, Agent, Decision, FormattedHistory, History
from glam.eval.generation import _default_action
from glam.llm.local import render_chat
from glam.policy.balrog import BalrogDialogue, feedback_sentence, last_action
from glam.policy.writer import WritingActorCritic, answer_line

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

__all__ = ["WritingAgent", "WrittenHistory"]


class WritingAgent(Agent):
    """A `WritingActorCritic` writing its actions in the harness's episodes (module docstring)."""

    def __init__(
        self, name: str, policy: WritingActorCritic, *, greedy: bool, batch_size: int = 0
    ) -> None:
        """
        Args:
            name: label in reports.
            policy: the trained policy, in eval mode.
            greedy: write the likeliest token at each step instead of sampling.
            batch_size: most prompts per forward; 0: all at once.
        """
        self.name = name
        self.policy = policy
        self.greedy = greedy
        self.batch_size = batch_size
        self.format = policy.policy_cfg.prompt_format

    def new_history(self, nbr_obs: int) -> History:
        generation = self.policy.generation
        if self.format == "balrog":
            return BalrogDialogue(
                "cot" if generation.answer == "think" else "naive",
                max_history=generation.max_history,
                feedback_on_invalid_action=generation.feedback,
            )
        return WrittenHistory(
            nbr_obs, self.format, self.policy.tokenizer, feedback=generation.feedback
        )

    @torch.no_grad()
    def act(self, request: ActRequest) -> list[Decision]:
        if request.messages is not None:
            if self.format != "balrog":  # the chat turns are read as a rendered template
                self.policy.policy_cfg = replace(self.policy.policy_cfg, prompt_format="balrog")
                self.format = "balrog"
            prompts = [render_chat(self.policy.tokenizer, turns) for turns in request.messages]
        else:
            prompts = request.prompts
        words = list(request.action_words)
        if words != list(self.policy.action_words):
            self.policy.action_words = words  # a renamed action space: read answers in its words
        fallback = self._invalid_action(request)
        think = self.policy.generation.answer == "think"
        # One seed per call from the episodes' RNGs: an episode's answers do not depend on the
        # torch RNG's state elsewhere (the batch's other episodes still share the draw).
        seeds = [int(rng.integers(2**31)) for rng in request.rngs]
        seed = int(np.random.SeedSequence(seeds).generate_state(1)[0])
        size = self.batch_size or len(prompts)
        decisions = []
        with torch.random.fork_rng():
            torch.manual_seed(seed)
            for start in range(0, len(prompts), size):
                written = self.policy(prompts[start : start + size], greedy=self.greedy).answers
                for text, action in zip(written.texts, written.actions.tolist(), strict=True):
                    valid = action < len(words)
                    decisions.append(
                        Decision(  # a dialogue keeps cot's extracted action and its reasoning
                            action if valid else fallback,
                            invalid=not valid,
                            answer=last_action(text.strip()) if think else text.strip(),
                            reasoning=text.strip() if think else None,
                        )
                    )
        return decisions

    def _invalid_action(self, request: ActRequest) -> int | None:
        """What an invalid answer plays: None (the no-op), or an index into the suite's words."""
        invalid = self.policy.generation.invalid_action
        if invalid == "noop":
            return None
        words = list(request.action_words)
        return words.index(invalid) if invalid in words else _default_action(request)


class WrittenHistory(FormattedHistory):
    """GLAM's prompt history as a writing policy's training keeps it (`WrittenEnvRunner`): an
    invalid answer's first line in place of an action and, with `feedback`, BALROG's notice
    first in the observation after it."""

    def __init__(
        self,
        nbr_obs: int,
        prompt_format: str = "glam",
        tokenizer: PreTrainedTokenizerBase | None = None,
        *,
        feedback: bool,
    ) -> None:
        super().__init__(nbr_obs, prompt_format, tokenizer)
        self.feedback = feedback
        self._notice: str | None = None

    def add_answer(
        self, answer: str, action: str, *, invalid: bool, reasoning: str | None = None
    ) -> None:
        """The policy's answer; `action` is the word played (`NO_OP_NAME` for the no-op)."""
        if not invalid:
            self.add_action(action)
            return
        self.add_action(answer_line(reasoning or answer))
        if self.feedback:
            self._notice = feedback_sentence(action)

    def add_observation(self, descriptions: Sequence[str]) -> None:
        if self._notice is not None:
            descriptions, self._notice = [self._notice, *descriptions], None
        super().add_observation(descriptions)

    def reset(self) -> None:
        super().reset()
        self._notice = None
