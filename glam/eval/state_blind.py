"""The state-blind ceiling of a level: the best success of a policy that never reads the
observation.

A policy that learned only how often to take each action (`agent.kind=fixed`, `agent.probs`)
reaches some success by chance: on GoToRedBall, going forward half the time and turning
otherwise finds the ball in about half the episodes. A trained agent is above this line only
if it reads the observation. The best probabilities are searched on a grid over the simplex
with tuning episodes (`eval.seed` other than the held-out one, so the held-out episodes do not
choose the winner), then the winner is evaluated like any agent on the held-out episodes
(`scripts/state_blind_ceiling.py`).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from dataclasses import dataclass, replace

import numpy as np

from glam.eval.builders import build_agent
from glam.eval.config import AgentConfig, PostTrainingTestsConfig
from glam.eval.harness import run_tests

__all__ = ["Candidate", "search_ceiling", "simplex_grid"]


@dataclass(frozen=True)
class Candidate:
    """One state-blind policy and how it did on the tuning episodes."""

    probs: tuple[float, ...]
    success_rate: float
    mean_return: float


def simplex_grid(actions: int, step: float) -> list[tuple[float, ...]]:
    """Every probability vector over `actions` actions whose entries are multiples of `step`
    (which must divide 1), in lexicographic order.

    Raises:
        ValueError: `actions` < 1, or a `step` that is not 1/k for a whole k >= 1.
    """
    if actions < 1:
        raise ValueError(f"a policy needs at least one action, got {actions}")
    parts = round(1 / step) if step > 0 else 0
    if parts < 1 or abs(parts * step - 1) > 1e-9:
        raise ValueError(f"step={step} must be 1/k for a whole k >= 1 (0.1, 0.05, 0.25...)")
    points = []
    for counts in itertools.product(range(parts + 1), repeat=actions - 1):
        if sum(counts) <= parts:
            points.append((*(c / parts for c in counts), (parts - sum(counts)) / parts))
    return points


def search_ceiling(
    cfg: PostTrainingTestsConfig,
    actions: int,
    step: float,
    on_candidate: Callable[[Candidate], None] | None = None,
) -> list[Candidate]:
    """Play `cfg`'s episodes (its level, action space, seeds, the `no_change` suite) with every
    state-blind policy of `simplex_grid(actions, step)`; return them best first (by success,
    then return). `on_candidate` is called after each."""
    results = []
    for probs in simplex_grid(actions, step):
        agent_cfg = AgentConfig(kind="fixed", probs=list(probs))
        run = run_tests(build_agent(agent_cfg, greedy=False), replace(cfg, agent=agent_cfg))
        episodes = run["no_change"].episodes
        candidate = Candidate(
            probs,
            float(np.mean([e.success for e in episodes])),
            float(np.mean([e.episode_return for e in episodes])),
        )
        results.append(candidate)
        if on_candidate is not None:
            on_candidate(candidate)
    return sorted(results, key=lambda c: (-c.success_rate, -c.mean_return))
