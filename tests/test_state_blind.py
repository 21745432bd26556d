"""The state-blind policy (`agent.kind=fixed`), the search for the best one, and its script."""

from __future__ import annotations

import csv
import json
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from glam.eval.builders import agent_label, build_agent
from glam.eval.config import AgentConfig, EvalConfig, PostTrainingTestsConfig
from glam.eval.episodes import run_suite
from glam.eval.harness import run_tests
from glam.eval.state_blind import search_ceiling, simplex_grid
from glam.eval.suites import SUITES

ROOT = Path(__file__).resolve().parents[1]
LEVEL = "BabyAI-GoToRedBall-v0"


def _config(probs: list[float], **settings) -> PostTrainingTestsConfig:
    settings = {
        "level": LEVEL,
        "suites": ["no_change"],
        "episodes": 20,
        "num_envs": 5,
        "action_space": "nav",
        "progress_bar": False,
        **settings,
    }
    return PostTrainingTestsConfig(
        agent=AgentConfig(kind="fixed", probs=probs), eval=EvalConfig(**settings)
    )


@pytest.mark.parametrize(
    ("probs", "message"),
    [
        (None, "needs agent.probs"),
        ([], "needs agent.probs"),
        ([0.5, 0.6, -0.1], "non-negative"),
        ([0.2, 0.2, 0.2], "sum to 1"),
        ([float("nan"), 0.5, 0.5], "non-negative"),
    ],
)
def test_bad_probabilities_are_refused(probs, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        AgentConfig(kind="fixed", probs=probs)


def test_probabilities_belong_to_the_fixed_agent_only() -> None:
    with pytest.raises(ValueError, match="agent.probs is for agent.kind=fixed"):
        AgentConfig(kind="random", probs=[0.5, 0.5])


def test_the_fixed_agent_draws_its_actions_with_the_given_frequencies() -> None:
    cfg = _config([0.1, 0.2, 0.7], episodes=30, max_steps=40)
    agent = build_agent(cfg.agent, greedy=True)  # greedy or not, it samples
    assert agent.name == agent_label(cfg.agent) == "fixed:[0.1,0.2,0.7]"
    episodes = run_tests(agent, cfg)["no_change"].episodes
    played = Counter(int(a) for e in episodes for a in e.actions.split())
    total = sum(played.values())
    assert total > 500
    for action, p in enumerate((0.1, 0.2, 0.7)):
        assert played[action] / total == pytest.approx(p, abs=0.05)
    # Seeded per episode: the same episodes again, action for action.
    again = run_tests(build_agent(cfg.agent, greedy=False), cfg)["no_change"].episodes
    assert [e.actions for e in again] == [e.actions for e in episodes]


def test_a_policy_over_other_actions_than_the_suites_is_refused() -> None:
    cfg = _config([0.5, 0.5])
    with pytest.raises(ValueError, match="has 2 probabilities; the suite's action space has 3"):
        run_suite(
            build_agent(cfg.agent, greedy=False),
            SUITES["no_change"],
            level=LEVEL,
            episodes=2,
            num_envs=2,
            seed_base=10**9,
            nbr_obs=1,
            action_space="nav",
        )


def test_simplex_grid_enumerates_every_vector_once() -> None:
    grid = simplex_grid(3, 0.5)
    assert grid == [
        (0.0, 0.0, 1.0),
        (0.0, 0.5, 0.5),
        (0.0, 1.0, 0.0),
        (0.5, 0.0, 0.5),
        (0.5, 0.5, 0.0),
        (1.0, 0.0, 0.0),
    ]
    assert len(simplex_grid(3, 0.1)) == 66  # C(12, 2)
    assert all(abs(sum(p) - 1) < 1e-12 for p in simplex_grid(4, 0.25))
    with pytest.raises(ValueError, match="1/k"):
        simplex_grid(3, 0.3)


def test_the_search_ranks_policies_by_their_success() -> None:
    # Never going forward never reaches the ball: the search must rank every such policy last.
    ranked = search_ceiling(_config([1, 0, 0], episodes=10, seed=1), actions=3, step=0.5)
    assert len(ranked) == 6
    assert [c.success_rate for c in ranked] == sorted(
        (c.success_rate for c in ranked), reverse=True
    )
    never_forward = [c for c in ranked if c.probs[2] == 0]
    assert all(c.success_rate == 0 for c in never_forward)
    assert ranked[0].probs[2] > 0 and ranked[0].success_rate > 0


@pytest.mark.slow
def test_the_script_searches_on_tuning_seeds_and_evaluates_the_best(tmp_path: Path) -> None:
    out = tmp_path / "ceiling"
    command = [sys.executable, "scripts/state_blind_ceiling.py", LEVEL, "--out", str(out)]
    command += ["--step", "0.5", "--tune-episodes", "10", "--episodes", "12", "--num-envs", "4"]
    result = subprocess.run(command, cwd=ROOT, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    results = json.loads((out / "results.json").read_text())
    suite = results["suites"]["no_change"]
    assert suite["episodes"] == 12
    with open(out / "ceiling_search.csv") as handle:
        rows = list(csv.DictReader(handle))
    assert len(rows) == 6 and {row["eval_seed"] for row in rows} == {"1"}
    best = [float(rows[0][word]) for word in ("turn left", "turn right", "go forward")]
    assert f"agent.probs={best}" in result.stdout
    # An earlier evaluation is kept unless --overwrite; the same seeds for both are refused.
    again = subprocess.run(command, cwd=ROOT, capture_output=True, text=True)
    assert again.returncode == 2 and "--overwrite" in again.stderr
    same = subprocess.run(
        [*command, "--overwrite", "--tune-seed", "0"], cwd=ROOT, capture_output=True, text=True
    )
    assert same.returncode == 2 and "choose the winner" in same.stderr
