"""The statistics the reports and the docs rest on.

- Over episodes: a success rate with its Wilson interval (`wilson_interval`, `summarize`), and
  BALROG's form of the same figures (`balrog_progress`).
- Over the same episodes played by two agents (paired by seed): McNemar's exact test on the
  discordant pairs (`mcnemar_exact_p`; `glam.eval.paired` reads two evaluations).
- Over seeds (each seed one number, e.g. its held-out success rate): the mean with a Student-t
  interval (`t_interval`; `seed_interval` clips it to [0, 1] for rates), and a two-sample test
  of two groups of seeds (`compare_seeds`): Welch's t-test with its p-value, beside the exact
  permutation test's. The unit of replication is the seed: the episodes of one seed share its
  training, so pooling them gives an interval for that policy, not for the method.
- Seeds against one evaluation of a baseline: a deterministic rule (the bot, always one
  action), whose one evaluation is all there is, by the one-sample t-test (`one_sample_test`);
  a stochastic one (uniformly random actions, random asking, a sampled teacher), whose one
  evaluation of n episodes is itself a sample, by Welch's test with the baseline's binomial
  variance (`sampled_baseline_test`): treating its rate as a constant makes p too small.
- Many tests of one claims table: Holm's step-down correction over the table's family
  (`holm`); the verdicts read the corrected p-values.

Why Welch is the test the docs read: with three seeds a side, an exact permutation test has
C(6, 3) = 20 relabellings, so its two-sided p-value is never below 2 / 20 = 0.1 whatever the
data: it cannot separate anything at 5%. Welch's test uses the spread of each group without
assuming them equal (a method whose seeds agree and one whose seeds scatter are the usual case
here), at the price of assuming seed means roughly normal; the permutation p-value is reported
beside it as the assumption-free check. scipy is not a dependency: the t distribution is
computed here (regularised incomplete beta by Lentz's continued fraction).
"""

from __future__ import annotations

import functools
import itertools
import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field

import numpy as np

__all__ = [
    "EpisodeResult",
    "SeedComparison",
    "SuiteSummary",
    "balrog_progress",
    "compare_seeds",
    "mcnemar_exact_p",
    "holm",
    "one_sample_test",
    "permutation_p_value",
    "sampled_baseline_test",
    "seed_interval",
    "summarize",
    "t_interval",
    "t_quantile",
    "t_two_sided_p",
    "welch_test",
    "wilson_interval",
]

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
    actions: str = ""
    """The actions played, in order: indices into the suite's action words joined by spaces,
    `-` for the no-op. Two evaluations with the same actions on the same seeds are one
    evaluation played twice (`glam.compare.episodes_digest`)."""
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


def mcnemar_exact_p(only_a: int, only_b: int) -> float:
    """Two-sided p-value of McNemar's exact test: of the pairs of episodes (one seed, two agents)
    where exactly one agent succeeded, `only_a` went to agent a and `only_b` to agent b; under
    "neither agent is better" each such pair goes either way with probability 1/2. The p-value
    is twice the binomial tail of the smaller count, capped at 1 (1 when there is no such pair:
    the episodes cannot tell the agents apart)."""
    if only_a < 0 or only_b < 0:
        raise ValueError(f"discordant pairs cannot be negative: {only_a}, {only_b}")
    n = only_a + only_b
    if n == 0:
        return 1.0
    tail = sum(math.comb(n, k) for k in range(min(only_a, only_b) + 1)) / 2**n
    return min(1.0, 2.0 * tail)


# ---------------------------------------------------------------------------------------------
# Over seeds: Student's t, Welch's test, the exact permutation test
# ---------------------------------------------------------------------------------------------


def _incomplete_beta(x: float, a: float, b: float) -> float:
    """The regularised incomplete beta function I_x(a, b), by the continued fraction of
    Numerical Recipes (modified Lentz), on the side where it converges fast."""
    if x <= 0.0:
        return 0.0
    if x >= 1.0:
        return 1.0
    log_front = (
        math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x)
    )
    if x > (a + 1) / (a + b + 2):  # the fraction converges fast below this point only
        return 1.0 - _incomplete_beta(1.0 - x, b, a)
    tiny = 1e-300
    c, d = 1.0, 1.0 - (a + b) * x / (a + 1)
    d = 1.0 / (d if abs(d) > tiny else tiny)
    fraction = d
    for m in range(1, 500):
        for numerator in (
            m * (b - m) * x / ((a + 2 * m - 1) * (a + 2 * m)),
            -(a + m) * (a + b + m) * x / ((a + 2 * m) * (a + 2 * m + 1)),
        ):
            d = 1.0 + numerator * d
            d = 1.0 / (d if abs(d) > tiny else tiny)
            c = 1.0 + numerator / c
            c = c if abs(c) > tiny else tiny
            fraction *= c * d
        if abs(c * d - 1.0) < 1e-15:
            break
    return math.exp(log_front) * fraction / a


