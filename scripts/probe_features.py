"""Probe a language model's hidden states: do they hold the bot's action and where the target is?

    # one CPU: the embedded model on 100 bot episodes of GoToRedBall, the input of layer 26 (the
    # lowest of the top 4 layers LoRA adapts in the top-4 presets) and the last layer's output
    OMP_NUM_THREADS=1 python scripts/probe_features.py --level BabyAI-GoToRedBall-v0 \
        --episodes 100 --layers 26 30 --threads 1 --out docs/probe/gotoredball_pretrained.json
    # the same architecture with random weights (pretrained input embeddings, as NPAE)
    OMP_NUM_THREADS=1 python scripts/probe_features.py --level BabyAI-GoToRedBall-v0 \
        --episodes 100 --layers 26 30 --threads 1 --random-init \
        --out docs/probe/gotoredball_random.json
    # one GPU: a trained run's policy (its base model with its LoRA adapter), on the prompts of
    # the env it was trained on; or the states of a demonstrations folder
    python scripts/probe_features.py --run runs/npae_top4/seed-1 --level BabyAI-GoToRedBall-v0 \
        --device cuda --out runs/npae_top4/seed-1/probe.json
    python scripts/probe_features.py --demos runs/demos/BabyAI-GoToRedBall-v0-seed0 --device cuda
    # a run's policy on the states it visited in an evaluation, with its own returns, and the
    # value head PPO trains fitted to them at two learning rates (--value-heads)
    python scripts/probe_features.py --run runs/warm --played runs/warm/eval/BabyAI-GoToRedBall-v0 \
        --layers 26 30 --value-heads --out runs/warm/probe_value.json
    # seconds, the tiny random model (mechanics only)
    python scripts/probe_features.py --model tiny-random-llama --level BabyAI-GoToRedBall-v0 \
        --episodes 8 --layers 1 2

BabyAI's bot plays `--episodes` episodes of `--level` (seeds `--seed`, `--seed + 1`, ...;
the ones it fails are dropped), or `--demos` names a folder of recorded ones; each decision's
prompt is the policy's (`--action-space`, `--nbr-obs`, `--prompt-format`; a run's own by
default). The hidden state of each prompt's last token at `--layers` (`hidden_states[k]`: the
input of layer k, and k = the number of layers for the last layer's output) is the feature of a
logistic regression that predicts (a) the bot's action and (b) the target's direction (forward,
left, right, not visible), trained on the states of some episodes and scored on the
`--held-out` others. Beside each layer: the training split's majority class and the same
regression on hand-made features (the target's offsets right and forward of the agent and
whether it sees it). A ridge regression on the same features predicts (c) the discounted
return (`--gamma`, PPO's 0.99) the bot's episode got from each state, what a critic must say,
scored by R^2 on the held-out episodes. With `--played` the states are an agent's, from an
evaluation's episodes (`scripts/post_training_tests.py`: results.json, episodes.jsonl), each
replayed from its seed, its action in place of the bot's and its own return to predict;
`--value-heads` also trains PPO's value head (and a linear one) on those returns by Adam at
each of `--head-lrs`, read after each of `--head-steps`. glam/eval/feature_probe.py says how
each figure is computed.

Prints the table and, with `--out`, writes every figure, the counts and the command as JSON (an
existing file is refused unless `--overwrite`). Exit status: 0 done; 2 bad input (an unknown
level or model, a layer the model lacks, a run folder without an LLM policy, a mission without
one target object, an `--out` it may not write).
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch
import transformers
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

import glam
from glam.baselines.loading import load_policy
from glam.bc.bot import BotUnsupportedError, collect_bot_demos
from glam.bc.config import BOT_UNSUPPORTED_LEVELS, DemosConfig
from glam.cli import exit_on, fail, positive_int
from glam.demos import DemoDatasetError
from glam.eval.feature_probe import (
    GAMMA,
    HeadFit,
    ProbeInputError,
    ProbeStates,
    check_layers,
    check_level,
    last_token_states,
    num_layers,
    probe_states,
    read_played_episodes,
    read_states,
    states_from_records,
)
from glam.models.loading import ModelNotFoundError, load_model
from glam.outputs import OutputDirError, add_output_file_options, check_output_file, write_json
from glam.policy.files import CheckpointError
from glam.policy.llm_policy import LLMActorCritic
from glam.runs.folder import policy_dir
from glam.threads import set_torch_threads

BAD_INPUT = (
    ProbeInputError,
    BotUnsupportedError,
    DemoDatasetError,
    CheckpointError,
    ModelNotFoundError,
    OutputDirError,
    FileNotFoundError,
)
"""What a bad input raises; the script reports each with `glam.cli.fail` (exit status 2)."""


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    source = parser.add_mutually_exclusive_group()
    source.add_argument("--model", default=glam.DEFAULT_MODEL, help="model spec (pretrained)")
    source.add_argument("--run", type=Path, help="a run or checkpoint folder: its policy")
    parser.add_argument(
        "--random-init", action="store_true", help="--model's architecture with random weights"
    )
    states = parser.add_mutually_exclusive_group()
    states.add_argument("--level", help="BabyAI level the bot plays")
    states.add_argument("--demos", type=Path, help="a demonstrations folder instead of the bot")
    states.add_argument(
        "--played",
        type=Path,
        help="an evaluation's folder (results.json, episodes.jsonl): the agent's own states",
    )
    parser.add_argument("--episodes", type=positive_int, default=100, help="bot episodes")
    parser.add_argument("--seed", type=int, default=0, help="episode seeds, split and init")
    parser.add_argument("--action-space", help="default: the run's, else nav")
    parser.add_argument("--nbr-obs", type=positive_int, help="default: the run's, else 1")
    parser.add_argument("--prompt-format", choices=["glam", "chat"], help="default: the run's")
    parser.add_argument(
        "--layers", type=int, nargs="+", help="hidden_states indices (default: L-4 and L)"
    )
    parser.add_argument("--held-out", type=float, default=0.25, help="share of test episodes")
    parser.add_argument(
        "--gamma", type=float, default=GAMMA, help="discount of the returns the value probe fits"
    )
    parser.add_argument("--l2", type=float, help="fixed L2 strength (default: chosen on a split)")
    parser.add_argument(
        "--value-heads",
        action="store_true",
        help="also train PPO's value head (and a linear one) on the returns, --head-lrs x steps",
    )
    parser.add_argument("--head-lrs", type=float, nargs="+", default=[2e-4, 2e-3])
    parser.add_argument("--head-steps", type=positive_int, nargs="+", default=[200, 2000])
    parser.add_argument("--batch-size", type=positive_int, default=16, help="prompts per forward")
    parser.add_argument("--device", default="cpu", help="cpu, cuda, cuda:1...")
    parser.add_argument("--threads", type=positive_int, help="torch CPU threads")
    add_output_file_options(parser)
    parser.add_argument("--no-progress", action="store_true", help="no progress bars")
    args = parser.parse_args(argv)
    if args.level is None and args.demos is None and args.played is None:
        parser.error("one of --level, --demos or --played is required")
    if any(not lr > 0 for lr in args.head_lrs):
        fail(f"--head-lrs must be > 0, got {args.head_lrs}")
    if args.random_init and args.run is not None:
        fail("--random-init applies to --model, not to a trained --run")
    if not 0 < args.held_out < 1:
        fail(f"--held-out is a share of the episodes in (0, 1), got {args.held_out}")
    if not 0 <= args.gamma <= 1:
        fail(f"--gamma must be in [0, 1], got {args.gamma}")
    if args.l2 is not None and not args.l2 > 0:
        fail(f"--l2 must be > 0, got {args.l2}")
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        fail(f"--device {args.device}: torch sees no CUDA GPU here; use --device cpu")
    return args


def load(args: argparse.Namespace) -> tuple[torch.nn.Module, Any, dict[str, Any]]:
    """The model and tokenizer probed, and the prompt settings they were trained with."""
    if args.run is None:
        torch.manual_seed(args.seed)  # the random initialisation of --random-init
        model, tokenizer = load_model(args.model, pretrained=not args.random_init)
        return model, tokenizer, {}
    policy = load_policy(policy_dir(args.run), trust_remote_code=False)
    if not isinstance(policy, LLMActorCritic):
        raise ProbeInputError(
            f"{args.run} holds a {type(policy).__name__}, not a language model's policy "
            "(policy.kind=llm): there are no hidden states to probe"
        )
    env = policy.training_env or {}
    trained = {
        "action_space": env.get("action_space"),
        "nbr_obs": env.get("nbr_obs"),
        "language": env.get("language"),
        "prompt_format": policy.policy_cfg.prompt_format,
        "action_words": policy.action_words,
    }
    return policy.model, policy.tokenizer, trained


def played_states(args: argparse.Namespace, tokenizer: Any, trained: dict[str, Any]) -> ProbeStates:
    """The states of the evaluation in --played, replayed with its own prompt settings."""
    results = args.played / "results.json"
    if not results.is_file():
        raise ProbeInputError(f"--played {args.played}: no results.json (an evaluation's folder)")
    recorded = json.loads(results.read_text())
    played = recorded["eval"]
    if played.get("distractors") is not None or played.get("max_steps") is not None:
        raise ProbeInputError(
            f"--played {args.played}: its episodes ran with eval.distractors or eval.max_steps "
            "changed, which the replay does not reproduce"
        )
    for key in ("action_space", "nbr_obs", "prompt_format"):
        if trained.get(key) is not None and recorded.get(key) != trained[key]:
            raise ProbeInputError(
                f"--played {args.played} was played with {key}={recorded.get(key)!r}, the run "
                f"was trained with {trained[key]!r}: its prompts are not the policy's"
            )
    return read_played_episodes(
        args.played / "episodes.jsonl",
        played["level"],
        action_space=recorded["action_space"],
        nbr_obs=recorded["nbr_obs"],
        prompt_format=recorded["prompt_format"],
        language=trained.get("language"),
        tokenizer=tokenizer,
        gamma=args.gamma,
    )


def states_of(args: argparse.Namespace, tokenizer: Any, trained: dict[str, Any]) -> ProbeStates:
    """The bot's states (collected now, or read from --demos), or the agent's (--played), in
    the prompt format probed."""
    if args.played is not None:
        return played_states(args, tokenizer, trained)
    if args.demos is not None:
        states = read_states(args.demos, gamma=args.gamma)
        for key in ("action_space", "nbr_obs", "prompt_format"):
            recorded = states.settings.get(key)
            if trained.get(key) is not None and recorded is not None and recorded != trained[key]:
                raise ProbeInputError(
                    f"{args.demos} was recorded with {key}={recorded!r}, the run was trained "
                    f"with {trained[key]!r}: its prompts are not the policy's"
                )
        return states
    prompt_format = args.prompt_format or trained.get("prompt_format") or "glam"
    try:
        config = DemosConfig(
            level=args.level,
            episodes=args.episodes,
            seed=args.seed,
            nbr_obs=args.nbr_obs or trained.get("nbr_obs") or 1,
            action_space=args.action_space or trained.get("action_space") or "nav",
            language=trained.get("language"),
            prompt_format=prompt_format,
            chat_model=str(args.run or args.model) if prompt_format == "chat" else None,
        )
    except ValueError as error:  # the collector's own checks (a level the bot cannot solve)
        raise ProbeInputError(str(error)) from None
    with Progress(
        TextColumn("[bold]bot episodes[/]"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        disable=args.no_progress,
    ) as bar:
        task = bar.add_task("", total=config.episodes)
        records, stats = collect_bot_demos(
            config, tokenizer=tokenizer, on_episode=lambda *_: bar.advance(task)
        )
    unused = ("output_dir", "overwrite")  # the collector's saving, not done here
    settings = {key: value for key, value in asdict(config).items() if key not in unused}
    return states_from_records(
        records,
        config.level,
        config.action_space,
        config.language,
        settings={"source": "bot", **settings, "stats": stats},
        gamma=args.gamma,
    )


def table(report: dict[str, Any], layers: list[int]) -> str:
    """The held-out accuracies as a markdown table, one row per task."""
    columns = ["majority", "hand-made", "hand-made table", *(f"layer {layer}" for layer in layers)]
    lines = [
        "| task | classes | " + " | ".join(columns) + " |",
        "|---|---:|" + "---:|" * len(columns),
    ]
    for task, result in report["tasks"].items():
        probes = result["probes"]
        cells = [result["majority"], probes["hand_made"]["accuracy"], result["hand_made_table"]]
        cells += [probes[f"layer_{layer}"]["accuracy"] for layer in layers]
        lines.append(
            f"| {task} | {len(result['classes'])} | " + " | ".join(f"{c:.3f}" for c in cells) + " |"
        )
    value = report.get("value")
    if value:
        columns = ["training mean", "hand-made", "hand-made table", *columns[3:]]
        probes = value["probes"]
        cells = [value["mean"], probes["hand_made"]["r2"], value["hand_made_table"]]
        cells += [probes[f"layer_{layer}"]["r2"] for layer in layers]
        if "step_r2" in value:
            columns += ["the step (not in the prompt)", "hand-made and the step"]
            cells += [value["step_r2"], value["hand_made_and_step_r2"]]
        lines += [
            "",
            f"| held-out R^2 of {value['target'].split(' from')[0]} | "
            + " | ".join(columns)
            + " |",
            "|---|" + "---:|" * len(columns),
            "| value (ridge) | " + " | ".join(f"{c:.3f}" for c in cells) + " |",
        ]
        for position, fit in enumerate(next(iter(value["heads"].values()), [])):
            for steps in fit["fit"]["steps"]:
                cells = [value["heads"][f"layer_{layer}"][position] for layer in layers]
                lines.append(
                    f"| {fit['head']}, {steps} steps | | | | "
                    + " | ".join(f"{cell[str(steps)]['r2']:.3f}" for cell in cells)
                    + " |"
                    + " |" * (len(columns) - 3 - len(layers))  # the step's columns
                )
    lines += [
        "",
        "| layer | mean norm | top-5 dims' share | varying share |",
        "|---|---:|---:|---:|",
    ]
    for layer in layers:
        stats = report["feature_statistics"][f"layer_{layer}"]
        lines.append(
            f"| {layer} | {stats['mean_norm']:.1f} | {stats['top5_share']:.3f} "
            f"| {stats['varying_share']:.4f} |"
        )
    return "\n".join(lines)


HEAD_SHAPES = [
    {"hidden_sizes": (1024, 1024), "activation": "sigmoid"},
    {"hidden_sizes": (), "activation": "sigmoid", "normalize": True},
]
"""The value heads `--value-heads` trains: PPO's default (`policy.value_hidden_sizes`,
`policy.value_activation`) and a linear read of standardised states, ridge's model."""

