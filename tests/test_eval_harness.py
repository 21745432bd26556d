"""Evaluation harness: exact episode counts, seeds, baselines, statistics and reports."""

from __future__ import annotations

import csv
import json
import os

import numpy as np
import pytest
import torch

from glam.eval.agents import BotAgent, RandomAgent, choose_actions
from glam.eval.config import SEED_BASE, AgentConfig, EvalConfig, PostTrainingTestsConfig
from glam.eval.episodes import run_suite
from glam.eval.harness import evaluate
from glam.eval.report import aggregate, excluded_suites, read_results, write_aggregate
from glam.eval.stats import summarize, wilson_interval
from glam.eval.suites import SUITES

LEVEL = "BabyAI-MixedTrainLocal-v0"


def _run(agent, episodes: int, num_envs: int, suite: str = "no_change", **kwargs):
    return run_suite(
        agent,
        SUITES[suite],
        level=LEVEL,
        episodes=episodes,
        num_envs=num_envs,
        seed_base=10**9,
        nbr_obs=3,
        **kwargs,
    )


def test_exactly_n_episodes_each_seed_once() -> None:
    run = _run(RandomAgent(), episodes=7, num_envs=3, max_steps=6)
    assert len(run.episodes) == 7
    assert [e.seed for e in run.episodes] == list(range(10**9, 10**9 + 7))


def test_per_task_type_plays_the_first_seeds_of_each_type() -> None:
    from collections import Counter

    import babyai_text
    from glam.eval.episodes import TASK_FAMILIES

    run = _run(RandomAgent(), episodes=1, num_envs=4, max_steps=3, per_task_type=2)
    families = Counter(TASK_FAMILIES.get(e.task_type, e.task_type) for e in run.episodes)
    assert families == dict.fromkeys(["goto", "pickup", "putnext", "pickup_then_goto", "open"], 2)
    # The first two seeds of each type, none skipped: replay the seeds up to the last one.
    env = babyai_text.make(LEVEL)
    seen: Counter[str] = Counter()
    expected = []
    for seed in range(10**9, run.episodes[-1].seed + 1):
        task = env.reset(seed=seed)[1]["task_type"]
        family = TASK_FAMILIES.get(task, task)
        if seen[family] < 2:
            seen[family] += 1
            expected.append(seed)
    assert [e.seed for e in run.episodes] == expected
    # A level with one task: that many episodes of it.
    single = run_suite(
        RandomAgent(),
        SUITES["no_change"],
        level="BabyAI-GoToLocal-v0",
        episodes=1,
        num_envs=2,
        seed_base=10**9,
        nbr_obs=1,
        max_steps=2,
        per_task_type=3,
    )
    assert [e.seed for e in single.episodes] == [10**9, 10**9 + 1, 10**9 + 2]


def test_seeds_are_reproducible_and_independent_of_the_batch() -> None:
    first = _run(RandomAgent(), episodes=6, num_envs=2, max_steps=20).episodes
    again = _run(RandomAgent(), episodes=6, num_envs=2, max_steps=20).episodes
    wider = _run(RandomAgent(), episodes=6, num_envs=6, max_steps=20).episodes
    assert first == again == wider
    assert len({e.mission for e in first}) > 1


def test_the_bot_passes_no_change() -> None:
    run = _run(BotAgent(), episodes=40, num_envs=8)
    summary = summarize(run.episodes)
    assert summary.success_rate >= 0.95
    assert len({e.task_type for e in run.episodes}) == 6  # the mix, both sequence phrasings


def test_the_bot_solves_the_renamed_actions_and_new_composition() -> None:
    for suite in ("renamed_actions", "new_composition"):
        assert (
            summarize(_run(BotAgent(), episodes=10, num_envs=5, suite=suite).episodes).success_rate
            == 1.0
        )


def test_the_bot_plays_on_without_the_actions_it_plans() -> None:
    """In the navigation space the bot cannot pick up an object that blocks its path: it plays
    on (replanning after the action actually played) and fails only those episodes."""

    def runs(action_space):
        return run_suite(
            BotAgent(),
            SUITES["no_change"],
            level="BabyAI-GoToRedBall-v0",
            episodes=8,
            num_envs=4,
            seed_base=SEED_BASE + 29,  # seeds 29 and 36 of the held-out set: a blocked path
            nbr_obs=3,
            action_space=action_space,
        ).episodes

    full, nav = runs(None), runs("nav")
    assert all(e.success for e in full)
    failed = [e.seed - SEED_BASE for e in nav if not e.success]
    assert failed == [29, 36]
    assert all(e.length == 64 for e in nav if not e.success)  # played to the step limit


