"""A policy that writes its action (`policy.kind=generate`), played by the evaluation harness.

The checkpoint of a run trained with `glam.policy.writer.WritingActorCritic` plays every suite in
the prompt format it was trained with: GLAM's text or the chat template (the harness's own prompt
history, rewritten by the suite), or BALROG's dialogue (the harness's `BalrogDialogue`, whose
chat turns the agent renders with the model's template). It writes an answer per env, sampled at
its training temperature (or the likeliest tokens with `eval.greedy`), from a torch seed drawn
from the episodes' own RNGs, and the answer is read as in training (`read_answer`).

An invalid answer plays `generate.invalid_action` when it is one of the suite's action words, and
otherwise the action standing for BALROG's "go forward" (a suite's env has no no-op to play); in
BALROG's dialogue the next observation carries the notice, as in training; GLAM's history keeps
the action played, not the answer. The episode reports count them (`invalid_actions`).

This agent plays the checkpoint as it was trained (the default `agent.protocol=scoring`). Under
`agent.protocol=generation` its model, adapter folded in, answers BALROG's protocol instead, as
a zero-shot model does (`glam.eval.generation.GenerationAgent`, built by `glam.eval.builders`).
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import torch

from glam.eval.agents import ActRequest, Agent, Decision, FormattedHistory, History
from glam.eval.generation import _default_action
from glam.llm.local import render_chat
from glam.policy.balrog import BalrogDialogue, last_action
from glam.policy.writer import WritingActorCritic

__all__ = ["WritingAgent"]


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
        return FormattedHistory(nbr_obs, self.format, self.policy.tokenizer)

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
        invalid = self.policy.generation.invalid_action
        fallback = words.index(invalid) if invalid in words else _default_action(request)
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
