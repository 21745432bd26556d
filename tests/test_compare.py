"""Reading comparisons (`glam.compare`, `scripts/compare_runs.py`) on hand-made run folders whose
curves, bands, thresholds and final success are worked out by hand.

PYTHONPATH=$PWD .venv/bin/python -m pytest tests/test_compare.py -x -q
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest
from omegaconf import OmegaConf

from glam.compare import (
    BASELINE,
    HELD_OUT,
    TRAINING,
    ComparisonError,
    FrameWindow,
    _seeds,
    band_over_seeds,
    baseline_rows,
    final_rows,
    frame_grid,
    frames_to_threshold,
    group_bands,
    interpolate,
    load_run,
    metric_bands,
    preset_from_command,
    run_label,
    smooth,
    t_quantile,
    threshold_rows,
    tidy_curves,
    window_text,
    window_updates,
)
from glam.eval.stats import wilson_interval
from glam.run_config import TrainingRunConfig

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))

import compare_runs  # noqa: E402

NAN = math.nan
T1 = 12.706204736174707
"""t(0.975) with 1 degree of freedom: tan(0.475 pi)."""


def make_run(
    folder: Path,
    frames: Sequence[float],
    success: Sequence[float],
    episodes: Sequence[float] | None = None,
    returns: Sequence[float] | None = None,
    *,
    seed: int = 1,
    label: str = "",
    command: str = "scripts/train_language_agent.py train.output_dir=x",
    config: dict[str, dict[str, Any]] | None = None,
) -> Path:
    """A run folder: config.yaml as the trainer writes it (the resolved config and `launch`) and
    a metrics.csv with blanks where no episode ended."""
    folder.mkdir(parents=True)
    resolved = OmegaConf.to_container(OmegaConf.structured(TrainingRunConfig()))
    resolved["train"] |= {"seed": seed, "label": label}
    for section, values in (config or {}).items():
        resolved[section] |= values
    resolved["launch"] = {"world_size": 1, "command": command}
    (folder / "config.yaml").write_text(OmegaConf.to_yaml(resolved))
    episodes = episodes if episodes is not None else [1.0] * len(frames)
    returns = returns if returns is not None else [0.5 * s for s in success]
    table = pd.DataFrame(
        {
            "update": range(1, len(frames) + 1),
            "frames": frames,
            "elapsed_seconds": range(1, len(frames) + 1),
            "charts/episode_return": returns,
            "charts/episodes": episodes,
            "charts/success_rate": success,
            "losses/entropy": 1.0,
        }
    )
    table.to_csv(folder / "metrics.csv", index=False)
    return folder


def write_results(
    folder: Path,
    label: str,
    level: str,
    success: float,
    episodes: int,
    suite: str = "no_change",
    figures: dict[str, float] | None = None,
) -> Path:
    """A results.json as `scripts/post_training_tests.py` writes it (the fields read here), with
    the agent's own figures when given (a mediator's `ask/*`)."""
    folder.mkdir(parents=True, exist_ok=True)
    low, high = wilson_interval(round(success * episodes), episodes)
    record = {
        "status": "ran",
        "level": level,
        "success_rate": success,
        "ci_low": low,
        "ci_high": high,
        "mean_return": success * 0.6,
        "mean_length": 20.0,
        "episodes": episodes,
        **({"agent_figures": figures} if figures else {}),
    }
    results = {
        "label": label,
        "protocol": "scoring",
        "agent": {"kind": "checkpoint", "path": str(folder)},
        "eval": {"level": level},
        "suites": {suite: record},
    }
    path = folder / "results.json"
    path.write_text(json.dumps(results))
    return path


# ---------------------------------------------------------------------------------------------
# Smoothing, interpolation, grid, intervals
# ---------------------------------------------------------------------------------------------


def test_smoothing_counts_the_episodes_of_the_last_updates() -> None:
    success = [0.0, NAN, 1.0, 0.5]  # the second update: no episode ended
    episodes = [1.0, 0.0, 3.0, 1.0]
    np.testing.assert_allclose(smooth(success, episodes, 1), [0.0, NAN, 1.0, 0.5])
    np.testing.assert_allclose(smooth(success, episodes, 2), [0.0, 0.0, 1.0, 3.5 / 4])
    np.testing.assert_allclose(smooth(success, episodes, 3), [0.0, 0.0, 3 / 4, 3.5 / 4])
    np.testing.assert_allclose(smooth([NAN, NAN, 1.0], [0, 0, 2], 2), [NAN, NAN, 1.0])
    with pytest.raises(ValueError, match="window must be >= 1"):
        smooth(success, episodes, 0)


def test_interpolation_is_linear_inside_and_never_extrapolates() -> None:
    grid = [50, 100, 150, 200, 250, 300, 350]
    values = interpolate([100, 200, 300], [NAN, 0.2, 0.6], grid)
    # Nothing before the first value (frame 200) nor after the last logged frame (300).
    np.testing.assert_allclose(values, [NAN, NAN, NAN, 0.2, 0.4, 0.6, NAN])
    assert np.isnan(interpolate([100, 200], [NAN, NAN], grid)).all()


def test_t_quantiles_match_closed_forms_and_tables() -> None:
    assert t_quantile(0.975, 1) == pytest.approx(math.tan(0.475 * math.pi), abs=1e-6)
    # 2 degrees of freedom: t = (2p - 1) sqrt(2 / (1 - (2p - 1)^2)).
    assert t_quantile(0.975, 2) == pytest.approx(0.95 * math.sqrt(2 / (1 - 0.95**2)), abs=1e-6)
    for df, table in ((4, 2.776445), (10, 2.228139), (30, 2.042272)):
        assert t_quantile(0.975, df) == pytest.approx(table, abs=2e-6)


def test_band_over_seeds_by_hand() -> None:
    band = band_over_seeds([[0.2, 0.2], [0.4, 0.6], [0.9, NAN]])
    # Column 0: mean 0.5, sd sqrt(0.26 / 2), t(0.975, 2) = 4.302653.
    half = 4.302653 * math.sqrt(0.13) / math.sqrt(3)
    assert band.mean[0] == pytest.approx(0.5)
    assert (band.low[0], band.high[0]) == pytest.approx((0.5 - half, 0.5 + half), abs=1e-6)
    # Column 1: the third seed has no value there, so the group has none either.
    assert np.isnan([band.mean[1], band.low[1], band.high[1]]).all()
    # The seeds' own curves are kept (the plot draws them beside the band).
    assert band.seeds == 3
    np.testing.assert_array_equal(band.curves[1], [0.4, 0.6])
    one = band_over_seeds([[0.3, 0.4]])
    np.testing.assert_allclose(one.mean, [0.3, 0.4])
    assert np.isnan(one.low).all() and np.isnan(one.high).all()


def test_runs_logged_at_different_frames_meet_on_a_common_grid(tmp_path: Path) -> None:
    a = load_run(make_run(tmp_path / "a", [100, 200, 300, 400], [0.0, 0.5, 1.0, 1.0], label="x"))
    b = load_run(make_run(tmp_path / "b", [150, 300, 450], [0.0, 0.6, 0.9], seed=2, label="x"))
    grid = frame_grid([a, b], 4)
    np.testing.assert_array_equal(grid, [100, 217, 333, 450])  # linspace(100, 450, 4), rounded
    success, returns = group_bands([a, b], grid, window=1)[a.label]
    # At 217: a = 0.5 + 0.17 * 0.5 = 0.585, b = 0.6 * 67 / 150 = 0.268.
    # At 333: a = 1.0, b = 0.6 + 0.3 * 33 / 150 = 0.666. Two seeds: half-width t1 * |a - b| / 2,
    # which takes a success band out of [0, 1]: it is clipped there; a return band is not.
    np.testing.assert_allclose(success.mean, [NAN, 0.4265, 0.833, NAN])
    np.testing.assert_allclose(success.low, [NAN, 0.0, 0.0, NAN], atol=1e-6)
    np.testing.assert_allclose(success.high, [NAN, 1.0, 1.0, NAN], atol=1e-6)
    np.testing.assert_allclose(returns.mean, 0.5 * success.mean)  # returns are 0.5 x success
    half = [NAN, T1 * 0.1585 / 2, T1 * 0.167 / 2, NAN]
    np.testing.assert_allclose(returns.mean - returns.low, half, atol=1e-6)
    tidy = tidy_curves([a, b], grid, window=1)
    assert list(tidy.columns) == ["label", "seed", "run", "frames", "success", "return"]
    # Each run only where it was logged: a ends at 400 < 450, b starts at 150 > 100.
    assert tidy[tidy.seed == 1].frames.tolist() == [100, 217, 333]
    assert tidy[tidy.seed == 2].frames.tolist() == [217, 333, 450]
    np.testing.assert_allclose(tidy[tidy.seed == 2].success, [0.268, 0.666, 0.9])


# ---------------------------------------------------------------------------------------------
# Frames to a threshold
# ---------------------------------------------------------------------------------------------


def test_frames_to_threshold_with_a_seed_that_never_reaches_it(tmp_path: Path) -> None:
    frames = [100, 200, 300, 400, 500]
    episodes = [2.0] * 5
    curves = {
        1: [0.0, 0.5, 1.0, 1.0, 1.0],  # smoothed over 2 updates: 0, .25, .75, 1, 1
        2: [0.5, 0.5, 1.0, 0.5, 0.5],  # .5, .5, .75, .75, .5
        3: [0.0, 0.0, 0.0, 0.0, 0.5],  # 0, 0, 0, 0, .25
    }
    runs = [
        load_run(make_run(tmp_path / f"s{seed}", frames, s, episodes, seed=seed, label="L"))
        for seed, s in curves.items()
    ]
    assert frames_to_threshold(np.array(frames), smooth(curves[1], episodes, 2), 0.75) == 300
    assert frames_to_threshold(np.array(frames), np.full(5, NAN), 0.1) is None
    half, most = threshold_rows(runs, [0.5, 0.8], window=2)
    assert (half.label, half.threshold) == ("L", 0.5)
    assert half.per_seed == {1: 300.0, 2: 100.0, 3: None}
    assert (len(half.reached), half.median, half.mean) == (2, 200.0, 200.0)
    assert most.per_seed == {1: 400.0, 2: None, 3: None}
    assert (len(most.reached), most.median, most.mean) == (1, 400.0, 400.0)


def test_a_window_in_frames_spans_the_same_experience_for_any_update_size(
    tmp_path: Path,
) -> None:
    """Runs of 100-frame and 400-frame updates smoothed over 800 frames: 8 and 2 updates. The
    large-update run reaches 0.75 at the same frame as the small one whose success rises at the
    same frames, where a window of 2 updates each would smooth the small run over 200 frames."""
    small = load_run(
        make_run(
            tmp_path / "small",
            list(range(100, 1700, 100)),
            [0.0] * 8 + [1.0] * 8,
            [1.0] * 16,
            seed=1,
            label="small",
        )
    )
    large = load_run(
        make_run(
            tmp_path / "large",
            [400, 800, 1200, 1600],
            [0.0, 0.0, 1.0, 1.0],
            [4.0] * 4,
            seed=1,
            label="large",
        )
    )
    window = FrameWindow(800)
    assert (window.updates(small), window.updates(large)) == (8, 2)
    assert window_updates(3, small) == 3 and window_text(window) == "800 frames"
    by_frames = {
        row.label: row.per_seed[1] for row in threshold_rows([small, large], [0.75], window)
    }
    assert by_frames == {"small": 1400.0, "large": 1600.0}
    by_updates = {row.label: row.per_seed[1] for row in threshold_rows([small, large], [0.75], 2)}
    assert by_updates == {"small": 1000.0, "large": 1600.0}  # the small run's 200-frame window
    with pytest.raises(ValueError, match=">= 1 frame"):
        FrameWindow(0)


# ---------------------------------------------------------------------------------------------
# Labels
# ---------------------------------------------------------------------------------------------


def test_labels_from_train_label_the_preset_or_the_folder(tmp_path: Path) -> None:
    named = load_run(make_run(tmp_path / "r1", [100], [0.5], label="glam"))
    assert (named.label, named.label_source) == ("glam", "train.label")
    command = "scripts/train_language_agent.py --config-name tiny train.output_dir=x"
    preset = load_run(make_run(tmp_path / "r2", [100], [0.5], command=command))
    assert (preset.label, preset.label_source) == ("tiny", "--config-name")
    folder = load_run(make_run(tmp_path / "seed-3", [100], [0.5]))
    assert (folder.label, folder.label_source) == ("seed-3", "folder name")
    # A config from before train.label existed reads as an empty label.
    assert run_label({"train": {"seed": 1}, "launch": {}}, Path("runs/old"))[0] == "old"
    assert preset_from_command("train.py -cn=glam_paper ppo.lr=1") == "glam_paper"
    assert preset_from_command("train.py --config-name=smollm2_lora_cpu") == "smollm2_lora_cpu"
    assert preset_from_command("accelerate launch train.py -cn tiny") == "tiny"
    assert preset_from_command("train.py ppo.lr=1") is None


def test_labels_from_config_keys_and_unknown_keys(tmp_path: Path) -> None:
    run = make_run(tmp_path / "r", [100], [0.5], config={"ppo": {"lr": 0.001}})
    assert load_run(run, ["ppo.lr"]).label == "ppo.lr=0.001"
    both = load_run(run, ["ppo.lr", "model.lora.r"])
    assert (both.label, both.label_source) == (
        "ppo.lr=0.001, model.lora.r=8",
        "ppo.lr, model.lora.r",
    )
    with pytest.raises(ComparisonError, match=r"'ppo.lrr' is not a key .*did you mean ppo.lr"):
        load_run(run, ["ppo.lrr"])


def test_unreadable_metrics_and_config_are_named(tmp_path: Path) -> None:
    run = make_run(tmp_path / "r", [100], [0.5])
    (run / "metrics.csv").write_text("update,frames,charts/success_rate\n1,lots,0.5\n")
    with pytest.raises(ComparisonError, match="metrics.csv holds a value that is not a number"):
        load_run(run)
    (run / "config.yaml").write_text("- a list\n")
    with pytest.raises(ComparisonError, match="config.yaml is not a config"):
        load_run(run)


def test_runs_are_grouped_by_label(tmp_path: Path) -> None:
    runs = [
        load_run(make_run(tmp_path / f"{label}{seed}", [100, 200], [s, s], seed=seed, label=label))
        for label, seed, s in (("a", 1, 0.2), ("b", 1, 0.9), ("a", 2, 0.4))
    ]
    bands = group_bands(runs, np.array([100.0, 200.0]), window=1)
    assert list(bands) == ["a", "b"]
    assert bands["a"][0].seeds == 2 and bands["b"][0].seeds == 1
    np.testing.assert_allclose(bands["a"][0].mean, [0.3, 0.3])
    np.testing.assert_allclose(bands["b"][0].mean, [0.9, 0.9])


# ---------------------------------------------------------------------------------------------
# Final success and baselines
# ---------------------------------------------------------------------------------------------

LEVEL = "BabyAI-GoToRedBallNoDists-v0"


def test_final_success_held_out_when_evaluated_else_training(tmp_path: Path) -> None:
    frames = [100, 200, 300]
    runs = []
    for seed, rate, n in ((1, 0.9, 100), (2, 0.7, 50)):
        folder = make_run(tmp_path / f"s{seed}", frames, [0.0, 0.0, 0.0], seed=seed, label="L")
        write_results(folder / "eval" / "heldout", "ckpt", LEVEL, rate, n)
        # Another suite's results beside it are not the final evaluation.
        write_results(folder / "eval" / "renamed", "ckpt", LEVEL, 0.1, 10, "renamed_actions")
        runs.append(load_run(folder))
    # Seed 3 has no evaluation: the episodes of its last 2 updates, 2 + 6 successes of 4 + 6.
    folder = make_run(
        tmp_path / "s3", frames, [0.0, 0.5, 1.0], [5, 4, 6], [0.0, 0.3, 0.6], seed=3, label="L"
    )
    runs.append(load_run(folder))
    held_out, training = final_rows(runs, window=2)
    assert (held_out.source, held_out.level, len(held_out.outcomes)) == (HELD_OUT, LEVEL, 2)
    assert [o.seed for o in held_out.outcomes] == [1, 2]
    assert held_out.mean == pytest.approx(0.8)
    # 0.8 -+ 12.7 x 0.1 leaves [0, 1]: a success rate's interval is clipped to it.
    assert held_out.seed_interval == pytest.approx((max(0.0, 0.8 - T1 * 0.1), 1.0))
    assert held_out.pooled_interval == pytest.approx(wilson_interval(90 + 35, 150))
    assert training.source == TRAINING and training.outcomes[0].seed == 3
    assert training.mean == pytest.approx(0.8)
    assert training.episodes == 10
    assert training.pooled_interval == pytest.approx(wilson_interval(8, 10))
    assert training.mean_return == pytest.approx((4 * 0.3 + 6 * 0.6) / 10)
    assert all(math.isnan(v) for v in training.seed_interval)  # one seed: no spread

    write_results(runs[0].path / "eval" / "again", "ckpt", LEVEL, 0.5, 10)
    with pytest.raises(ComparisonError, match="two evaluations of no_change on BabyAI-GoTo"):
        final_rows(runs, window=2)


def test_baselines_from_evaluation_results(tmp_path: Path) -> None:
    write_results(tmp_path / "random" / "seed-1", "random", LEVEL, 0.4, 100)
    write_results(tmp_path / "random" / "seed-2", "random", LEVEL, 0.5, 100)
    write_results(tmp_path / "bot", "bot", LEVEL, 1.0, 50)
    rows = baseline_rows([tmp_path / "random", tmp_path / "bot" / "results.json"])
    by_label = {row.label: row for row in rows}
    assert {row.source for row in rows} == {BASELINE}
    assert len(by_label["random"].outcomes) == 2
    assert by_label["random"].mean == pytest.approx(0.45)
    assert by_label["random"].pooled_interval == pytest.approx(wilson_interval(90, 200))
    assert by_label["bot"].pooled_interval == (wilson_interval(50, 50)[0], 1.0)
    with pytest.raises(ComparisonError, match="no results.json at"):
        baseline_rows([tmp_path / "nothing"])
    with pytest.raises(ComparisonError, match="has the suite french"):
        baseline_rows([tmp_path / "bot"], suite="french")


def _write_episodes(
    folder: Path, successes: Sequence[bool], suite: str = "no_change", actions: str | None = None
) -> None:
    """An episodes.jsonl as the harness writes it beside results.json (with each episode's
    actions when given, as the harness writes them since it records them)."""
    lines = [
        json.dumps(
            {
                "suite": suite,
                "seed": 10**12 + i,
                "success": won,
                "length": 5 + i,
                "episode_return": 0.9 if won else 0.0,
                **({"actions": actions} if actions is not None else {}),
            }
        )
        for i, won in enumerate(successes)
    ]
    (folder / "episodes.jsonl").write_text("\n".join(lines) + "\n")


def test_replays_of_one_deterministic_evaluation_count_once(tmp_path: Path) -> None:
    """A rule evaluated once per training seed on the same episodes is one evaluation: its
    100 episodes are not 300, and three equal rates are not three seeds."""
    same = [True] * 86 + [False] * 14
    for seed in (1, 2, 3):
        write_results(tmp_path / "rule" / f"seed-{seed}", "rule", LEVEL, 0.86, 100)
        _write_episodes(tmp_path / "rule" / f"seed-{seed}", same)
    (row,) = baseline_rows([tmp_path / "rule"])
    assert (len(row.outcomes), len(row.distinct), row.episodes) == (3, 1, 100)
    assert row.pooled_interval == pytest.approx(wilson_interval(86, 100))
    assert all(math.isnan(v) for v in row.seed_interval)  # one evaluation: no spread
    # Another seed whose episodes differ (even at the same rate) is a seed of its own.
    write_results(tmp_path / "rule" / "seed-4", "rule", LEVEL, 0.86, 100)
    _write_episodes(tmp_path / "rule" / "seed-4", same[::-1])
    (row,) = baseline_rows([tmp_path / "rule"])
    assert (len(row.distinct), row.episodes) == (2, 200)
    assert _seeds(row) == "4 (2 distinct: the rest replay its episodes)"  # the table's column


def test_agents_that_fail_alike_but_act_differently_are_not_replays(tmp_path: Path) -> None:
    """Two policies that time out in every episode have the same seeds, successes, returns and
    lengths; the actions they played tell them apart, and a replay still plays the same."""
    never = [False] * 100
    for seed, actions in ((1, "0 2 2 -"), (2, "1 1 0 2"), (3, "0 2 2 -")):
        write_results(tmp_path / "w" / f"seed-{seed}", "w", LEVEL, 0.0, 100)
        _write_episodes(tmp_path / "w" / f"seed-{seed}", never, actions=actions)
    (row,) = baseline_rows([tmp_path / "w"])
    assert (len(row.outcomes), len(row.distinct), row.episodes) == (3, 2, 200)
    # Files from before the actions were recorded: a writer's invalid answers still tell.
    for seed, invalid in ((1, 40), (2, 12)):
        folder = tmp_path / "old" / f"seed-{seed}"
        write_results(folder, "old", LEVEL, 0.0, 100)
        _write_episodes(folder, never)
        lines = [json.loads(line) for line in (folder / "episodes.jsonl").read_text().splitlines()]
        rows = [json.dumps({**line, "invalid_actions": invalid}) for line in lines]
        (folder / "episodes.jsonl").write_text("\n".join(rows) + "\n")
    (row,) = baseline_rows([tmp_path / "old"])
    assert len(row.distinct) == 2


def test_metrics_written_by_the_trainers_logger_are_read(tmp_path: Path) -> None:
    """The real metrics.csv format: columns in the logger's order, blanks for NaN."""
    from glam.ppo.logger import MetricsLogger

    folder = make_run(tmp_path / "run", [1], [0.0])
    (folder / "metrics.csv").unlink()
    logger = MetricsLogger(folder, enabled=True)
    for update, (rate, count) in enumerate([(NAN, 0.0), (0.5, 2.0), (1.0, 1.0)], start=1):
        episode_return = 0.4 * rate if count else NAN
        metrics = {
            "charts/success_rate": rate,
            "charts/episode_return": episode_return,
            "charts/episodes": count,
            "losses/policy": 0.1,
        }
        logger.log(update, 64 * update, float(update), metrics)
    logger.close()
    run = load_run(folder)
    np.testing.assert_array_equal(run.frames, [64, 128, 192])
    np.testing.assert_allclose(run.success, [NAN, 0.5, 1.0])
    np.testing.assert_allclose(smooth(run.success, run.episodes, 3), [NAN, 0.5, 2 / 3])


