"""Compare groups of seeds with a reference: each group's mean with its 95% interval, then every
group against the reference by the test its data call for, with Holm's correction over the
tests of the command (its family).

    # any machine, no run folder needed: the per-seed values a doc page gives
    python scripts/seed_test.py llm=0.70,0.75,0.62 none=0.59,0.65,0.62
    python scripts/seed_test.py --not-rates llm=4096,2048,4096 none=22528,2048,26624
    python scripts/seed_test.py always=1.0 learned=1.00,1.00,0.99   # seeds against one rule
    python scripts/seed_test.py random=53/100 llm=0.40,0.57,0.62    # against a sampled baseline
    python scripts/seed_test.py --reference symbolic scoring=0.40,0.57,0.62 \
        symbolic=0.79,0.83,0.84 drrn=0.67,0.77,0.81

Each argument is a group:
- `LABEL=V1,V2,...`: one value per seed (a held-out success rate, frames to a threshold...);
- `LABEL=V`: one evaluation of a deterministic rule (BabyAI's bot, always one action): its one
  number is all there is to it, and seeds are met by the one-sample t-test;
- `LABEL=K/N`: one evaluation of a stochastic baseline (uniformly random actions, random
  asking, a sampled teacher), K successes of N episodes: itself a sample, met by Welch's test
  with its binomial variance (`glam.eval.stats.sampled_baseline_test`).
Two evaluations of episodes (a rule, a sampled baseline) are not compared here: pair their
episodes with `scripts/compare_episodes.py` (McNemar's exact test).

The references are `--reference LABEL[,LABEL...]` (default: the first group). Every other group
is tested against each reference (the difference is the group's mean less the reference's); the
p-values are printed raw and corrected by Holm's step-down method over those
tests (`glam.eval.stats.holm`): a verdict reads the corrected one. Why Welch's p-value is the
one the docs read and the permutation p-value stands beside it: `glam.eval.stats`'s docstring.
Exit status: 0 done; 2 bad input (a group without `=` or without a value, a value that is not a
finite number, a rate outside [0, 1] without `--not-rates`, a count that is not K/N with
0 <= K <= N, one label twice, an unknown `--reference`, two single evaluations to compare).
"""

from __future__ import annotations

import argparse
import math
import sys
from dataclasses import dataclass

from glam.cli import fail
from glam.eval.stats import (
    compare_seeds,
    holm,
    one_sample_test,
    sampled_baseline_test,
    seed_interval,
    t_interval,
    wilson_interval,
)


@dataclass(frozen=True)
class Group:
    """One group of the command line."""

    label: str
    values: list[float]
    """One per seed; a single value for one evaluation."""
    trials: int | None = None
    """`K/N`: the N episodes of a stochastic baseline's one evaluation (its value is K / N)."""

    @property
    def seeds(self) -> bool:
        return len(self.values) > 1

    @property
    def mean(self) -> float:
        return sum(self.values) / len(self.values)


def parse_group(text: str, *, rates: bool = True) -> Group:
    """`LABEL=V1,V2,...`, `LABEL=V` or `LABEL=K/N` as a `Group`: finite numbers, within [0, 1]
    for `rates`.

    Raises:
        ValueError: naming the group and what is wrong with it.
    """
    label, sep, values = text.partition("=")
    if not sep or not label:
        raise ValueError(f"{text!r} is not LABEL=V1,V2,... (or LABEL=K/N)")
    if "/" in values:
        successes, _, trials = values.partition("/")
        try:
            k, n = int(successes), int(trials)
        except ValueError:
            raise ValueError(f"{text!r}: a sampled baseline is K/N, two whole numbers") from None
        if not 0 <= k <= n or n < 2:
            raise ValueError(f"{text!r}: K/N needs 0 <= K <= N and N >= 2 episodes")
        return Group(label, [k / n], trials=n)
    try:
        numbers = [float(v) for v in values.split(",") if v.strip()]
    except ValueError:
        raise ValueError(f"{text!r}: the values must be numbers") from None
    if not numbers:
        raise ValueError(f"{text!r}: no value (give one per seed: {label}=0.5,0.7)")
    if not all(math.isfinite(v) for v in numbers):
        raise ValueError(f"{text!r}: the values must be finite numbers")
    if rates and not all(0.0 <= v <= 1.0 for v in numbers):
        raise ValueError(
            f"{text!r}: a rate lies in [0, 1]; pass --not-rates for other values (frames...)"
        )
    return Group(label, numbers)


