"""Benchmark the key-value cache kept across an episode's turns (`generate.kv_cache`).

A writing policy (`glam.policy.writer`) plays `--steps` steps of `--envs` envs in BALROG's
dialogue (`policy.prompt_format=balrog`: the prompt grows by each turn). At every step it writes
the envs' answers twice from the same RNG state, computing every prompt whole and reading from
the cache the keys of each env's longest common prefix with its last turn, in alternating order
so that both timings see the same machine load; the envs then step with the cached run's answers.
Reported: seconds per step of each (the policy's forward only), prompt tokens computed, the
cache's size, whether the two wrote the same answers at every step (they should: the cache is
exact up to float rounding), and the share of answers that named no action (the zero-shot
model's, at `generate.temperature=1`). Benchmarks are scripts, never timed tests.

    # the embedded model on one CPU (2 threads), fp32; ~5 envs as in issue 18's BALROG runs
    python scripts/bench_generation.py --envs 5 --steps 16 --out runs/bench_generation.json
    # a few seconds, the tiny random model (mechanics only: its tokenizer has no chat
    # template, so it plays GLAM's format, where prompts do not grow)
    python scripts/bench_generation.py --model tiny-random-llama --prompt-format glam --steps 4
    # one GPU
    python scripts/bench_generation.py --device cuda --envs 32 --steps 32
"""

from __future__ import annotations

import argparse
import difflib
import platform
import time
from dataclasses import replace
from pathlib import Path

import torch

import glam
from babyai_text.env import known_level_ids
from glam.cli import fail, positive_int
from glam.config import AdapterConfig, EnvConfig, ModelConfig, PolicyConfig
from glam.envs import resolve_action_space
from glam.outputs import OutputDirError, add_output_file_options, check_output_file, write_json
from glam.policy.generation_config import GenerationConfig
from glam.policy.writer import WritingActorCritic
from glam.ppo.algorithm_config import AlgorithmConfig
from glam.ppo.written import WrittenEnvRunner
from glam.threads import set_torch_threads

WRITER = "scripts/bench_generation.py"
"""The mark of the JSON this script writes (`glam.outputs.write_json`)."""


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default=glam.DEFAULT_MODEL, help="model spec for load_model")
    parser.add_argument("--device", default="cpu", help="cpu, cuda, cuda:1...")
    parser.add_argument("--level", default="BabyAI-GoToLocal-v0")
    parser.add_argument("--action-space", default="default")
    parser.add_argument("--prompt-format", default="balrog", choices=["balrog", "chat", "glam"])
    parser.add_argument("--envs", type=positive_int, default=5)
    parser.add_argument("--steps", type=positive_int, default=16)
    parser.add_argument("--max-new-tokens", type=positive_int, default=8)
    parser.add_argument(
        "--max-history", type=positive_int, default=16, help="BALROG's dialogue length"
    )
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads")
    parser.add_argument("--seed", type=int, default=0)
    add_output_file_options(parser)
    return parser.parse_args()


def play(policy: WritingActorCritic, args: argparse.Namespace) -> dict:
    """`args.steps` steps of `args.envs` envs; at each, the same answers written twice from the
    same RNG state, without the cache and with it, in alternating order (paired timings: both
    see the same machine load), and the envs stepped once with them."""
    policy.generation = GenerationConfig(
        max_new_tokens=args.max_new_tokens, max_history=args.max_history
    )
    env = EnvConfig(name=args.level, num_envs=args.envs, action_space=args.action_space)
    runner = WrittenEnvRunner(
        env,
        PolicyConfig(prompt_format=args.prompt_format),
        policy.generation,
        num_envs=args.envs,
        seed=args.seed,
        tokenizer=policy.tokenizer,
    )
    runner.reset()
    policy.eval()
    torch.manual_seed(args.seed)
    seconds: dict[bool, list[float]] = {False: [], True: []}
    computed = {False: 0, True: 0}
    identical, invalid, answers = True, 0, 0
    for step in range(args.steps):
        observations = runner.observations()
        tokens = sum(len(ids) for ids in policy._encode(observations.prompts))
        state = torch.get_rng_state()
        written = {}
        for kv_cache in (step % 2 == 1, step % 2 == 0):
            torch.set_rng_state(state)
            policy.generation = replace(policy.generation, kv_cache=kv_cache)
            start = time.perf_counter()
            written[kv_cache] = policy(**observations.inputs()).answers
            seconds[kv_cache].append(time.perf_counter() - start)
            reused = policy.turn_cache.take_counts()[0] if kv_cache else 0
            computed[kv_cache] += tokens - reused
        identical &= written[False].texts == written[True].texts
        invalid += int((~written[True].valid).sum())
        answers += len(written[True])
        runner.step(written[True])
    runner.close()
    half = args.steps // 2
    return {
        "seconds_per_step": {str(k).lower(): sum(v) / len(v) for k, v in seconds.items()},
        "seconds_per_step_last_half": {
            str(k).lower(): sum(v[half:]) / len(v[half:]) for k, v in seconds.items()
        },
        "prompt_tokens_computed": {str(k).lower(): v for k, v in computed.items()},
        "cache_mib": policy.turn_cache.nbytes / 2**20,
        "answers_identical": identical,
        "invalid_share": invalid / answers,
    }


def main() -> None:
    args = parse_args()
    if args.out is not None:  # found now, not after minutes of playing
        try:
            check_output_file(args.out, key="--out", writer=WRITER, overwrite=args.overwrite)
        except OutputDirError as error:
            fail(str(error))
    if args.level not in known_level_ids():
        close = difflib.get_close_matches(args.level, known_level_ids(), n=3)
        fail(
            f"--level {args.level}: unknown BabyAI level (did you mean {', '.join(close) or 'BabyAI-GoToLocal-v0'}?)"
        )
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        fail(f"--device {args.device}: torch sees no CUDA GPU here; use --device cpu")
    print(f"[bench] {set_torch_threads(args.threads, '--threads').describe()}", flush=True)
    try:
        model_cfg = ModelConfig(
            name_or_path=args.model, lora=AdapterConfig(enabled=False), autocast_bf16=False
        )
        policy = WritingActorCritic.from_run_config(
            model_cfg,
            PolicyConfig(prompt_format=args.prompt_format),
            GenerationConfig(),
            AlgorithmConfig(),
            list(resolve_action_space(args.action_space).words),
        )
    except (OSError, ValueError) as error:
        fail(f"--model {args.model}: {error}")
    policy.to(args.device)
    if args.prompt_format != "glam" and not policy.tokenizer.chat_template:
        fail(f"--model {args.model} has no chat template: pass --prompt-format glam")
    row = play(policy, args)
    for kv_cache in ("false", "true"):
        print(
            f"kv_cache={kv_cache:5}  {row['seconds_per_step'][kv_cache]:.3f} s/step (last half "
            f"{row['seconds_per_step_last_half'][kv_cache]:.3f})  prompt tokens computed "
            f"{row['prompt_tokens_computed'][kv_cache]}"
        )
    times = row["seconds_per_step"]
    saving = 1 - times["true"] / times["false"]
    print(
        f"answers identical with and without the cache: {row['answers_identical']}; time "
        f"saved {saving:.0%}; the cache held {row['cache_mib']:.0f} MiB at the end; "
        f"{row['invalid_share']:.0%} of the answers named no action"
    )
    if args.out is not None:
        result = {
            "args": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
            "machine": platform.processor() or platform.machine(),
            "threads": torch.get_num_threads(),
            "torch": torch.__version__,
            **row,
            "time_saved": saving,
        }
        write_json(args.out, result, WRITER)
        print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
