"""The statistics over seeds (`glam.eval.stats`): Student's t, Welch's test and the exact
permutation test against values worked out by hand or in closed form.

.venv/bin/python -m pytest tests/test_stats.py -x -q
"""

from __future__ import annotations

import math
import subprocess
import sys
from pathlib import Path

import pytest

from glam.eval.stats import (
    compare_seeds,
    holm,
    one_sample_test,
    permutation_p_value,
    sampled_baseline_test,
    seed_interval,
    t_interval,
    t_quantile,
    t_two_sided_p,
    welch_test,
)


@pytest.mark.parametrize("t", [0.0, 0.5, 1.7320508, 4.0, 30.0])
def test_t_tails_match_the_closed_forms_of_one_and_two_degrees_of_freedom(t: float) -> None:
    # df = 1 (Cauchy): P(|T| >= t) = 1 - 2 atan(t) / pi; df = 2: 1 - t / sqrt(2 + t^2).
    assert t_two_sided_p(t, 1) == pytest.approx(1 - 2 * math.atan(t) / math.pi, abs=1e-12)
    assert t_two_sided_p(t, 2) == pytest.approx(1 - t / math.sqrt(2 + t * t), abs=1e-12)


def test_t_quantiles_match_the_tables_for_whole_and_fractional_df() -> None:
    for df, table in ((1, 12.706205), (2, 4.302653), (4, 2.776445), (10, 2.228139)):
        assert t_quantile(0.975, df) == pytest.approx(table, abs=2e-6)
    # A fractional df (Welch's) lies between its neighbours, and the tail at it is 0.05.
    assert t_quantile(0.975, 2) > t_quantile(0.975, 2.5) > t_quantile(0.975, 3)
    assert t_two_sided_p(t_quantile(0.975, 2.5), 2.5) == pytest.approx(0.05, abs=1e-10)


def test_seed_intervals_are_clipped_to_rates() -> None:
    # SmolLM2 + retrieval in docs/oni.md: 0.01, 0.05, 0.40: mean 0.1533, sd 0.2146,
    # half-width 4.302653 x 0.2146 / sqrt(3) = 0.5330: [-0.380, 0.686] unclipped.
    mean, low, high = t_interval([0.01, 0.05, 0.40])
    assert (mean, low, high) == pytest.approx((0.15333, -0.37965, 0.68631), abs=1e-4)
    assert seed_interval([0.01, 0.05, 0.40]) == pytest.approx((0.15333, 0.0, 0.68631), abs=1e-4)
    assert seed_interval([0.99, 1.0, 0.95])[2] == 1.0
    assert all(math.isnan(v) for v in seed_interval([0.5])[1:])


def test_welch_by_hand() -> None:
    # b has no spread, so df = n_a - 1 = 2 and t = 1 / sqrt(1/3) = sqrt(3): p = 1 - sqrt(3/5).
    t, df, p = welch_test([0, 1, 2], [0, 0, 0])
    assert (t, df) == pytest.approx((math.sqrt(3), 2.0))
    assert p == pytest.approx(1 - math.sqrt(3 / 5), abs=1e-12)
    # Equal spreads of 1: t = -3 / sqrt(2/3), df = 4; R's t.test(1:3, 4:6) says p = 0.02131.
    t, df, p = welch_test([1, 2, 3], [4, 5, 6])
    assert (t, df) == pytest.approx((-3 / math.sqrt(2 / 3), 4.0))
    assert p == pytest.approx(0.021312, abs=1e-6)
    # docs/teach.md: the LLM teacher 0.70, 0.75, 0.62 against plain PPO 0.59, 0.65, 0.62:
    # variances 0.0043 and 0.0009, t = 0.07 / sqrt(0.0052 / 3) = 1.681, df = 2.80, p ~ 0.2.
    t, df, p = welch_test([0.70, 0.75, 0.62], [0.59, 0.65, 0.62])
    assert (t, df) == pytest.approx((1.6813, 2.8021), abs=1e-4)
    assert 0.19 < p < 0.21
    assert welch_test([0.5, 0.5], [0.5, 0.5])[2] == 1.0  # no spread, equal: nothing to tell
    assert welch_test([1.0, 1.0], [0.0, 0.0])[2] == 0.0  # no spread, apart
    with pytest.raises(ValueError, match="at least 2 values a group"):
        welch_test([1.0], [0.0, 0.5])


def test_the_exact_permutation_test_by_hand() -> None:
    # 20 ways to split six values into 3 + 3; only {1,2,3} | {4,5,6} and its mirror reach a
    # difference of 3: p = 2 / 20. With three seeds a side no data can do better.
    assert permutation_p_value([1, 2, 3], [4, 5, 6]) == pytest.approx(0.1)
    assert permutation_p_value([1, 1, 1], [1, 1, 1]) == 1.0
    # [0, 2] | [1, 3] differs by 1; of the 6 splits, those at |difference| >= 1 are
    # {0,1}|{2,3}, {0,2}|{1,3}, {1,3}|{0,2}, {2,3}|{0,1}: 4 / 6.
    assert permutation_p_value([0, 2], [1, 3]) == pytest.approx(4 / 6)
    comparison = compare_seeds([1, 2, 3], [4, 5, 6])
    assert comparison.difference == pytest.approx(-3.0)
    assert comparison.separated() and comparison.p_permutation == pytest.approx(0.1)


