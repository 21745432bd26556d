"""How often the LLM teacher chooses the subgoal BabyAI's bot pursues (docs/teach.md).

    # one CPU: the embedded SmolLM2 on 200 seeded situations of GoToLocal, beside the uniform
    # teacher (chance)
    python scripts/teacher_agreement.py --out runs/teacher_agreement
    # another model or level; a GPU model spec works the same way
    python scripts/teacher_agreement.py --model /models/Llama-3.2-1B-Instruct \
        --level BabyAI-GoTo-v0 --situations 500 --out runs/teacher_agreement_goto

The situations are states of the bot's own seeded episodes (glam/eval/teacher_agreement.py says how
they are drawn and what each measure means). Writes agreement.json (the measures per teacher),
situations.jsonl (every situation with each teacher's choice) and agreement.md into `--out`, and
prints the table. An `--out` holding earlier results is refused unless `--overwrite`, one that
is a file, cannot be written or holds another kind of output always, before any work. Exit
status: 0 done; 2 bad input (an unknown level, a model that cannot be loaded, fewer than one
situation, an `--out` it may not write).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import gymnasium as gym
from tqdm import tqdm

from glam.cli import report
from glam.eval.teacher_agreement import MINIGRID_ACTIONS, measure_agreement, situations
from glam.outputs import AGREEMENT, OutputDirError, check_output_dir
from glam.teach.teacher import SubgoalTeacher


def _table(results: list[dict]) -> str:
    lines = [
        "| teacher | situations | coverage | subgoal agreement (95% CI) | chance | "
        "action agreement (95% CI) | P(bot's subgoal) | P(bot's action) | LLM calls |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        sub_lo, sub_hi = r["subgoal_agreement_ci"]
        act_lo, act_hi = r["action_agreement_ci"]
        lines.append(
            f"| {r['teacher']} | {r['situations']} | {r['coverage']:.3f} | "
            f"{r['subgoal_agreement']:.3f} ({sub_lo:.3f}-{sub_hi:.3f}) | {r['chance']:.3f} | "
            f"{r['action_agreement']:.3f} ({act_lo:.3f}-{act_hi:.3f}) | "
            f"{r['bot_subgoal_probability']:.3f} | {r['bot_action_probability']:.3f} | "
            f"{r['llm_calls']} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="smollm2-135m", help="the LLM teacher's model spec")
    parser.add_argument("--level", default="BabyAI-GoToLocal-v0")
    parser.add_argument("--situations", type=int, default=200)
    parser.add_argument("--seed", type=int, default=0, help="first episode seed, and the draw")
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument("--out", type=Path, default=Path("runs/teacher_agreement"))
    parser.add_argument("--overwrite", action="store_true", help="replace results in --out")
    args = parser.parse_args(argv)
    if args.situations < 1:
        return report(f"--situations must be >= 1, got {args.situations}")
    try:
        check_output_dir(
            args.out, AGREEMENT, key="--out", overwrite=args.overwrite, overwrite_key="--overwrite"
        )
    except OutputDirError as error:
        return report(error)
    try:
        gym.spec(args.level)
    except gym.error.Error as error:
        return report(f"unknown level {args.level!r}: {error}")

    from glam.models.loading import ModelNotFoundError
    from glam.teach.scorers import LocalScorer

    try:
        scorer = LocalScorer.load(args.model)
    except (ModelNotFoundError, OSError, ValueError) as error:
        return report(f"cannot load the teacher's model {args.model!r}: {error}")
    cases = list(
        tqdm(
            situations(args.level, args.situations, args.seed),
            total=args.situations,
            desc="situations",
            unit="situation",
        )
    )
    print(f"{len(cases)} situations of {args.level} (episode seeds from {args.seed})")
    teachers = {
        f"llm:{args.model}": SubgoalTeacher(
            MINIGRID_ACTIONS, scorer, temperature=args.temperature, cache=False
        ),
        "uniform": SubgoalTeacher(MINIGRID_ACTIONS, None),
    }
    results, records = [], {}
    for name, teacher in teachers.items():
        start = time.perf_counter()
        result, records[name] = measure_agreement(teacher, cases, name, progress=True)
        results.append(result.as_dict() | {"seconds": round(time.perf_counter() - start, 1)})
        teacher.close()
    args.out.mkdir(parents=True, exist_ok=True)
    meta = {"level": args.level, "seed": args.seed, "temperature": args.temperature}
    (args.out / "agreement.json").write_text(json.dumps({**meta, "teachers": results}, indent=2))
    with (args.out / "situations.jsonl").open("w") as file:
        for i, case in enumerate(records[f"llm:{args.model}"]):
            uniform = records["uniform"][i]
            case["uniform_subgoal"] = uniform["teacher_subgoal"]
            file.write(json.dumps(case) + "\n")
    table = _table(results)
    (args.out / "agreement.md").write_text(
        f"# Teacher agreement with BabyAI's bot on {args.level}\n\n"
        f"Command: `python scripts/teacher_agreement.py {' '.join(argv or sys.argv[1:])}`\n\n"
        f"{table}\n"
    )
    print(table)
    print(f"wrote agreement.json, agreement.md and situations.jsonl to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