# ---------------------------------------------------------------------------------------------
# scripts/compare_runs.py
# ---------------------------------------------------------------------------------------------


def _compare(*args: str | Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "compare_runs.py"), *map(str, args)],
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_script_writes_the_comparison(tmp_path: Path) -> None:
    frames = [256 * u for u in range(1, 9)]
    runs = []
    for preset, slope in (("tiny", 0.1), ("glam", 0.2)):
        for seed in (1, 2):
            success = [min(1.0, slope * u + 0.05 * seed) for u in range(1, 9)]
            command = f"scripts/train_language_agent.py --config-name {preset}"
            runs.append(
                make_run(tmp_path / f"{preset}-{seed}", frames, success, seed=seed, command=command)
            )
    write_results(
        tmp_path / "glam-1" / "eval" / "test", "ckpt", "BabyAI-MixedTestLocal-v0", 0.8, 40
    )
    write_results(tmp_path / "random", "random", LEVEL, 0.3, 100)
    out = tmp_path / "out"
    done = _compare(
        *runs,
        "--out",
        out,
        "--smooth",
        "1",
        "--min-episodes",
        "1",
        "--baselines",
        tmp_path / "random",
    )
    assert done.returncode == 0, done.stderr
    for name in ("csv", "md", "png"):
        assert f"wrote {name:3s} {out / f'comparison.{name}'}" in done.stdout
    tidy = pd.read_csv(out / "comparison.csv")
    assert list(tidy.columns) == ["label", "seed", "run", "frames", "success", "return"]
    assert sorted(set(zip(tidy.label, tidy.seed, strict=True))) == [
        ("glam", 1),
        ("glam", 2),
        ("tiny", 1),
        ("tiny", 2),
    ]
    last = tidy[(tidy.label == "tiny") & (tidy.seed == 2)].iloc[-1]
    assert (last.frames, last.success) == (2048, pytest.approx(0.9))
    markdown = (out / "comparison.md").read_text()
    # tiny reaches 0.5 at update 5 (seed 1: 0.55) and 4 (seed 2: 0.5); 0.9 only with seed 2.
    assert "| tiny | 0.5 | 2 of 2 | 1,152 | 1,152 | 1: 1,280, 2: 1,024 |" in markdown
    assert "| tiny | 0.9 | 1 of 2 | 2,048 | 2,048 | 1: never, 2: 2,048 |" in markdown
    assert f"| glam | {HELD_OUT} | BabyAI-MixedTestLocal-v0 | 1 | 0.800 |" in markdown
    assert f"| glam | {TRAINING} | {LEVEL} | 1 | 1.000 |" in markdown
    assert f"| random | {BASELINE} | {LEVEL} | 1 | 0.300 |" in markdown
    assert str(tmp_path / "tiny-1") in markdown
    png = (out / "comparison.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 20_000
    # The same runs smoothed over 256 frames: one update each, the thresholds as above.
    framed = _compare(
        *runs, "--out", tmp_path / "framed", "--smooth-frames", "256", "--min-episodes", "1"
    )
    assert framed.returncode == 0, framed.stderr
    text = (tmp_path / "framed" / "comparison.md").read_text()
    assert "the last 256 frames (in each run's updates: tiny seed 1: 1," in text
    assert "| tiny | 0.5 | 2 of 2 | 1,152 | 1,152 | 1: 1,280, 2: 1,024 |" in text
    assert _compare(*runs, "--out", tmp_path / "x", "--smooth-frames", "0").returncode == 2


def _bad_inputs(tmp_path: Path) -> dict[str, tuple[list[str], str]]:
    good = make_run(tmp_path / "good", [100, 200], [0.1, 0.2])
    no_metrics = make_run(tmp_path / "no-metrics", [100], [0.1])
    (no_metrics / "metrics.csv").unlink()
    header_only = make_run(tmp_path / "header-only", [100], [0.1])
    (header_only / "metrics.csv").write_text("update,frames,charts/success_rate\n")
    empty = make_run(tmp_path / "empty", [100], [0.1])
    (empty / "metrics.csv").write_text("")
    twin = make_run(tmp_path / "twin" / "good", [100], [0.1])  # same label (folder) and seed
    return {
        "no metrics.csv": ([str(no_metrics)], "has no metrics.csv"),
        "header only": ([str(header_only)], "metrics.csv is empty: the run has no logged update"),
        "empty file": ([str(empty)], "metrics.csv is empty"),
        "not a folder": ([str(tmp_path / "missing")], "is not a folder"),
        "unknown label key": ([str(good), "--label-by", "ppo.lrr"], "'ppo.lrr' is not a key"),
        "same label and seed": ([str(good), str(twin)], "are both label 'good', seed 1"),
        "baseline without results": ([str(good), "--baselines", str(tmp_path)], "no results.json"),
    }


@pytest.mark.parametrize(
    "case",
    [
        "no metrics.csv",
        "header only",
        "empty file",
        "not a folder",
        "unknown label key",
        "same label and seed",
        "baseline without results",
    ],
)
def test_script_refuses_bad_input(case: str, tmp_path: Path) -> None:
    args, message = _bad_inputs(tmp_path)[case]
    out = tmp_path / "out"
    done = _compare(*args, "--out", out)
    assert done.returncode == 2, done.stdout
    assert done.stderr.startswith("error: ") and message in done.stderr
    assert not out.exists()


def test_script_refuses_unreadable_input_and_an_output_it_may_not_write(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A binary metrics.csv and `--out` naming a file were raw tracebacks; a second comparison
    into the same `--out` silently replaced the first."""
    good = make_run(tmp_path / "good", [100, 200], [0.1, 0.2])
    binary = make_run(tmp_path / "binary", [100], [0.1])
    (binary / "metrics.csv").write_bytes(b"\x89PNG\r\n\x1a\n\x00\xff\xfe" * 40)
    file = tmp_path / "notes.txt"
    file.write_text("mine")
    earlier = tmp_path / "cmp"
    earlier.mkdir()
    (earlier / "comparison.md").write_text("an earlier comparison")
    for args, message in [
        ([binary, "--out", tmp_path / "out"], f"{binary / 'metrics.csv'} is not a readable CSV"),
        ([good, "--out", file], f"--out='{file}' is a file, not a folder"),
        ([good, "--out", earlier], "already holds results (comparison.md): pass --overwrite"),
    ]:
        with pytest.raises(SystemExit) as stopped:
            compare_runs.main([*map(str, args)])
        assert stopped.value.code == 2
        err = capsys.readouterr().err
        assert err.startswith("error: ") and message in err, err
    assert (earlier / "comparison.md").read_text() == "an earlier comparison"
    assert not (tmp_path / "out").exists() and file.read_text() == "mine"
    assert compare_runs.main([str(good), "--out", str(earlier), "--overwrite"]) == 0
    assert (earlier / "comparison.md").read_text() != "an earlier comparison"


def test_a_window_with_too_few_episodes_gives_no_value() -> None:
    """Early windows hold only the episodes that succeeded fast: with `min_episodes` they are
    blank, and a threshold is first reached where enough episodes back it."""
    success = np.array([1.0, 0.5, 0.6, 0.6])
    episodes = np.array([4, 16, 20, 20])
    np.testing.assert_allclose(
        smooth(success, episodes, 2, min_episodes=1), [1.0, 0.6, 0.5 * 16 / 36 + 0.6 * 20 / 36, 0.6]
    )
    np.testing.assert_allclose(
        smooth(success, episodes, 2, min_episodes=30), [NAN, NAN, (8 + 12) / 36, 0.6]
    )
    frames = np.array([100, 200, 300, 400])
    assert frames_to_threshold(frames, smooth(success, episodes, 2, 1), 0.9) == 100
    assert frames_to_threshold(frames, smooth(success, episodes, 2, 30), 0.9) is None


def test_wall_time_and_agent_figures_beside_final_success(tmp_path: Path) -> None:
    """A mediator's queries per episode and each run's training time reach the final rows (mean
    over seeds), the Markdown table (beside success) and final.csv (per seed); a row without
    them shows blanks."""
    frames = [100, 200, 300]
    paths = []
    for seed, elapsed, queries in ((1, 120.0, 4.0), (2, 240.0, 6.0)):
        folder = make_run(tmp_path / f"m{seed}", frames, [0.5, 0.8, 1.0], seed=seed, label="med")
        table = pd.read_csv(folder / "metrics.csv")
        table["elapsed_seconds"] = [elapsed / 3, elapsed / 2, elapsed]
        table.to_csv(folder / "metrics.csv", index=False)
        figures = {"ask/queries_per_episode": queries, "ask/cost": 0.01 * queries}
        write_results(folder / "eval" / "test", "ckpt", LEVEL, 0.9, 100, figures=figures)
        paths.append(folder)
    plain = make_run(tmp_path / "plain", frames, [0.0, 0.1, 0.2], label="rl")
    write_results(plain / "eval" / "test", "ckpt", LEVEL, 0.1, 100)
    paths.append(plain)
    always = {"ask/queries_per_episode": 23.5}
    write_results(tmp_path / "always", "always", LEVEL, 1.0, 100, figures=always)

    runs = [load_run(path) for path in paths]
    assert [run.wall_seconds for run in runs] == [120.0, 240.0, 3.0]
    rows = {row.label: row for row in final_rows(runs, window=2)}
    assert rows["med"].wall_seconds == 180.0
    assert rows["med"].figure("ask/queries_per_episode") == 5.0
    assert rows["med"].figure_keys == ["ask/cost", "ask/queries_per_episode"]
    assert math.isnan(rows["rl"].figure("ask/queries_per_episode"))

    out = tmp_path / "out"
    done = _compare(*paths, "--out", out, "--baselines", tmp_path / "always")
    assert done.returncode == 0, done.stderr
    assert f"wrote final {out / 'final.csv'}" in done.stdout
    lines = (out / "comparison.md").read_text().splitlines()
    header = next(line for line in lines if line.startswith("| label | source"))
    assert header.endswith(
        "| mean return | training wall time | ask/queries_per_episode | per seed |"
    )
    assert next(line for line in lines if line.startswith("| med | held-out")).endswith(
        "| 0.540 | 3.0 min | 5.00 | 1: 0.900, 2: 0.900 |"
    )
    assert next(line for line in lines if line.startswith("| rl | held-out")).endswith(
        "| 0.060 | 0.1 min | – | 1: 0.100 |"
    )
    assert next(line for line in lines if line.startswith("| always | baseline")).endswith(
        "| 0.600 | – | 23.50 | 1.000 |"
    )
    assert "## The agents' own figures" in lines
    assert "| med | held-out evaluation | " + LEVEL + " | 2 | 0.050 | 5.000 |" in lines
    final = pd.read_csv(out / "final.csv")
    assert list(final.columns) == [
        "label",
        "source",
        "level",
        "seed",
        "success_rate",
        "successes",
        "episodes",
        "mean_return",
        "train_wall_seconds",
        "ask/cost",
        "ask/queries_per_episode",
        "source_file",
    ]
    med = final[final.label == "med"]
    assert med.train_wall_seconds.tolist() == [120.0, 240.0]
    assert med["ask/queries_per_episode"].tolist() == [4.0, 6.0]
    assert final[final.label == "rl"]["ask/cost"].isna().all()

    # Without the figure anywhere, or with --figures left empty, no column is added.
    done = _compare(plain, "--out", tmp_path / "out2")
    assert done.returncode == 0, done.stderr
    text = (tmp_path / "out2" / "comparison.md").read_text()
    assert "ask/queries_per_episode" not in text and "agents' own figures" not in text
    done = _compare(*paths, "--out", tmp_path / "out3", "--figures")
    header = next(
        line
        for line in (tmp_path / "out3" / "comparison.md").read_text().splitlines()
        if line.startswith("| label | source")
    )
    assert header.endswith("| training wall time | per seed |")


def test_a_writing_policys_invalid_answers_beside_its_success(tmp_path: Path) -> None:
    """The invalid share over training (a metrics.csv column) gets its curves, its first and
    last values, and a column of the tidy CSV; a held-out invalid share sits beside success. A
    scoring run has neither: blanks, and no section when no run has them."""
    frames = [100, 200, 300, 400]
    paths = []
    for seed, shares in ((1, [0.9, 0.7, 0.3, 0.1]), (2, [0.8, 0.6, 0.2, 0.0])):
        folder = make_run(tmp_path / f"w{seed}", frames, [0.0] * 4, seed=seed, label="written")
        table = pd.read_csv(folder / "metrics.csv")
        table["answers/invalid_share"] = shares
        table.to_csv(folder / "metrics.csv", index=False)
        path = write_results(folder / "eval" / "test", "ckpt", LEVEL, 0.2, 100)
        results = json.loads(path.read_text())
        results["suites"]["no_change"]["invalid_action_rate"] = 0.25 * seed
        path.write_text(json.dumps(results))
        paths.append(folder)
    scored = make_run(tmp_path / "s", frames, [0.5, 0.6, 0.9, 1.0], label="scored")
    write_results(scored / "eval" / "test", "ckpt", LEVEL, 0.9, 100)
    paths.append(scored)

    runs = [load_run(path) for path in paths]
    assert runs[0].metrics["answers/invalid_share"].tolist() == [0.9, 0.7, 0.3, 0.1]
    assert "answers/invalid_share" not in runs[2].metrics and runs[2].seconds_per_update == 1.0
    # The health diagnostics are read for every run that logged them (tabled, not drawn).
    assert runs[2].metrics["losses/entropy"].tolist() == [1.0, 1.0, 1.0, 1.0]
    grid = np.array([100.0, 400.0])
    band = metric_bands(runs, grid, "answers/invalid_share", window=2)
    assert list(band) == ["written"]  # the scoring runs have no curve
    np.testing.assert_allclose(band["written"].mean, [0.85, 0.15])  # (0.9+0.8)/2; (0.2+0.1)/2

    out = tmp_path / "out"
    done = _compare(*paths, "--out", out, "--smooth", "2")
    assert done.returncode == 0, done.stderr
    lines = (out / "comparison.md").read_text().splitlines()
    assert (
        "| written | answers/invalid_share | 2 | 0.750 | 0.150 | 1: 0.800 -> 0.200, 2: 0.700 -> 0.100 |"
        in lines
    )
    assert not any(line.startswith("| scored | answers/") for line in lines)
    assert any(line.startswith("| scored | losses/entropy | 1 | 1.000 | 1.000 |") for line in lines)
    header = next(line for line in lines if line.startswith("| label | source"))
    assert "| training wall time | invalid answers | per seed |" in header
    assert next(line for line in lines if line.startswith("| written | held-out")).endswith(
        "| 0.375 | 1: 0.200, 2: 0.200 |"
    )
    assert next(line for line in lines if line.startswith("| scored | held-out")).endswith(
        "| – | 1: 0.900 |"
    )
    final = pd.read_csv(out / "final.csv")
    assert final.set_index("label")["invalid_action_rate"].dropna().tolist() == [0.25, 0.5]
    tidy = pd.read_csv(out / "comparison.csv")
    assert tidy[tidy.label == "scored"]["answers/invalid_share"].isna().all()
    assert tidy[tidy.label == "written"]["answers/invalid_share"].notna().all()

    done = _compare(scored, "--out", tmp_path / "out2")
    text = (tmp_path / "out2" / "comparison.md").read_text()
    # Its health is tabled; a writing policy's figures are not made up for it.
    assert "| scored | losses/entropy |" in text
    assert "answers/invalid_share" not in text and "invalid answers" not in text
    assert "answers/invalid_share" not in pd.read_csv(tmp_path / "out2" / "comparison.csv")
