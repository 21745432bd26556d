"""Copy a trained run's adapter into glam/data/demo_policy, with the record `make demo` prints.

    python scripts/train_language_agent.py train.output_dir=runs/demo-adapter
    python scripts/post_training_tests.py agent.kind=checkpoint agent.path=runs/demo-adapter \
        eval.episodes=100 'eval.suites=[no_change]' eval.output_dir=runs/demo-adapter/eval
    python scripts/ship_demo_policy.py runs/demo-adapter runs/demo-adapter/eval \
        --command "python scripts/train_language_agent.py train.output_dir=runs/demo-adapter" \
        --commit 5bd4161 --load-average "3.4-4.1"

The run must be of the demo's preset (`smollm2_lora_cpu`, the adapter its policy rebuilds from);
its newest checkpoint's adapter is copied, the held-out evaluation's success is read from its
`results.json`, and the demo's own episodes are played with the untrained and the trained policy
(`glam.demo.play`; `--demo-episodes`, and `--test-episodes` for the suite's check,
tests/test_demo_policy.py). `record.json` is written last. Exit status: 0 done; 2 bad input (not
a run of the preset, no checkpoint, no evaluation).
"""

from __future__ import annotations

import argparse
import csv
import json
import shutil
import sys
from pathlib import Path

from omegaconf import OmegaConf

from glam.cli import report
from glam.demo import DEMO_POLICY, PRESET, demo_policy, play, success_of
from glam.run_config import compose_run
from glam.runs.folder import policy_dir

ADAPTER_FILES = ("adapter_config.json", "adapter_model.safetensors")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("run", type=Path, help="the training run's folder")
    parser.add_argument("evaluation", type=Path, help="its held-out evaluation's folder")
    parser.add_argument("--command", required=True, help="the command that trained the run")
    parser.add_argument("--commit", required=True, help="the commit it ran at")
    parser.add_argument("--load-average", default="", help="the machine's load during training")
    parser.add_argument("--demo-episodes", type=int, default=10)
    parser.add_argument("--test-episodes", type=int, default=10)
    args = parser.parse_args(argv)
    if min(args.demo_episodes, args.test_episodes) < 1:
        return report("--demo-episodes and --test-episodes must be >= 1")
    try:
        adapter = policy_dir(args.run) / "adapter"
        config = OmegaConf.to_container(OmegaConf.load(args.run / "config.yaml"))
        results = json.loads((args.evaluation / "results.json").read_text())
        with (args.run / "metrics.csv").open() as handle:
            rows = list(csv.DictReader(handle))
    except (OSError, ValueError, KeyError) as error:
        return report(f"cannot read the run or its evaluation: {error}")
    preset = OmegaConf.to_container(OmegaConf.structured(compose_run(PRESET)))
    for section in ("model", "policy", "env"):
        theirs = {k: v for k, v in config[section].items() if k != "autocast_bf16"}
        ours = {k: v for k, v in preset[section].items() if k != "autocast_bf16"}
        if theirs != ours:
            return report(f"{args.run}: its {section} settings are not the {PRESET} preset's")
    if not all((adapter / name).is_file() for name in ADAPTER_FILES):
        return report(f"{adapter} holds no LoRA adapter ({', '.join(ADAPTER_FILES)})")

    DEMO_POLICY.mkdir(parents=True, exist_ok=True)
    (DEMO_POLICY / "record.json").unlink(missing_ok=True)
    for name in ADAPTER_FILES:
        shutil.copyfile(adapter / name, DEMO_POLICY / name)
    try:
        held_out = _held_out(results)
    except KeyError as error:
        return report(f"{args.evaluation}/results.json has no no_change suite result ({error})")
    demo = {"episodes": args.demo_episodes}
    for name in ("untrained", "trained"):
        demo[name] = success_of(play(demo_policy(name == "trained"), args.demo_episodes))
        print(f"[ship] {name}: {demo[name]}")
    test = {
        "episodes": args.test_episodes,
        **success_of(play(demo_policy(True), args.test_episodes)),
    }
    last = rows[-1]
    record = {
        "preset": PRESET,
        "command": args.command,
        "commit": args.commit,
        "checkpoint": str(adapter.parent.parent.name),
        "updates": int(last["update"]),
        "frames": int(last["frames"]),
        "train_minutes": float(last["elapsed_seconds"]) / 60,
        "load_average": args.load_average,
        "held_out": held_out,
        "demo": demo,
        "test": test,
        "config": {section: config[section] for section in ("model", "policy", "env", "train")},
    }
    (DEMO_POLICY / "record.json").write_text(json.dumps(record, indent=2) + "\n")
    print(f"[ship] adapter and record.json written to {DEMO_POLICY}")
    return 0


def _held_out(results: dict) -> dict:
    """The evaluation's `no_change` suite: its episodes, success and interval, mean length."""
    suite = results["suites"]["no_change"]
    keys = ("episodes", "success_rate", "ci_low", "ci_high", "mean_length")
    return {key: suite[key] for key in keys}


if __name__ == "__main__":
    sys.exit(main())
