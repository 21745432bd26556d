"""Shared test set-up: no test may reach a model hub (none is reachable on CI machines), and no
test lands on a GPU by accident.

`GLAM_TEST_DEVICE` picks where the suite runs:

- `cpu` (the default, on a machine with GPUs too): the GPUs are hidden from this process and
  from every process a test starts (`CUDA_VISIBLE_DEVICES=""`; DeepSpeed gets its CPU
  accelerator). Otherwise the subprocess tests would train on whatever GPU they find, and the
  2-process launches of tests/test_distributed.py would put their ranks on cuda:0 and cuda:1.
  Tests marked `gpu` are skipped, saying how to run them.
- `cuda`: the GPU subset only (tests marked `gpu`, with the GPUs visible: tests/test_on_gpu.py);
  every other test is skipped, so none of them runs on a GPU by accident. Without a CUDA GPU
  that torch can use, the subset is skipped too, saying why. scripts/gpu_check.sh runs it.

    GLAM_TEST_DEVICE=cuda python -m pytest tests -q
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

if os.environ.get("PYTEST_XDIST_WORKER"):
    # `make test` runs the suite in one worker per core (pytest-xdist): one torch thread each,
    # inherited by the processes a test starts (two threads per job on shared cores ran 10-30x
    # slower here). Read by torch when it is first imported, which is after this file.
    os.environ["OMP_NUM_THREADS"] = "1"
    os.environ["MKL_NUM_THREADS"] = "1"
else:
    # One process: torch's own default, one thread per core, pinned for the processes a test
    # starts too, so that two runs a test compares never choose their threads by the machine's
    # load (glam.threads; another count sums fp32 in another order).
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    os.environ.setdefault("OMP_NUM_THREADS", str(cores or 1))

TEST_DEVICES = ("cpu", "cuda")
TEST_DEVICE = os.environ.get("GLAM_TEST_DEVICE", "cpu").strip().lower() or "cpu"
if TEST_DEVICE == "cpu":
    # Before anything initialises CUDA; inherited by every subprocess a test starts.
    os.environ["CUDA_VISIBLE_DEVICES"] = ""
    os.environ.setdefault("DS_ACCELERATOR", "cpu")


def pytest_configure(config: pytest.Config) -> None:
    if TEST_DEVICE not in TEST_DEVICES:
        raise pytest.UsageError(
            f"GLAM_TEST_DEVICE={TEST_DEVICE!r}: use one of {', '.join(TEST_DEVICES)} "
            "(cpu, the default: the whole suite on the CPU; cuda: the GPU subset)"
        )


def _no_cuda_reason() -> str | None:
    """Why the GPU subset cannot run here (None: it can)."""
    import torch

    if torch.cuda.is_available():
        return None
    return (
        f"GLAM_TEST_DEVICE=cuda, but torch {torch.__version__} (CUDA {torch.version.cuda}) sees "
        "no usable CUDA GPU"
    )


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if TEST_DEVICE == "cpu":
        skip_gpu = pytest.mark.skip(reason="a GPU test: run it with GLAM_TEST_DEVICE=cuda")
        for item in items:
            if "gpu" in item.keywords:
                item.add_marker(skip_gpu)
        return
    skip_cpu = pytest.mark.skip(
        reason="GLAM_TEST_DEVICE=cuda runs the GPU subset only (the rest: GLAM_TEST_DEVICE=cpu)"
    )
    no_cuda = _no_cuda_reason()
    for item in items:
        if "gpu" not in item.keywords:
            item.add_marker(skip_cpu)
        elif no_cuda is not None:
            item.add_marker(pytest.mark.skip(reason=no_cuda))


@pytest.fixture(scope="session")
def redball_demos(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A demonstrations folder (`scripts/collect_bot_demos.py`'s) of 8 BabyAI-GoToRedBall-v0
    bot episodes, one observation per prompt, the three navigation actions: the cloning tests'."""
    from glam.bc.bot import collect_bot_demos
    from glam.bc.config import DemosConfig
    from glam.demos import write_demos

    level = "BabyAI-GoToRedBall-v0"
    records, _ = collect_bot_demos(
        DemosConfig(level=level, episodes=8, nbr_obs=1, action_space="nav")
    )
    folder = tmp_path_factory.mktemp("redball_demos") / "demos"
    write_demos(records, folder, metadata={"nbr_obs": 1, "level": level})
    return folder
