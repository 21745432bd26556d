"""Every script's output file, as a user runs it: a training run's files are never replaced, a
file another script wrote is replaced only under `--overwrite`, and the refusal comes before any
work (glam/outputs.py, `check_output_file`). The scripts run as subprocesses on hand-made run
folders; none loads a model.

    .venv/bin/python -m pytest tests/test_output_files.py
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPTS = ROOT / "scripts"

FILE_WRITERS = {
    "bench_generation.py": "--out",
    "bench_oni.py": "--out",
    "bench_ppo.py": "--out",
    "bench_scoring.py": "--out",
    "compare_episodes.py": "--json",
    "compare_served_scores.py": "--out",
    "draw_architecture.py": "--out",
    "estimate_throughput.py": "--out",
    "plot_learning_curve.py": "--out",
    "plot_probe.py": "--out",
    "probe_answers.py": "--out",
    "probe_features.py": "--out",
}
"""The scripts that write an output file, and the option that names it: each checks it with
`check_output_file` before any work and writes it marked (`write_json`, `png_metadata`)."""
FOLDER_WRITERS = {
    "bot_agreement.py",
    "compare_runs.py",
    "imitate_bot.py",
    "oni_label_agreement.py",
    "state_blind_ceiling.py",
    "teacher_agreement.py",
    "test_results.py",
}
"""The scripts that write their files into an output folder they check with `check_output_dir`."""
OTHER_WRITERS = {
    "demo.py": "replaces only a folder marked demo.txt, or an empty one (checked first)",
    "keep_runs.py": "writes only into a new or empty folder (glam.runs.record.keep_record)",
    "ship_demo_policy.py": "writes only the project's glam/data/demo_policy (the shipped adapter)",
}
"""The scripts that write files by a rule of their own, and the rule."""
WRITES = (
    "write_text",
    "write_bytes",
    "savefig",
    "json.dump",
    "to_csv",
    "copy2",
    "copyfile",
    "rmtree",
)
"""What writing a file looks like in a script's source."""


def _writes(source: str) -> bool:
    """Whether a script's source writes a file (`WRITES`, or `open(..., "w")`)."""
    methods = {name.split(".")[-1] for name in WRITES}
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Attribute) and node.attr in methods:
            return True
        opens = isinstance(node, ast.Call) and getattr(node.func, "id", None) == "open"
        if opens and any(
            isinstance(arg, ast.Constant) and arg.value in ("w", "a", "wb") for arg in node.args
        ):
            return True
    return False


def _command_source(name: str) -> str:
    """A script's source, with that of the glam module whose `main` it runs, if it only calls
    one (`scripts/estimate_throughput.py` runs `glam.scaling_report.main`)."""
    source = (SCRIPTS / name).read_text()
    for node in ast.walk(ast.parse(source)):
        if (
            isinstance(node, ast.ImportFrom)
            and (node.module or "").startswith("glam.")
            and any(alias.name == "main" for alias in node.names)
        ):
            source += (ROOT / (node.module.replace(".", "/") + ".py")).read_text()
    return source


def test_every_script_that_writes_a_file_goes_through_the_check() -> None:
    writers = {path.name for path in SCRIPTS.glob("*.py") if _writes(path.read_text())}
    listed = set(FILE_WRITERS) | FOLDER_WRITERS | set(OTHER_WRITERS)
    assert writers <= listed, f"scripts that write without a listed rule: {writers - listed}"
    for name in FILE_WRITERS:
        source = _command_source(name)
        assert "check_output_file(" in source and f'WRITER = "scripts/{name}"' in source, name
        assert "write_json(" in source or "png_metadata(" in source, name
    for name in FOLDER_WRITERS:
        assert "check_output_dir(" in (SCRIPTS / name).read_text(), name


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, *args], cwd=ROOT, capture_output=True, text=True, timeout=300
    )


@pytest.fixture
def run_dir(tmp_path: Path) -> Path:
    """A training run's folder as the trainer leaves it (config, metrics, a checkpoint)."""
    run = tmp_path / "run"
    (run / "checkpoints" / "update_000001").mkdir(parents=True)
    (run / "config.yaml").write_text("train:\n  seed: 1\n")
    (run / "metrics.csv").write_text("update,frames,charts/success_rate\n1,256,0.5\n")
    return run


