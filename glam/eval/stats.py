"""Summary statistics of evaluation episodes: success rate with a Wilson interval, means, and
BALROG's form of the same figures (mean progression and its standard error, in %)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field

__all__ = ["EpisodeResult", "SuiteSummary", "balrog_progress", "summarize", "wilson_interval"]

Z_95 = 1.959963984540054
"""Two-sided 95% quantile of the standard normal."""


def wilson_interval(successes: int, trials: int, z: float = Z_95) -> tuple[float, float]:
    """Wilson score interval of a binomial proportion (95% by default).

    Unlike the normal approximation it stays inside [0, 1] and is not empty at 0 or n successes,
    which matters for the bot (all successes) and for a broken suite (none).
    """
    if trials <= 0:
        raise ValueError(f"trials must be positive, got {trials}")
    if not 0 <= successes <= trials:
        raise ValueError(f"successes must be in [0, {trials}], got {successes}")
    p = successes / trials
    denominator = 1 + z * z / trials
    centre = (p + z * z / (2 * trials)) / denominator
    half_width = z * math.sqrt(p * (1 - p) / trials + z * z / (4 * trials * trials)) / denominator
    # At 0 or n successes the bound is exactly 0 or 1; floating point would give 1e-17 off.
    low = 0.0 if successes == 0 else max(0.0, centre - half_width)
    high = 1.0 if successes == trials else min(1.0, centre + half_width)
    return low, high


def balrog_progress(progressions: Sequence[float]) -> tuple[float, float]:
    """BALROG's `(progression_percentage, standard_error)` of episodes' progressions.

    As BALROG's `collect_and_summarize_results`: the mean in %, and the standard deviation
    over the episodes (dividing by n, not n - 1) over sqrt(n), in %; 0 for a single episode.
    In BabyAI an episode's progression is 1 on success, else 0.
    """
    n = len(progressions)
    if n == 0:
        raise ValueError("no episode to summarize")
    mean = sum(progressions) / n
    if n == 1:
        return 100 * mean, 0.0
    spread = math.sqrt(sum((x - mean) ** 2 for x in progressions) / n)
    return 100 * mean, 100 * spread / math.sqrt(n)


@dataclass(frozen=True)
class EpisodeResult:
    """What one evaluation episode ended with."""

    seed: int
    """Seed the env was reset with."""
    mission: str
    """Mission as the env stated it (before any prompt rewrite)."""
    task_type: str | None
    """Task type of the episode (`goto`, `pickup`...), None when unknown."""
    success: bool
    """Whether the mission was completed."""
    episode_return: float
    """Sum of the rewards of the env played: BabyAI's (`1 - 0.9 * t / max_steps` on success,
    else 0); a mediated env's are net of its query costs (`ask/cost` in `figures`)."""
    length: int
    """Number of steps taken."""
    invalid_actions: int = 0
    """Answers that were not an action and were replaced (generation protocol only)."""
    figures: dict[str, float] = field(default_factory=dict)
    """The agent's own figures of the episode (`Agent.episode_figures`: a mediator's queries,
    `ask/*`); empty for most agents."""


@dataclass(frozen=True)
class SuiteSummary:
    """The figures reported for one suite (or one task type within a suite)."""

    success_rate: float
    ci_low: float
    ci_high: float
    mean_return: float
    mean_length: float
    episodes: int
    invalid_action_rate: float

    def to_dict(self) -> dict[str, float | int]:
        return asdict(self)


def summarize(results: Sequence[EpisodeResult]) -> SuiteSummary:
    """Success rate with its 95% Wilson interval, mean return and length of `results`."""
    if not results:
        raise ValueError("no episode to summarize")
    n = len(results)
    successes = sum(result.success for result in results)
    ci_low, ci_high = wilson_interval(successes, n)
    steps = sum(result.length for result in results)
    return SuiteSummary(
        success_rate=successes / n,
        ci_low=ci_low,
        ci_high=ci_high,
        mean_return=sum(result.episode_return for result in results) / n,
        mean_length=steps / n,
        episodes=n,
        invalid_action_rate=sum(r.invalid_actions for r in results) / max(steps, 1),
    )
