"""An evaluation's journal: finished episodes survive a kill, `eval.resume=true` plays the rest."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from glam.eval.agents import RandomAgent
from glam.eval.config import AgentConfig, EvalConfig, PostTrainingTestsConfig
from glam.eval.harness import evaluate
from glam.eval.journal import JOURNAL, Journal, JournalError
from glam.outputs import OutputExistsError

ROOT = Path(__file__).resolve().parents[1]


def _config(output_dir: Path, **eval_settings) -> PostTrainingTestsConfig:
    settings = {
        "suites": ["no_change", "adj_synonyms"],
        "episodes": 12,
        "num_envs": 3,
        "max_steps": 10,
        "output_dir": str(output_dir),
        "progress_bar": False,
    } | eval_settings
    return PostTrainingTestsConfig(agent=AgentConfig(kind="random"), eval=EvalConfig(**settings))


def _episodes(folder: Path) -> list[dict]:
    return [json.loads(line) for line in (folder / "episodes.jsonl").read_text().splitlines()]


def _interrupted(monkeypatch, folder: Path, steps: int) -> Path:
    """Evaluate into `folder`, the random agent stopping the process (as Ctrl-C would) at its
    `steps`-th step."""
    act = RandomAgent.act
    count = {"n": 0}

    def interrupted(self, request):
        count["n"] += 1
        if count["n"] == steps:
            raise KeyboardInterrupt
        return act(self, request)

    with monkeypatch.context() as patch:
        patch.setattr(RandomAgent, "act", interrupted)
        with pytest.raises(KeyboardInterrupt):
            evaluate(_config(folder))
    return folder


@pytest.fixture
def uninterrupted(tmp_path) -> tuple[dict, Path]:
    results, _ = evaluate(_config(tmp_path / "whole"))
    return results, tmp_path / "whole"


def test_a_resumed_evaluation_equals_an_uninterrupted_one(tmp_path, monkeypatch, uninterrupted):
    whole, whole_dir = uninterrupted
    assert not (whole_dir / JOURNAL).exists()  # removed with the results written
    # within the second suite (12 episodes of at most 10 steps, 3 envs each)
    folder = _interrupted(monkeypatch, tmp_path / "cut", 60)
    assert not (folder / "results.json").exists()
    kept = Journal.found(folder)
    assert 12 < kept < 24  # all of no_change, part of adj_synonyms

    # num_envs and the progress bar may change: they do not change what an episode plays
    results, paths = evaluate(_config(folder, resume=True, num_envs=5, progress_bar=True))
    assert _episodes(folder) == _episodes(whole_dir)  # every seed once, played the same
    for name in ("no_change", "adj_synonyms"):
        assert results["suites"][name] == whole["suites"][name]  # prompts counted once too
    assert results["resumed"] == {"runs": 2, "episodes_kept": kept}
    assert results["elapsed_seconds"] > 0
    assert not (folder / JOURNAL).exists()
    assert json.loads(paths["json"].read_text())["resumed"]["runs"] == 2


def test_an_unfinished_evaluation_is_not_replaced_or_resumed_unasked(tmp_path, monkeypatch):
    folder = _interrupted(monkeypatch, tmp_path / "cut", 30)
    with pytest.raises(
        OutputExistsError, match=r"unfinished evaluation \(\d+ episodes.*eval.resume=true"
    ):
        evaluate(_config(folder))
    # overwrite starts again: the journal is replaced, not continued
    results, _ = evaluate(_config(folder, overwrite=True))
    assert "resumed" not in results and not (folder / JOURNAL).exists()
    # a finished evaluation has nothing to resume
    with pytest.raises(JournalError, match="holds no unfinished evaluation"):
        evaluate(_config(folder, resume=True))
    with pytest.raises(ValueError, match="choose one"):
        _config(folder, resume=True, overwrite=True)


def test_other_settings_refuse_the_resume_naming_them(tmp_path, monkeypatch):
    folder = _interrupted(monkeypatch, tmp_path / "cut", 30)
    with pytest.raises(JournalError, match=r"eval.max_steps \(was 10, now 12\)"):
        evaluate(_config(folder, resume=True, max_steps=12))
    assert Journal.found(folder) > 0  # the refusal leaves the journal as it was


def test_a_line_cut_by_a_kill_is_played_again_and_a_damaged_one_stops(
    tmp_path, monkeypatch, uninterrupted
):
    _, whole_dir = uninterrupted
    folder = _interrupted(monkeypatch, tmp_path / "cut", 30)
    journal = folder / JOURNAL
    lines = journal.read_text().splitlines()
    journal.write_text("\n".join(lines[:-1]) + "\n" + lines[-1][:40])  # the last one cut short
    with pytest.warns(UserWarning, match="cut short"):
        evaluate(_config(folder, resume=True))
    assert _episodes(folder) == _episodes(whole_dir)

    damaged = _interrupted(monkeypatch, tmp_path / "damaged", 30)
    lines = (damaged / JOURNAL).read_text().splitlines()
    lines[1] = lines[1][:20]
    (damaged / JOURNAL).write_text("\n".join(lines) + "\n")
    with pytest.raises(JournalError, match="line 2: not JSON"):
        evaluate(_config(damaged, resume=True))


def test_the_usage_of_the_runs_adds_up(tmp_path) -> None:
    journal = Journal(tmp_path / JOURNAL, {})
    journal.earlier_usage = {"model_id": "m", "answers": 10, "prompt_tokens": 900}
    assert journal.usage({"model_id": "m", "answers": 4, "prompt_tokens": 100}) == {
        "model_id": "m",
        "answers": 14,
        "prompt_tokens": 1000,
    }
    assert journal.usage(None) is None


def test_a_killed_script_resumes_where_it_stopped(tmp_path, uninterrupted) -> None:
    """SIGKILL, not an exception: what is on disk at that instant is all there is."""
    folder = tmp_path / "killed"
    command = [
        sys.executable,
        str(ROOT / "scripts" / "post_training_tests.py"),
        "agent.kind=random",
        "eval.suites=[no_change,adj_synonyms]",
        "eval.episodes=400",
        "eval.num_envs=3",
        "eval.max_steps=10",
        "eval.progress_bar=false",
        f"eval.output_dir={folder}",
    ]
    process = subprocess.Popen(command, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 120
    while (Journal.found(folder) or 0) < 20 and process.poll() is None:
        assert time.monotonic() < deadline, "no episode finished in 120 s"
        time.sleep(0.05)
    os.kill(process.pid, signal.SIGKILL)
    process.wait()
    assert process.returncode == -signal.SIGKILL, process.stderr.read().decode()
    kept = Journal.found(folder)
    assert 20 <= kept < 800 and not (folder / "results.json").exists()

    refused = subprocess.run(command, cwd=ROOT, capture_output=True, text=True)
    assert refused.returncode == 2 and "eval.resume=true" in refused.stderr + refused.stdout

    results, _ = evaluate(_config(folder, episodes=400, resume=True))
    episodes = _episodes(folder)
    # a line cut by the kill is counted by `found` but played again
    assert len(episodes) == 800 and results["resumed"]["episodes_kept"] in (kept - 1, kept)
    by_seed = {(e["suite"], e["seed"]): e for e in episodes}
    assert len(by_seed) == 800
    # the first 12 seeds of each suite, as the uninterrupted 12-episode run played them
    for episode in _episodes(uninterrupted[1]):
        assert by_seed[(episode["suite"], episode["seed"])] == episode
