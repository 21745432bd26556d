"""Compare groups of seeds: each group's mean with its 95% t-interval (clipped to [0, 1] for
rates), and every group against the first by Welch's t-test and the exact permutation test; a
group of one value is an agent evaluated once (a deterministic rule), met by a one-sample t-test.

    # any machine, no run folder needed: the per-seed values a doc page gives
    python scripts/seed_test.py llm=0.70,0.75,0.62 none=0.59,0.65,0.62
    python scripts/seed_test.py --not-rates llm=4096,2048,4096 none=22528,2048,26624
    python scripts/seed_test.py always=1.0 learned=1.00,1.00,0.99   # seeds against one rule

Each argument is `LABEL=V1,V2,...`, one value per seed (a held-out success rate, frames to a
threshold...). Why Welch's p-value is the one the docs read and the permutation p-value stands
beside it: `glam.eval.stats`'s docstring. Exit status: 0 done; 2 bad input (a group without
`=`, without a value, a value that is not a finite number, a rate outside [0, 1] without
`--not-rates`, one label twice, two groups of one value).
"""

from __future__ import annotations

import argparse
import math
import sys

from glam.cli import fail
from glam.eval.stats import compare_seeds, one_sample_test, seed_interval, t_interval


def parse_group(text: str, *, rates: bool = True) -> tuple[str, list[float]]:
    """`LABEL=V1,V2,...` -> (label, values): at least one finite number each, within [0, 1]
    for `rates`.

    Raises:
        ValueError: naming the group and what is wrong with it.
    """
    label, sep, values = text.partition("=")
    if not sep or not label:
        raise ValueError(f"{text!r} is not LABEL=V1,V2,...")
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
    return label, numbers


def parse_groups(texts: list[str], *, rates: bool = True) -> list[tuple[str, list[float]]]:
    """Every group of the command line (`parse_group`), each label once.

    Raises:
        ValueError: a bad group, or a label given twice.
    """
    groups = [parse_group(text, rates=rates) for text in texts]
    labels = [label for label, _ in groups]
    twice = sorted({label for label in labels if labels.count(label) > 1})
    if twice:
        raise ValueError(f"the label(s) {', '.join(twice)} name two groups: give each one name")
    return groups


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("groups", nargs="+", help="LABEL=V1,V2,... (one value per seed)")
    parser.add_argument(
        "--not-rates", action="store_true", help="values are not rates: no clipping to [0, 1]"
    )
    args = parser.parse_args(argv)
    try:
        groups = parse_groups(args.groups, rates=not args.not_rates)
    except ValueError as error:
        fail(error)
    print("| group | seeds | mean | 95% t-interval over seeds |")
    print("|---|---|---|---|")
    for label, values in groups:
        _, low, high = t_interval(values) if args.not_rates else seed_interval(values)
        mean = sum(values) / len(values)
        interval = f"[{low:.3f}, {high:.3f}]" if len(values) > 1 else "- (one evaluation)"
        print(f"| {label} | {len(values)} | {mean:.4g} | {interval} |")
    if len(groups) < 2:
        return
    first, reference = groups[0]
    print()
    print(
        f"| {first} against | difference | t | df | p: Welch (one-sample against one value) | permutation p |"
    )
    print("|---|---|---|---|---|---|")
    for label, values in groups[1:]:
        if len(reference) < 2 and len(values) < 2:
            fail(f"{first} and {label}: two single values cannot be tested over seeds")
        if len(reference) < 2 or len(values) < 2:  # seeds against one evaluation
            seeds, fixed = (values, reference[0]) if len(reference) < 2 else (reference, values[0])
            t, df, p = one_sample_test(seeds, fixed)
            sign = 1 if len(reference) >= 2 else -1
            difference = sign * (sum(seeds) / len(seeds) - fixed)
            print(f"| {label} | {difference:+.4g} | {sign * t:.3f} | {df:.0f} | {p:.3f} | - |")
            continue
        test = compare_seeds(reference, values)
        print(
            f"| {label} | {test.difference:+.4g} | {test.t:.3f} | {test.df:.2f} "
            f"| {test.p_welch:.3f} | {test.p_permutation:.3f} |"
        )


if __name__ == "__main__":
    main(sys.argv[1:])
