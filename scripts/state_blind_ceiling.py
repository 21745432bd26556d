"""The state-blind ceiling of a level: the best policy that never reads the observation, evaluated
on the held-out episodes as any agent is.

    # any machine, about 2 min: GoToRedBall with the three navigation actions
    python scripts/state_blind_ceiling.py BabyAI-GoToRedBall-v0 --action-space nav \
        --out runs/eval/ceiling-gotoredball
    # then beside trained runs: a horizontal line in the figure, a row in the table
    python scripts/compare_runs.py runs/ablation/* --out runs/cmp \
        --baselines runs/eval/ceiling-gotoredball

Every probability vector on a grid over the actions (`--step`, 0.1: 66 policies for three
actions) plays `--tune-episodes` episodes with tuning seeds (`--tune-seed`, not the held-out
`--seed`); the best (by success, then return) plays `--episodes` held-out episodes through the
evaluation harness (`agent.kind=fixed agent.probs=[...]`), labelled `--label`, written to `--out`
like any evaluation (results.json, episodes.jsonl...), with the search's table in
`ceiling_search.csv` beside it. Exit status: 0 done; 2 bad input (an unknown level or action
space, a step that is not 1/k, the same tuning and held-out seed, an `--out` it may not write).
"""

from __future__ import annotations

import argparse
import csv
import sys
from pathlib import Path

from rich.progress import Progress

from babyai_text.actions import get_action_space
from glam.cli import exit_on
from glam.eval.config import AgentConfig, EvalConfig, PostTrainingTestsConfig
from glam.eval.harness import evaluate
from glam.eval.state_blind import search_ceiling, simplex_grid
from glam.outputs import EVALUATION, OutputDirError, check_output_dir

SEARCH_CSV = "ceiling_search.csv"


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("level", help="BabyAI-Text level id (BabyAI-GoToRedBall-v0)")
    parser.add_argument("--action-space", default="nav", help="action space (nav, default...)")
    parser.add_argument("--step", type=float, default=0.1, help="grid step, 1/k (0.1)")
    parser.add_argument("--tune-episodes", type=int, default=300, help="episodes per policy")
    parser.add_argument("--tune-seed", type=int, default=1, help="eval.seed of the search")
    parser.add_argument("--episodes", type=int, default=100, help="held-out episodes")
    parser.add_argument("--seed", type=int, default=0, help="eval.seed of the held-out episodes")
    parser.add_argument("--num-envs", type=int, default=20, help="envs stepped together")
    parser.add_argument("--label", default="state-blind ceiling", help="name in tables")
    parser.add_argument("--out", type=Path, required=True, help="evaluation folder to write")
    parser.add_argument("--overwrite", action="store_true", help="replace an earlier evaluation")
    args = parser.parse_args(argv)

    with exit_on(ValueError, KeyError, OutputDirError):
        if args.tune_seed == args.seed:
            raise ValueError(
                f"--tune-seed and --seed are both {args.seed}: the held-out episodes would "
                "choose the winner; give the search other seeds"
            )
        actions = get_action_space(args.action_space).words
        grid = simplex_grid(len(actions), args.step)
        check_output_dir(
            args.out, EVALUATION, key="--out", overwrite=args.overwrite, overwrite_key="--overwrite"
        )
        settings = dict(
            level=args.level,
            suites=["no_change"],
            num_envs=args.num_envs,
            action_space=args.action_space,
            progress_bar=False,
        )
        tuning = PostTrainingTestsConfig(
            agent=AgentConfig(kind="fixed", probs=list(grid[0])),
            eval=EvalConfig(
                episodes=args.tune_episodes,
                seed=args.tune_seed,
                output_dir=str(args.out),
                **settings,
            ),
        )
        print(
            f"[ceiling] {len(grid)} state-blind policies over {', '.join(actions)}, "
            f"{args.tune_episodes} tuning episodes each (eval.seed={args.tune_seed})",
            flush=True,
        )
        with Progress() as progress:
            task = progress.add_task("search", total=len(grid))
            ranked = search_ceiling(
                tuning, len(actions), args.step, lambda _: progress.advance(task)
            )

    print("best on the tuning episodes:")
    print("| " + " | ".join(actions) + " | success | return |")
    print("|" + "---|" * (len(actions) + 2))
    for candidate in ranked[:5]:
        probs = " | ".join(f"{p:.2f}" for p in candidate.probs)
        print(f"| {probs} | {candidate.success_rate:.3f} | {candidate.mean_return:.3f} |")

    best = ranked[0]
    held_out = PostTrainingTestsConfig(
        agent=AgentConfig(kind="fixed", probs=list(best.probs)),
        eval=EvalConfig(
            episodes=args.episodes,
            seed=args.seed,
            output_dir=str(args.out),
            overwrite=args.overwrite,
            label=args.label,
            **settings,
        ),
    )
    with exit_on(ValueError, OutputDirError):
        results, paths = evaluate(held_out)
    with open(args.out / SEARCH_CSV, "w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow([*actions, "success_rate", "mean_return", "episodes", "eval_seed"])
        for candidate in ranked:
            writer.writerow(
                [*candidate.probs, candidate.success_rate, candidate.mean_return]
                + [args.tune_episodes, args.tune_seed]
            )
    suite = results["suites"]["no_change"]
    print(
        f"{args.label}: agent.probs={list(best.probs)} held out {suite['success_rate']:.3f} "
        f"[{suite['ci_low']:.3f}, {suite['ci_high']:.3f}] on {suite['episodes']} episodes "
        f"(eval.seed={args.seed})"
    )
    for kind, path in paths.items():
        print(f"wrote {kind:8s} {path}")
    print(f"wrote search   {args.out / SEARCH_CSV}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