def test_the_bot_plays_on_after_giving_up(monkeypatch) -> None:
    """A bot that gives up by raising (as minigrid's does on plans it cannot finish) leaves its
    episode to the space's first action; the other envs keep their bots."""
    import glam.teach.teacher as teacher

    class GivesUpOnDoors(teacher.BabyAIBot):
        def replan(self, action_taken=None):
            if "door" in self.mission.mission:
                raise AssertionError("cannot plan")
            return super().replan(action_taken)

    honest = _run(BotAgent(), episodes=16, num_envs=4, max_steps=12).episodes
    monkeypatch.setattr(teacher, "BabyAIBot", GivesUpOnDoors)
    run = _run(BotAgent(), episodes=16, num_envs=4, max_steps=12).episodes
    doors = [e for e in run if "door" in e.mission]
    assert 0 < len(doors) < len(run)
    assert all(not e.success and e.length == 12 for e in doors)  # turned left to the limit
    assert [e for e in run if e not in doors] == [e for e in honest if "door" not in e.mission]
    assert any(e.success for e in run)


def test_the_bot_plays_the_same_episodes_in_french() -> None:
    """The bot reads the grid: in French it meets the same rooms, so it plays the same moves."""

    def outcomes(suite: str) -> list[tuple]:
        run = _run(BotAgent(), episodes=12, num_envs=4, suite=suite)
        return [(e.seed, e.task_type, e.success, e.length, e.episode_return) for e in run.episodes]

    assert outcomes("french") == outcomes("no_change")


def test_wilson_interval_known_values() -> None:
    low, high = wilson_interval(0, 10)
    assert low == 0.0 and high == pytest.approx(0.2775, abs=1e-4)
    low, high = wilson_interval(10, 10)
    assert low == pytest.approx(0.7225, abs=1e-4) and high == 1.0
    low, high = wilson_interval(50, 100)
    assert (low, high) == pytest.approx((0.4038, 0.5962), abs=1e-4)
    with pytest.raises(ValueError):
        wilson_interval(3, 2)


def test_choose_actions_greedy_and_sampled() -> None:
    logits = torch.tensor([[0.0, 5.0, 1.0], [3.0, 0.0, 0.0]])
    assert choose_actions(logits, [None, None], greedy=True) == [1, 0]

    def sample() -> list[int]:
        return choose_actions(logits, [np.random.default_rng(s) for s in (1, 2)], greedy=False)

    assert sample() == sample()
    many = [
        choose_actions(logits[:1], [np.random.default_rng(s)], greedy=False)[0] for s in range(300)
    ]
    assert 0.9 < many.count(1) / 300 < 1.0  # softmax(0, 5, 1)[1] = 0.976


def test_evaluate_writes_every_report(tmp_path) -> None:
    cfg = PostTrainingTestsConfig(
        agent=AgentConfig(kind="random"),
        eval=EvalConfig(
            suites=["no_change", "adj_synonyms"],
            episodes=5,
            num_envs=5,
            max_steps=8,
            output_dir=str(tmp_path),
            progress_bar=False,
        ),
    )
    results, paths = evaluate(cfg)
    on_disk = json.loads(paths["json"].read_text())
    assert on_disk == json.loads(json.dumps(results))
    record = on_disk["suites"]["adj_synonyms"]
    for key in ("success_rate", "ci_low", "ci_high", "mean_return", "mean_length", "episodes"):
        assert key in record
    assert record["episodes"] == 5 and record["mean_length"] <= 8
    assert record["rewritten_prompt_fraction"] == 1.0
    assert sum(t["episodes"] for t in record["per_task_type"].values()) == 5
    assert on_disk["suites"]["no_change"]["rewritten_prompt_fraction"] == 0.0
    assert "| adj_synonyms |" in paths["md"].read_text()
    assert (
        paths["csv"]
        .read_text()
        .startswith("label,suite,level,action_space,prompt_format,language,task_type,success_rate")
    )
    assert paths["png"].read_bytes()[:4] == b"\x89PNG"
    assert len(paths["episodes"].read_text().splitlines()) == 10


