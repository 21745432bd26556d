"""The code a GPU user runs, checked on the CPU (issue 34): each test stands in for the GPU part
it checks (a patched `torch.cuda`, stand-ins for `srun` and `accelerate`) and fails on the code
as it was before the fix. The checks that need a real GPU are tests/test_on_gpu.py
(`GLAM_TEST_DEVICE=cuda`), run by scripts/gpu_check.sh.

    .venv/bin/python -m pytest tests/test_gpu_path.py -q
"""

from __future__ import annotations

import os
import re
import stat
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
import yaml
from accelerate.utils import DistributedType

import glam.campaign as glam_campaign

ROOT = Path(__file__).resolve().parents[1]


# --------------------------------------------------------------------------------------------
# 1. The SLURM templates launch the distributed type the campaign asks for
# --------------------------------------------------------------------------------------------


def _stand_ins(folder: Path, record: Path) -> Path:
    """`srun` (runs its command once, here), `scontrol` (one host) and `accelerate` (records
    its arguments) on a PATH of their own."""
    folder.mkdir()
    scripts = {
        "srun": 'while [[ $1 == --* ]]; do shift; done\nexec "$@"\n',
        "scontrol": "echo node-a\n",
        "accelerate": f'printf "%s\\n" "$@" >"{record}"\n',
    }
    for name, body in scripts.items():
        path = folder / name
        path.write_text("#!/usr/bin/env bash\n" + body)
        path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return folder


def _launched(tmp_path: Path, campaign_file: Path, job_id: int = 4321, index: int = 0) -> object:
    """The `accelerate launch` arguments of a campaign's training job `index`, as its rendered
    batch script composes them on its first node, parsed and completed by accelerate itself."""
    from accelerate.commands.launch import _validate_launch_command, launch_command_parser

    campaign = glam_campaign.load_campaign(campaign_file)
    jobs = [j for j in glam_campaign.plan_jobs(campaign, tmp_path) if j.label.endswith("train")]
    script = tmp_path / f"job-{index}.sbatch"
    script.write_text(jobs[index].script)
    record = tmp_path / f"accelerate-{index}.args"
    env = {
        **os.environ,
        "PATH": f"{_stand_ins(tmp_path / f'bin-{index}', record)}{os.pathsep}{os.environ['PATH']}",
        "VIRTUAL_ENV": "stand-in",  # the job would activate .venv, whose accelerate is real
        "SLURM_SUBMIT_DIR": str(ROOT),
        "SLURM_JOB_ID": str(job_id),
        "SLURM_JOB_NODELIST": "node-a",
        "SLURM_NNODES": str(campaign.slurm.nodes),
        "SLURM_NODEID": "0",
    }
    result = subprocess.run(
        ["bash", str(script)], env=env, cwd=tmp_path, capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stdout + result.stderr
    words = record.read_text().splitlines()
    assert words[0] == "launch"
    args = launch_command_parser().parse_args(words[1:])
    _validate_launch_command(args)  # fills the launch mode from the config file, as launch does
    return args


def _campaign(tmp_path: Path, slurm: dict) -> Path:
    path = tmp_path / "campaign.yaml"
    path.write_text(
        yaml.safe_dump({"name": "c", "preset": "glam_paper", "seeds": [1], "slurm": slurm})
    )
    return path


@pytest.mark.parametrize(
    ("nodes", "gpus", "config", "stage"),
    [(1, 8, "zero2", 2), (2, 4, "zero3", 3)],
)
def test_a_campaign_asking_for_deepspeed_launches_deepspeed(
    tmp_path: Path, nodes: int, gpus: int, config: str, stage: int
) -> None:
    slurm = {
        "nodes": nodes,
        "gpus_per_node": gpus,
        "accelerate_args": ["--config_file", f"configs/accelerate/{config}.yaml"],
    }
    args = _launched(tmp_path, _campaign(tmp_path, slurm))
    assert args.use_deepspeed and not args.multi_gpu  # not DDP in DeepSpeed's clothes
    assert args.zero_stage == stage
    assert args.num_processes == nodes * gpus and args.num_machines == nodes


def test_the_multi_node_campaign_gives_each_job_its_own_rendezvous_port(tmp_path: Path) -> None:
    # Two seeds whose first node is the same host must not rendezvous on the same port.
    campaign = ROOT / "configs" / "campaign" / "glam_paper_multi_node.yaml"
    seeds = [_launched(tmp_path, campaign, job_id, index) for index, job_id in ((0, 101), (1, 102))]
    assert [args.num_machines for args in seeds] == [2, 2]
    assert seeds[0].main_process_port != seeds[1].main_process_port
    # No launcher options: DDP over the 8 GPUs of the two nodes.
    assert all(args.multi_gpu and not args.use_deepspeed for args in seeds)
    assert [args.num_processes for args in seeds] == [8, 8]


# --------------------------------------------------------------------------------------------
# 2. The suite's device switch: nothing lands on a GPU by accident
# --------------------------------------------------------------------------------------------


def test_processes_the_tests_start_see_no_gpu() -> None:
    # GLAM_TEST_DEVICE=cpu (the default) hides the GPUs from every subprocess test too, so the
    # 2-process launches of test_distributed.py never put ranks on cuda:0 and cuda:1.
    probe = "import os; print(repr(os.environ.get('CUDA_VISIBLE_DEVICES')))"
    seen = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True)
    assert seen.stdout.strip() == "''"


