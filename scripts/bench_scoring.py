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
import statistics

import torch

import glam
from glam.cli import exit_on
from glam.outputs import OutputDirError, add_output_file_options, check_output_file, write_json
from glam.scoring_bench import HEADER, describe_device, format_row, measure_scoring, rollout_prompts

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

    print(HEADER)
    rows = measure_scoring(
        model,
        tokenizer,
        prompts,
        action_words,
        args.batch_sizes,
        repeats=args.repeats,
        naive_max_batch=args.naive_max_batch,
        device=device,
        show=lambda row: print(format_row(row), flush=True),
    )

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


if __name__ == "__main__":
    main()
