"""The planner and mediator in the PPO loop: the run's envs become mediated envs, the policy is
the mediator over their two actions, and each update reports the queries.

`AskHook` is a `glam.ppo.hooks.TrainerHook` that only wraps envs (`wrap_env`) and reports
(`after_update`): the trainer runs PPO on the mediated envs' rewards (query costs included)
unchanged. `build_mediator_policy` is the run's `PolicyFactory`: BabyAI's symbolic network over
`MEDIATOR_ACTIONS` (`glam.couplings.coupling_policy_factory` picks it).

Metrics of an update, over the episodes that ended in its rollout (all processes):
`ask/queries_per_episode` (= `ask/chosen_per_episode` + `ask/forced_per_episode`), `ask/cost`
(query costs per episode), `ask/latency_s` (seconds per query in the planner),
`ask/ask_fraction` (queries by choice per decision), and over the rollout's queries
`ask/llm_calls` and `ask/cache_hits` (the language model's scorings, and the cache's answers).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from glam.ask.config import AskConfig
from glam.ask.mediated import MEDIATOR_ACTIONS, AskCounts, MediatedEnv
from glam.ask.planner import BotPlanner, LLMPlanner, Planner
from glam.baselines.run_config import BaselineRunConfig
from glam.baselines.symbolic import SymbolicActorCritic, resume_symbolic_policy
from glam.policy.files import env_record
from glam.ppo.hooks import TrainerHook
from glam.skills import SkillMap
from glam.teach.scorers import SubgoalScorer, build_scorer

if TYPE_CHECKING:
    from glam.ppo.setup import Training

__all__ = ["AskHook", "ask_metrics", "build_mediator_policy"]


def build_mediator_policy(cfg: BaselineRunConfig, checkpoint: Path | None) -> SymbolicActorCritic:
    """The mediator: a fresh symbolic network of the `symbolic` settings over `MEDIATOR_ACTIONS`,
    or the one saved in `checkpoint / "policy"` (the trainer's `PolicyFactory`)."""
    if checkpoint is not None:
        return resume_symbolic_policy(cfg, checkpoint)
    policy = SymbolicActorCritic(cfg.symbolic, MEDIATOR_ACTIONS)
    policy.training_env = env_record(cfg.env)
    return policy


def ask_metrics(counts: AskCounts, llm_calls: float, cache_hits: float) -> dict[str, float]:
    """The update's `ask/*` metrics from the counts of its ended episodes (NaN without any)."""
    episodes, queries = counts.episodes, counts.queries
    nan = math.nan
    return {
        "ask/queries_per_episode": queries / episodes if episodes else nan,
        "ask/chosen_per_episode": counts.chosen / episodes if episodes else nan,
        "ask/forced_per_episode": counts.forced / episodes if episodes else nan,
        "ask/cost": counts.cost / episodes if episodes else nan,
        "ask/latency_s": counts.latency_s / queries if queries else nan,
        "ask/ask_fraction": counts.chosen / counts.decisions if counts.decisions else nan,
        "ask/llm_calls": llm_calls,
        "ask/cache_hits": cache_hits,
    }


class AskHook(TrainerHook):
    """LLM4RL's planner and mediator joined to the PPO trainer (see the module docstring)."""

    def __init__(
        self,
        cfg: AskConfig,
        *,
        planner: Callable[[], Planner] | None = None,
        make_skills: Callable[[Any], SkillMap] = SkillMap,
    ) -> None:
        """
        Args:
            cfg: the `ask` settings (`mode` other than `none`).
            planner: makes one env's planner; by default the one `cfg.planner` names (the LLM's
                scorer loaded once, at the first env, and shared).
            make_skills: the skills of an episode (`glam.skills.SkillMap`; a test may give
                others).
        """
        self.cfg = cfg
        self.make_planner = planner or self._default_planner
        self.make_skills = make_skills
        self.envs: list[MediatedEnv] = []
        self.planners: list[Planner] = []
        self._scorer: SubgoalScorer | None = None

    def _default_planner(self) -> Planner:
        if self.cfg.planner == "bot":
            return BotPlanner()
        if self._scorer is None:
            self._scorer = build_scorer(self.cfg, "ask")
        return LLMPlanner(self._scorer, cache=self.cfg.cache)

    def wrap_env(self, env: Any) -> MediatedEnv:
        planner = self.make_planner()
        mediated = MediatedEnv(env, planner, self.cfg, make_skills=self.make_skills)
        self.planners.append(planner)
        self.envs.append(mediated)
        return mediated

    def pop_counts(self) -> tuple[AskCounts, int, int]:
        """This process's counts since the last call: the ended episodes' sums, the language
        model's scorings and cache hits."""
        counts, llm_calls, cache_hits = AskCounts(), 0, 0
        for env in self.envs:
            counts.add(env.pop_counts())
        for planner in self.planners:
            scored = planner.pop_counts()
            llm_calls += scored.llm_calls
            cache_hits += scored.cache_hits
        return counts, llm_calls, cache_hits

    def after_update(
        self, training: Training, model: torch.nn.Module, metrics: dict[str, float]
    ) -> dict[str, float]:
        counts, llm_calls, cache_hits = self.pop_counts()
        local = torch.tensor([*counts.as_list(), llm_calls, cache_hits], dtype=torch.float64)
        accelerator = training.accelerator
        total = accelerator.reduce(local.to(accelerator.device), "sum").cpu().tolist()
        summed = AskCounts(*total[:-2])
        return ask_metrics(summed, total[-2], total[-1])

    def close(self) -> None:
        """Release the planners' language model or connections."""
        if self._scorer is not None:
            self._scorer.close()
            self._scorer = None
