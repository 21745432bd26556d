"""How often an LLM judge labels the agent's events as the oracle does (docs/oni.md).

    # one CPU: the embedded SmolLM2 on 200 distinct messages of 7 BabyAI levels
    python scripts/oni_label_agreement.py --out runs/oni_agreement
    # another model, in this process or behind an OpenAI-compatible server
    python scripts/oni_label_agreement.py --model /models/Llama-3.1-8B-Instruct --out runs/oni_8b
    python scripts/oni_label_agreement.py --backend openai --base-url http://127.0.0.1:8000/v1 \
        --out runs/oni_vllm

The messages are (mission, event) pairs met in seeded episodes of the bot with random actions
mixed in (glam/oni/agreement.py), drawn at random among the distinct ones; the judge answers
glam.oni.annotator.JUDGE_PROMPT exactly as ONI's annotator does in training. Writes
agreement.json (the measures), messages.jsonl (every message, the oracle's label, the judge's
label and margin) and agreement.md into `--out`, and prints the tables. An `--out` holding
earlier results is refused unless `--overwrite`, one that is a file, cannot be written or holds
another kind of output always, before any work. Exit status: 0 done; 2 bad input (an unknown
level, a model or server that cannot be reached, no message, an `--out` it may not write).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections import defaultdict
from pathlib import Path

from tqdm import tqdm

from glam.cli import report
from glam.llm.chat import ChatClientError
from glam.oni.agreement import DEFAULT_LEVELS, agreement, collect_messages, draw, event_kind
from glam.oni.annotator import JudgeLabeller, build_labeller
from glam.oni.config import OniConfig
from glam.oni.oracle import oracle_label
from glam.outputs import AGREEMENT, OutputDirError, check_output_dir


def _tables(result: dict, rows: list[dict]) -> str:
    lo, hi = result["agreement_ci"]
    lines = [
        "| judge | messages | agreement (95% CI) | base rate | judged positive | constant "
        "labeller | Cohen's kappa | balanced accuracy | margin ROC AUC |",
        "|---|---|---|---|---|---|---|---|---|",
        f"| {result['judge']}{'' if result['calibrated'] else ' (uncalibrated)'} | {result['messages']} | {result['agreement']:.3f} "
        f"({lo:.3f}-{hi:.3f}) | {result['base_rate']:.3f} | {result['judged_positive_rate']:.3f}"
        f" | {result['constant_agreement']:.3f} | {result['cohen_kappa']:.3f} | "
        f"{result['balanced_accuracy']:.3f} | {result['margin_auc']:.3f} |",
        "",
        "| event | messages | oracle positive | judged positive | agreement |",
        "|---|---|---|---|---|",
    ]
    kinds: dict[str, list[dict]] = defaultdict(list)
    for row in rows:
        kinds[event_kind(row["event"])].append(row)
    for kind, members in sorted(kinds.items(), key=lambda item: -len(item[1])):
        n = len(members)
        lines.append(
            f"| {kind} | {n} | {sum(r['oracle'] for r in members) / n:.2f} | "
            f"{sum(r['judged'] for r in members) / n:.2f} | "
            f"{sum(r['oracle'] == r['judged'] for r in members) / n:.2f} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="smollm2-135m", help="the judge's model spec")
    parser.add_argument("--backend", choices=("local", "openai"), default="local")
    parser.add_argument("--base-url", default="http://127.0.0.1:8080/v1")
    parser.add_argument("--model-id", default="", help="--backend openai: the model name sent")
    parser.add_argument(
        "--no-calibrate", action="store_true", help="threshold the judge's margins at 0"
    )
    parser.add_argument("--levels", nargs="+", default=list(DEFAULT_LEVELS))
    parser.add_argument("--episodes-per-level", type=int, default=20)
    parser.add_argument("--messages", type=int, default=200)
    parser.add_argument("--seed", type=int, default=0, help="episode seeds and the draw")
    parser.add_argument("--out", type=Path, default=Path("runs/oni_agreement"))
    parser.add_argument("--overwrite", action="store_true", help="replace results in --out")
    args = parser.parse_args(argv)
    if args.messages < 1 or args.episodes_per_level < 1:
        return report("--messages and --episodes-per-level must be at least 1")
    try:
        check_output_dir(
            args.out, AGREEMENT, key="--out", overwrite=args.overwrite, overwrite_key="--overwrite"
        )
    except OutputDirError as error:
        return report(error)
    try:
        pool = collect_messages(
            args.levels, episodes_per_level=args.episodes_per_level, seed=args.seed
        )
    except ValueError as error:  # an unknown level names the known ones
        return report(error)
    messages = draw(pool, args.messages, seed=args.seed)
    if not messages:
        return report("the episodes produced no event message")
    print(
        f"[oni] {len(pool)} distinct messages met in {args.episodes_per_level} episodes of each "
        f"of {len(args.levels)} levels; judging {len(messages)}"
    )
    cfg = OniConfig(
        reward_model="retrieval",
        backend=args.backend,
        model=args.model,
        base_url=args.base_url,
        model_id=args.model_id,
        calibrate=not args.no_calibrate,
    )
    try:
        judge = build_labeller(cfg)
    except (OSError, ValueError, ChatClientError) as error:
        return report(f"cannot load the judge: {error}")
    assert isinstance(judge, JudgeLabeller)
    start = time.perf_counter()
    margins = []
    for message in tqdm(messages, desc="judging", unit="msg"):
        margins.extend(judge.preferences([message]))
    seconds = time.perf_counter() - start
    judge.close()
    oracle = [oracle_label(goal, event) for goal, event in messages]
    judged = [float(m > 0) for m in margins]
    name = (
        args.model if args.backend == "local" else f"{args.model_id or 'served'} @ {args.base_url}"
    )
    result = {"judge": name, **agreement(oracle, judged, margins)}
    result |= {
        "calibrated": not args.no_calibrate,
        "seconds_per_message": seconds / len(messages),
        "levels": args.levels,
        "distinct_messages_met": len(pool),
        "seed": args.seed,
    }
    rows = [
        {"mission": goal, "event": event, "oracle": o, "judged": j, "margin": m}
        for (goal, event), o, j, m in zip(messages, oracle, judged, margins, strict=True)
    ]
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "agreement.json").write_text(json.dumps(result, indent=2) + "\n")
    with (args.out / "messages.jsonl").open("w") as out:
        for row in rows:
            out.write(json.dumps(row) + "\n")
    tables = _tables(result, rows)
    (args.out / "agreement.md").write_text(tables + "\n")
    print(tables)
    print(
        f"[oni] {seconds / len(messages):.3f} s per message; wrote agreement.json, "
        f"messages.jsonl and agreement.md to {args.out}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