class _Item:
    def __init__(self, *marks: str) -> None:
        self.keywords = dict.fromkeys(marks, True)
        self.skipped: list[str] = []

    def add_marker(self, marker: pytest.MarkDecorator) -> None:
        self.skipped.append(marker.kwargs["reason"])


@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_the_switch_runs_the_gpu_subset_or_the_rest(
    device: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    import conftest

    monkeypatch.setattr(conftest, "TEST_DEVICE", device)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)  # this machine, a CPU
    gpu_test, cpu_test = _Item("gpu"), _Item()
    conftest.pytest_collection_modifyitems(None, [gpu_test, cpu_test])
    if device == "cpu":
        assert gpu_test.skipped == ["a GPU test: run it with GLAM_TEST_DEVICE=cuda"]
        assert cpu_test.skipped == []
    else:  # neither runs here: the CPU tests never on a GPU, the GPU ones not without one
        assert "sees no usable CUDA GPU" in gpu_test.skipped[0]
        assert "runs the GPU subset only" in cpu_test.skipped[0]


# --------------------------------------------------------------------------------------------
# 3. A GPU that torch cannot use stops the run instead of training on the CPU
# --------------------------------------------------------------------------------------------


@pytest.fixture
def unusable_gpu(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> pytest.MonkeyPatch:
    """An NVIDIA GPU on the machine (its device file), which torch cannot use."""
    import torch

    import glam.devices

    device_file = tmp_path / "nvidia0"
    device_file.touch()
    monkeypatch.setattr(glam.devices, "NVIDIA_DEVICE", device_file)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    return monkeypatch


def test_a_cpu_only_torch_on_a_gpu_machine_stops_the_launch(
    unusable_gpu: pytest.MonkeyPatch,
) -> None:
    import torch

    from glam.ppo.launch import LaunchError, build_accelerator

    unusable_gpu.setattr(torch.version, "cuda", None)
    unusable_gpu.setenv("CUDA_VISIBLE_DEVICES", "0,1")  # what SLURM gives a 2-GPU job
    with pytest.raises(
        LaunchError,
        match=r"CUDA_VISIBLE_DEVICES=0,1 names GPUs, but torch .* is a CPU-only build.*train.cpu=true",
    ):
        build_accelerator()


def test_a_driver_older_than_the_wheel_stops_the_launch_and_the_evaluation(
    unusable_gpu: pytest.MonkeyPatch,
) -> None:
    import torch

    from glam.eval.builders import resolve_device
    from glam.ppo.launch import LaunchError, build_accelerator

    unusable_gpu.setattr(torch.version, "cuda", "99.0")
    with pytest.raises(LaunchError, match=r"nvidia0 exists .* built for CUDA 99.0.*driver"):
        build_accelerator()
    with pytest.raises(ValueError, match="agent.device=auto: .*agent.device=cpu"):
        resolve_device("auto")


def test_the_cpu_asked_for_or_the_gpus_hidden_train_on_the_cpu(
    unusable_gpu: pytest.MonkeyPatch,
) -> None:
    from glam.devices import unusable_gpu as problem

    assert problem("train.cpu=true") is not None
    unusable_gpu.setenv("CUDA_VISIBLE_DEVICES", "")  # hidden on purpose, as the test suite does
    assert problem("train.cpu=true") is None


# --------------------------------------------------------------------------------------------
# 4. A resume that sees fewer GPUs than the launch that saved
# --------------------------------------------------------------------------------------------


class _Policy(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(2, 2)

    def save_pretrained(self, path: Path) -> None:
        path.mkdir(parents=True)
        (path / "weights.json").write_text("[]")


def _process_on(device: torch.device) -> SimpleNamespace:
    """The accelerator of a lone process on `device`, as the checkpoint code reads it."""
    return SimpleNamespace(
        device=device,
        is_main_process=True,
        process_index=0,
        num_processes=1,
        distributed_type=DistributedType.NO,
        state=SimpleNamespace(deepspeed_plugin=None),
        unwrap_model=lambda model: model,
    )


def test_a_resume_seeing_one_gpu_restores_the_rng_of_the_gpu_it_trained_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Written by the rank on cuda:3 of an 8-GPU `accelerate launch`; resumed under SLURM's
    # --gpus-per-task=1, where that rank sees one GPU, cuda:0.
    from glam.runs.checkpoint import TrainerState, load_training_state, save_checkpoint

    visible = [8]
    generators = {i: torch.full((8,), i, dtype=torch.uint8) for i in range(8)}
    restored: list[tuple[int, torch.Tensor]] = []

    def index(device: object) -> int:
        return torch.device(device).index or 0

    def set_state(state: torch.Tensor, device: object = "cuda") -> None:
        if index(device) >= visible[0]:
            raise RuntimeError("CUDA error: invalid device ordinal")
        restored.append((index(device), state))

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: visible[0])
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(
        torch.cuda, "get_rng_state", lambda device="cuda": generators[index(device)]
    )
    monkeypatch.setattr(
        torch.cuda, "get_rng_state_all", lambda: list(generators.values())[: visible[0]]
    )
    monkeypatch.setattr(torch.cuda, "set_rng_state", set_state)
    monkeypatch.setattr(
        torch.cuda,
        "set_rng_state_all",
        lambda states: [set_state(s, torch.device("cuda", i)) for i, s in enumerate(states)],
    )
    model = _Policy()
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.1)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda update: 1.0)
    parts = {"model": model, "optimizer": optimizer, "scheduler": scheduler}
    checkpoint = save_checkpoint(
        _process_on(torch.device("cuda", 3)),
        tmp_path,
        **parts,
        env_state={"seed": 7},
        state=TrainerState(update=1, frames=10),
        config_yaml="a: 1\n",
    )
    saved = torch.load(checkpoint / "rank_0" / "rng.pt", weights_only=True)["cuda"]
    assert torch.equal(saved, generators[3])  # its own GPU's generator: one state, not eight

    visible[0] = 1
    load_training_state(_process_on(torch.device("cuda", 0)), checkpoint, **parts)
    assert [(i, s.tolist()) for i, s in restored] == [(0, generators[3].tolist())]


