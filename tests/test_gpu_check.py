"""The GPU check's Python steps (glam/gpu_check.py), on the CPU: what each reads, checks and
writes, on files made here the way the check's steps leave them.

.venv/bin/python -m pytest tests/test_gpu_check.py
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from glam.gpu_check import (
    balrog_report,
    check_run,
    gather_results,
    junit_counts,
    machine_facts,
    main,
)


def _junit(path: Path, **counts: int) -> Path:
    attributes = " ".join(f'{key}="{value}"' for key, value in counts.items())
    path.write_text(f'<testsuites><testsuite name="pytest" {attributes}></testsuite></testsuites>')
    return path


def test_junit_counts_and_a_skip_fails_the_subset(tmp_path: Path) -> None:
    passed = _junit(tmp_path / "ok.xml", tests=12, failures=0, errors=0, skipped=0)
    assert junit_counts(passed) == {"tests": 12, "failures": 0, "errors": 0, "skipped": 0}
    assert main(["junit", str(passed)]) == 0
    skipped = _junit(tmp_path / "skip.xml", tests=12, skipped=1)  # the subset must run whole
    assert junit_counts(skipped)["skipped"] == 1
    assert main(["junit", str(skipped)]) == 1
    assert main(["junit", str(_junit(tmp_path / "f.xml", tests=3, failures=1))]) == 1


def _run_folder(tmp_path: Path, updates: list[int], latest: str, device: str = "cuda") -> Path:
    run = tmp_path / "run"
    (run / "checkpoints").mkdir(parents=True)
    launch = {
        "world_size": 1,
        "distributed_type": "NO",
        "mixed_precision": "no",
        "device": device,
    }
    (run / "config.yaml").write_text(yaml.safe_dump({"launch": launch}))
    rows = ["update,frames,charts/fps,losses/approx_kl"] + [
        f"{u},{256 * u},40.5,0.001" for u in updates
    ]
    (run / "metrics.csv").write_text("\n".join(rows) + "\n")
    (run / "checkpoints" / "latest").write_text(latest + "\n")
    return run


def test_check_run_passes_a_whole_run_and_names_each_problem(tmp_path: Path) -> None:
    run = _run_folder(tmp_path, [1, 2, 3], "update_000003")
    found, problems = check_run(run, 3, "cuda")
    assert problems == []
    assert found["device"] == "cuda" and found["last_update"]["charts/fps"] == "40.5"
    assert main(["check-run", str(run), "3", "cuda"]) == 0

    _, problems = check_run(run, 4, "cpu")  # one update short, another device
    assert problems == [
        "metrics.csv has updates ['1', '2', '3']",
        "latest names update_000003",
        "device cuda",
    ]
    assert main(["check-run", str(run), "4", "cuda"]) == 1


def test_balrog_report_reads_the_evaluations_results(tmp_path: Path) -> None:
    folder = tmp_path / "zero-shot"
    folder.mkdir()
    record = {
        "suites": {
            "no_change": {
                "success_rate": 0.1,
                "ci_low": 0.04,
                "ci_high": 0.21,
                "episodes": 50,
                "invalid_action_rate": 0.5,
            }
        },
        "generation": {"answers": 1536},
        "elapsed_seconds": 245.2,
    }
    (folder / "results.json").write_text(json.dumps(record))
    assert balrog_report(folder) == (
        "BALROG zero-shot: success 0.100 [0.040, 0.210] of 50, invalid answers 0.500 of 1536, 245 s"
    )


def test_results_gather_the_steps_and_the_benches(tmp_path: Path) -> None:
    (tmp_path / "steps.tsv").write_text(
        "env\tPASS\t12\tglam imports\nbench\tPASS\t80\tdone\ntests\tSKIP\t0\tnot asked\n"
    )
    (tmp_path / "facts.json").write_text(json.dumps({"torch": "2.13.0"}))
    bench = {
        "frames_per_update": 256,
        "seconds_per_update": 3.2,
        "rollout_env_steps_per_s": 120.0,
        "update_env_steps_per_s": 160.0,
        "cuda_peak_allocated_mib": 1500.0,
        "lora_layers": 4,
        "cache_trunk": True,
        "phase_rollout_forward_s": 1.5,
        "phase_backward_s": 0.5,
    }
    (tmp_path / "bench.json").write_text(json.dumps(bench))
    record, lines = gather_results(tmp_path, "pretrained")
    assert [step["status"] for step in record["steps"]] == ["PASS", "PASS", "SKIP"]
    assert record["facts"] == {"torch": "2.13.0"} and record["weights"] == "pretrained"
    assert record["bench"]["env_steps_per_s"] == pytest.approx(80.0)
    assert lines == [
        "bench: 3.20 s/update, 80.0 env-steps/s (rollout 120.0, update 160.0), CUDA peak 1500 "
        "MiB, LoRA layers 4, trunk cache True; phases (s): rollout_forward 1.50, backward 0.50"
    ]
    out = tmp_path / "out"
    out.mkdir()
    assert main(["results", str(tmp_path), str(out)]) == 0
    assert json.loads((out / "results.json").read_text())["headline"] == lines


def test_facts_on_a_machine_without_a_gpu(tmp_path: Path) -> None:
    facts = machine_facts()
    assert {"python", "torch", "cuda", "cudnn", "cpus", "transformers", "peft"} <= set(facts)
    out = tmp_path / "facts.json"
    assert main(["facts", str(out)]) == 0
    assert json.loads(out.read_text())["torch"] == facts["torch"]
