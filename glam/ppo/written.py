"""The envs of a policy that writes its action: prompts, invalid answers, and what the answers say.

`WrittenEnvRunner` is the `EnvRunner` of `policy.kind=generate` (`glam.policy.writer`). It
differs where a written answer differs from a scored action:

- **Prompts**: GLAM's format (the prompt ends "Action k:", the answer follows on that line), the
  chat template around it (asking for the action alone, or, with `generate.answer=think`, for
  reasoning that ends "ACTION: <action>", BALROG's chain-of-thought request), or BALROG's
  dialogue (`policy.prompt_format=balrog`: `glam.policy.balrog.BalrogDialogue`, its last
  `generate.max_history` observations and answers as chat turns, which only grow within an
  episode: the policy's key-value cache then reads only each turn's new tokens).
- **Invalid answers** are played as `generate.invalid_action` (`noop`: minigrid's `done`,
  which does nothing in BabyAI, added to the envs' actions but never shown in a prompt; or an
  action word), cost `generate.invalid_penalty`, and with `generate.feedback` the next
  observation starts with BALROG's notice. The history keeps the answer as written (its first
  line), as BALROG's dialogue does.
- **What the answers say** (`rollout_metrics`, every update, over all processes): the share of
  invalid answers, the mean entropy of their tokens' distributions, the entropy of the answer
  strings and the share of the most common one, their length and how many were cut at
  `generate.max_new_tokens`. The degenerate-output guard (RAGEN's "Echo Trap") stops the run,
  before it trains on the rollout, once one answer string is `generate.collapse_share` of the
  answers for `generate.collapse_updates` rollouts in a row.

`WrittenObservations.states` carry each env's current observation alone (the mission and what
the agent sees): GiGPO's anchor states.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable
from typing import Any

import numpy as np
from accelerate.utils import gather_object
from minigrid.core.actions import Actions

from babyai_text import NO_OP, ActionSpace
from glam.config import EnvConfig, PolicyConfig
from glam.envs import EnvRunner, resolve_action_space
from glam.llm.local import render_chat
from glam.policy.balrog import AGENT_TYPES, NO_OP_NAME, BalrogDialogue, feedback_sentence
from glam.policy.generation_config import GenerationConfig
from glam.policy.prompts import glam_prompt
from glam.policy.writer import Answers, WrittenObservations, answer_line, normalize_answer
from glam.runs.errors import TrainingDiverged

__all__ = ["NOOP_WORD", "PolicyCollapsed", "WrittenEnvRunner", "answer_statistics"]

NOOP_WORD = NO_OP
"""The envs' extra action an invalid answer plays with `generate.invalid_action=noop`; never in
a prompt."""


class PolicyCollapsed(TrainingDiverged):
    """The policy writes one answer over and over (RAGEN's "Echo Trap"): training on would only
    reinforce it. Stops the run like a divergence (exit status 3), before the update."""


class WrittenEnvRunner(EnvRunner):
    """`num_envs` BabyAI-Text envs for a policy that writes its action (module docstring)."""

    def __init__(
        self,
        env_cfg: EnvConfig,
        policy_cfg: PolicyConfig,
        generation: GenerationConfig,
        *,
        num_envs: int,
        seed: int,
        tokenizer: Any = None,
        wrap_env: Callable[[Any], Any] | None = None,
        group_size: int = 1,
    ) -> None:
        """As `EnvRunner`, with `generation` (`generate.*`): the answer format, the invalid
        answer's action, penalty and feedback, the dialogue's length and the guard.

        Raises:
            ValueError: an `invalid_action` that is neither `noop` nor an action word, or a chat
                format with a tokenizer that has no chat template.
        """
        self.generation = generation
        self._format = policy_cfg.prompt_format
        if self._format != "glam" and not getattr(tokenizer, "chat_template", None):
            raise ValueError(
                f"policy.prompt_format={self._format} renders the model's chat template, and "
                f"{type(tokenizer).__name__} has none; use policy.prompt_format=glam"
            )
        super().__init__(
            env_cfg,
            policy_cfg,
            num_envs=num_envs,
            seed=seed,
            tokenizer=tokenizer,
            wrap_env=wrap_env,
            group_size=group_size,
        )
        words = list(self.envs.action_words)
        if generation.invalid_action == "noop":
            self.action_words = words[:-1]  # the no-op is the envs', never the prompt's
            self._invalid_played, self._invalid_name = len(words) - 1, NO_OP_NAME
        elif generation.invalid_action in words:
            self._invalid_played = words.index(generation.invalid_action)
            self._invalid_name = generation.invalid_action
        else:
            raise ValueError(
                f"generate.invalid_action={generation.invalid_action!r} is neither `noop` nor "
                f"one of the actions {words}"
            )
        agent_type = "cot" if generation.answer == "think" else "naive"
        self.dialogues = [
            BalrogDialogue(
                agent_type,
                max_history=generation.max_history,
                feedback_on_invalid_action=generation.feedback,
            )
            for _ in range(num_envs)
        ]
        self.states: list[str] = [""] * num_envs
        """Each env's current observation alone: the mission and its sentences."""
        self._final_states: list[str] = [""] * num_envs
        self._answers: list[Answers] = []
        """This rollout's answers, step by step, for `rollout_metrics`."""
        self._collapsed: list[float] = []
        """The top answer's share in each rollout of the current streak above the guard's."""

    def _action_space(self, env_cfg: EnvConfig) -> ActionSpace:
        space = resolve_action_space(env_cfg.action_space)
        if self.generation.invalid_action != "noop":
            return space
        return ActionSpace(
            name=f"{space.name}+noop",
            words=(*space.words, NOOP_WORD),
            minigrid_actions=(*space.minigrid_actions, int(Actions.done)),
        )

    # ----------------------------------------------------------------------------------------
    # Prompts
    # ----------------------------------------------------------------------------------------

    def _start_history(self, i: int, obs: dict[str, Any], info: dict[str, Any]) -> None:
        super()._start_history(i, obs, info)
        self.dialogues[i] = BalrogDialogue(
            self.dialogues[i].agent_type.name,
            max_history=self.generation.max_history,
            feedback_on_invalid_action=self.generation.feedback,
        )
        self.dialogues[i].add_observation(info["descriptions"])
        self.states[i] = _state(obs["mission"], info["descriptions"])

    def _prompt(self, i: int) -> str:
        mission, words = self.missions[i], self.action_words
        if self._format == "balrog":
            return render_chat(self._tokenizer, self.dialogues[i].messages(mission, words))
        if self._format == "chat" and self.generation.answer == "think":
            history = self.histories[i]
            text = glam_prompt(
                mission, words, history.observations, history.actions, language=self.language
            )
            request = {"role": "user", "content": f"{text}\n\n{AGENT_TYPES['cot'].request}"}
            return render_chat(self._tokenizer, [request])
        return super()._prompt(i)

    def observations(self) -> WrittenObservations:
        return WrittenObservations(self.prompts(), None, list(self.states))

    def final_observations(self) -> tuple[list[int], WrittenObservations | None]:
        envs = [i for i, prompt in enumerate(self.final_prompts) if prompt is not None]
        if not envs:
            return [], None
        return envs, WrittenObservations(
            [self.final_prompts[i] for i in envs], None, [self._final_states[i] for i in envs]
        )

    # ----------------------------------------------------------------------------------------
    # Steps
    # ----------------------------------------------------------------------------------------

    def step(  # type: ignore[override]
        self, answers: Answers
    ) -> tuple[np.ndarray, np.ndarray, list[dict[str, Any] | None]]:
        """Play each env's answer: the action it names, or the invalid answer's action.

        Returns:
            As `EnvRunner.step`; the penalty of invalid answers is in the rewards.
        """
        if not isinstance(answers, Answers):
            raise TypeError(
                "a writing policy's runner plays its answers (glam.policy.writer.Answers), not "
                "action indices"
            )
        self._stepped = True
        self._answers.append(answers)
        valid = answers.valid.numpy()
        played = np.where(valid, answers.actions.numpy(), self._invalid_played)
        observations, rewards, terminated, truncated, infos = self.envs.step(played.tolist())
        rewards = rewards - np.float32(self.generation.invalid_penalty) * ~valid
        dones = terminated | truncated
        episodes: list[dict[str, Any] | None] = []
        self.final_prompts = [None] * self.num_envs
        for i, (obs, info) in enumerate(zip(observations, infos, strict=True)):
            if truncated[i] and not terminated[i]:
                final = info["final_info"]["descriptions"]
                self._add_turn(i, answers.texts[i], int(answers.actions[i]), bool(valid[i]), final)
                self.final_prompts[i] = self._prompt(i)
                self._final_states[i] = _state(self.missions[i], final)
            if dones[i]:
                episodes.append(info["episode"])
                self._start_history(i, obs, info)
            else:
                episodes.append(None)
                descriptions = info["descriptions"]
                self._add_turn(
                    i, answers.texts[i], int(answers.actions[i]), bool(valid[i]), descriptions
                )
                self.states[i] = _state(self.missions[i], descriptions)
                self._observations[i] = obs
        return rewards, dones, episodes

    def _add_turn(
        self, i: int, text: str, action: int, valid: bool, descriptions: list[str]
    ) -> None:
        """Env i's answer and the observation it led to, in its history and its dialogue."""
        word = self.action_words[action] if valid else self._invalid_name
        self.histories[i].add_action(word if valid else answer_line(text))
        notice = [feedback_sentence(word)] if not valid and self.generation.feedback else []
        self.histories[i].add_observation([*notice, *descriptions])
        dialogue = self.dialogues[i]
        think = self.generation.answer == "think"
        extracted = dialogue.agent_type.answer(text.strip())
        dialogue.add_answer(
            extracted if think else text.strip(),
            word,
            invalid=not valid,
            reasoning=text.strip() if think else None,
        )
        dialogue.add_observation(descriptions)

    # ----------------------------------------------------------------------------------------
    # What the answers say, and the guard
    # ----------------------------------------------------------------------------------------

    def rollout_metrics(self, accelerator: Any) -> dict[str, float]:
        """The answers of the rollout just collected, over every process (collective); stops
        the run when the guard trips.

        Raises:
            PolicyCollapsed: one answer string made at least `generate.collapse_share` of the
                answers of the last `generate.collapse_updates` rollouts (on every process).
        """
        local = [
            (normalize_answer(text), bool(ok), float(entropy), int(length), bool(stopped))
            for answers in self._answers
            for text, ok, entropy, length, stopped in zip(
                answers.texts,
                answers.valid.tolist(),
                answers.entropy.tolist(),
                answers.lengths.tolist(),
                answers.stopped.tolist(),
                strict=True,
            )
        ]
        self._answers = []
        rows = gather_object(local) if accelerator.num_processes > 1 else local
        metrics, top = answer_statistics(rows)
        self._check_collapse(metrics["answers/top_share"], top)
        return metrics

    def _check_collapse(self, share: float, top: str) -> None:
        limit, streak = self.generation.collapse_share, self.generation.collapse_updates
        self._collapsed = [*self._collapsed, share] if share >= limit else []
        if streak and len(self._collapsed) >= streak:
            shares = ", ".join(f"{s:.0%}" for s in self._collapsed[-streak:])
            raise PolicyCollapsed(
                f"the policy collapsed to one answer: {top!r} was {shares} of the answers of the "
                f'last {streak} rollouts (generate.collapse_share={limit}; RAGEN\'s "Echo Trap"), '
                "and training on would only reinforce it. Resume from an earlier checkpoint "
                "with a lower ppo.lr, a higher ppo.entropy_coef or generate.temperature; "
                "generate.collapse_updates=0 turns the guard off"
            )


def answer_statistics(
    rows: list[tuple[str, bool, float, int, bool]],
) -> tuple[dict[str, float], str]:
    """`answers/*` metrics of `(normalised text, valid, mean token entropy, tokens, ended by
    itself)` rows, and the most common text.

    `string_entropy` is the entropy (nats) of the answers' empirical distribution over strings:
    0 when every answer is the same string, whatever its tokens' entropy says.
    """
    if not rows:
        nan = math.nan
        keys = ("invalid_share", "token_entropy", "string_entropy", "top_share", "distinct")
        return {f"answers/{k}": nan for k in (*keys, "tokens", "cut_share")}, ""
    count = len(rows)
    texts = Counter(text for text, *_ in rows)
    top, top_count = texts.most_common(1)[0]
    shares = np.array(list(texts.values()), dtype=np.float64) / count
    return {
        "answers/invalid_share": sum(not ok for _, ok, *_ in rows) / count,
        "answers/token_entropy": float(np.mean([row[2] for row in rows])),
        "answers/string_entropy": float(-(shares * np.log(shares)).sum()),
        "answers/top_share": top_count / count,
        "answers/distinct": float(len(texts)),
        "answers/tokens": float(np.mean([row[3] for row in rows])),
        "answers/cut_share": sum(not row[4] for row in rows) / count,
    }, top


def _state(mission: str, descriptions: list[str]) -> str:
    """An env's current observation alone, as GiGPO compares them."""
    return "\n".join([mission, *descriptions])