# --------------------------------------------------------------------------------------------
# 5. Low-precision weights are never fine-tuned in place
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_full_fine_tuning_of_low_precision_weights_is_refused(dtype: str) -> None:
    from glam.config import ConfigError
    from glam.run_config import compose_run

    full = ["model.lora.enabled=false", f"model.dtype={dtype}"]
    with pytest.raises(
        ConfigError, match=f"model.dtype={dtype} with full fine-tuning.*autocast_bf16=true"
    ):
        compose_run("tiny", full)
    # An adapter stays fp32 over a low-precision base; fp32 weights under bf16 autocast are fine.
    assert compose_run("tiny", [f"model.dtype={dtype}"]).model.dtype == dtype
    compose_run("tiny", ["model.lora.enabled=false", "model.autocast_bf16=true"])


# --------------------------------------------------------------------------------------------
# 7. The hot loops, bf16 on older GPUs, couplings on the GPU, multi-node caches
# --------------------------------------------------------------------------------------------

LOOP_FILES = (
    "glam/ppo/trainer.py",
    "glam/ppo/update.py",
    "glam/ppo/learner.py",
    "glam/ppo/algorithms.py",
    "glam/policy/output.py",
)
"""The training loop's own files (the scorer's reads are of its CPU-side layout tensors)."""


