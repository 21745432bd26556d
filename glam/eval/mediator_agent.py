"""LLM4RL's mediator as an agent of the evaluation harness: it plays mediated envs
(`glam.ask.mediated.MediatedEnv`: ask the planner, or let the current skill act) and reports its
queries beside success.

- `agent.kind=checkpoint` of a run trained with `ask.mode=learned`: the saved mediator (BabyAI's
  symbolic network over ask / continue) decides, in envs built from the run's `ask` settings
  (its config.yaml: planner, cost, budget, subgoal shown), as in training;
- `agent.kind=checkpoint` of a run trained with `always`, `skill_end` or `random`, or
  `agent.kind=mediator` with `agent.ask.mode` one of these: the mode's rule asks, no network.

Figures (the training run's `ask/*` metrics, `glam.ask.hook.ask_metrics`, over a suite's
episodes, and per task type): `ask/queries_per_episode` = `ask/chosen_per_episode` +
`ask/forced_per_episode`, `ask/cost` (query costs per episode), `ask/latency_s` (seconds per
query in the planner), `ask/ask_fraction` (queries by choice per step), `ask/llm_calls` and
`ask/cache_hits` (totals). Each episode's counts are in episodes.jsonl (`ask/queries`...).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import fields
from typing import Any

from glam.ask.config import AskConfig
from glam.ask.hook import AskHook, ask_metrics
from glam.ask.mediated import CONTINUE, AskCounts, MediatedEnv
from glam.eval.agents import ActRequest, Agent, Decision
from glam.eval.stats import EpisodeResult

__all__ = ["MediatorAgent"]

_COUNTS = [item.name for item in fields(AskCounts) if item.name != "episodes"]
"""The counts of one episode kept in its figures, as `ask/<name>`."""


class MediatorAgent(Agent):
    """Plays every env of a suite through the planner and skills of `cfg` (module docstring)."""

    prompt_format = "grid"  # the network reads the grid and "<mission> | subgoal: <subgoal>"

    def __init__(self, name: str, cfg: AskConfig, *, policy: Agent | None = None) -> None:
        """
        Args:
            name: label in reports.
            cfg: the `ask` settings the envs are mediated with (`mode` other than `none`).
            policy: what chooses between ask and continue in `learned` mode (a `SymbolicAgent`
                over `MEDIATOR_ACTIONS`); None in the other modes, whose rule decides.
        """
        if (cfg.mode == "learned") != (policy is not None):
            raise ValueError(
                f"ask.mode={cfg.mode!r}: a mediator network decides in `learned` mode only"
            )
        self.name = name
        self.cfg = cfg
        self.policy = policy
        # The hook's planner factory: one language model for every env, released by `close`.
        self._hook = AskHook(cfg)

    def wrap_env(self, env: Any) -> MediatedEnv:
        if env.language != "en":
            raise ValueError(
                f"the skills and planners of glam.ask speak English; a mediator cannot play a "
                f"{env.language!r} env (eval.level, or the suite's language)"
            )
        return self._hook.wrap_env(env)

    def act(self, request: ActRequest) -> list[Decision]:
        if self.policy is None:  # the mode's rule decides: the action is not read
            return [Decision(CONTINUE) for _ in request.envs]
        return self.policy.act(request)

    def episode_figures(self, env: MediatedEnv) -> dict[str, float]:
        counts = env.pop_counts()  # the episode that just ended, alone: it pops after each
        scored = env.planner.pop_counts()
        figures = {f"ask/{name}": float(getattr(counts, name)) for name in _COUNTS}
        figures["ask/queries"] = float(counts.queries)
        figures["ask/llm_calls"] = float(scored.llm_calls)
        figures["ask/cache_hits"] = float(scored.cache_hits)
        return figures

    def suite_figures(self, episodes: Sequence[EpisodeResult]) -> dict[str, float]:
        counts = AskCounts(episodes=len(episodes))
        for episode in episodes:
            counts.add(AskCounts(0, *(episode.figures[f"ask/{name}"] for name in _COUNTS)))
        llm_calls = sum(episode.figures["ask/llm_calls"] for episode in episodes)
        cache_hits = sum(episode.figures["ask/cache_hits"] for episode in episodes)
        return ask_metrics(counts, llm_calls, cache_hits)

    def close(self) -> None:
        if self.policy is not None:
            self.policy.close()
        self._hook.close()