WRITER = "scripts/probe_features.py"
"""The mark of the JSON this script writes (`glam.outputs.write_json`)."""


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    print(f"[probe] {set_torch_threads(args.threads, '--threads').describe()}", flush=True)
    if args.no_progress:
        transformers.utils.logging.disable_progress_bar()
    started = time.perf_counter()
    with exit_on(*BAD_INPUT):
        if args.out is not None:
            check_output_file(args.out, key="--out", writer=WRITER, overwrite=args.overwrite)
        if args.level is not None:  # the cheap checks first, before the model loads
            if args.level in BOT_UNSUPPORTED_LEVELS:
                raise ProbeInputError(f"{args.level}: BabyAI's bot cannot solve it")
            check_level(args.level, args.action_space or "default")
        model, tokenizer, trained = load(args)
        count = num_layers(model)
        layers = check_layers(args.layers or [max(count - 4, 0), count], count)
        model.to(args.device).eval()
        loaded = time.perf_counter()
        states = states_of(args, tokenizer, trained)
        if trained.get("action_words") and trained["action_words"] != states.action_words:
            raise ProbeInputError(
                f"the run's actions {trained['action_words']} are not the states' "
                f"{states.action_words}: pass the run's --action-space"
            )
        collected = time.perf_counter()
        features = last_token_states(
            model,
            tokenizer,
            states.prompts,
            layers,
            batch_size=args.batch_size,
            progress=not args.no_progress,
        )
        forwarded = time.perf_counter()
        heads = [
            HeadFit(lr=lr, steps=args.head_steps, **shape)
            for shape in HEAD_SHAPES
            for lr in args.head_lrs
        ]
        report = probe_states(
            states,
            features,
            held_out=args.held_out,
            seed=args.seed,
            l2=args.l2,
            value_heads=heads if args.value_heads else (),
        )
    done = time.perf_counter()
    weights = "run" if args.run else "random" if args.random_init else "pretrained"
    result = {
        "command": shlex.join(["python", "scripts/probe_features.py", *argv]),
        "level": states.level,
        "model": str(args.run) if args.run else args.model,
        "weights": weights,
        "num_layers": count,
        "layers": layers,
        "states_from": states.settings,
        **report,
        "seconds": {
            "load": loaded - started,
            "states": collected - loaded,
            "forward": forwarded - collected,
            "probes": done - forwarded,
            "total": done - started,
        },
    }
    print(
        f"{states.level}, {weights} {result['model']}: {report['states']} states of "
        f"{report['episodes']} episodes ({report['test']['episodes']} held out, "
        f"{report['test']['states']} states); held-out accuracy:"
    )
    print(table(report, layers))
    print(f"took {done - started:.0f} s ({forwarded - collected:.0f} s of forwards)")
    if args.out is not None:
        write_json(args.out, result, WRITER)
        print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
