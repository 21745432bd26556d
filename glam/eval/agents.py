"""Agents the evaluation harness can play, behind one interface.

Every agent answers an :class:`ActRequest` (the prompts of the running envs, after the suite's
rewrite, with the envs themselves and per-episode RNGs) with one :class:`Decision` per env.
Language agents read only the prompts; the bot and the symbolic policy read only the grid (and
the symbolic policy the mission); random reads nothing.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np
import torch

from babyai_text.actions import get_action_space
from glam.baselines.symbolic import SymbolicActorCritic
from glam.eval.stats import EpisodeResult
from glam.llm.chat import Message
from glam.policy.observations import GridObservations, policy_inputs
from glam.policy.prompts import PromptHistory
from glam.teach.teacher import BotTeacher

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

__all__ = [
    "ActRequest",
    "Agent",
    "BotAgent",
    "ConstantAgent",
    "Decision",
    "FixedAgent",
    "FormattedHistory",
    "History",
    "RandomAgent",
    "ScoringAgent",
    "SymbolicAgent",
    "choose_actions",
    "grid_observation",
]


class History(Protocol):
    """The recent observations and actions of one episode, rendered as the prompt."""

    def add_observation(self, descriptions: Sequence[str]) -> None: ...

    def add_action(self, action: str) -> None: ...

    def prompt(self, mission: str, action_words: Sequence[str], language: str = "en") -> str: ...


class FormattedHistory(PromptHistory):
    """GLAM's prompt history in a fixed format: `glam` text, or `chat` (needs the tokenizer)."""

    def __init__(
        self,
        nbr_obs: int,
        prompt_format: str = "glam",
        tokenizer: PreTrainedTokenizerBase | None = None,
    ) -> None:
        super().__init__(nbr_obs)
        self.prompt_format = prompt_format
        self.tokenizer = tokenizer

    def prompt(self, mission: str, action_words: Sequence[str], language: str = "en") -> str:
        return super().prompt(
            mission,
            action_words,
            language,
            prompt_format=self.prompt_format,
            tokenizer=self.tokenizer,
        )


@dataclass(frozen=True)
class Decision:
    """The action an agent takes in one env."""

    action: int | None
    """Index into the env's action words; None: the no-op (`babyai_text.NO_OP`, nothing happens),
    which a writing policy trained so plays for an invalid answer."""
    invalid: bool = False
    """The agent's answer was not an action and was replaced by the default one (or the no-op)."""
    answer: str | None = None
    """What the agent said its action was, when it writes one (the generation protocol):
    kept in its dialogue as said, valid or not."""
    reasoning: str | None = None
    """The agent's whole answer when it reasons before acting (BALROG's cot agent)."""


@dataclass
class ActRequest:
    """One step of every running env, in the same order in each list."""

    prompts: list[str]
    """Prompt of each env, after the suite's rewrite: exactly what a language model reads."""
    action_words: tuple[str, ...]
    """The env's action words (the same for every env of a suite)."""
    envs: list[Any]
    """The `babyai_text.TextEnv`s themselves (only the grid readers look at them)."""
    slots: list[int]
    """Env slot of each entry: stable over an episode, reused by the next one."""
    new_episode: list[bool]
    """True at the first step of an episode."""
    rngs: list[np.random.Generator]
    """Per-episode RNGs (seeded from the episode seed) for any random choice."""
    messages: list[list[Message]] | None = None
    """Chat turns of each env, after the suite's rewrite, for agents whose history is a
    dialogue (`BalrogDialogue`); `prompts` then holds them as readable text."""


class Agent(ABC):
    """An evaluated agent."""

    name: str = "agent"
    """Label of the agent in reports."""
    trained_nbr_obs: int | None = None
    """Observations per prompt the agent was trained with, when known."""
    trained_action_space: str | None = None
    """Action space the agent was trained with, when known."""
    prompt_format: str | None = None
    """What the agent reads when its class fixes it: `none` (nothing), `grid` (the grid and
    the mission, not the prompt); None: the prompt, in its history's format."""

    def new_history(self, nbr_obs: int) -> History:
        """A fresh prompt history for a new episode (GLAM's prompt format by default)."""
        return PromptHistory(nbr_obs)

    def wrap_env(self, env: Any) -> Any:
        """Called once per env of a suite (a `babyai_text.TextEnv`) when it is made; returns the
        env the agent plays instead (mirrors `glam.ppo.hooks.TrainerHook.wrap_env`: LLM4RL's
        mediated env). A wrapper keeps `TextEnv`'s interface; its `action_words` are those the
        agent's decisions index. The default plays `env` itself."""
        return env

    def episode_figures(self, env: Any) -> dict[str, float]:
        """Called when an episode of `env` (as `wrap_env` returned it) ends, before the next
        starts: figures of the agent's own for that episode (namespaced, e.g. `ask/queries`),
        kept in its `EpisodeResult.figures`. None by default."""
        return {}

    def suite_figures(self, episodes: Sequence[EpisodeResult]) -> dict[str, float]:
        """The summary of `episodes`' figures (a suite's, or one task type's), written beside
        their success rate; None by default."""
        return {}

    @abstractmethod
    def act(self, request: ActRequest) -> list[Decision]:
        """One decision per entry of `request`."""

    def close(self) -> None:  # noqa: B027 (nothing to release by default)
        """Release what the agent holds open (a client's connections); idempotent."""


