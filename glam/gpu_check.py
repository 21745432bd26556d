"""The Python steps of the GPU check (`scripts/gpu_check.sh`, docs/gpu.md), one subcommand each.

    python -m glam.gpu_check facts FACTS.json          # torch, CUDA, the GPU, the libraries
    python -m glam.gpu_check random-model SOURCE TARGET
    python -m glam.gpu_check junit TESTS.xml           # exit 1 on a failure, error or skip
    python -m glam.gpu_check check-run RUN_DIR UPDATES DEVICE
    python -m glam.gpu_check balrog-report RUN_DIR
    python -m glam.gpu_check results WORK OUT          # results.json and the headline lines

The shell script runs the steps with their timeouts and its table of statuses (`steps.tsv`);
these are the parts a test can call: what each step reads, checks and writes.
"""

from __future__ import annotations

import argparse
import csv
import importlib
import json
import os
import sys
import xml.etree.ElementTree as ElementTree
from pathlib import Path
from typing import Any

from glam.models.precision import resolve_autocast_bf16
from glam.outputs import write_json
from glam.scaling_report import WRITER as ESTIMATE_WRITER
from glam.scaling_report import parse_args as estimate_args
from glam.scaling_report import run as estimate

__all__ = [
    "balrog_report",
    "check_run",
    "gather_results",
    "junit_counts",
    "machine_facts",
    "main",
    "random_model",
]

LIBRARIES = ("transformers", "accelerate", "peft", "deepspeed", "minigrid", "datasets")
"""The libraries whose versions the facts record (or why one does not import)."""
BENCHES = ("bench", "bench-all", "bench-micro64")
"""The bench steps whose JSON `gather_results` reads, in the summary's order."""
ESTIMATE_WORKLOAD = [
    "--model",
    "smollm2-135m",
    "--prompt-tokens",
    "58",
    "--candidates",
    "3",
    "--candidate-tokens",
    "2",
    "--envs",
    "8",
    "--frames-per-env",
    "32",
    "--epochs",
    "2",
    "--micro-batch-size",
    "8",
    "--hardware",
    "h100",
    "--precision",
    "amp-bf16",
]
"""The bench's workload as `scripts/estimate_throughput.py` reads it (the default preset)."""


def machine_facts() -> dict[str, Any]:
    """Python, torch, CUDA and cuDNN, the CPUs, the libraries' versions, and on a GPU its name,
    capability, memory, bf16 and TF32 defaults and the precision glam chooses there."""
    import torch

    facts: dict[str, Any] = {
        "python": sys.version.split()[0],
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "cudnn": torch.backends.cudnn.version(),
        "cpus": os.cpu_count(),
    }
    for name in LIBRARIES:
        try:
            facts[name] = importlib.import_module(name).__version__
        except Exception as error:  # noqa: BLE001 (a library that fails to import is a fact)
            facts[name] = f"not importable: {type(error).__name__}: {error}"
    if torch.cuda.is_available():
        p = torch.cuda.get_device_properties(0)
        facts |= {
            "gpu": p.name,
            "capability": f"{p.major}.{p.minor}",
            "sms": p.multi_processor_count,
            "memory_gib": round(p.total_memory / 2**30, 1),
            "bf16_native": torch.cuda.is_bf16_supported(including_emulation=False),
            "tf32_matmul_default": torch.backends.cuda.matmul.allow_tf32,
            "sdpa_flash": torch.backends.cuda.flash_sdp_enabled(),
            "sdpa_mem_efficient": torch.backends.cuda.mem_efficient_sdp_enabled(),
            "glam_precision": resolve_autocast_bf16(None, torch.device("cuda", 0))[1],
        }
    return facts


def random_model(source: Path, target: Path) -> int:
    """Random weights (seed 0) of the architecture of a model folder with a config and a
    tokenizer but no weights, saved to `target`; returns the parameter count."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, GenerationConfig

    torch.manual_seed(0)
    config = AutoConfig.from_pretrained(source, trust_remote_code=False)
    model = AutoModelForCausalLM.from_config(config, trust_remote_code=False)
    model.generation_config = GenerationConfig.from_pretrained(source)
    model.save_pretrained(target)
    AutoTokenizer.from_pretrained(source, trust_remote_code=False).save_pretrained(target)
    return sum(p.numel() for p in model.parameters())


def junit_counts(path: Path) -> dict[str, int]:
    """A pytest JUnit XML file's counts: tests, failures, errors, skipped."""
    root = ElementTree.parse(path).getroot()
    suite = root if root.tag == "testsuite" else root.find("testsuite")
    if suite is None:
        raise ValueError(f"{path}: no testsuite element")
    return {key: int(suite.get(key, 0)) for key in ("tests", "failures", "errors", "skipped")}


def check_run(run: Path, updates: int, device: str) -> tuple[dict[str, Any], list[str]]:
    """What a finished training run leaves in its folder: `metrics.csv` with updates 1 to
    `updates`, the checkpoint `latest` names, the device of `config.yaml`'s launch record.
    Returns the launch record with the last update's timings, and the problems found."""
    import yaml

    launch = yaml.safe_load((run / "config.yaml").read_text())["launch"]
    with (run / "metrics.csv").open() as handle:
        rows = list(csv.DictReader(handle))
    latest = (run / "checkpoints" / "latest").read_text().strip()
    problems = []
    if [int(row["update"]) for row in rows] != list(range(1, updates + 1)):
        problems.append(f"metrics.csv has updates {[row['update'] for row in rows]}")
    if latest != f"update_{updates:06d}":
        problems.append(f"latest names {latest}")
    if launch["device"] != device:
        problems.append(f"device {launch['device']}")
    keys = ("charts/fps", "losses/approx_kl", "time/rollout_forward_s", "time/backward_s")
    found = {
        **{key: launch[key] for key in ("world_size", "distributed_type", "mixed_precision")},
        "device": launch["device"],
        "last_update": {key: rows[-1].get(key) for key in keys} if rows else {},
    }
    return found, problems