@pytest.mark.parametrize(
    ("script", "extra"),
    [
        ("estimate_throughput.py", ["--model", "smollm2-135m"]),
        ("bench_ppo.py", ["--updates", "1"]),
        ("compare_episodes.py", ["EVAL_A", "EVAL_B"]),
        ("plot_learning_curve.py", ["RUN"]),
        ("probe_answers.py", []),  # the others check the same way (the structure test above)
    ],
)
def test_a_runs_metrics_are_never_replaced(run_dir: Path, script: str, extra: list[str]) -> None:
    before = (run_dir / "metrics.csv").read_bytes()
    args = [str(run_dir) if arg == "RUN" else arg for arg in extra]
    args = [str(run_dir.parent / arg.lower()) if arg.startswith("EVAL_") else arg for arg in args]
    flag = FILE_WRITERS[script]
    done = _run(f"scripts/{script}", *args, flag, str(run_dir / "metrics.csv"), "--overwrite")
    assert done.returncode == 2, done.stderr[-2000:]
    assert done.stderr.startswith("error: ") and "metrics.csv" in done.stderr
    assert "is a file of a training run" in done.stderr or "name a file ending in" in done.stderr
    assert (run_dir / "metrics.csv").read_bytes() == before


def test_a_report_is_replaced_by_its_own_script_and_by_no_other(tmp_path: Path) -> None:
    out = tmp_path / "estimate.json"
    command = ["scripts/estimate_throughput.py", "--model", "smollm2-135m", "--out", str(out)]
    first = _run(*command)
    assert first.returncode == 0, first.stderr[-2000:]
    record = json.loads(out.read_text())
    assert record["written_by"] == "scripts/estimate_throughput.py"
    assert _run(*command).returncode == 0  # its own report, run again

    # Another script's report: refused before any work (its evaluations are not even read),
    # and kept as it was.
    before = out.read_bytes()
    episodes = tmp_path / "missing_a", tmp_path / "missing_b"
    refused = _run("scripts/compare_episodes.py", *map(str, episodes), "--json", str(out))
    assert refused.returncode == 2
    assert "exists (scripts/estimate_throughput.py wrote it): pass --overwrite" in refused.stderr
    assert out.read_bytes() == before

    notes = tmp_path / "notes.json"
    notes.write_text('{"mine": true}\n')
    refused = _run(*command[:-1], str(notes))
    assert refused.returncode == 2 and "not written by this script" in refused.stderr
    assert notes.read_text() == '{"mine": true}\n'
    assert _run(*command[:-1], str(notes), "--overwrite").returncode == 0
    assert json.loads(notes.read_text())["written_by"] == "scripts/estimate_throughput.py"


def test_a_plot_needs_a_format_and_is_replaced_only_by_its_plotter(run_dir: Path) -> None:
    for bad in ("curve", "curve.txt"):
        done = _run("scripts/plot_learning_curve.py", str(run_dir), "--out", str(run_dir / bad))
        assert done.returncode == 2 and "name a file ending in .png or .pdf or .svg" in done.stderr
        assert not (run_dir / bad).exists() and not (run_dir / f"{bad}.png").exists()
    plotted = _run("scripts/plot_learning_curve.py", str(run_dir))
    assert plotted.returncode == 0, plotted.stderr[-2000:]
    assert _run("scripts/plot_learning_curve.py", str(run_dir)).returncode == 0
    other = _run(
        "scripts/plot_probe.py", str(run_dir), "--out", str(run_dir / "learning_curve.png")
    )
    assert other.returncode == 2  # no probe.csv, and the curve is not the probe's to replace


def test_the_demo_replaces_only_its_own_folder(tmp_path: Path) -> None:
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "thesis.tex").write_text("years of work\n")
    done = _run("scripts/demo.py", "--output-dir", str(mine))
    assert done.returncode == 2 and "holds files the demo did not write" in done.stderr
    assert (mine / "thesis.tex").read_text() == "years of work\n"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (
            ["--level", "BabyAI-GoToRedBal-v0"],
            "unknown BabyAI level (did you mean BabyAI-GoToRedBall",
        ),
        (["--device", "cuda"], "torch sees no CUDA GPU here"),
    ],
)
def test_bench_generation_names_a_bad_level_or_device(args: list[str], message: str) -> None:
    if "cuda" in args:
        torch = pytest.importorskip("torch")
        if torch.cuda.is_available():
            pytest.skip("this machine has a GPU")
    done = _run("scripts/bench_generation.py", *args)
    assert done.returncode == 2 and message in done.stderr and "Traceback" not in done.stderr


def test_gpu_pack_refuses_a_misspelt_option_and_a_missing_python(tmp_path: Path) -> None:
    pack = ROOT / ".gpu" / "wheels"
    before = sorted(pack.iterdir()) if pack.is_dir() else None
    misspelt = subprocess.run(
        ["bash", "scripts/gpu_pack.sh", "--ggfu"], cwd=ROOT, capture_output=True, text=True
    )
    assert misspelt.returncode == 2 and "unknown option --ggfu" in misspelt.stderr
    missing = subprocess.run(
        ["bash", "scripts/gpu_pack.sh"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env={"PATH": "/usr/bin:/bin", "GLAM_PY": str(tmp_path / "no-python")},
    )
    assert missing.returncode == 2 and "no Python at" in missing.stderr
    assert (sorted(pack.iterdir()) if pack.is_dir() else None) == before  # the earlier pack kept