def t_two_sided_p(t: float, df: float) -> float:
    """P(|T| >= |t|) for Student's T with `df` (> 0, not necessarily whole) degrees of
    freedom."""
    if not df > 0:
        raise ValueError(f"degrees of freedom must be > 0, got {df}")
    if math.isinf(t):
        return 0.0
    return _incomplete_beta(df / (df + t * t), df / 2, 0.5)


@functools.cache
def t_quantile(p: float, df: float) -> float:
    """The `p` quantile (0.5 < p < 1) of Student's t with `df` degrees of freedom (bisection on
    `t_two_sided_p`, to 1e-12)."""
    if not 0.5 < p < 1 or not df > 0:
        raise ValueError(f"t_quantile needs 0.5 < p < 1 and df > 0, got p={p}, df={df}")
    tail = 2 * (1 - p)
    low, high = 0.0, 1.0
    while t_two_sided_p(high, df) > tail:
        low, high = high, 2 * high
    while high - low > 1e-12 * max(1.0, high):
        middle = (low + high) / 2
        low, high = (middle, high) if t_two_sided_p(middle, df) > tail else (low, middle)
    return (low + high) / 2


def t_interval(
    values: Sequence[float], bounds: tuple[float, float] | None = None
) -> tuple[float, float, float]:
    """`(mean, low, high)`: the mean of `values` and its 95% Student-t interval (NaN bounds for
    a single value), clipped to `bounds` when given (a rate cannot leave [0, 1], and an interval
    that does says only that the seeds are few and spread)."""
    data = np.asarray(values, float)
    mean = float(data.mean())
    if len(data) < 2:
        return mean, math.nan, math.nan
    half = t_quantile(0.975, len(data) - 1) * float(data.std(ddof=1)) / math.sqrt(len(data))
    low, high = mean - half, mean + half
    if bounds is not None:
        low, high = max(low, bounds[0]), min(high, bounds[1])
    return mean, low, high


def seed_interval(rates: Sequence[float]) -> tuple[float, float, float]:
    """`(mean, low, high)` of success rates over seeds: the t-interval clipped to [0, 1]."""
    return t_interval(rates, bounds=(0.0, 1.0))


def welch_test(a: Sequence[float], b: Sequence[float]) -> tuple[float, float, float]:
    """`(t, df, p)` of Welch's two-sample t-test of mean(a) = mean(b), two-sided.

    Two groups without spread: p = 1 when their means are equal, 0 (t infinite) when not.
    """
    x, y = np.asarray(a, float), np.asarray(b, float)
    if len(x) < 2 or len(y) < 2:
        raise ValueError(f"Welch's test needs at least 2 values a group, got {len(x)} and {len(y)}")
    va, vb = float(x.var(ddof=1)) / len(x), float(y.var(ddof=1)) / len(y)
    difference = float(x.mean() - y.mean())
    if va + vb == 0.0:
        if difference == 0.0:
            return 0.0, float(len(x) + len(y) - 2), 1.0
        return math.copysign(math.inf, difference), float(len(x) + len(y) - 2), 0.0
    t = difference / math.sqrt(va + vb)
    df = (va + vb) ** 2 / (va**2 / (len(x) - 1) + vb**2 / (len(y) - 1))
    return t, df, t_two_sided_p(t, df)


def one_sample_test(
    values: Sequence[float], reference: float, *, stochastic: bool = False
) -> tuple[float, float, float]:
    """`(t, df, p)` of the one-sample t-test of mean(values) = `reference`, two-sided: seeds
    against an agent evaluated once on the same episodes (a deterministic rule, whose one
    evaluation is all there is to it; its episodes' own sampling is not in the test).

    Seeds without spread: p = 1 at the reference, 0 (t infinite) elsewhere.

    Raises:
        ValueError: fewer than 2 values, or a `stochastic` reference (a random policy, a sampled
            teacher): its one evaluation is itself a sample, for `sampled_baseline_test`.
    """
    if stochastic:
        raise ValueError(
            "a stochastic reference's one evaluation is itself a sample: taking its rate as a "
            "constant makes p too small; use sampled_baseline_test(values, successes, trials)"
        )
    x = np.asarray(values, float)
    if len(x) < 2:
        raise ValueError(f"a one-sample test needs at least 2 values, got {len(x)}")
    difference = float(x.mean()) - reference
    spread = float(x.std(ddof=1)) / math.sqrt(len(x))
    if spread == 0.0:
        if difference == 0.0:
            return 0.0, len(x) - 1.0, 1.0
        return math.copysign(math.inf, difference), len(x) - 1.0, 0.0
    t = difference / spread
    return t, len(x) - 1.0, t_two_sided_p(t, len(x) - 1.0)