def test_the_loop_reads_the_device_once_per_forward_and_twice_per_micro_batch(
    tmp_path: Path,
) -> None:
    from accelerate import Accelerator
    from helpers_syncs import rollout_and_update_reads

    torch.set_num_threads(1)
    reads = rollout_and_update_reads(
        tmp_path, Accelerator(cpu=True), ["ppo.micro_batch_size=8", "train.total_frames=64"]
    )
    # Rollout: the finiteness flag of each forward (was 8 reads a step: a boolean-mask index,
    # two flags, the stop flag, and torch's checks of every distribution and sampled action).
    assert reads["rollout"].count(*LOOP_FILES) <= reads["forwards"]
    # Update: per micro-batch the output's and the loss's finiteness, per optimizer step the
    # gradient norm, then the weights' finiteness and the statistics once (was 15 a micro-batch).
    bound = 2 * reads["micro_batches"] + reads["optimizer_steps"] + 2
    assert reads["update"].count(*LOOP_FILES) <= bound
    assert reads["metrics"]["losses/grad_norm"] > 0  # it did update


def test_zero3_partitions_are_checked_for_infinite_weights() -> None:
    # Under ZeRO-3 a parameter is an empty placeholder; its shard holds the weights.
    from glam.ppo.update import _all_finite

    placeholder = torch.nn.Parameter(torch.empty(0))
    placeholder.ds_tensor = torch.tensor([1.0, float("inf")])
    assert not bool(_all_finite([torch.nn.Parameter(torch.ones(3)), placeholder]))
    placeholder.ds_tensor = torch.ones(2)
    assert bool(_all_finite([placeholder]))


def test_bf16_emulated_by_an_older_gpu_is_not_chosen(monkeypatch: pytest.MonkeyPatch) -> None:
    from glam.models.precision import resolve_autocast_bf16

    gpu = torch.device("cuda", 0)
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda including_emulation=True: True)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "Tesla V100-SXM2-32GB")
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (7, 0))
    chosen, why = resolve_autocast_bf16(None, gpu)
    assert not chosen and "compute capability 7.0" in why
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "NVIDIA H100 80GB HBM3")
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (9, 0))
    assert resolve_autocast_bf16(None, gpu)[0]


def test_in_process_teachers_score_on_the_gpu_in_batches(monkeypatch: pytest.MonkeyPatch) -> None:
    import glam.teach.scorers as scorers

    moved: list[torch.device] = []

    class Model(torch.nn.Module):
        def to(self, device: torch.device) -> Model:
            moved.append(device)
            return self

    monkeypatch.setattr(scorers, "load_model", lambda spec: (Model(), object()))
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 1)  # this rank's GPU
    scorer = scorers.LocalScorer.load("smollm2-135m")
    assert moved == [torch.device("cuda", 1)] and scorer.batch_size > 1
    assert scorers.LocalScorer.load("smollm2-135m", device="cpu").batch_size == 1


def test_each_node_builds_its_model_cache_on_one_of_its_processes(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import contextlib

    import glam.ppo.setup as setup

    first: list[str] = []

    class Node:
        @contextlib.contextmanager
        def local_main_process_first(self):
            first.append("node")
            yield

        def main_process_first(self):  # the whole job's first: other nodes' caches wait
            raise AssertionError("a node without the main process would convert all at once")

    monkeypatch.setattr(setup, "prepare_model_cache", lambda spec: first.append(spec))
    setup.prepare_model_once(Node(), "smollm2-135m")
    assert first == ["node", "smollm2-135m"]


def test_evaluation_on_an_ampere_gpu_uses_tf32_for_fp32_products(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from glam.eval.builders import resolve_device

    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (9, 0))
    before = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    try:
        torch.backends.cuda.matmul.allow_tf32 = False
        assert resolve_device("cuda:0") == torch.device("cuda", 0)
        assert torch.backends.cuda.matmul.allow_tf32
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = before


def test_every_test_the_docs_name_exists() -> None:
    # docs/benchmarks.md named a GPU test that was never written, with a command selecting 0 tests.
    docs = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    named = {
        (path.name, file, test)
        for path in docs
        for file, test in re.findall(r"(tests/\w+\.py)::(\w+)", path.read_text())
    }
    assert named
    missing = [
        f"{doc} names {file}::{test}"
        for doc, file, test in sorted(named)
        if not re.search(rf"^\s*def {test}\(", _text(ROOT / file), flags=re.MULTILINE)
    ]
    assert not missing, missing


def _text(path: Path) -> str:
    return path.read_text() if path.is_file() else ""
