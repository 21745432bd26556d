"""How often trained students act as BabyAI's bot would, on held-out episodes (docs/teach.md).

    # the newest checkpoint of each run, on its training level, 20 envs x 100 steps
    python scripts/bot_agreement.py runs/teach/teach_gotolocal/teach.teacher-*_seed-1
    # another level, greedy students, the table and json kept
    python scripts/bot_agreement.py runs/a runs/b --level BabyAI-GoToLocal-v0 --greedy --out runs/agree

The trainer's `teach/agreement` is in-sample (the update's own minibatches); this is the figure on
fresh episodes (glam/eval/student_agreement.py): each run's policy plays envs seeded from 10**12 (the
evaluation's seeds) with its run's env settings, BabyAI's bot advising on every state as it does
as a teacher, and a state counts when the student's most probable action is the bot's (also
split by whether the mission's object is in the agent's view). Prints a table; with `--out`,
writes agreement.json and agreement.md there (earlier ones are replaced only with `--overwrite`;
the folder is checked before any work). Exit status: 0 done; 2 bad input (a folder that is not a
run with a checkpoint, an unknown level, a bad count, an `--out` it may not write).
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import replace
from pathlib import Path

import gymnasium as gym
from omegaconf import OmegaConf

from glam.cli import report
from glam.outputs import AGREEMENT, OutputDirError, check_output_dir


def _table(rows: list[dict]) -> str:
    lines = [
        "| run | level | states advised | agreement with the bot (95% Wilson) | "
        "object in view: states, agreement | out of view: states, agreement | "
        "episodes ended | their success (short ones end first) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        low, high = r["interval"]
        out_of_view = r["advised"] - r["advised_in_view"]
        lines.append(
            f"| {r['run']} | {r['level']} | {r['advised']} of {r['states']} | "
            f"{r['agreement']:.3f} [{low:.3f}, {high:.3f}] | "
            f"{r['advised_in_view']}, {r['agreement_in_view']:.3f} | "
            f"{out_of_view}, {r['agreement_out_of_view']:.3f} | {r['episodes']} | "
            f"{r['success_rate']:.3f} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("runs", nargs="+", type=Path, help="run folders (or checkpoints)")
    parser.add_argument("--level", help="the level played (default: each run's env.name)")
    parser.add_argument("--envs", type=int, default=20, help="envs played at once")
    parser.add_argument("--steps", type=int, default=100, help="steps of every env")
    parser.add_argument("--greedy", action="store_true", help="students take their argmax")
    parser.add_argument(
        "--seed", type=int, default=0, help="episode seeds 10**12 + seed * 10**6 on"
    )
    parser.add_argument("--out", type=Path, help="folder for agreement.json and agreement.md")
    parser.add_argument("--overwrite", action="store_true", help="replace results in --out")
    args = parser.parse_args(argv)
    if args.envs < 1 or args.steps < 1 or args.seed < 0:
        return report("--envs and --steps must be >= 1 and --seed >= 0")
    if args.out is not None:
        try:
            check_output_dir(
                args.out,
                AGREEMENT,
                key="--out",
                overwrite=args.overwrite,
                overwrite_key="--overwrite",
            )
        except OutputDirError as error:
            return report(error)
    if args.level is not None:
        try:
            gym.spec(args.level)
        except gym.error.Error as error:
            return report(f"unknown level {args.level!r}: {error}")

    import torch

    from glam.baselines.loading import load_policy
    from glam.config import ConfigError, validate_config
    from glam.eval.config import SEED_BASE
    from glam.eval.student_agreement import student_agreement
    from glam.policy.files import CheckpointError
    from glam.run_config import TrainingRunConfig
    from glam.runs.folder import policy_dir

    rows = []
    for run in args.runs:
        config = run / "config.yaml" if (run / "config.yaml").is_file() else None
        config = config or (run.parent.parent / "config.yaml")  # a checkpoint of a run
        try:
            recorded = OmegaConf.to_container(OmegaConf.load(config))
            recorded.pop("launch", None)  # how the run was started, not a setting
            cfg = validate_config(recorded, TrainingRunConfig)
            policy = load_policy(policy_dir(run)).eval()
        except (FileNotFoundError, ConfigError, CheckpointError) as error:
            return report(f"{run} is not a run folder with a checkpoint: {error}")
        env = replace(cfg.env, name=args.level or cfg.env.name)
        torch.manual_seed(args.seed)
        result = student_agreement(
            policy,
            env,
            cfg.policy,
            num_envs=args.envs,
            steps=args.steps,
            seed=SEED_BASE + args.seed * 10**6,
            greedy=args.greedy,
        )
        rows.append(
            {
                "run": str(run),
                "level": env.name,
                "greedy": args.greedy,
                "agreement": result.rate,
                "interval": list(result.interval),
                "agree": result.agree,
                "advised": result.advised,
                "agreement_in_view": result.rate_in_view,
                "agree_in_view": result.agree_in_view,
                "advised_in_view": result.advised_in_view,
                "agreement_out_of_view": result.rate_out_of_view,
                "states": result.states,
                "episodes": result.episodes,
                "success_rate": result.success_rate,
            }
        )
        print(f"{run}: agreement {result.rate:.3f} on {result.advised} advised states")
    table = _table(rows)
    print(table)
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "agreement.json").write_text(json.dumps(rows, indent=2))
        command = " ".join(argv if argv is not None else sys.argv[1:])
        (args.out / "agreement.md").write_text(
            f"# Students' agreement with BabyAI's bot\n\n"
            f"Command: `python scripts/bot_agreement.py {command}`\n\n{table}\n"
        )
        print(f"wrote agreement.json and agreement.md to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
