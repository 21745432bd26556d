"""Two evaluations compared episode by episode (glam/eval/paired.py, scripts/compare_episodes.py):
McNemar's exact test checked by hand, and the pairing on real evaluations of the bot and of the
`go forward` control."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from glam.eval.config import AgentConfig, EvalConfig, PostTrainingTestsConfig
from glam.eval.harness import evaluate
from glam.eval.paired import ALL, compare_paired, read_episodes
from glam.eval.stats import mcnemar_exact_p

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))
import compare_episodes  # noqa: E402


@pytest.mark.parametrize(
    ("only_a", "only_b", "expected"),
    [
        (0, 0, 1.0),  # no discordant pair: nothing to tell them apart
        (2, 0, 0.5),  # 2 * (1/2)^2
        (5, 0, 0.0625),  # 2 * (1/2)^5
        (6, 1, 0.125),  # 2 * (C(7,0) + C(7,1)) / 2^7 = 2 * 8 / 128
        (1, 6, 0.125),  # two-sided: the same either way
        (10, 2, 2 * (1 + 12 + 66) / 4096),  # 0.03857...
        (3, 3, 1.0),  # twice a tail above 1/2, capped
    ],
)
def test_mcnemar_exact_p_by_hand(only_a: int, only_b: int, expected: float) -> None:
    assert mcnemar_exact_p(only_a, only_b) == pytest.approx(expected, abs=1e-12)


def test_mcnemar_refuses_negative_counts() -> None:
    with pytest.raises(ValueError, match="cannot be negative"):
        mcnemar_exact_p(-1, 2)


def _evaluate(kind: str, output_dir: Path, level: str = "BabyAI-MixedTrainLocal-v0") -> Path:
    evaluate(
        PostTrainingTestsConfig(
            agent=AgentConfig(kind=kind),
            eval=EvalConfig(
                level=level,
                episodes_per_task_type=2,
                num_envs=5,
                output_dir=str(output_dir),
                progress_bar=False,
            ),
        )
    )
    return output_dir


@pytest.fixture(scope="module")
def evaluations(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("paired")
    return {kind: _evaluate(kind, root / kind) for kind in ("bot", "constant")}


def test_the_bot_against_the_control_pairs_every_episode(evaluations: dict[str, Path]) -> None:
    bot = read_episodes(evaluations["bot"], "no_change")
    control = read_episodes(evaluations["constant"], "no_change")
    assert set(bot) == set(control) and len(bot) == 10  # the same seeds: 2 per task type
    rows = compare_paired(bot, control)
    assert [row.task_type for row in rows] == [
        "goto", "open", "pickup", "pickup_then_goto", "putnext", ALL,
    ]  # fmt: skip
    total = rows[-1]
    assert total.episodes == 10 and sum(row.episodes for row in rows[:-1]) == 10
    solved_bot = {seed for seed, e in bot.items() if e["success"]}
    solved_control = {seed for seed, e in control.items() if e["success"]}
    assert total.successes_a == len(solved_bot) == 10  # the bot solves every episode
    assert total.successes_b == len(solved_control)
    assert total.only_a == len(solved_bot - solved_control)
    assert total.only_b == len(solved_control - solved_bot) == 0
    # 6 or more discordant pairs (the control solves at most 4 of the 10): p < 0.05
    assert total.p_value == mcnemar_exact_p(total.only_a, 0) < 0.05
    assert total.same_actions == sum(bot[s]["actions"] == control[s]["actions"] for s in bot)
    assert total.same_actions < 10

    itself = compare_paired(bot, bot)[-1]  # an evaluation against itself: nothing to tell
    assert (itself.only_a, itself.only_b, itself.same_actions, itself.p_value) == (0, 0, 10, 1.0)


def test_the_script_prints_the_table_and_writes_json(
    evaluations: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "bot_vs_control.json"
    argv = [str(evaluations["bot"]), str(evaluations["constant"] / "episodes.jsonl")]
    assert compare_episodes.main([*argv, "--labels", "bot", "control", "--json", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "paired by seed: 10; left out: 0 of bot, 0 of control" in printed
    assert "| **all** | 10 | 10 |" in printed and f"wrote json {out}" in printed
    record = json.loads(out.read_text())
    assert record["rows"][-1]["task_type"] == ALL and record["rows"][-1]["successes_a"] == 10
    assert record["rows"][-1]["p_value"] == mcnemar_exact_p(record["rows"][-1]["only_a"], 0)


def test_bad_input_is_named_and_exits_2(
    evaluations: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bot = str(evaluations["bot"])
    garbage = tmp_path / "garbage" / "episodes.jsonl"
    garbage.parent.mkdir()
    garbage.write_text('{"suite": "no_change", "seed": 1, "success": true}\nnot json\n')
    other_level = _evaluate("constant", tmp_path / "goto", level="BabyAI-GoToRedBallNoDists-v0")
    shifted = tmp_path / "shifted.jsonl"  # the control's episodes under other seeds
    lines = (evaluations["constant"] / "episodes.jsonl").read_text().splitlines()
    shifted.write_text(
        "".join(
            json.dumps(json.loads(line) | {"seed": -1 - i}) + "\n" for i, line in enumerate(lines)
        )
    )
    cases = [
        ([bot, str(tmp_path / "missing")], "cannot read the episodes"),
        ([bot, str(garbage.parent)], "line 2: not an episode record"),
        ([bot, bot, "--suite", "french"], "no episode of suite 'french' (suites there: no_change)"),
        ([bot, str(shifted)], "share no seed"),
        ([bot, str(other_level)], "is not the same episode in both"),  # same seeds, other level
    ]
    for argv, message in cases:
        with pytest.raises(SystemExit) as stopped:
            compare_episodes.main(argv)
        assert stopped.value.code == 2, argv
        assert message in capsys.readouterr().err, argv