def test_rows_say_what_ran_and_a_suite_that_cannot_apply_is_left_out(tmp_path, monkeypatch) -> None:
    """The issue's case: a navigation agent on GoToLocalS6N2. Every row names its level, action
    space, prompt format and language; new_composition is "not applicable" with its reason, and
    no chart, mean or aggregated table counts it."""
    import glam.eval.report as report

    charted: list[list[str]] = []
    monkeypatch.setattr(
        report, "_bar_chart", lambda path, title, groups, *args: charted.append(list(groups))
    )
    level = "BabyAI-GoToLocalS6N2-v0"
    cfg = PostTrainingTestsConfig(
        agent=AgentConfig(kind="random"),
        eval=EvalConfig(
            level=level,
            action_space="nav",
            suites=["no_change", "french", "renamed_actions", "new_composition"],
            episodes=4,
            num_envs=4,
            max_steps=5,
            output_dir=str(tmp_path / "eval"),
            progress_bar=False,
        ),
    )
    results, paths = evaluate(cfg)
    suites = json.loads(paths["json"].read_text())["suites"]
    setups = {
        name: tuple(record[k] for k in ("level", "action_space", "prompt_format", "language"))
        for name, record in suites.items()
    }
    assert setups == {
        "no_change": (level, "nav", "none", "en"),
        "french": (level, "french[nav]", "none", "fr"),
        "renamed_actions": (level, "renamed[nav]", "none", "en"),
        "new_composition": ("BabyAI-PickUpSeqPickUpLocal-v0", "nav", "none", "en"),
    }
    assert suites["french"]["action_words"] == ["tourner à gauche", "tourner à droite", "avancer"]
    skipped = suites["new_composition"]
    assert skipped["status"] == "not applicable" and "success_rate" not in skipped
    assert "without 'pick up', 'drop'" in skipped["reason"]
    assert all(
        suites[s]["status"] == "ran" and suites[s]["episodes"] == 4
        for s in setups
        if s != "new_composition"
    )
    lines = paths["episodes"].read_text().splitlines()
    assert len(lines) == 12 and not any('"new_composition"' in line for line in lines)
    # Markdown and CSV: a row saying so, with the reason; the chart: no bar.
    markdown = paths["md"].read_text()
    assert (
        "| new_composition | BabyAI-PickUpSeqPickUpLocal-v0 | nav | none | en | not applicable |"
        in markdown
    )
    assert skipped["reason"] in markdown
    assert f"| french | {level} | french[nav] | none | fr | " in markdown
    with paths["csv"].open() as handle:
        (csv_skipped,) = [r for r in csv.DictReader(handle) if r["suite"] == "new_composition"]
    assert csv_skipped["status"] == "not applicable" and csv_skipped["success_rate"] == ""
    assert csv_skipped["reason"] == skipped["reason"] and csv_skipped["action_space"] == "nav"
    assert charted == [["no_change", "french", "renamed_actions"]]
    # Aggregated over runs: not in the table, the means or the chart; listed with its reason.
    rows = aggregate([results])
    assert {row.suite for row in rows} == {"no_change", "french", "renamed_actions"}
    excluded = excluded_suites([results])
    assert excluded == {(results["label"], "new_composition"): skipped["reason"]}
    summary = write_aggregate(
        tmp_path / "sum", rows, baseline="no_change", title="t", excluded=excluded
    )
    text = summary["md"].read_text()
    assert "| new_composition |" not in text and skipped["reason"] in text
    assert "new_composition" not in summary["csv"].read_text()
    assert charted[-1] == ["no_change", "french", "renamed_actions"]


def test_unknown_level_or_missing_bc_fail_before_any_episode(tmp_path) -> None:
    cfg = PostTrainingTestsConfig(
        agent=AgentConfig(kind="random"),
        eval=EvalConfig(level="BabyAI-Nowhere-v0", output_dir=str(tmp_path)),
    )
    with pytest.raises(ValueError, match="unknown level id.*BabyAI-Nowhere-v0"):
        evaluate(cfg)
    cfg = PostTrainingTestsConfig(
        agent=AgentConfig(kind="bc", path=str(tmp_path / "no_bc")),
        eval=EvalConfig(output_dir=str(tmp_path)),
    )
    with pytest.raises(FileNotFoundError, match="no_bc"):
        evaluate(cfg)
    assert not (tmp_path / "results.json").exists()


def test_an_output_folder_it_may_not_write_stops_the_evaluation_before_the_agent_loads(
    tmp_path, monkeypatch
) -> None:
    """A file, or a training run, where the results go was found after every episode ran."""

    def no_agent(*args: object, **kwargs: object) -> None:
        raise AssertionError("the agent was built before the output folder was checked")

    monkeypatch.setattr("glam.eval.harness.build_agent", no_agent)
    file = tmp_path / "results"
    file.write_text("not a folder")
    run_dir = tmp_path / "run"
    (run_dir / "checkpoints").mkdir(parents=True)
    (run_dir / "metrics.csv").write_text("update,frames\n1,8\n")
    for folder, message in [
        (file, r"eval.output_dir='.*results' is a file, not a folder"),
        (file / "eval", r"cannot be created: .*results is a file"),
        (run_dir, r"holds a training run \(checkpoints, metrics.csv\)"),
    ]:
        cfg = PostTrainingTestsConfig(
            agent=AgentConfig(kind="random"),
            eval=EvalConfig(output_dir=str(folder), overwrite=True),
        )
        with pytest.raises(ValueError, match=message):
            evaluate(cfg)


