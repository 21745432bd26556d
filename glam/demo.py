"""The trained adapter the project ships for its demo, and how the demo plays it.

`glam/data/demo_policy/` holds the LoRA adapter of one run of the default preset
(`smollm2_lora_cpu`: SmolLM2-135M, rank 8 on the q and v projections of its top 4 layers, on
BabyAI-GoToRedBallNoDists), copied from the run's last checkpoint, and `record.json`: the command
and commit that trained it, the run's figures, and the success of the untrained and the trained
policy on the demo's held-out episodes as `play` measures them. `make demo` plays both there, so
that a newcomer sees a trained agent act before the live training starts;
`tests/test_demo_policy.py` plays the trained one again and fails if its success drifts from the
record.

The value head is not shipped (acting reads only the scores): the policy is rebuilt from the
preset with the adapter as LoRA's starting weights (`model.lora.init`), as a warm-started run
would be.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch

from babyai_text.actions import get_action_space
from glam.eval.agents import ScoringAgent
from glam.eval.config import SEED_BASE
from glam.eval.episodes import SuiteRun, run_suite
from glam.eval.stats import summarize
from glam.eval.suites import Suite
from glam.policy.llm_policy import LLMActorCritic
from glam.run_config import compose_run

__all__ = ["DEMO_POLICY", "PRESET", "demo_policy", "play", "read_record", "success_of"]

DEMO_POLICY = Path(__file__).resolve().parent / "data" / "demo_policy"
"""The shipped adapter (`adapter_config.json`, `adapter_model.safetensors`) and `record.json`."""
PRESET = "smollm2_lora_cpu"
"""The preset the adapter was trained with, and the demo's policy is built from."""


def read_record() -> dict[str, Any]:
    """`record.json`: how the adapter was made and what it measured."""
    return json.loads((DEMO_POLICY / "record.json").read_text())


def demo_policy(trained: bool) -> LLMActorCritic:
    """The preset's policy, untrained (LoRA's zero update: the pretrained model's scores) or
    with the shipped adapter; in eval mode."""
    cfg = compose_run(PRESET)
    if trained:
        cfg.model.lora.init = str(DEMO_POLICY)
    torch.manual_seed(0)  # the heads, which acting does not read
    words = get_action_space(cfg.env.action_space).words
    return LLMActorCritic.from_config(cfg.model, cfg.policy, words).eval()


@torch.no_grad()
def play(
    policy: LLMActorCritic, episodes: int, *, num_envs: int = 10, on_episode_end=None
) -> SuiteRun:
    """Play the preset's level on the held-out episodes `SEED_BASE + k` (those the evaluation
    harness plays for `eval.seed=0`), sampling from the policy with each episode's own seeded
    generator, as `scripts/post_training_tests.py` does."""
    cfg = compose_run(PRESET)

    def score(prompts: list[str], action_words: tuple[str, ...]) -> torch.Tensor:
        return policy(prompts, [list(action_words)] * len(prompts)).logits

    agent = ScoringAgent("demo", score, greedy=False)
    suite = Suite("no_change", "the training set-up", action_space=cfg.env.action_space)
    return run_suite(
        agent,
        suite,
        level=cfg.env.name,
        episodes=episodes,
        num_envs=num_envs,
        seed_base=SEED_BASE,
        nbr_obs=cfg.env.nbr_obs,
        on_episode_end=on_episode_end,
    )


def success_of(run: SuiteRun) -> dict[str, float]:
    """Success rate, its Wilson interval, and the mean length of a played run."""
    summary = summarize(run.episodes).to_dict()
    return {key: summary[key] for key in ("success_rate", "ci_low", "ci_high", "mean_length")}
