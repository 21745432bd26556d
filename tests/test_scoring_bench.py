"""The scoring benchmark's parts (glam/scoring_bench.py, run by scripts/bench_scoring.py): the
prompts it scores, the rows' figures and the naive scorer's agreement, on the tiny model.
No timing is asserted: benchmarks are scripts.

.venv/bin/python -m pytest tests/test_scoring_bench.py
"""

from __future__ import annotations

import pytest
import torch
from helpers_tiny import one_torch_thread, tiny_causal_lm  # noqa: F401

from glam.scoring_bench import HEADER, format_row, measure_scoring, rollout_prompts, summarise


def test_rollout_prompts_have_a_full_history_and_the_levels_actions() -> None:
    prompts, actions = rollout_prompts("BabyAI-GoToRedBallNoDists-v0", 5, 3, seed=0)
    assert len(prompts) == 5 and actions == ["turn left", "turn right", "go forward"] + actions[3:]
    for prompt in prompts:  # three observations and the two actions between them, at least
        assert "Observation 2" in prompt and "Action 1" in prompt
    assert rollout_prompts("BabyAI-GoToRedBallNoDists-v0", 5, 3, seed=0)[0] == prompts


def test_summarise_by_hand() -> None:
    row = summarise(
        {
            "batch_size": 4,
            "packed_s": [0.2, 0.1, 0.3],
            "floor_s": [0.05, 0.05, 0.04],
            "naive_s": [1.0, 0.8],
        }
    )
    assert row["packed_median_s"] == 0.2 and row["packed_steps_per_s"] == 4 / 0.2
    assert row["naive_median_s"] == pytest.approx(0.9)
    assert row["speedup_over_naive"] == pytest.approx(0.9 / 0.2)
    assert row["time_over_floor"] == pytest.approx(0.2 / 0.05)
    assert "time_over_unpadded_floor" not in row


def test_measured_rows_and_the_naive_scorer_agree(one_torch_thread) -> None:  # noqa: F811
    model, tokenizer = tiny_causal_lm("llama")
    prompts, actions = rollout_prompts("BabyAI-GoToRedBallNoDists-v0", 3, 2, seed=1)
    shown: list[dict] = []
    rows = measure_scoring(
        model,
        tokenizer,
        prompts,
        actions,
        [1, 3],
        repeats=1,
        naive_max_batch=1,
        device=torch.device("cpu"),
        show=shown.append,
    )
    assert shown == rows and [row["batch_size"] for row in rows] == [1, 3]
    assert rows[0]["max_abs_difference"] < 1e-4  # packed scores = one forward per pair
    assert "naive_median_s" not in rows[1]  # above naive_max_batch
    cells = format_row(rows[1]).split()  # B and 8 figures, "-" where one was not measured
    assert len(cells) == 9 and cells[0] == "3" and cells[1] == "-" and cells[-1] == "-"
    assert HEADER.split()[0] == "B"