def balrog_report(folder: Path) -> str:
    """One line of a BALROG-protocol evaluation's results: success with its interval, invalid
    answers, seconds."""
    record = json.loads((folder / "results.json").read_text())
    suite, generation = record["suites"]["no_change"], record["generation"]
    return (
        f"BALROG {folder.name}: success {suite['success_rate']:.3f} [{suite['ci_low']:.3f}, "
        f"{suite['ci_high']:.3f}] of {suite['episodes']}, invalid answers "
        f"{suite['invalid_action_rate']:.3f} of {generation['answers']}, "
        f"{record['elapsed_seconds']:.0f} s"
    )


def _estimate(work: Path, key: str, extra: list[str]) -> dict[str, Any] | None:
    """The throughput model (`glam.scaling_report`, what `scripts/estimate_throughput.py` runs)
    on the bench's workload, written to `work` as that script writes it; None if it refuses."""
    try:
        record = estimate(estimate_args([*ESTIMATE_WORKLOAD, *extra]))
    except (ValueError, SystemExit):
        return None
    target = write_json(work / f"estimate-{key}.json", record, ESTIMATE_WRITER)
    return json.loads(target.read_text())


def gather_results(work: Path, weights: str) -> tuple[dict[str, Any], list[str]]:
    """The steps' figures (`steps.tsv`, `facts.json`, the benches' JSON) as one record, and the
    headline lines: seconds per update, env-steps per second, CUDA peak and phases of each
    bench; with `bench-all`, the throughput model's prediction and calibration beside it."""
    with (work / "steps.tsv").open() as handle:
        steps = [
            dict(zip(("step", "status", "seconds", "note"), row, strict=False))
            for row in csv.reader(handle, delimiter="\t")
        ]
    results: dict[str, Any] = {"weights": weights, "steps": steps}
    facts = work / "facts.json"
    if facts.is_file():
        results["facts"] = json.loads(facts.read_text())
    lines = []
    for name in BENCHES:
        path = work / f"{name}.json"
        if not path.is_file():
            continue
        bench = json.loads(path.read_text())
        frames, seconds = bench["frames_per_update"], bench["seconds_per_update"]
        bench["env_steps_per_s"] = frames / seconds
        results[name] = bench
        phases = ", ".join(
            f"{key[6:-2]} {value:.2f}" for key, value in bench.items() if key.startswith("phase_")
        )
        lines.append(
            f"{name}: {seconds:.2f} s/update, {frames / seconds:.1f} env-steps/s (rollout "
            f"{bench['rollout_env_steps_per_s']:.1f}, update {bench['update_env_steps_per_s']:.1f}"
            f"), CUDA peak {bench.get('cuda_peak_allocated_mib', float('nan')):.0f} MiB, LoRA "
            f"layers {bench['lora_layers']}, trunk cache {bench['cache_trunk']}; phases (s): "
            f"{phases}"
        )
    if "bench-all" in results:
        measured = results["bench-all"]["seconds_per_update"]
        runs = {
            "prediction_mfu_0.2": ["--mfu", "0.2"],
            "calibrated": ["--calibrate-seconds-per-update", str(measured)],
        }
        for key, extra in runs.items():
            estimate = _estimate(work, key, extra)
            if estimate is not None:
                results[f"estimate_{key}"] = estimate
        lines.append(
            f"scaling model (docs/scaling.md), LoRA on every layer: measured {measured:.2f} "
            "s/update; prediction and calibrated MFU in results.json (estimate_*)"
        )
    results["headline"] = lines
    return results, lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("facts").add_argument("out", type=Path)
    random = commands.add_parser("random-model")
    random.add_argument("source", type=Path)
    random.add_argument("target", type=Path)
    commands.add_parser("junit").add_argument("xml", type=Path)
    run = commands.add_parser("check-run")
    run.add_argument("run", type=Path)
    run.add_argument("updates", type=int)
    run.add_argument("device")
    commands.add_parser("balrog-report").add_argument("folder", type=Path)
    results = commands.add_parser("results")
    results.add_argument("work", type=Path)
    results.add_argument("out", type=Path)
    args = parser.parse_args(argv)

    if args.command == "facts":
        facts = machine_facts()
        print(json.dumps(facts, indent=1))
        args.out.write_text(json.dumps(facts, indent=1))
        print(
            "FACTS",
            facts.get("gpu", "no GPU"),
            facts.get("capability", ""),
            "| torch",
            facts["torch"],
            "CUDA",
            facts["cuda"],
            "|",
            facts.get("glam_precision", "no CUDA"),
        )
    elif args.command == "random-model":
        count = random_model(args.source, args.target)
        print(
            f"random weights of {args.source}'s architecture in {args.target}: "
            f"{count / 1e6:.1f}M parameters"
        )
    elif args.command == "junit":
        counts = junit_counts(args.xml)
        print("GPU SUBSET", counts)  # a skipped test is a failure here: the subset must run
        return 1 if counts["failures"] or counts["errors"] or counts["skipped"] else 0
    elif args.command == "check-run":
        found, problems = check_run(args.run, args.updates, args.device)
        print("RUN", found)
        if problems:
            print("PROBLEMS: " + "; ".join(problems), file=sys.stderr)
            return 1
    elif args.command == "balrog-report":
        print(balrog_report(args.folder))
    else:
        record, lines = gather_results(args.work, os.environ.get("WEIGHTS", "unknown"))
        (args.out / "results.json").write_text(json.dumps(record, indent=1, default=str) + "\n")
        print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