def parse_groups(texts: list[str], *, rates: bool = True) -> list[Group]:
    """Every group of the command line (`parse_group`), each label once.

    Raises:
        ValueError: a bad group, or a label given twice.
    """
    groups = [parse_group(text, rates=rates) for text in texts]
    labels = [group.label for group in groups]
    twice = sorted({label for label in labels if labels.count(label) > 1})
    if twice:
        raise ValueError(f"the label(s) {', '.join(twice)} name two groups: give each one name")
    return groups


def format_p(p: float) -> str:
    """A p-value with enough digits to compare with 0.05 or 0.01 after a correction."""
    return f"{p:.4f}" if p >= 1e-3 else f"{p:.2e}"


def test_against(reference: Group, group: Group) -> tuple[str, float, float, float, float | None]:
    """`(test, t, df, p, permutation p)` of `group` against `reference`, t signed as
    `group - reference`.

    Raises:
        ValueError: neither is a group of seeds.
    """
    if not reference.seeds and not group.seeds:
        raise ValueError(
            f"{reference.label} and {group.label}: two single evaluations cannot be tested over "
            "seeds; pair their episodes with scripts/compare_episodes.py (McNemar)"
        )
    if reference.seeds and group.seeds:
        comparison = compare_seeds(group.values, reference.values)
        return "Welch", comparison.t, comparison.df, comparison.p_welch, comparison.p_permutation
    seeds, single = (group, reference) if group.seeds else (reference, group)
    sign = 1.0 if group.seeds else -1.0
    if single.trials is not None:
        successes = round(single.values[0] * single.trials)
        t, df, p = sampled_baseline_test(seeds.values, successes, single.trials)
        return f"Welch, {single.label} sampled", sign * t, df, p, None
    t, df, p = one_sample_test(seeds.values, single.values[0])
    return "one-sample", sign * t, df, p, None


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "groups", nargs="+", help="LABEL=V1,V2,... (one value per seed), LABEL=V or LABEL=K/N"
    )
    parser.add_argument(
        "--not-rates", action="store_true", help="values are not rates: no clipping to [0, 1]"
    )
    parser.add_argument(
        "--reference",
        help="the group(s) the others are tested against, comma-separated (default: the first)",
    )
    args = parser.parse_args(argv)
    try:
        groups = parse_groups(args.groups, rates=not args.not_rates)
        by_label = {group.label: group for group in groups}
        names = args.reference.split(",") if args.reference else [groups[0].label]
        unknown = [name for name in names if name not in by_label]
        if unknown:
            raise ValueError(
                f"--reference {args.reference}: no group {', '.join(unknown)} "
                f"({', '.join(by_label)})"
            )
        if args.not_rates and any(group.trials for group in groups):
            raise ValueError("K/N is a rate: it cannot be compared with --not-rates values")
        references = [by_label[name] for name in names]
        others = [group for group in groups if group.label not in names]
        pairs = [(reference, group) for reference in references for group in others]
        tests = [test_against(reference, group) for reference, group in pairs]
    except ValueError as error:
        fail(error)
    print("| group | seeds | mean | 95% interval |")
    print("|---|---|---|---|")
    for group in groups:
        if group.trials is not None:
            low, high = wilson_interval(round(group.mean * group.trials), group.trials)
            interval = f"[{low:.3f}, {high:.3f}] (Wilson, {group.trials} episodes)"
        elif group.seeds:
            _, low, high = (
                t_interval(group.values) if args.not_rates else seed_interval(group.values)
            )
            interval = f"[{low:.3f}, {high:.3f}]"
        else:
            interval = "- (one evaluation of a deterministic rule)"
        seeds = len(group.values) if group.trials is None else "-"
        print(f"| {group.label} | {seeds} | {group.mean:.4g} | {interval} |")
    if not pairs:
        return
    corrected = holm([p for _, _, _, p, _ in tests])
    print()
    print(
        f"Against {', '.join(names)}; Holm's correction over these {len(tests)} test(s) (the "
        "family of this command)."
    )
    print()
    print("| group | against | difference | test | t | df | p | p, Holm | permutation p |")
    print("|---|---|---|---|---|---|---|---|---|")
    for (reference, group), (name, t, df, p, p_permutation), p_holm in zip(
        pairs, tests, corrected, strict=True
    ):
        permutation = "-" if p_permutation is None else format_p(p_permutation)
        print(
            f"| {group.label} | {reference.label} | {group.mean - reference.mean:+.4g} | {name} "
            f"| {t:.3f} | {df:.2f} | {format_p(p)} | {format_p(p_holm)} | {permutation} |"
        )


if __name__ == "__main__":
    main(sys.argv[1:])
