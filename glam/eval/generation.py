"""BALROG's BabyAI protocol: the model writes its action as free text, in a dialogue.

BALROG (Paglieri et al., 2024; balrog-ai/BALROG) evaluates BabyAI-Text this way, and so does
this module, word for word where the model reads it:

- The first user message is BALROG's instruction: the goal, the six actions with a short
  description each, two tips, "PLAY!".
- Then the dialogue: the last `max_history` observations and `max_history` actions (BALROG keeps
  `2 * max_history` events) as user and assistant turns. A past observation is headed
  "Obesrvation:" (BALROG's spelling), the current one "Current Observation:" and an empty line;
  each is the env's descriptions, one per line, without "You see ".
- The agent type appends its request to the last turn: `naive` asks for one action, `cot` for
  step-by-step thinking that ends with "ACTION: <action>".
- The answer, stripped of surrounding spaces, must be one of the action words exactly (naive;
  "Turn left." is not an action); cot's answer is what follows its last "ACTION:" once every
  character but letters, spaces and colons is removed. Anything else becomes "go forward".
- With invalid-action feedback, the observation after an invalid answer starts with BALROG's
  notice ("Your previous output did not contain a valid action. Defaulted to action: go forward").
- The assistant turn holds the answer as given (naive: the whole answer, even when invalid;
  cot: its extracted action, the latest `max_cot_history` ones replaced by "Previous plan:" and
  the whole reasoning). An empty answer adds no assistant turn.

The prompts, the answer reading and the feedback live in `glam.policy.balrog`, shared with the
policy that writes its action in training (`glam.policy.writer`). The model is any
`glam.llm.ChatClient`: in-process or behind an OpenAI-compatible server.
Figures under this protocol line up with BALROG's BabyAI ones; figures under GLAM's scoring
protocol (a softmax over the likelihood of each action) do not, since scoring can never produce
an invalid action.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from minigrid.core.actions import Actions

from glam.eval.agents import ActRequest, Agent, Decision
from glam.llm.chat import ChatClient
from glam.policy.balrog import (
    AGENT_TYPES,
    DEFAULT_ACTION,
    AgentType,
    BalrogDialogue,
    instruction_prompt,
)

__all__ = [
    "AGENT_TYPES",
    "BALROG_SETTINGS",
    "AgentType",
    "BalrogDialogue",
    "BalrogSetting",
    "GenerationAgent",
    "instruction_prompt",
]


def _default_action(request: ActRequest) -> int:
    """Index of "go forward", or of the action standing for it in a renamed action space."""
    if DEFAULT_ACTION in request.action_words:
        return request.action_words.index(DEFAULT_ACTION)
    return request.envs[0].action_space_def.minigrid_actions.index(int(Actions.forward))


class GenerationAgent(Agent):
    """A chat model that writes its action in BALROG's dialogue, in-process or over HTTP."""

    def __init__(
        self,
        name: str,
        client: ChatClient,
        *,
        agent_type: str = "naive",
        max_history: int = 16,
        max_cot_history: int = 1,
        feedback_on_invalid_action: bool = True,
    ) -> None:
        """
        Args:
            name: label in reports.
            client: the model (`glam.llm.local.LocalChatClient`, `glam.llm.remote...`).
            agent_type, max_history, max_cot_history, feedback_on_invalid_action: see
                `BalrogDialogue`.
        """
        if agent_type not in AGENT_TYPES:
            raise ValueError(f"agent_type={agent_type!r} is not one of {list(AGENT_TYPES)}")
        self.name = name
        self.client = client
        self.agent_type = agent_type
        self.max_history = max_history
        self.max_cot_history = max_cot_history
        self.feedback_on_invalid_action = feedback_on_invalid_action
        self.trained_nbr_obs = max_history  # the observations each prompt holds
        self.answers: list[str] = []
        """Every answer, as the model wrote it, in order (for inspection)."""
        self.prompt_tokens = 0
        self.cached_prompt_tokens = 0
        """Of `prompt_tokens`, those read from the client's cache (the in-process turn cache)."""
        self.completion_tokens = 0
        self.cut_answers = 0
        """Answers cut at the token limit."""

    def new_history(self, nbr_obs: int) -> BalrogDialogue:
        return BalrogDialogue(
            self.agent_type,
            max_history=self.max_history,
            max_cot_history=self.max_cot_history,
            feedback_on_invalid_action=self.feedback_on_invalid_action,
        )

    def act(self, request: ActRequest) -> list[Decision]:
        if request.messages is None:
            raise ValueError("the generation protocol needs the chat turns (ActRequest.messages)")
        # One seed per answer from the episode's own RNG: an episode's answers depend on its
        # seed only, not on the other episodes of the batch (with a client that honours seeds).
        seeds = [int(rng.integers(2**31)) for rng in request.rngs]
        # An env slot's dialogue grows within its episode: the client may reuse its last turn.
        completions = self.client.complete(request.messages, seeds, slots=request.slots)
        agent_type = AGENT_TYPES[self.agent_type]
        fallback = _default_action(request)
        decisions = []
        for completion in completions:
            text = completion.text.strip()  # BALROG's client strips every answer
            self.answers.append(completion.text)
            self.prompt_tokens += completion.prompt_tokens
            self.cached_prompt_tokens += completion.cached_tokens
            self.completion_tokens += completion.completion_tokens
            self.cut_answers += completion.finish_reason == "length"
            answer = agent_type.answer(text)
            valid = answer in request.action_words
            decisions.append(
                Decision(
                    request.action_words.index(answer) if valid else fallback,
                    invalid=not valid,
                    answer=answer,
                    reasoning=text if agent_type.reasons else None,
                )
            )
        return decisions

    def close(self) -> None:
        self.client.close()

    def usage(self) -> dict[str, Any]:
        """Answers, tokens read (and of those, read from a cache) and written, and answers cut
        at the token limit so far."""
        return {
            "model_id": self.client.model_id,
            "answers": len(self.answers),
            "prompt_tokens": self.prompt_tokens,
            "cached_prompt_tokens": self.cached_prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "cut_answers": self.cut_answers,
        }


