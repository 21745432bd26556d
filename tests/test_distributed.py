"""Every documented launcher, for real, with two processes on this CPU.

- The same PPO update on the same transitions gives the same trainable weights in one process,
  two DDP processes over gloo, DeepSpeed ZeRO-2 and ZeRO-3 with two processes
  (tests/distributed_probe.py runs it inside each launch and asserts the world size there).
- Initial LoRA and head weights are identical on every process before any broadcast; advantage
  normalisation is global.
- DeepSpeed's optimizer shards (Adam moments) come back on resume.
- `scripts/train_language_agent.py` under each launcher, with LoRA on the top layer and the
  update run from the cached trunk (`glam.trunk`): the run records its world size and DeepSpeed
  stage, its adapter loads with peft, and a run killed with SIGKILL resumes.
- A launch whose processes would run as independent jobs stops at once, saying what to do.
- The writing policy with GRPO on two processes: a run resumed after its second update plays
  its third as the uninterrupted run does.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from functools import cache
from pathlib import Path

import pytest
import yaml
from helpers_launch import accelerate_launch
from safetensors.torch import load_file

ROOT = Path(__file__).resolve().parents[1]
PROBE = ROOT / "tests" / "distributed_probe.py"
SCRIPT = ROOT / "scripts" / "train_language_agent.py"
LAYOUTS = ["multi_cpu", "zero2", "zero3"]
DEEPSPEED_STAGE = {"multi_cpu": None, "zero2": 2, "zero3": 3}

pytestmark = pytest.mark.slow


def _env() -> dict[str, str]:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    return env


def _launcher(layout: str | None) -> list[str]:
    """The command prefix: plain python for one process, else `accelerate launch` with 2."""
    if layout is None:
        return [sys.executable]
    return accelerate_launch(layout)


def _run(command: list[str], timeout: float = 300) -> subprocess.CompletedProcess:
    result = subprocess.run(
        command, capture_output=True, text=True, timeout=timeout, env=_env(), cwd=ROOT
    )
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-4000:]
    return result


@cache
def probe(layout: str | None, tmp: str) -> tuple[dict, dict | None, Path]:
    """The probe's update report, its resume report and the update's checkpoint. DDP saves the
    same optimizer.pt as one process does, so its resume is not run again (None)."""
    modes = ("update",) if layout == "multi_cpu" else ("update", "resume")
    world = 1 if layout is None else 2
    run_dir, reports = Path(tmp) / (layout or "single"), [None, None]
    shutil.rmtree(run_dir, ignore_errors=True)  # an earlier test's failed probe starts afresh
    for index, mode in enumerate(modes):
        out = Path(tmp) / f"{layout or 'single'}-{mode}.json"
        extra = [] if layout is None else ["--num_processes", "2"]
        _run([*_launcher(layout), *extra, str(PROBE), mode, str(run_dir), str(out), str(world)])
        reports[index] = json.loads(out.read_text())
    return reports[0], reports[1], Path(reports[0]["checkpoint"])


@pytest.fixture(scope="module")
def probe_dir(tmp_path_factory: pytest.TempPathFactory) -> str:
    return str(tmp_path_factory.mktemp("probe"))


def _trainable(checkpoint: Path) -> dict[str, object]:
    policy = checkpoint / "policy"
    return {
        **load_file(policy / "adapter" / "adapter_model.safetensors"),
        **{f"head.{k}": v for k, v in load_file(policy / "heads.safetensors").items()},
    }


@pytest.mark.parametrize("layout", LAYOUTS)
def test_one_update_is_the_same_under_every_launcher(layout: str, probe_dir: str) -> None:
    single, _, single_checkpoint = probe(None, probe_dir)
    report, _, checkpoint = probe(layout, probe_dir)
    assert report["world_size"] == 2
    assert report["distributed_type"] == ("MULTI_CPU" if layout == "multi_cpu" else "DEEPSPEED")
    # Drawn from the same seed on both processes, before accelerate could broadcast anything.
    first, second = report["initial_weight_checksums"]
    assert first == second == single["initial_weight_checksums"][0]
    # Rank 1's advantages have another mean and scale: only global statistics match these.
    assert report["advantage_mean_std"] == pytest.approx(report["full_batch_mean_std"], rel=1e-6)
    assert report["metrics"]["losses/grad_norm"] == pytest.approx(
        single["metrics"]["losses/grad_norm"], rel=1e-5
    )
    # ZeRO-3 builds the model partitioned at load: no process ever holds it whole. NPAE's random
    # model (`model.pretrained=false`) gets the pretrained embeddings under every launcher.
    assert report["base_partitioned_at_load"] == (layout == "zero3")
    assert report["random_model_keeps_embeddings"]
    expected, got = _trainable(single_checkpoint), _trainable(checkpoint)
    assert expected.keys() == got.keys()
    moved = max(t.abs().max().item() for t in expected.values())
    assert moved > 1e-2
    for name, tensor in expected.items():
        # fp32 sums in another order (~1e-7 relative); two Adam steps of lr 1e-2 can magnify
        # that where a gradient is near zero. 1e-5 is 1/2000 of one step; measured: <= 1.3e-6.
        assert (tensor - got[name]).abs().max().item() < 1e-5, name


@pytest.mark.parametrize("layout", [None, "zero2", "zero3"])
def test_resume_restores_the_adam_moments(layout: str | None, probe_dir: str) -> None:
    saved, restored, _ = probe(layout, probe_dir)
    assert saved["adam_moments"][0] > 0 and saved["adam_moments"][1] > 0
    assert restored["adam_moments"] == pytest.approx(saved["adam_moments"], rel=1e-9)


def _train_command(layout: str | None, run_dir: Path, *overrides: str) -> list[str]:
    extra = [] if layout is None else ["--num_processes", "2"]
    return [
        *_launcher(layout),
        *extra,
        str(SCRIPT),
        "--config-name",
        "tiny",
        f"train.output_dir={run_dir}",
        "train.save_every=1",
        *overrides,
    ]


def _kill_tree(process: subprocess.Popen) -> None:
    """SIGKILL the launcher and every process under it (torchrun's workers run in sessions of
    their own, so the launcher's process group does not reach them)."""
    import psutil

    try:
        children = psutil.Process(process.pid).children(True)
    except psutil.NoSuchProcess:  # a process of the tree exited while it was being listed
        children = psutil.Process(process.pid).children(True) if process.poll() is None else []
    tree = [process.pid, *(child.pid for child in children)]
    for pid in tree:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    process.wait()
    psutil.wait_procs([p for p in map(_process_or_none, tree[1:]) if p], timeout=30)


def _process_or_none(pid: int):
    import psutil

    try:
        return psutil.Process(pid)
    except psutil.NoSuchProcess:
        return None


def _latest(run_dir: Path) -> int:
    pointer = run_dir / "checkpoints" / "latest"
    text = pointer.read_text().strip() if pointer.is_file() else ""
    return int(text.split("_")[1]) if text else 0


@pytest.mark.parametrize("layout", LAYOUTS)
def test_launcher_trains_checkpoints_and_resumes_after_sigkill(layout: str, tmp_path: Path) -> None:
    from peft import PeftModel

    from glam.models.loading import load_model

    run_dir = tmp_path / layout
    # LoRA on the top layer of two: the update runs from the rollout's cached trunk states.
    cached = "model.lora.layers=1"
    process = subprocess.Popen(
        _train_command(layout, run_dir, cached, "train.total_frames=1000000"),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=_env(),
        cwd=ROOT,
    )
    try:
        start = time.monotonic()
        while _latest(run_dir) < 1:
            assert process.poll() is None, process.stdout.read()[-4000:]
            assert time.monotonic() - start < 240, "no checkpoint in time"
            time.sleep(0.2)
    finally:
        _kill_tree(process)
    killed_at = _latest(run_dir)

    launch = yaml.safe_load((run_dir / "config.yaml").read_text())["launch"]
    assert launch["world_size"] == 2 and launch["envs_per_process"] == 2
    assert launch["deepspeed_stage"] == DEEPSPEED_STAGE[layout]
    checkpoint = run_dir / "checkpoints" / f"update_{killed_at:06d}"
    seeds = [
        json.loads((checkpoint / f"rank_{r}" / "envs.json").read_text())["seed"] for r in (0, 1)
    ]
    assert seeds[0] != seeds[1]  # each process plays its own episodes
    base, _ = load_model("tiny-random-llama")
    adapted = PeftModel.from_pretrained(base, checkpoint / "policy" / "adapter")
    lora_b = {n: p for n, p in adapted.named_parameters() if "lora_B" in n}
    assert lora_b and any(p.abs().sum() > 0 for p in lora_b.values())  # trained, not the zero init
    assert all(".layers.1." in name for name in lora_b)  # the top layer's adapter only

    frames = (killed_at + 1) * 64
    result = _run(
        _train_command(layout, run_dir, cached, "train.resume=true", f"train.total_frames={frames}")
    )
    assert f"resumed from {checkpoint}" in result.stdout
    assert "[glam] trunk cache: on (the rollout keeps the input of layer 1" in result.stdout
    assert f"done: {frames} frames in {killed_at + 1} updates" in result.stdout
    updates = [int(row.split(",")[0]) for row in (run_dir / "metrics.csv").read_text().split()[1:]]
    assert updates == list(range(1, killed_at + 2))


def test_a_world_size_the_accelerator_does_not_see_is_refused() -> None:
    # What accelerate does on a machine without CUDA when told neither to use the CPU nor
    # DeepSpeed: each launched process comes up alone (`NO`, one process). build_accelerator
    # picks the CPU so this cannot happen here; the check stops it wherever else it could.
    from types import SimpleNamespace

    from accelerate.utils import DistributedType

    from glam.ppo.launch import LaunchError, check_world_size

    alone = SimpleNamespace(num_processes=1, distributed_type=DistributedType.NO)
    with pytest.raises(LaunchError, match="the launcher started 2 processes but this one runs"):
        check_world_size(alone, 2)
    check_world_size(SimpleNamespace(num_processes=2, distributed_type=DistributedType.NO), 2)


def test_a_written_grpo_run_on_two_processes_resumes_as_the_uninterrupted_one(
    tmp_path: Path,
) -> None:
    """The writing policy (`policy.kind=generate`) with GRPO and its KL term over gloo: every
    process samples its own answers, the group statistics are gathered from both, and a run
    stopped after its second update and resumed plays its third as the uninterrupted run does."""

    def run(folder: Path, frames: int, *extra: str) -> subprocess.CompletedProcess:
        command = [*accelerate_launch("multi_cpu"), "--num_processes", "2", str(SCRIPT)]
        command += ["--config-name", "written_tiny", f"train.output_dir={folder}"]
        command += ["algorithm.name=grpo", "algorithm.group_size=2", "algorithm.kl_coef=0.01"]
        return _run([*command, "train.save_every=1", f"train.total_frames={frames}", *extra])

    run(tmp_path / "whole", 192)
    run(tmp_path / "cut", 128)
    resumed = run(tmp_path / "cut", 192, "train.resume=true")
    assert f"resumed from {tmp_path / 'cut' / 'checkpoints' / 'update_000002'}" in resumed.stdout
    launch = yaml.safe_load((tmp_path / "cut" / "config.yaml").read_text())["launch"]
    assert launch["world_size"] == 2 and launch["envs_per_process"] == 2

    def rows(folder: Path) -> list[dict[str, str]]:
        import csv

        with (folder / "metrics.csv").open() as file:
            return list(csv.DictReader(file))

    whole, cut = rows(tmp_path / "whole"), rows(tmp_path / "cut")
    assert [row["update"] for row in cut] == ["1", "2", "3"]
    compared = [key for key in whole[2] if key.startswith(("losses/", "answers/", "charts/s"))]
    assert {"answers/invalid_share", "losses/kl_ref"} <= set(compared)
    assert [whole[2][key] for key in compared] == [cut[2][key] for key in compared]