def test_seeds_against_one_evaluation_by_hand() -> None:
    # mean 1, standard error 1 / sqrt(3): t = sqrt(3), df = 2, p = 1 - sqrt(3/5) as above.
    t, df, p = one_sample_test([0, 1, 2], 0.0)
    assert (t, df, p) == pytest.approx((math.sqrt(3), 2.0, 1 - math.sqrt(3 / 5)))
    assert one_sample_test([1.0, 1.0, 1.0], 1.0) == (0.0, 2.0, 1.0)
    assert one_sample_test([1.0, 1.0, 1.0], 0.5)[2] == 0.0


def test_the_seed_test_script_prints_the_intervals_and_the_tests(
    capsys: pytest.CaptureFixture[str],
) -> None:
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))
    import seed_test

    seed_test.main(["none=0.59,0.65,0.62", "llm=0.70,0.75,0.62", "rule=0.5", "random=40/100"])
    out = capsys.readouterr().out
    assert "| none | 3 | 0.62 | [0.545, 0.695] |" in out
    assert "| rule | 1 | 0.5 | - (one evaluation of a deterministic rule) |" in out
    assert "| random | - | 0.4 | [0.309, 0.498] (Wilson, 100 episodes) |" in out
    assert "Holm's correction over these 3 test(s)" in out
    # raw p 0.1977, 0.0202, 6.80e-05: Holm multiplies the smallest by 3, the next by 2, then 1
    assert "| llm | none | +0.07 | Welch | 1.681 | 2.80 | 0.1977 | 0.1977 | 0.3000 |" in out
    assert "| rule | none | -0.12 | one-sample | -6.928 | 2.00 | 0.0202 | 0.0404 | - |" in out
    assert "| random | none | -0.22 | Welch, random sampled | -4.234 | 70.65 | 6.80e-05 |" in out

    # Two references: every other group against each, one family of 2 x 2 tests.
    groups = ["none=0.59,0.65,0.62", "llm=0.70,0.75,0.62", "rule=0.5", "other=0.60,0.61,0.62"]
    seed_test.main(["--reference", "llm,rule", *groups])
    out = capsys.readouterr().out
    assert "Against llm, rule; Holm's correction over these 4 test(s)" in out
    assert "| none | llm | -0.07 | Welch | -1.681 | 2.80 | 0.1977 |" in out
    assert "| other | rule | +0.11 | one-sample |" in out
    with pytest.raises(SystemExit) as stopped:
        seed_test.main(["a=0.5", "b=0.6"])
    assert stopped.value.code == 2
    assert "compare_episodes.py" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("groups", "message"),
    [
        (["a=0.5,1.6", "b=0.4,0.5"], "a rate lies in [0, 1]; pass --not-rates"),
        (["a=", "b=0.4,0.5"], "'a=': no value"),
        (["a=0.5,nan", "b=0.4,0.5"], "the values must be finite numbers"),
        (["--not-rates", "a=4096,inf", "b=2048,1024"], "the values must be finite numbers"),
        (["a=0.5,0.6", "a=0.4,0.5"], "the label(s) a name two groups"),
        (["a=0.5,x"], "the values must be numbers"),
        (["a=0.5,0.6", "b=7/5"], "K/N needs 0 <= K <= N"),
        (["a=0.5,0.6", "b=0.4,0.5", "--reference", "c"], "--reference c: no group c"),
    ],
)
def test_the_seed_test_script_refuses_bad_groups_in_one_line(
    groups: list[str], message: str
) -> None:
    done = subprocess.run(
        [
            sys.executable,
            str(Path(__file__).resolve().parents[1] / "scripts" / "seed_test.py"),
            *groups,
        ],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.startswith("error: ") and message in done.stderr
    assert len(done.stderr.splitlines()) == 1  # no traceback


def test_a_sampled_baseline_carries_its_own_variance_by_hand() -> None:
    # seeds 0.5, 0.6, 0.7: mean 0.6, variance 0.01 -> 0.01 / 3; baseline 40 of 100: 0.24 / 100
    va, vb = 0.01 / 3, 0.4 * 0.6 / 100
    t, df, p = sampled_baseline_test([0.5, 0.6, 0.7], 40, 100)
    assert t == pytest.approx(0.2 / math.sqrt(va + vb))  # 2.641
    assert df == pytest.approx((va + vb) ** 2 / (va**2 / 2 + vb**2 / 99))  # 5.86
    assert p == pytest.approx(t_two_sided_p(t, df))
    # Seeds that agree against a baseline of 100 episodes: its sampling error dominates, and
    # treating its rate as a constant makes p far too small.
    constant = one_sample_test([0.66, 0.67, 0.68], 0.53)[2]
    sampled = sampled_baseline_test([0.66, 0.67, 0.68], 53, 100)[2]
    assert constant < 0.002 < 0.005 < sampled < 0.01
    # A baseline that never succeeds has no variance: the one-sample test.
    assert sampled_baseline_test([0.1, 0.2, 0.3], 0, 100) == one_sample_test([0.1, 0.2, 0.3], 0.0)
    with pytest.raises(ValueError, match="not a count"):
        sampled_baseline_test([0.5, 0.6], 101, 100)
    with pytest.raises(ValueError, match="use sampled_baseline_test"):
        one_sample_test([0.66, 0.67, 0.68], 0.53, stochastic=True)


def test_holm_by_hand() -> None:
    # sorted: 0.01 x 4 = 0.04; 0.03 x 3 = 0.09; 0.04 x 2 = 0.08 -> 0.09 (monotone); 0.2 x 1
    assert holm([0.01, 0.04, 0.03, 0.2]) == pytest.approx([0.04, 0.09, 0.09, 0.2])
    assert holm([0.5, 0.6]) == pytest.approx([1.0, 1.0])  # capped
    assert holm([]) == []
