"""How well the teacher-student's network learns BabyAI's bot's advice by supervised learning alone.

    # one CPU: BabyAI's symbolic actor-critic (memoryless, 32 channels, as teach_symbolic) fitted
    # to the bot's advice on 40,000 states of GoToLocal, held-out agreement on 5,000 others
    python scripts/imitate_bot.py --states 40000 --out runs/imitation/gotolocal_40k
    # BabyAI's width, four times the states
    python scripts/imitate_bot.py --states 160000 --image-dim 128 --out runs/imitation/gotolocal_160k_128

The ceiling of the distillation term of LLM4Teach's student (docs/teach.md): states of episodes
where the agent follows the bot's advice half the time (`--follow`) and acts uniformly otherwise,
labelled with the bot's advice, split into training states (episode seeds from `--seed` * 10**6)
and held-out ones (episode seeds from 10**12, the evaluation's); the network is fitted by
cross-entropy (Adam, no reward, no PPO) and scored after each epoch by the share of held-out states
where its most probable action is the bot's, also split by whether the mission's object is in
view. Also reports how often a bot knowing only the current view advises the same as the
teaching bot (glam/eval/bot_imitation.py). Writes imitation.csv (one row per epoch),
imitation.json and imitation.md into `--out` (earlier ones are replaced only with `--overwrite`;
the folder is checked before any work). Exit status: 0 done; 2 bad input (an unknown level or
action space, a count below 1, a `--follow` outside [0, 1], an `--out` it may not write).
"""

from __future__ import annotations

import argparse
import csv
import json
import sys
import time
from dataclasses import asdict
from functools import partial
from pathlib import Path

import numpy as np
import torch
from tqdm import tqdm

import babyai_text
from glam.baselines.config import SymbolicConfig
from glam.baselines.symbolic import SymbolicActorCritic
from glam.cli import report
from glam.eval.bot_imitation import advice_states, imitate, share
from glam.eval.config import SEED_BASE
from glam.outputs import IMITATION, OutputDirError, check_output_dir
from glam.threads import set_torch_threads


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--level", default="BabyAI-GoToLocal-v0")
    parser.add_argument("--action-space", default="nav", help="babyai_text action space")
    parser.add_argument("--states", type=int, default=40000, help="labelled training states")
    parser.add_argument("--test-states", type=int, default=5000, help="held-out states")
    parser.add_argument("--follow", type=float, default=0.5, help="P(behaviour takes the advice)")
    parser.add_argument("--epochs", type=int, default=15)
    parser.add_argument("--image-dim", type=int, default=32, help="symbolic.image_dim")
    parser.add_argument("--instr-dim", type=int, help="symbolic.instr_dim (default: --image-dim)")
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--seed", type=int, default=0, help="training episodes and weights")
    parser.add_argument(
        "--threads", type=int, default=None, help="torch threads (default: the cores free)"
    )
    parser.add_argument("--out", type=Path, help="folder for imitation.csv, .json and .md")
    parser.add_argument("--overwrite", action="store_true", help="replace results in --out")
    args = parser.parse_args(argv)
    counts = (args.states, args.test_states, args.epochs, args.image_dim, args.batch_size)
    if min(counts) < 1 or not 0.0 <= args.follow <= 1.0 or args.seed < 0:
        return report(
            "--states, --test-states, --epochs, --image-dim and --batch-size must be >= 1, "
            "--follow in [0, 1], --seed >= 0"
        )
    if args.out is not None:
        try:
            check_output_dir(
                args.out,
                IMITATION,
                key="--out",
                overwrite=args.overwrite,
                overwrite_key="--overwrite",
            )
        except OutputDirError as error:
            return report(error)
    make_env = partial(babyai_text.make, args.level, action_space=args.action_space)
    try:
        words = list(make_env().action_words)
    except ValueError as error:  # an unknown level or action space, named by the message
        return report(error)
    print(f"[imitate] {set_torch_threads(args.threads, '--threads').describe()}", flush=True)
    torch.manual_seed(args.seed)
    start = time.time()
    rng = np.random.default_rng(args.seed)
    with tqdm(total=args.states + args.test_states, desc="labelling states") as bar:
        train = advice_states(
            make_env,
            args.states,
            seed=args.seed * 10**6,
            follow=args.follow,
            generator=rng,
            progress=bar,
        )
        test = advice_states(
            make_env,
            args.test_states,
            seed=SEED_BASE,
            follow=args.follow,
            generator=rng,
            progress=bar,
        )
    labelled_s = time.time() - start
    cfg = SymbolicConfig(image_dim=args.image_dim, instr_dim=args.instr_dim or args.image_dim)
    policy = SymbolicActorCritic(cfg, words)
    history = []
    epochs = imitate(
        policy, train, test, epochs=args.epochs, lr=args.lr, batch_size=args.batch_size
    )
    for row in tqdm(epochs, total=args.epochs, desc="fitting"):
        history.append(asdict(row))
        tqdm.write(
            f"epoch {row.epoch}: loss {row.loss:.3f}, agreement on training states "
            f"{row.train_agreement:.3f}, held-out {row.agreement:.3f} (object in view "
            f"{row.agreement_in_view:.3f}, out of view {row.agreement_out_of_view:.3f})"
        )
    best = max(history, key=lambda r: r["agreement"])
    summary = {
        "level": args.level,
        "action_space": args.action_space,
        "states": len(train),
        "test_states": len(test),
        "train_episodes": train.episodes,
        "test_episodes": test.episodes,
        "follow": args.follow,
        "symbolic": asdict(cfg),
        "test_in_view": share(test.in_view),
        "view_determined_in_view": share(test.view_determined[test.in_view]),
        "view_determined_out_of_view": share(test.view_determined[~test.in_view]),
        "label_shares": (torch.bincount(train.labels, minlength=len(words)) / len(train)).tolist(),
        "final": history[-1],
        "best": best,
        "labelling_seconds": round(labelled_s, 1),
        "seconds": round(time.time() - start, 1),
    }
    table = "\n".join(
        [
            "| states | epochs | held-out agreement, last epoch (best, at epoch) | object in view | "
            "out of view | on training states | a view-only bot agrees (in view / out) |",
            "|---|---|---|---|---|---|---|",
            f"| {len(train)} | {args.epochs} | {history[-1]['agreement']:.3f} "
            f"({best['agreement']:.3f}, {best['epoch']}) | {history[-1]['agreement_in_view']:.3f} | "
            f"{history[-1]['agreement_out_of_view']:.3f} | {history[-1]['train_agreement']:.3f} | "
            f"{summary['view_determined_in_view']:.3f} / {summary['view_determined_out_of_view']:.3f} |",
        ]
    )
    print(table)
    print(f"held-out states with the mission's object in view: {summary['test_in_view']:.2f}")
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        with open(args.out / "imitation.csv", "w", newline="") as file:
            writer = csv.DictWriter(file, fieldnames=list(history[0]))
            writer.writeheader()
            writer.writerows(history)
        (args.out / "imitation.json").write_text(json.dumps(summary, indent=2))
        command = " ".join(argv if argv is not None else sys.argv[1:])
        (args.out / "imitation.md").write_text(
            f"# The student network imitating BabyAI's bot\n\n"
            f"Command: `python scripts/imitate_bot.py {command}`\n\n{table}\n"
        )
        print(f"wrote imitation.csv, imitation.json and imitation.md to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