@dataclass(frozen=True)
class BalrogSetting:
    """One setting of BALROG's `balrog/config/config.yaml` and the preset key that matches it."""

    balrog_key: str
    balrog_value: Any
    key: str
    """Key in `configs/eval/balrog.yaml` (`PostTrainingTestsConfig`)."""
    value: Any
    note: str = ""


BALROG_SETTINGS: tuple[BalrogSetting, ...] = (
    BalrogSetting(
        "envs.babyai_kwargs.num_dists",
        0,
        "eval.distractors",
        0,
        "objects besides those the task needs: 1 object for goto/pickup, 2 for "
        "putnext and pick-up-then-go-to, the key for open",
    ),
    BalrogSetting(
        "tasks.babyai_tasks",
        "BabyAI-MixedTrainLocal-v0/{goto, pickup, open, putnext, pick_up_seq_go_to}",
        "eval.level",
        "BabyAI-MixedTrainLocal-v0",
        "the five task types, reported apart",
    ),
    BalrogSetting(
        "eval.num_episodes.babyai",
        10,
        "eval.episodes_per_task_type",
        10,
        "the first 10 evaluation seeds that draw each task type",
    ),
    BalrogSetting(
        "eval.max_steps_per_episode",
        None,
        "eval.max_steps",
        None,
        "the level's own limit: 64 steps for goto and pickup, 128 for the others",
    ),
    BalrogSetting(
        "agent.type",
        "naive",
        "eval.generation.agent_type",
        "naive",
        "`cot` is BALROG's chain-of-thought agent",
    ),
    BalrogSetting(
        "agent.max_history", 16, "eval.generation.max_history", 16, "16 observations and 16 actions"
    ),
    BalrogSetting("agent.max_cot_history", 1, "eval.generation.max_cot_history", 1),
    BalrogSetting(
        "eval.feedback_on_invalid_action", True, "eval.generation.feedback_on_invalid_action", True
    ),
    BalrogSetting("client.generate_kwargs.temperature", 1.0, "eval.client.temperature", 1.0),
    BalrogSetting("client.generate_kwargs.max_tokens", 4096, "eval.client.max_tokens", 4096),
    BalrogSetting("client.timeout", 60, "eval.client.timeout", 60.0),
    BalrogSetting(
        "client.max_retries",
        5,
        "eval.client.max_retries",
        4,
        "BALROG counts tries, we count retries after the first: 5 tries both",
    ),
    BalrogSetting(
        "client.delay", 2, "eval.client.delay", 2.0, "back-off 2, 4, 8, 16 s between the tries"
    ),
    BalrogSetting(
        "client.base_url",
        "http://localhost:8080/v1",
        "eval.client.base_url",
        "http://127.0.0.1:8080/v1",
        "with `eval.client.backend=openai`; the preset's default backend is `local`",
    ),
)
"""BALROG's BabyAI settings, side by side with the `balrog` preset's (`configs/eval/balrog.yaml`;
docs/evaluation.md shows this table; tests/test_balrog.py checks the preset against it)."""
