"""Greedy success rate of a language model on seeded episodes, through the evaluation harness.

Behavioural cloning reports it for the zero-shot model and for the cloned one, on the same
seeds; the episodes are played by `glam.eval.episodes.run_suite` with a scoring agent, so the
figure is the one the evaluation harness would give for the `bc` agent with `greedy=true`.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from glam.eval.agents import FormattedHistory, ScoringAgent
from glam.eval.episodes import run_suite
from glam.eval.stats import summarize
from glam.eval.suites import Suite
from glam.scoring import score_actions

__all__ = ["greedy_success_rate"]


@torch.no_grad()
def greedy_success_rate(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    *,
    level: str,
    episodes: int,
    seed_base: int,
    nbr_obs: int,
    action_space: str | None = None,
    prompt_format: str = "glam",
    normalization: str = "sum",
    num_envs: int = 8,
    label: str = "model",
    on_episode_end: Callable[..., None] | None = None,
) -> dict[str, float]:
    """Play `episodes` episodes (seeds `seed_base + k`) taking the highest-scored action.

    Prompts are rendered in `prompt_format` (`glam`, or `chat` with the tokenizer's template)
    and scored with `normalization`, as in the demonstrations. Returns `success_rate`, its 95%
    Wilson interval (`ci_low`, `ci_high`), `mean_return`, `mean_length` and `episodes`.
    """

    def score(prompts: list[str], action_words: tuple[str, ...]) -> torch.Tensor:
        candidates = [list(action_words)] * len(prompts)
        return torch.stack(score_actions(model, tokenizer, prompts, candidates, normalization))

    was_training = model.training
    model.eval()
    agent = ScoringAgent(
        label,
        score,
        greedy=True,
        history_factory=lambda nbr_obs: FormattedHistory(nbr_obs, prompt_format, tokenizer),
    )
    suite = Suite("no_change", "the training set-up, unchanged", action_space=action_space)
    run = run_suite(
        agent,
        suite,
        level=level,
        episodes=episodes,
        num_envs=num_envs,
        seed_base=seed_base,
        nbr_obs=nbr_obs,
        on_episode_end=on_episode_end,
    )
    model.train(was_training)
    return summarize(run.episodes).to_dict()
