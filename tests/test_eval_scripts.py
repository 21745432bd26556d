"""The evaluation scripts as subprocesses: outputs, aggregation, and clear failures."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
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

    # A baseline no input played once exited 0 with the change column blank.
    done = _script(
        "test_results.py", f"inputs=[{tmp_path}]", f"output_dir={tmp_path / 'x'}", "baseline=kl"
    )
    assert done.returncode == 2
    assert done.stderr.startswith(
        "error: baseline='kl' is not a suite any input played; they hold invented_nouns, "
        "no_change: pass one of them as baseline"
    )
    assert not (tmp_path / "x").exists()


@pytest.mark.parametrize(
    ("overrides", "status", "message"),
    [
        (["agent.kind=checkpoint", "agent.path=/nonexistent/run"], 2, "/nonexistent/run"),
        (["agent.kind=dqn"], 1, "invalid configuration: agent.kind='dqn' is not one of"),
        (["agent.kind=random", "eval.suites=[no_change,klingon]"], 2, "known suites: no_change"),
        (["eval.episode=3"], 1, "unknown key eval.episode (did you mean eval.episodes?)"),
    ],
    ids=["missing_checkpoint", "unknown_agent", "unknown_suite", "misspelt_key"],
)
def test_user_errors_exit_non_zero_with_a_clear_message(
    tmp_path: Path, overrides: list[str], status: int, message: str
) -> None:
    done = _script("post_training_tests.py", *overrides, f"eval.output_dir={tmp_path}")
    assert done.returncode == status
    assert "error:" in done.stderr and message in done.stderr
    assert "Traceback" not in done.stderr
    assert not (tmp_path / "results.json").exists()


def test_results_are_never_replaced_unless_asked(tmp_path: Path) -> None:
    out, summary = tmp_path / "eval", tmp_path / "summary"
    common = [
        "agent.kind=random",
        "eval.episodes=2",
        "eval.num_envs=2",
        "eval.max_steps=3",
        "eval.progress_bar=false",
        f"eval.output_dir={out}",
    ]
    assert _script("post_training_tests.py", *common).returncode == 0
    before = {path.name: path.read_bytes() for path in out.iterdir()}

    again = _script("post_training_tests.py", *common, "eval.seed=1")
    assert again.returncode == 2
    assert f"eval.output_dir='{out}' already holds results (results.json" in again.stderr
    assert "pass eval.overwrite=true to replace them, or choose another eval.output_dir" in (
        again.stderr
    )
    assert {path.name: path.read_bytes() for path in out.iterdir()} == before

    replaced = _script("post_training_tests.py", *common, "eval.seed=1", "eval.overwrite=true")
    assert replaced.returncode == 0, replaced.stderr
    assert json.loads((out / "results.json").read_text())["seed_base"] == 10**12 + 10**6

    # The aggregated table: the same rule, with the top-level `overwrite`.
    table = ("test_results.py", f"inputs=[{out}]", f"output_dir={summary}")
    assert _script(*table).returncode == 0
    again = _script(*table)
    assert again.returncode == 2 and "pass overwrite=true" in again.stderr
    assert _script(*table, "overwrite=true").returncode == 0


def test_ctrl_c_keeps_the_finished_episodes_and_says_how_to_go_on(tmp_path: Path) -> None:
    out = tmp_path / "eval"
    command = [
        sys.executable,
        str(ROOT / "scripts" / "post_training_tests.py"),
        "agent.kind=random",
        "eval.episodes=5000",
        "eval.num_envs=1",
        "eval.progress_bar=false",
        f"eval.output_dir={out}",
    ]
    # Ctrl-C's default (a shell may start the suite with SIGINT ignored, which children inherit)
    process = subprocess.Popen(
        command,
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    deadline = time.monotonic() + 240
    journal = out / "episodes.partial.jsonl"  # glam.eval.journal: each episode as it ends
    while len(_lines(journal)) < 3 and time.monotonic() < deadline:
        time.sleep(0.2)
    process.send_signal(signal.SIGINT)
    _, stderr = process.communicate(timeout=120)
    assert process.returncode == 130, stderr.decode()[-2000:]
    message = stderr.decode()
    assert "Traceback" not in message and message.strip().splitlines()[-1].startswith("error: ")
    assert "continue with eval.resume=true" in message
    kept = [json.loads(line) for line in _lines(journal)]
    assert kept[0]["kind"] == "start" and [e["kind"] for e in kept[1:]].count("episode") >= 2


def _lines(path: Path) -> list[str]:
    return path.read_text().splitlines() if path.exists() else []
