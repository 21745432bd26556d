"""The section `generate` of a training run: how a policy that writes its action
(`policy.kind=generate`, `glam.policy.writer`) samples and reads its answer, declared with
`glam.config.config_section`. A light module (no torch): the PPO trainer's schema
(`glam.ppo.run_config`) imports it.
"""

from __future__ import annotations

from dataclasses import dataclass

from glam.config import CoreRunConfig, check_choice, check_positive, config_section

ANSWER_FORMATS: tuple[str, ...] = ("action", "think")
CONSTRAINTS: tuple[str, ...] = ("none", "actions")
"""`none`: any token may be written; `actions`: only the tokens that continue an action word,
and the end of the answer only after a whole one (`glam.decoding.AnswerTrie`)."""
"""`action`: the answer is the action, exactly (after normalisation); `think`: free reasoning
ending in "ACTION: <action>" (BALROG's chain-of-thought agent)."""


@config_section("generate")
@dataclass
class GenerationConfig:
    """A policy that writes its action (`policy.kind=generate`, `glam.policy.writer`): the model
    samples an answer after the prompt, the answer is read into one of the env's actions, and
    the log-probability of the whole answer (its sampled tokens, temperature included) is the
    action's. docs/written_actions.md."""

    max_new_tokens: int = 8
    """Most tokens of an answer. An `action` answer ends earlier at the end-of-text token or a
    newline (a GLAM prompt would otherwise go on with the next observation); a `think` answer
    ends at the end-of-text token only, and needs room (64-256)."""
    temperature: float = 1.0
    """Sampling temperature (no top-k or top-p cut): the old log-probabilities of PPO's ratio
    are those of this distribution. `policy.temperature` is the scoring policy's, unused here."""
    answer: str = "action"
    """`action`: the answer, lower-cased, spaces collapsed and surrounding punctuation stripped,
    must be one of the action words; `think`: the text after the answer's last "ACTION:" must
    be (BALROG's cot reading; needs `policy.prompt_format=chat` or `balrog`)."""
    constrain: str = "none"
    """`actions`: the answer is drawn only from tokens that continue an action word (its own
    tokens, with or without a leading space), and ends (end-of-text, or a token holding only
    a newline) only after a whole one: every answer is valid, and an action the free model
    never writes gets drawn. With `answer=think` the thought is free (but may not end the
    answer) and what follows "ACTION:" is constrained so; "ACTION:" itself is forced where only
    the room for it and the longest action is left. The action's log-probability is that of the
    constrained distribution (renormalised at each token), in the rollout and in the update.
    `none`: free writing."""
    invalid_action: str = "noop"
    """What an invalid answer plays: `noop` (minigrid's `done`, which does nothing in BabyAI;
    the step and its time pass) or an action word (BALROG plays `go forward`)."""
    invalid_penalty: float = 0.0
    """Subtracted from the reward of a step whose answer was invalid (in BabyAI's reward units,
    then scaled by `env.reward_scale` like the reward). 0: none."""
    feedback: bool = True
    """Start the observation after an invalid answer with BALROG's notice ("Your previous output
    did not contain a valid action. Defaulted to action: ...")."""
    max_history: int = 16
    """`policy.prompt_format=balrog`: observations kept in the dialogue, and as many answers
    (BALROG: 16). The GLAM and chat formats keep `env.nbr_obs` observations."""
    kv_cache: bool = True
    """Keep each env's keys and values from one turn to the next and read only the tokens a
    prompt adds to the last one (the longest common prefix is reused; the rest is computed).
    Exact (tests/test_writer.py); it pays where prompts grow (BALROG's dialogue)."""
    collapse_share: float = 0.95
    """The degenerate-output guard (RAGEN's "Echo Trap"): the run stops, saying so, when one
    answer string is at least this share of a rollout's answers for `collapse_updates`
    rollouts in a row."""
    collapse_updates: int = 3
    """Rollouts in a row the guard waits for (0: the guard is off; the answer statistics are
    logged anyway)."""

    def __post_init__(self) -> None:
        check_positive("generate.max_new_tokens", self.max_new_tokens)
        check_positive("generate.temperature", self.temperature)
        check_positive("generate.max_history", self.max_history)
        check_choice("generate.answer", self.answer, ANSWER_FORMATS)
        check_choice("generate.constrain", self.constrain, CONSTRAINTS)
        if not self.invalid_action:
            raise ValueError("generate.invalid_action is empty: give `noop` or an action word")
        if self.invalid_penalty < 0:
            raise ValueError(
                f"generate.invalid_penalty must be >= 0 (it is subtracted), got "
                f"{self.invalid_penalty}"
            )
        if not 0.0 < self.collapse_share <= 1.0:
            raise ValueError(
                f"generate.collapse_share must be in (0, 1], got {self.collapse_share}"
            )
        if self.collapse_updates < 0:
            raise ValueError(f"generate.collapse_updates must be >= 0, got {self.collapse_updates}")

    def check_run(self, run: CoreRunConfig) -> None:
        """The policy settings a writing policy needs (the couplings it does not run with:
        `glam.run_config.TrainingRunConfig.check_sections`)."""
        generate = run.policy.kind == "generate"
        if run.policy.prompt_format == "balrog" and not generate:
            raise ValueError(
                "policy.prompt_format=balrog is BALROG's dialogue for a policy that writes its "
                "action: set policy.kind=generate"
            )
        if not generate:
            return
        if self.answer == "think" and run.policy.prompt_format == "glam":
            raise ValueError(
                'generate.answer=think asks the model to reason before "ACTION:", which needs a '
                "request in the prompt: set policy.prompt_format=chat or balrog"
            )
        if run.policy.head != "scoring" or run.policy.value_from_base:
            raise ValueError(
                "policy.head and policy.value_from_base are the scoring policy's: leave them at "
                "`scoring` and false with policy.kind=generate (its value head reads the prompt)"
            )
        if run.train.save_rollouts:
            raise ValueError(written_clash(["train.save_rollouts=true"]))


def written_clash(used: list[str]) -> str:
    """Why a writing policy refuses the settings `used` (`key=value` each)."""
    return (
        f"policy.kind=generate does not run with {', '.join(used)} yet: a written answer is not "
        "one of a fixed list of actions that a teacher, a mediator, coded actions or the "
        "demonstrations format expect"
    )
