"""What a writing policy writes at the first step of episodes: how often each action, and no action.

A writing policy (`policy.kind=generate`, docs/written_actions.md) can only learn an action it
sometimes writes. This probe samples `--samples` answers after the first prompt of `--envs`
episodes (the env seeds `--seed`, `--seed + 1`, ...) and counts what they name, read as training
reads them (`glam.policy.writer.read_answer`), for the embedded model zero-shot or a trained run
(`--checkpoint RUN_DIR`, with its base model beside it, the adapter off). The prompts are the
training runner's (`glam.ppo.written.WrittenEnvRunner`); with `--orders all`, GLAM's prompt lists
the actions in each of their orders (the answer is read by its words, so the order the prompt
lists them in is free), which tells a position bias from a bias against an action's words.

    # the embedded model, zero-shot, the default preset's level and actions, every order
    python scripts/probe_answers.py --orders all --out runs/probe_answers_zero_shot.json
    # a written run's policy and its base
    python scripts/probe_answers.py --checkpoint runs/written/ppo/seed-1 \
        --out runs/probe_answers_ppo_seed1.json
    # the same with the answers constrained to the action words (generate.constrain=actions)
    python scripts/probe_answers.py --constrain actions --out runs/probe_answers_constrained.json
    # seconds, the tiny random model (mechanics only)
    python scripts/probe_answers.py --model tiny-random-llama --envs 2 --samples 4
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
from collections import Counter
from dataclasses import replace
from pathlib import Path

import torch

import glam
from glam.cli import exit_on, fail, positive_int
from glam.config import AdapterConfig, EnvConfig, ModelConfig, PolicyConfig
from glam.envs import resolve_action_space
from glam.outputs import OutputDirError, add_output_file_options, check_output_file, write_json
from glam.policy.generation_config import GenerationConfig
from glam.policy.llm_policy import CheckpointError
from glam.policy.prompts import glam_prompt
from glam.policy.writer import WritingActorCritic, read_answer
from glam.ppo.algorithm_config import AlgorithmConfig
from glam.ppo.written import WrittenEnvRunner
from glam.runs.folder import policy_dir
from glam.threads import set_torch_threads

INVALID = "(no action)"
"""The row of answers that name no action."""

WRITER = "scripts/probe_answers.py"
"""The mark of the JSON this script writes (`glam.outputs.write_json`)."""


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    source = parser.add_mutually_exclusive_group()
    source.add_argument("--model", default=glam.DEFAULT_MODEL, help="model spec (zero-shot)")
    source.add_argument("--checkpoint", type=Path, help="a run folder or checkpoint (trained)")
    parser.add_argument("--level", default="BabyAI-GoToRedBallNoDists-v0")
    parser.add_argument("--action-space", default="nav")
    parser.add_argument("--prompt-format", default="glam", choices=["glam", "chat"])
    parser.add_argument("--orders", default="env", choices=["env", "all"])
    parser.add_argument("--envs", type=positive_int, default=4, help="episodes (first prompts)")
    parser.add_argument("--samples", type=positive_int, default=64, help="answers per prompt")
    parser.add_argument("--max-new-tokens", type=positive_int, default=3)
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument(
        "--constrain",
        default="none",
        choices=["none", "actions"],
        help="generate.constrain: `actions` writes only action words",
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=positive_int, default=None, help="torch CPU threads")
    add_output_file_options(parser)
    args = parser.parse_args()
    if not args.temperature > 0:
        fail(f"--temperature must be > 0, got {args.temperature}")
    if args.orders == "all" and args.prompt_format != "glam":
        fail("--orders all reorders GLAM's list of actions: use --prompt-format glam")
    if args.out is not None:  # before any work
        with exit_on(OutputDirError):
            check_output_file(args.out, key="--out", writer=WRITER, overwrite=args.overwrite)
    return args


def load(args: argparse.Namespace, words: list[str]) -> WritingActorCritic:
    """The embedded (or named) model zero-shot, or the checkpoint's policy."""
    generation = GenerationConfig(
        max_new_tokens=args.max_new_tokens,
        temperature=args.temperature,
        constrain=args.constrain,
    )
    try:
        if args.checkpoint is not None:
            folder = policy_dir(args.checkpoint)  # a checkpoint is data: no model code runs
            policy = WritingActorCritic.from_pretrained(folder, trust_remote_code=False)
            policy.generation = replace(policy.generation, **vars(generation))
            policy.answer_trie()  # room for the longest action, where constrained
        else:
            model_cfg = ModelConfig(
                name_or_path=args.model, lora=AdapterConfig(enabled=False), autocast_bf16=False
            )
            policy_cfg = PolicyConfig(prompt_format=args.prompt_format)
            policy = WritingActorCritic.from_run_config(
                model_cfg, policy_cfg, generation, AlgorithmConfig(), words
            )
    except (OSError, ValueError, CheckpointError) as error:
        fail(f"{args.checkpoint or args.model}: {error}")
    if list(policy.action_words) != words:
        fail(f"the policy's actions {policy.action_words} are not --action-space's {words}")
    if args.prompt_format != "glam" and not policy.tokenizer.chat_template:
        fail("this model has no chat template: pass --prompt-format glam")
    return policy.eval()


def first_prompts(
    policy: WritingActorCritic, args: argparse.Namespace, order: tuple[str, ...]
) -> list[str]:
    """The first prompt of each episode, as the training runner writes it; with another order of
    the actions, GLAM's prompt listing them in that order."""
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
    try:
        if list(order) == list(policy.action_words):
            return runner.observations().prompts
        return [
            glam_prompt(runner.missions[i], list(order), h.observations, h.actions)
            for i, h in enumerate(runner.histories)
        ]
    finally:
        runner.close()


def tally(policy: WritingActorCritic, prompts: list[str], samples: int) -> dict:
    """What `samples` answers after each prompt name: counts and shares, the commonest texts."""
    texts = []
    for _ in range(samples):
        with torch.no_grad():
            texts += policy(prompts).answers.texts
    named = Counter(read_answer(text, policy.action_words) for text in texts)
    counts = {word: named[i] for i, word in enumerate(policy.action_words)}
    counts[INVALID] = named[None]
    return {
        "answers": len(texts),
        "counts": counts,
        "shares": {key: count / len(texts) for key, count in counts.items()},
        "commonest": Counter(texts).most_common(5),
    }


def main() -> None:
    args = parse_args()
    print(f"[probe] {set_torch_threads(args.threads, '--threads').describe()}", flush=True)
    try:
        words = list(resolve_action_space(args.action_space).words)
    except ValueError as error:
        fail(str(error))
    policy = load(args, words)
    variants = {"policy": contextlib.nullcontext}
    if args.checkpoint is not None and hasattr(policy.model, "disable_adapter"):
        variants["base (adapter off)"] = policy.model.disable_adapter
    orders = list(itertools.permutations(words)) if args.orders == "all" else [tuple(words)]
    rows = []
    for order in orders:
        prompts = first_prompts(policy, args, order)
        for name, context in variants.items():
            torch.manual_seed(args.seed)
            with context():
                row = tally(policy, prompts, args.samples)
            rows.append({"variant": name, "order": list(order), **row})
            shares = "  ".join(f"{key} {share:.3f}" for key, share in row["shares"].items())
            print(f"{name:18}  listed: {', '.join(order):34}  {shares}")
    if args.out is not None:
        result = {
            "args": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
            "rows": rows,
        }
        write_json(args.out, result, WRITER)
        print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
