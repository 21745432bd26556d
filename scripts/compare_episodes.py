"""Compare two evaluations episode by episode: the same seeds, McNemar's exact test.

    # any machine (reads two evaluation folders): a trained checkpoint against its control
    python scripts/compare_episodes.py runs/eval/balrog/written-ppo-seed-1-bf16-cut16 \
        runs/eval/balrog/constant-go-forward --labels checkpoint control
    python scripts/compare_episodes.py runs/eval/a runs/eval/b --suite french --json runs/a_vs_b.json

Both folders are evaluations (`scripts/post_training_tests.py`, `scripts/zero_shot_generation.py`)
with their episodes.jsonl; their episodes pair up by seed (same `eval.seed`, level and episode
counts: the same rooms and missions). Per task type and over all: episodes, successes of each,
the discordant pairs (solved by one only), the episodes played action for action alike, and
McNemar's exact two-sided p-value (glam/eval/paired.py; docs/evaluation.md, "Two agents on the
same episodes"). Seeds that only one evaluation played are left out and counted. Prints a
markdown table; `--json` also writes the rows. Exit status: 0 done; 2 bad input (a folder
without episodes.jsonl, a line that is not an episode, a suite neither played, no common seed,
one seed with two missions, a `--json` path it cannot write).
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import asdict
from pathlib import Path

from glam.cli import exit_on
from glam.eval.paired import compare_paired, format_table, read_episodes
from glam.outputs import add_output_file_options, check_output_file, write_json

WRITER = "scripts/compare_episodes.py"
"""The mark of the JSON this script writes (`glam.outputs.write_json`)."""


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("a", type=Path, help="an evaluation folder (or its episodes.jsonl)")
    parser.add_argument("b", type=Path, help="the evaluation to compare it with")
    parser.add_argument("--suite", default="no_change", help="the suite to pair (no_change)")
    parser.add_argument(
        "--labels", nargs=2, metavar=("A", "B"), help="names in the table (the folder names)"
    )
    add_output_file_options(parser, "--json", help="also write the rows to this JSON file")
    args = parser.parse_args(argv)
    label_a, label_b = args.labels or (_name(args.a), _name(args.b))
    with exit_on(ValueError):  # OutputDirError is one
        if args.json is not None:  # before any work
            check_output_file(args.json, key="--json", writer=WRITER, overwrite=args.overwrite)
        a = read_episodes(args.a, args.suite)
        b = read_episodes(args.b, args.suite)
        rows = compare_paired(a, b)
    common = rows[-1].episodes
    print(f"{label_a}: {args.a} ({len(a)} episodes of {args.suite})")
    print(f"{label_b}: {args.b} ({len(b)} episodes of {args.suite})")
    print(
        f"paired by seed: {common}; left out: {len(a) - common} of {label_a}, "
        f"{len(b) - common} of {label_b}\n"
    )
    print(format_table(rows, label_a, label_b))
    if args.json is not None:
        record = {
            "a": {"label": label_a, "path": str(args.a)},
            "b": {"label": label_b, "path": str(args.b)},
            "suite": args.suite,
            "rows": [asdict(row) | {"p_value": row.p_value} for row in rows],
        }
        with exit_on(OSError):
            write_json(args.json, record, WRITER)
        print(f"\nwrote json {args.json}")
    return 0


def _name(path: Path) -> str:
    """A table label for an evaluation: its folder's name."""
    return (path.parent if path.is_file() else path).name or str(path)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
