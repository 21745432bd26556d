"""The learner's frames per second with ONI's asynchronous annotator, against the same run
without one (docs/oni.md): the annotator must not slow the learner down.

    # the oni_symbolic preset, 3 variants x 2 rounds of 80k frames, interleaved
    python scripts/bench_oni.py --frames 81920 --rounds 2 --out runs/bench_oni

Variants: `none` (oni.reward_model=none: no annotator, no wrapper: plain PPO), `llm` (the
embedded SmolLM2 judging in its own process, the preset's annotator), `slow` (the oracle made
deliberately slow: it sleeps `--slow-delay` seconds after each batch). Each run is
scripts/train_baseline.py in its own process, as a user starts it; a variant's figure is its
training frames divided by the run's training time (the metrics' `elapsed_seconds`), the
median over rounds. Rounds interleave the variants so that a drift of the machine hits them
alike. Run it alone on the machine: the load average before each run is recorded. Writes
bench_oni.json into `--out` and prints a table. Exit status: 0 done, 1 a run failed.
"""

from __future__ import annotations

import argparse
import csv
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

from glam.cli import report
from glam.outputs import OutputDirError, check_output_file, write_json

ROOT = Path(__file__).resolve().parent.parent


def _variants(slow_delay: float) -> dict[str, list[str]]:
    return {
        "none": ["oni.reward_model=none"],
        "llm": ["oni.reward_model=retrieval", "oni.backend=local"],
        "slow": ["oni.reward_model=retrieval", "oni.backend=oracle", f"oni.delay={slow_delay}"],
    }


def _run(name: str, overrides: list[str], frames: int, run_dir: Path) -> dict[str, float]:
    command = [
        sys.executable,
        str(ROOT / "scripts" / "train_baseline.py"),
        "--config-name",
        "oni_symbolic",
        *overrides,
        f"train.total_frames={frames}",
        "train.save_every=0",
        "train.progress_bar=false",
        f"train.output_dir={run_dir}",
    ]
    load = os.getloadavg()[0]
    done = subprocess.run(command, capture_output=True, text=True, cwd=ROOT)
    if done.returncode != 0:
        raise RuntimeError(f"{name} failed ({done.returncode}): {done.stderr[-2000:]}")
    with (run_dir / "metrics.csv").open() as file:
        rows = list(csv.DictReader(file))
    last = rows[-1]
    seconds = float(last["elapsed_seconds"])
    result = {
        "frames": float(last["frames"]),
        "seconds": seconds,
        "fps": float(last["frames"]) / seconds,
        "load_before": load,
    }
    for key in ("oni/labels_received", "oni/labels_pending", "oni/label_latency_s"):
        if key in last and last[key] != "":
            result[key] = float(last[key])
    return result


WRITER = "scripts/bench_oni.py"
"""The mark of the JSON this script writes (`glam.outputs.write_json`)."""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--frames", type=int, default=81920, help="frames per run")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--slow-delay", type=float, default=5.0)
    parser.add_argument("--out", type=Path, default=Path("runs/bench_oni"))
    parser.add_argument(
        "--overwrite", action="store_true", help="replace a bench_oni.json another script wrote"
    )
    args = parser.parse_args(argv)
    try:  # before any run
        check_output_file(
            args.out / "bench_oni.json", key="--out", writer=WRITER, overwrite=args.overwrite
        )
    except OutputDirError as error:
        return report(error)
    variants = _variants(args.slow_delay)
    runs: dict[str, list[dict[str, float]]] = {name: [] for name in variants}
    args.out.mkdir(parents=True, exist_ok=True)
    for round_ in range(args.rounds):
        for name, overrides in variants.items():
            run_dir = args.out / f"{name}_round{round_}"
            try:
                result = _run(name, overrides, args.frames, run_dir)
            except RuntimeError as error:
                return report(error, status=1)
            runs[name].append(result)
            print(
                f"[bench_oni] round {round_} {name}: {result['fps']:.0f} frames/s "
                f"({result['seconds']:.1f} s, load before {result['load_before']:.2f})",
                flush=True,
            )
    base = statistics.median(r["fps"] for r in runs["none"])
    summary = {
        name: {
            "median_fps": statistics.median(r["fps"] for r in results),
            "relative_to_none": statistics.median(r["fps"] for r in results) / base,
            "runs": results,
        }
        for name, results in runs.items()
    }
    record = {
        "when": time.strftime("%Y-%m-%d %H:%M:%S"),
        "machine": {"cpu_count": os.cpu_count(), "processor": platform.processor()},
        "frames_per_run": args.frames,
        "rounds": args.rounds,
        "slow_delay": args.slow_delay,
        "variants": summary,
    }
    write_json(args.out / "bench_oni.json", record, WRITER)
    print("| variant | median frames/s | vs none | per round |")
    print("|---|---|---|---|")
    for name, entry in summary.items():
        rounds = ", ".join(f"{r['fps']:.0f}" for r in entry["runs"])
        print(
            f"| {name} | {entry['median_fps']:.0f} | {entry['relative_to_none']:.3f} | {rounds} |"
        )
    print(f"[bench_oni] wrote {args.out / 'bench_oni.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
