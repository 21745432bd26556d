"""The teacher-agreement measurement (glam/eval/teacher_agreement.py, scripts/teacher_agreement.py):
seeded situations from the bot's own episodes, and agreement figures that an oracle scorer,
a null one and a real (tiny) model each land where they should.

.venv/bin/python -m pytest tests/test_teacher_agreement.py
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from helpers_tiny import one_torch_thread, save_tiny_model

from glam.eval.teacher_agreement import MINIGRID_ACTIONS, measure_agreement, situations
from glam.teach.scorers import SubgoalScorer
from glam.teach.teacher import SubgoalTeacher

__all__ = ["one_torch_thread"]  # autouse fixture: one torch thread in this module

ROOT = Path(__file__).resolve().parents[1]
LEVEL = "BabyAI-GoToLocal-v0"


class OracleScorer(SubgoalScorer):
    """All the weight on the bot's subgoal of each situation (looked up by prompt)."""

    def __init__(self, answers: dict[str, str]) -> None:
        self.answers = answers

    def log_likelihoods(self, prompts, candidates):  # noqa: ANN001, ANN201
        return [
            torch.tensor([0.0 if c == self.answers[p] else -50.0 for c in cands])
            for p, cands in zip(prompts, candidates, strict=True)
        ]


@pytest.fixture(scope="module")
def cases() -> list:
    return list(situations(LEVEL, 30, seed=0))


def test_situations_are_seeded_states_of_the_bot_s_episodes(cases: list) -> None:
    again = list(situations(LEVEL, 30, seed=0))
    assert [c.prompt for c in again] == [c.prompt for c in cases]
    assert len(cases) == 30 and len({c.episode_seed for c in cases}) == 30
    for case in cases:
        assert case.prompt.startswith("Goal: go to ") and case.prompt.endswith("Next subgoal:")
        assert case.candidates[-1] == "explore" and case.bot_action in MINIGRID_ACTIONS
        assert len(case.next_actions) == len(case.candidates)
        if case.bot_subgoal in case.candidates:  # the skill of the bot's subgoal acts as it does
            index = case.candidates.index(case.bot_subgoal)
            assert case.next_actions[index] == case.bot_action
    assert [c.prompt for c in situations(LEVEL, 30, seed=1)] != [c.prompt for c in cases]


def test_an_oracle_agrees_and_the_uniform_teacher_scores_chance(cases: list) -> None:
    answers = {c.prompt: c.bot_subgoal for c in cases}
    oracle = SubgoalTeacher(MINIGRID_ACTIONS, OracleScorer(answers), cache=False)
    result, records = measure_agreement(oracle, cases, "oracle")
    covered = sum(c.bot_subgoal in c.candidates for c in cases) / len(cases)
    assert result.coverage == pytest.approx(covered) and covered > 0.9
    assert result.subgoal_agreement == pytest.approx(covered)
    assert result.action_agreement == pytest.approx(1.0)
    assert result.llm_calls == len({c.prompt for c in cases})
    assert records[0]["teacher_subgoal"] == cases[0].bot_subgoal
    uniform, _ = measure_agreement(SubgoalTeacher(MINIGRID_ACTIONS, None), cases, "uniform")
    chance = sum(1 / len(c.candidates) for c in cases) / len(cases)
    assert uniform.chance == pytest.approx(chance)
    assert uniform.bot_subgoal_probability == pytest.approx(
        sum(1 / len(c.candidates) for c in cases if c.bot_subgoal in c.candidates) / len(cases)
    )
    low, high = uniform.subgoal_agreement_ci
    assert low <= uniform.subgoal_agreement <= high and uniform.llm_calls == 0


def test_the_script_measures_a_model_and_refuses_bad_input(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    folder = save_tiny_model(tmp_path / "tiny")
    script = [sys.executable, str(ROOT / "scripts" / "teacher_agreement.py")]
    out = tmp_path / "agreement"
    done = subprocess.run(
        [*script, "--model", str(folder), "--situations", "12", "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    assert "Sampling rejected" not in done.stdout
    table = json.loads((out / "agreement.json").read_text())
    llm, uniform = table["teachers"]
    assert llm["teacher"] == f"llm:{folder}" and uniform["teacher"] == "uniform"
    assert llm["situations"] == 12 and 1 <= llm["llm_calls"] <= 12
    assert len((out / "situations.jsonl").read_text().splitlines()) == 12
    assert "| uniform | 12 |" in (out / "agreement.md").read_text()
    # Bad input, in-process (the same `main`): exit status 2 and the reason.
    spec = importlib.util.spec_from_file_location("agreement_script", script[1])
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    for bad, message in [
        (["--situations", "0"], "--situations must be >= 1"),
        (["--level", "BabyAI-Nope-v0"], "unknown level"),
        (["--model", str(tmp_path / "missing")], "cannot load the teacher's model"),
    ]:
        assert module.main([*bad, "--out", str(tmp_path / "x")]) == 2
        assert message in capsys.readouterr().err
