"""Benchmark action scoring: env-steps/s of the naive forward, the packed scorer, and the floor.

For each batch size B, B GLAM prompts taken from real BabyAI-Text rollouts (nbr_obs=3, random
actions, BabyAI-MixedTrainLocal-v0) are scored against the 6 action words by

- naive:  one full forward per (prompt, action) pair (`score_actions_naive`), 6B forwards;
- packed: `score_actions`, one batched forward (prompts once, candidates packed after them);
- floor:  the bare prompt forward alone (B prompts padded to the longest, last-position logits
  only), which any scorer that reads the prompts must pay;
- unpadded floor: the same prompts one at a time, without padding: the least compute any
  scorer can do (batching on a GPU beats it; on a CPU padding makes the batched floor slower).

Reported: env-steps/s (B / seconds per batch), packed speed-up over naive, packed time over the
floor's, and the largest |packed - naive| score difference. Timings are medians of `--repeats`
runs after one warm-up. Benchmarks are scripts, never timed tests.

    # one CPU (2 threads), fp32, as in docs/benchmarks.md
    python scripts/bench_scoring.py --batch-sizes 1 8 32 --out runs/bench_scoring_cpu.json
    # the same with bf16 weights (CPUs with AVX512-BF16)
    python scripts/bench_scoring.py --dtype bfloat16 --batch-sizes 1 8 32
    # one GPU, larger batches (the naive forward only up to B=32)
    python scripts/bench_scoring.py --device cuda --dtype bfloat16 \
        --batch-sizes 1 8 32 64 128 256 --naive-max-batch 32 --out runs/bench_scoring_gpu.json
"""

from __future__ import annotations

import argparse
import platform
import random
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import torch

import glam
from glam.cli import exit_on
from glam.outputs import OutputDirError, add_output_file_options, check_output_file, write_json
from glam.policy.prompts import PromptHistory
from glam.scoring import score_actions, score_actions_naive

WRITER = "scripts/bench_scoring.py"
"""The mark of the JSON this script writes (`glam.outputs.write_json`)."""


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default=glam.DEFAULT_MODEL, help="model spec for load_model")
    parser.add_argument("--device", default="cpu", help="cpu, cuda, cuda:1...")
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 8, 32])
    parser.add_argument("--naive-max-batch", type=int, default=32, help="skip naive above this B")
    parser.add_argument("--repeats", type=int, default=3, help="timed runs per measurement")
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads")
    parser.add_argument("--level", default="BabyAI-MixedTrainLocal-v0")
    parser.add_argument("--nbr-obs", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0)
    add_output_file_options(parser)
    return parser.parse_args()


def rollout_prompts(level: str, count: int, nbr_obs: int, seed: int) -> tuple[list[str], list[str]]:
    """`count` prompts with a full history, from random-action episodes of `level`."""
    import babyai_text

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


def main() -> None:
    args = parse_args()
    if args.out is not None:  # before any work
        with exit_on(OutputDirError):
            check_output_file(args.out, key="--out", writer=WRITER, overwrite=args.overwrite)
    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    model, tokenizer = glam.load_model(args.model, dtype=args.dtype)
    model = model.to(device).eval()
    prompts, action_words = rollout_prompts(
        args.level, max(args.batch_sizes), args.nbr_obs, args.seed
    )
    lengths = [len(ids) for ids in tokenizer(prompts)["input_ids"]]

    def floor(batch: list[str]) -> None:
        inputs = tokenizer(batch, padding=True, padding_side="left", return_tensors="pt")
        model(**inputs.to(device), logits_to_keep=1, use_cache=False)

    rows = []
    print(HEADER)
    with torch.no_grad():
        for batch_size in args.batch_sizes:
            batch = prompts[:batch_size]
            candidates = [action_words] * batch_size
            packed_scores = score_actions(model, tokenizer, batch, candidates)
            row = {
                "batch_size": batch_size,
                "packed_s": timed(
                    lambda b=batch, c=candidates: score_actions(model, tokenizer, b, c),
                    args.repeats,
                    device,
                ),
                "floor_s": timed(lambda b=batch: floor(b), args.repeats, device),
            }
            if batch_size <= args.naive_max_batch:
                row["unpadded_floor_s"] = timed(
                    lambda b=batch: [floor([prompt]) for prompt in b], 1, device, warm_up=False
                )
            if batch_size <= args.naive_max_batch:
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
                more = args.repeats - 1 if batch_size <= 8 else 0
                row["naive_s"] = [first] + timed(
                    lambda b=batch, c=candidates: score_actions_naive(model, tokenizer, b, c),
                    more,
                    device,
                    warm_up=False,
                )
            rows.append(summarise(row))
            print_row(rows[-1])

    result = {
        "model": args.model,
        "dtype": args.dtype,
        "device": describe_device(device),
        "torch_threads": torch.get_num_threads(),
        "level": args.level,
        "nbr_obs": args.nbr_obs,
        "actions": action_words,
        "prompt_tokens": {"mean": statistics.mean(lengths), "max": max(lengths)},
        "rows": rows,
    }
    print(
        f"\n{args.model} {args.dtype} on {result['device']}, {result['torch_threads']} threads; "
        f"prompts {statistics.mean(lengths):.0f} tokens on average (max {max(lengths)})"
    )
    if args.out:
        write_json(args.out, result, WRITER)
        print(f"wrote {args.out}")


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


def print_row(row: dict) -> None:
    def cell(key: str, width: int, spec: str) -> str:
        return f"{row[key]:{width}{spec}}" if key in row else f"{'-':>{width}}"

    print(
        f"{row['batch_size']:>4} {cell('naive_steps_per_s', 11, '.2f')} "
        f"{cell('packed_steps_per_s', 12, '.2f')} {cell('floor_steps_per_s', 11, '.2f')} "
        f"{cell('unpadded_floor_steps_per_s', 9, '.2f')} {cell('speedup_over_naive', 8, '.2f')} "
        f"{cell('time_over_floor', 8, '.2f')} {cell('time_over_unpadded_floor', 11, '.2f')} "
        f"{cell('max_abs_difference', 11, '.1e')}",
        flush=True,
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


if __name__ == "__main__":
    main()