def sampled_baseline_test(
    values: Sequence[float], successes: int, trials: int
) -> tuple[float, float, float]:
    """`(t, df, p)` of seeds' rates `values` against a stochastic baseline evaluated once with
    `successes` of `trials` episodes, two-sided: Welch's test with the baseline's variance
    p(1 - p) / trials (p = successes / trials) and `trials - 1` degrees of freedom, so that the
    baseline's own sampling error is counted (a baseline of rate 0 or 1 has none: the test is
    then the one-sample test).

    Raises:
        ValueError: fewer than 2 values, or counts that are not 0 <= successes <= trials, 2 <=
            trials.
    """
    x = np.asarray(values, float)
    if len(x) < 2:
        raise ValueError(f"a test over seeds needs at least 2 values, got {len(x)}")
    if not (0 <= successes <= trials and trials >= 2):
        raise ValueError(f"a baseline of {successes} successes in {trials} episodes is not a count")
    rate = successes / trials
    va, vb = float(x.var(ddof=1)) / len(x), rate * (1 - rate) / trials
    if vb == 0.0:
        return one_sample_test(x, rate)
    difference = float(x.mean()) - rate
    t = difference / math.sqrt(va + vb)
    df = (va + vb) ** 2 / (va**2 / (len(x) - 1) + vb**2 / (trials - 1))
    return t, df, t_two_sided_p(t, df)


def holm(p_values: Sequence[float]) -> list[float]:
    """Holm's step-down adjusted p-values of a family of tests, in the given order: the i-th
    smallest p times (m - i + 1), made non-decreasing, capped at 1. A test is rejected at level
    alpha when its adjusted p-value is below alpha (family-wise error at most alpha)."""
    m = len(p_values)
    order = sorted(range(m), key=lambda i: p_values[i])
    adjusted = [0.0] * m
    running = 0.0
    for rank, i in enumerate(order):
        running = max(running, min(1.0, (m - rank) * p_values[i]))
        adjusted[i] = running
    return adjusted


PERMUTATION_EXACT_LIMIT = 200_000
"""Relabellings enumerated exactly up to this many; beyond, 100,000 random ones (seeded)."""


def permutation_p_value(a: Sequence[float], b: Sequence[float]) -> float:
    """Two-sided p-value of the permutation test of |mean(a) - mean(b)|: the share of the
    relabellings of the pooled values into groups of the same sizes whose difference is at
    least the observed one (the observed labelling included). Exact below
    `PERMUTATION_EXACT_LIMIT` relabellings; the smallest possible value is 2 / C(n, len(a))
    (0.1 for three seeds a side)."""
    pooled = np.asarray([*a, *b], float)
    n, k = len(pooled), len(a)
    if k < 1 or n - k < 1:
        raise ValueError("the permutation test needs at least one value a group")
    total = pooled.sum()
    observed = abs(pooled[:k].mean() - pooled[k:].mean())
    tolerance = 1e-12 * max(1.0, float(np.abs(pooled).max()))
    if math.comb(n, k) <= PERMUTATION_EXACT_LIMIT:
        sums = np.array([pooled[list(rows)].sum() for rows in itertools.combinations(range(n), k)])
        differences = np.abs(sums / k - (total - sums) / (n - k))
        return float(np.mean(differences >= observed - tolerance))
    generator = np.random.default_rng(0)
    draws = 100_000
    sums = np.array([generator.permutation(pooled)[:k].sum() for _ in range(draws)])
    differences = np.abs(sums / k - (total - sums) / (n - k))
    return float((np.sum(differences >= observed - tolerance) + 1) / (draws + 1))


@dataclass(frozen=True)
class SeedComparison:
    """Two groups of seeds compared: their means, Welch's test and the permutation test."""

    mean_a: float
    mean_b: float
    t: float
    df: float
    p_welch: float
    """Welch's two-sided p-value: what the docs' verdicts read (see the module docstring)."""
    p_permutation: float
    """The exact permutation test's two-sided p-value (no normality assumed)."""

    @property
    def difference(self) -> float:
        return self.mean_a - self.mean_b

    def separated(self, alpha: float = 0.05) -> bool:
        """Whether Welch's test separates the groups at level `alpha`."""
        return self.p_welch < alpha


def compare_seeds(a: Sequence[float], b: Sequence[float]) -> SeedComparison:
    """Welch's and the permutation test of group `a` against group `b` (one value a seed)."""
    t, df, p = welch_test(a, b)
    return SeedComparison(
        mean_a=float(np.mean(a)),
        mean_b=float(np.mean(b)),
        t=t,
        df=df,
        p_welch=p,
        p_permutation=permutation_p_value(a, b),
    )
