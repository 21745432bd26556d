"""Whether this process has a GPU that torch cannot use: a run that would fall back to the CPU
without a word.

`torch.cuda.is_available()` is False both on a machine without a GPU and on one whose GPU torch
cannot use: a CPU-only torch wheel (a virtual environment built elsewhere), or a CUDA wheel newer
than the NVIDIA driver. Code that picks "CUDA where available, else the CPU" would then train an
8-process `multi_gpu.yaml` launch as 8 CPU processes, hours slower and with nothing said.
`unusable_gpu` tells the two apart from what the process was given: GPUs named in
`CUDA_VISIBLE_DEVICES`, or, where that is unset, an NVIDIA device file. An empty
`CUDA_VISIBLE_DEVICES` hides the GPUs on purpose (the test suite does so): no GPU is expected.
"""

from __future__ import annotations

import os
from pathlib import Path

import torch

NVIDIA_DEVICE = Path("/dev/nvidia0")
"""The device file of the first NVIDIA GPU: there when the driver sees a GPU."""

HIDDEN = ("", "-1", "none", "void", "nodevfiles")
"""`CUDA_VISIBLE_DEVICES` values that hide every GPU (CUDA and SLURM's)."""


def gpu_evidence() -> str | None:
    """What says that this process was given a GPU (None: nothing does)."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        if visible.strip().lower() in HIDDEN:
            return None
        return f"CUDA_VISIBLE_DEVICES={visible} names GPUs"
    if NVIDIA_DEVICE.exists():
        return f"{NVIDIA_DEVICE} exists (an NVIDIA GPU is attached)"
    return None


def unusable_gpu(cpu_setting: str) -> str | None:
    """Why this process has a GPU that torch cannot use, with what to do about it; None when
    torch uses the GPU or none was given. `cpu_setting` is the setting that asks for the CPU on
    purpose (`train.cpu=true`, `agent.device=cpu`)."""
    if torch.cuda.is_available():
        return None
    evidence = gpu_evidence()
    if evidence is None:
        return None
    if torch.version.cuda is None:
        why = f"torch {torch.__version__} is a CPU-only build"
        fix = "install a CUDA build of torch (PyPI's default Linux wheel is one)"
    else:
        why = (
            f"torch {torch.__version__} is built for CUDA {torch.version.cuda} and finds no "
            "usable GPU: the NVIDIA driver may be older than that CUDA (nvidia-smi shows the "
            "newest CUDA the driver supports), or the GPU is not reachable"
        )
        fix = "install the torch wheel built for the driver's CUDA"
    return (
        f"{evidence}, but {why}: the run would compute on the CPU. To use the GPU, {fix}; to "
        f"compute on the CPU on purpose, set {cpu_setting} or hide the GPUs with "
        "CUDA_VISIBLE_DEVICES=''"
    )