def _fake(label: str, level: str, rates: dict[str, float]) -> dict:
    return {
        "label": label,
        "eval": {"level": level},
        "suites": {s: {"success_rate": r, "episodes": 100} for s, r in rates.items()},
    }


@pytest.mark.parametrize(
    ("content", "problem"),
    [
        (b"\x89PNG\r\n\x1a\n\x00\xff", "'utf-8' codec can't decode"),
        (b"{results", "Expecting property name"),
        (b"[1, 2]", "no `suites` object"),
        (b'{"suites": {}, "eval": {"level": "L"}}', "no `label` text"),
        (b'{"label": "a", "suites": {}}', "no `eval.level` text"),
        (
            b'{"label": "a", "eval": {"level": "L"}, "suites": {"s": {"success_rate": "high"}}}',
            "suite 's': success_rate is 'high', not a number",
        ),
    ],
    ids=["binary", "not_json", "a_list", "no_label", "no_level", "text_rate"],
)
def test_a_file_that_is_not_a_results_json_is_named(tmp_path, content: bytes, problem: str) -> None:
    """scripts/test_results.py met these with a raw traceback (UnicodeDecodeError, KeyError)."""
    path = tmp_path / "results.json"
    path.write_bytes(content)
    with pytest.raises(ValueError) as refused:
        read_results(path)
    message = str(refused.value)
    assert message.startswith(f"{path} is not a results.json of scripts/post_training_tests.py")
    assert problem in message


def test_aggregate_mean_spread_and_change(tmp_path) -> None:
    results = [
        _fake("glam", LEVEL, {"no_change": 0.8, "french": 0.1}),
        _fake("glam", LEVEL, {"no_change": 0.6, "french": 0.0}),
        _fake("random", LEVEL, {"no_change": 0.15}),
    ]
    rows = {(r.label, r.suite): r for r in aggregate(results)}
    glam_french = rows["glam", "french"]
    assert glam_french.runs == 2 and glam_french.mean == pytest.approx(0.05)
    assert glam_french.std == pytest.approx(np.std([0.1, 0.0], ddof=1))
    assert glam_french.change_pct == pytest.approx(100 * (0.05 - 0.7) / 0.7)
    assert rows["glam", "no_change"].change_pct == pytest.approx(0.0)
    assert rows["random", "no_change"].episodes == 100
    paths = write_aggregate(tmp_path, list(rows.values()), baseline="no_change", title="t")
    assert "-93%" in paths["md"].read_text()
    # One run: its Wilson interval, not a spread of 0.
    single = _fake("bot", LEVEL, {"no_change": 0.9})
    single["suites"]["no_change"] |= {"ci_low": 0.83, "ci_high": 0.94}
    (row,) = aggregate([single])
    assert row.ci == (0.83, 0.94)
    paths = write_aggregate(tmp_path, [row], baseline="no_change", title="t")
    assert "0.900 [0.830, 0.940] (n=1)" in paths["md"].read_text()
    # Two levels are never averaged together.
    mixed = aggregate([*results, _fake("glam", "BabyAI-MixedTestLocal-v0", {"no_change": 0.1})])
    assert {r.label for r in mixed} >= {"glam (MixedTrainLocal-v0)", "glam (MixedTestLocal-v0)"}


def test_a_log_file_gets_a_line_while_envs_play(tmp_path, monkeypatch, capsys) -> None:
    """Without a terminal (nohup, SLURM), progress shows at episode ends and, between them, at
    least every HEARTBEAT_S seconds (here every step)."""
    monkeypatch.setattr("glam.eval.harness.HEARTBEAT_S", 0.0)
    cfg = PostTrainingTestsConfig(
        agent=AgentConfig(kind="random"),
        eval=EvalConfig(episodes=4, num_envs=2, max_steps=3, output_dir=str(tmp_path)),
    )
    evaluate(cfg)
    lines = [line for line in capsys.readouterr().out.splitlines() if line.startswith("[eval]")]
    # First what it chose to compute with: tests/conftest.py pins OMP_NUM_THREADS.
    pinned = os.environ["OMP_NUM_THREADS"]
    assert lines.pop(0) == f"[eval] {pinned} torch thread(s) (OMP_NUM_THREADS={pinned})"
    assert lines[0].startswith(
        "[eval] 0/4 episodes, 1 steps played by this run (2 envs in the last)"
    )
    assert any(line.startswith("[eval] 4/4 episodes (no_change)") for line in lines)
    assert sum("steps played" in line for line in lines) >= 6  # at least 2 x 3 steps
