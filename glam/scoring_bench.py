"""Benchmarking action scoring (`scripts/bench_scoring.py`): real prompts, timings, the
naive scorer beside the packed one and the floors, one summarised row per batch size.

Benchmarks are scripts, never timed tests: the tests of this module check what it computes
(the rows' figures, the prompts), not how fast.
"""

from __future__ import annotations

import platform
import random
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import torch
from transformers import PreTrainedTokenizerBase

import babyai_text
from glam.policy.prompts import PromptHistory
from glam.scoring import score_actions, score_actions_naive

__all__ = [
    "HEADER",
    "describe_device",
    "format_row",
    "measure_scoring",
    "rollout_prompts",
    "summarise",
    "timed",
]


def rollout_prompts(level: str, count: int, nbr_obs: int, seed: int) -> tuple[list[str], list[str]]:
    """`count` prompts with a full history, from random-action episodes of `level`."""
    env = babyai_text.make(level)
    action_words = list(env.action_words)
    rng = random.Random(seed)
    prompts: list[str] = []
    episode = 0
    while len(prompts) < count:
        obs, info = env.reset(seed=seed * 100_000 + episode)
        episode += 1
        history = PromptHistory(nbr_obs)
        history.add_observation(info["descriptions"])
        # Stop at a random step past the point where the history window is full.
        for _ in range(nbr_obs - 1 + rng.randrange(8)):
            action = rng.choice(action_words)
            history.add_action(action)
            obs, _, terminated, truncated, info = env.step(action)
            if terminated or truncated:
                break
            history.add_observation(info["descriptions"])
        else:
            prompts.append(history.prompt(obs["mission"], action_words))
    return prompts, action_words


def timed(
    function: Callable[[], object], repeats: int, device: torch.device, warm_up: bool = True
) -> list[float]:
    """Wall-clock seconds of `repeats` calls (after one warm-up call, unless told not to)."""

    def once() -> float:
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        start = time.perf_counter()
        function()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        return time.perf_counter() - start

    if warm_up:
        once()
    return [once() for _ in range(repeats)]


def measure_scoring(
    model: torch.nn.Module,
    tokenizer: PreTrainedTokenizerBase,
    prompts: list[str],
    action_words: list[str],
    batch_sizes: list[int],
    *,
    repeats: int,
    naive_max_batch: int,
    device: torch.device,
    show: Callable[[dict], None] = lambda row: None,
) -> list[dict]:
    """One row per batch size B: the seconds of `repeats` packed scorings of B prompts against
    `action_words`, of the padded floor and (up to `naive_max_batch`) of the unpadded floor and
    the naive scorer, with the largest |packed - naive| score; summarised (`summarise`) and
    passed to `show` as each is done."""

    def floor(batch: list[str]) -> None:
        inputs = tokenizer(batch, padding=True, padding_side="left", return_tensors="pt")
        model(**inputs.to(device), logits_to_keep=1, use_cache=False)

    rows = []
    with torch.no_grad():
        for batch_size in batch_sizes:
            batch = prompts[:batch_size]
            candidates = [action_words] * batch_size
            packed_scores = score_actions(model, tokenizer, batch, candidates)
            row = {
                "batch_size": batch_size,
                "packed_s": timed(
                    lambda b=batch, c=candidates: score_actions(model, tokenizer, b, c),
                    repeats,
                    device,
                ),
                "floor_s": timed(lambda b=batch: floor(b), repeats, device),
            }
            if batch_size <= naive_max_batch:
                row["unpadded_floor_s"] = timed(
                    lambda b=batch: [floor([prompt]) for prompt in b], 1, device, warm_up=False
                )
            if batch_size <= naive_max_batch:
                # The naive pass is slow and its time barely varies: its first (already warm)
                # call gives the scores and one timing; past B=8 that is enough.
                start = time.perf_counter()
                naive_scores = score_actions_naive(model, tokenizer, batch, candidates)
                if device.type == "cuda":
                    torch.cuda.synchronize(device)
                first = time.perf_counter() - start
                row["max_abs_difference"] = max(
                    float((p - n).abs().max())
                    for p, n in zip(packed_scores, naive_scores, strict=True)
                )
                more = repeats - 1 if batch_size <= 8 else 0
                row["naive_s"] = [first] + timed(
                    lambda b=batch, c=candidates: score_actions_naive(model, tokenizer, b, c),
                    more,
                    device,
                    warm_up=False,
                )
            rows.append(summarise(row))
            show(rows[-1])

    return rows


def summarise(row: dict) -> dict:
    batch_size = row["batch_size"]
    for name in ("naive", "packed", "floor", "unpadded_floor"):
        if f"{name}_s" in row:
            seconds = statistics.median(row[f"{name}_s"])
            row[f"{name}_median_s"] = seconds
            row[f"{name}_steps_per_s"] = batch_size / seconds
    if "naive_median_s" in row:
        row["speedup_over_naive"] = row["naive_median_s"] / row["packed_median_s"]
    row["time_over_floor"] = row["packed_median_s"] / row["floor_median_s"]
    if "unpadded_floor_median_s" in row:
        row["time_over_unpadded_floor"] = row["packed_median_s"] / row["unpadded_floor_median_s"]
    return row


HEADER = (
    f"{'B':>4} {'naive st/s':>11} {'packed st/s':>12} {'floor st/s':>11} {'unpadded':>9} "
    f"{'x naive':>8} {'/ floor':>8} {'/ unpadded':>11} {'max |diff|':>11}"
)


def format_row(row: dict) -> str:
    """A summarised row as a line under `HEADER` (`-` where a figure was not measured)."""

    def cell(key: str, width: int, spec: str) -> str:
        return f"{row[key]:{width}{spec}}" if key in row else f"{'-':>{width}}"

    return (
        f"{row['batch_size']:>4} {cell('naive_steps_per_s', 11, '.2f')} "
        f"{cell('packed_steps_per_s', 12, '.2f')} {cell('floor_steps_per_s', 11, '.2f')} "
        f"{cell('unpadded_floor_steps_per_s', 9, '.2f')} {cell('speedup_over_naive', 8, '.2f')} "
        f"{cell('time_over_floor', 8, '.2f')} {cell('time_over_unpadded_floor', 11, '.2f')} "
        f"{cell('max_abs_difference', 11, '.1e')}"
    )


def describe_device(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"CPU {cpu}"