def choose_actions(
    logits: torch.Tensor, rngs: Sequence[np.random.Generator], *, greedy: bool
) -> list[int]:
    """Argmax of each row of `logits` (batch, actions), or a sample from its softmax.

    Sampling draws from each env's own RNG, so an episode's actions do not depend on which other
    episodes share its batch.
    """
    if greedy:
        return logits.argmax(dim=-1).tolist()
    probs = torch.softmax(logits.detach().double(), dim=-1).cpu().numpy()
    return [
        int(rng.choice(len(row), p=row / row.sum())) for rng, row in zip(rngs, probs, strict=True)
    ]


class RandomAgent(Agent):
    """Uniformly random actions (the paper's random baseline)."""

    name = "random"
    prompt_format = "none"

    def act(self, request: ActRequest) -> list[Decision]:
        n_actions = len(request.action_words)
        return [Decision(int(rng.integers(n_actions))) for rng in request.rngs]


class ConstantAgent(Agent):
    """The same action every step (`go forward`: what BALROG's protocol plays for an answer that
    names no action; a model that never names one plays exactly this agent's episodes)."""

    prompt_format = "none"

    def __init__(self, word: str) -> None:
        self.word = word
        self.name = f"constant:{word}"
        self.minigrid_action = get_action_space("default").to_minigrid(word)

    def act(self, request: ActRequest) -> list[Decision]:
        actions = request.envs[0].action_space_def.minigrid_actions
        if self.minigrid_action not in actions:
            raise ValueError(
                f"agent.action={self.word!r}: the suite's actions ({', '.join(request.action_words)}) "
                "have no such action"
            )
        return [Decision(actions.index(self.minigrid_action)) for _ in request.prompts]


class FixedAgent(Agent):
    """A state-blind policy: each step an action drawn from the same probabilities, whatever the
    observation (`agent.probs`, in the order of the suite's actions). The best such policy of a
    level is the success a policy that learned only the actions' frequencies can reach."""

    prompt_format = "none"

    def __init__(self, probs: Sequence[float]) -> None:
        self.probs = np.asarray(probs, dtype=np.float64)
        self.probs /= self.probs.sum()  # the config allows a rounding error of 1e-6
        self.name = "fixed:[" + ",".join(f"{p:g}" for p in probs) + "]"

    def act(self, request: ActRequest) -> list[Decision]:
        if len(self.probs) != len(request.action_words):
            raise ValueError(
                f"agent.probs has {len(self.probs)} probabilities; the suite's action space has "
                f"{len(request.action_words)} actions ({', '.join(request.action_words)})"
            )
        return [Decision(int(rng.choice(len(self.probs), p=self.probs))) for rng in request.rngs]


class BotAgent(Agent):
    """BabyAI's planning bot on the underlying minigrid env; it never reads the text.

    It is the oracle teacher (`glam.teach.BotTeacher`) played greedily: the bot's minigrid
    action is mapped back to the suite's action space (so it plays the renamed-action and French
    suites too), and the bot replans after the action actually played. Where the bot has no
    advice (`done` once the plan is empty; `pick up` and `drop` to move a blocking object, in the
    navigation space; an instruction it cannot plan, or a plan it gives up on by raising) the
    space's first action is played.
    """

    name = "bot"
    prompt_format = "none"

    def __init__(self) -> None:
        self._teacher: BotTeacher | None = None

    def act(self, request: ActRequest) -> list[Decision]:
        space = request.envs[0].action_space_def.minigrid_actions
        if self._teacher is None or self._teacher.minigrid_actions != tuple(space):
            self._teacher = BotTeacher(space)
        probs, valid = self._teacher.distributions(request.envs, request.slots, request.new_episode)
        actions = torch.where(valid, probs.argmax(-1), 0).tolist()
        self._teacher.record_actions(request.slots, actions)
        return [Decision(action) for action in actions]


