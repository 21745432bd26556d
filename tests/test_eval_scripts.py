"""The evaluation scripts as subprocesses: outputs, aggregation, and clear failures."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _script(name: str, *overrides: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(ROOT / "scripts" / name), *overrides],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_post_training_tests_then_test_results(tmp_path: Path) -> None:
    done = _script(
        "post_training_tests.py",
        "agent.kind=random",
        "eval.suites=[no_change,invented_nouns]",
        "eval.episodes=4",
        "eval.num_envs=4",
        "eval.max_steps=5",
        "eval.seed=1",
        "eval.progress_bar=false",
        f"eval.output_dir={tmp_path / 'seed-1'}",
    )
    assert done.returncode == 0, done.stderr
    assert f"wrote json     {tmp_path / 'seed-1' / 'results.json'}" in done.stdout
    results = json.loads((tmp_path / "seed-1" / "results.json").read_text())
    assert results["seed_base"] == 10**12 + 10**6
    assert results["suites"]["invented_nouns"]["episodes"] == 4
    # A second seed of the same agent (edited copy: saves a second run).
    results["suites"]["no_change"]["success_rate"] = 0.5
    (tmp_path / "seed-2").mkdir()
    (tmp_path / "seed-2" / "results.json").write_text(json.dumps(results))

    done = _script("test_results.py", f"inputs=[{tmp_path}]", f"output_dir={tmp_path / 'sum'}")
    assert done.returncode == 0, done.stderr
    assert "aggregated 2 results.json" in done.stdout
    assert "| invented_nouns |" in (tmp_path / "sum" / "summary.md").read_text()
    assert (tmp_path / "sum" / "summary.png").is_file()


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["agent.kind=checkpoint", "agent.path=/nonexistent/run"], "/nonexistent/run"),
        (["agent.kind=dqn"], "agent.kind='dqn' is not one of"),
        (["agent.kind=random", "eval.suites=[no_change,klingon]"], "known suites: no_change"),
    ],
    ids=["missing_checkpoint", "unknown_agent", "unknown_suite"],
)
def test_user_errors_exit_non_zero_with_a_clear_message(
    tmp_path: Path, overrides: list[str], message: str
) -> None:
    done = _script("post_training_tests.py", *overrides, f"eval.output_dir={tmp_path}")
    assert done.returncode == 2
    assert "error:" in done.stderr and message in done.stderr
    assert "Traceback" not in done.stderr
    assert not (tmp_path / "results.json").exists()


def test_a_misspelt_key_fails(tmp_path: Path) -> None:
    done = _script("post_training_tests.py", "eval.episode=3", f"eval.output_dir={tmp_path}")
    assert done.returncode != 0
    assert "episode" in done.stderr