ScoreFn = Callable[[list[str], tuple[str, ...]], torch.Tensor]
"""(prompts, action words) -> (batch, actions) logits of the policy."""


class ScoringAgent(Agent):
    """A language model that scores every action string; the policy is their softmax."""

    def __init__(
        self,
        name: str,
        score: ScoreFn,
        *,
        greedy: bool,
        batch_size: int = 0,
        history_factory: Callable[[int], History] | None = None,
    ) -> None:
        """
        Args:
            name: label in reports.
            score: the scoring function (see :data:`ScoreFn`).
            greedy: argmax instead of sampling.
            batch_size: most prompts per call of `score`; 0: all at once.
            history_factory: builds the prompt history of an episode; None: GLAM's format.
        """
        self.name = name
        self.score = score
        self.greedy = greedy
        self.batch_size = batch_size
        self.history_factory = history_factory

    def new_history(self, nbr_obs: int) -> History:
        if self.history_factory is not None:
            return self.history_factory(nbr_obs)
        return super().new_history(nbr_obs)

    @torch.no_grad()
    def act(self, request: ActRequest) -> list[Decision]:
        size = self.batch_size or len(request.prompts)
        logits = torch.cat(
            [
                self.score(request.prompts[start : start + size], request.action_words).float()
                for start in range(0, len(request.prompts), size)
            ]
        )
        actions = choose_actions(logits, request.rngs, greedy=self.greedy)
        return [Decision(action) for action in actions]


def grid_observation(env: Any) -> dict[str, Any]:
    """The minigrid observation a `babyai_text.TextEnv` returned at its last reset or step: the
    egocentric view (`image`), the `direction`, and the `mission` in the env's language.

    minigrid computes it from the current state (`gen_obs`, no randomness, no side effect).
    """
    return {**env.unwrapped.gen_obs(), "mission": env.mission}


class SymbolicAgent(Agent):
    """A policy on minigrid's symbolic observation (`SymbolicActorCritic`): it reads each env's
    grid and mission, never the prompt, so a suite that only rewrites the prompt does not
    apply to it (`glam.eval.suites.plan_suite`, prompt format `grid`).

    A policy with memory (`symbolic.memory`) keeps one memory per env slot, zero at the first
    step of each episode (`ActRequest.new_episode`), as in training."""

    prompt_format = "grid"

    def __init__(
        self,
        name: str,
        policy: SymbolicActorCritic,
        *,
        greedy: bool,
        temperature: float = 1.0,
        batch_size: int = 0,
    ) -> None:
        """
        Args:
            name: label in reports.
            policy: the actor-critic; its outputs are its `action_words`, in order.
            greedy: argmax instead of sampling.
            temperature: sampling is from softmax(logits / temperature).
            batch_size: most envs per forward pass; 0: all at once.
        """
        self.name = name
        self.policy = policy
        self.greedy = greedy
        self.temperature = temperature
        self.batch_size = batch_size
        self.memories: dict[int, torch.Tensor] = {}
        """A policy with memory's memory `(memory_size,)` after the last step of each env slot."""

    @torch.no_grad()
    def act(self, request: ActRequest) -> list[Decision]:
        if list(request.action_words) != self.policy.action_words:
            raise ValueError(
                f"the symbolic policy has one output per action of {self.policy.action_words}, "
                f"the env offers {list(request.action_words)}: evaluate it in the action space "
                "it was trained in (eval.action_space)"
            )
        observations = GridObservations.from_minigrid([grid_observation(e) for e in request.envs])
        memory = self._memories_before(request)
        n, size = len(observations), self.batch_size or len(observations)
        outputs = []
        for start in range(0, n, size):
            rows = range(start, min(start + size, n))
            part = None if memory is None else memory[start : rows.stop]
            outputs.append(self.policy(**policy_inputs(observations.select(rows), part)))
        if memory is not None:
            after = torch.cat([output.memory for output in outputs])
            self.memories.update(zip(request.slots, after, strict=True))
        logits = torch.cat([output.logits for output in outputs])
        actions = choose_actions(
            logits.float().cpu() / self.temperature, request.rngs, greedy=self.greedy
        )
        return [Decision(action) for action in actions]

    def _memories_before(self, request: ActRequest) -> torch.Tensor | None:
        """`(envs, memory_size)` each slot's memory from its last step, zero where an episode
        starts; None for a policy without memory."""
        size = self.policy.memory_size
        if not size:
            return None
        zero = torch.zeros(size, device=self.policy.device)
        return torch.stack(
            [
                zero if new else self.memories[slot]
                for slot, new in zip(request.slots, request.new_episode, strict=True)
            ]
        )
