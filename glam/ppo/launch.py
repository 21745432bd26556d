"""The `Accelerator` of a training process, built so that a launch cannot go wrong silently.

`accelerate launch` hands every process its rank and the world size in the environment
(`WORLD_SIZE`, `LOCAL_RANK`), but on a machine without CUDA accelerate 1.x quietly falls back to
one process per launched process unless told to use the CPU (N independent runs writing into one
folder), and under DeepSpeed it initialises the process group without counting it (every rank
then believes it is alone). `build_accelerator` picks the CPU by itself where there is no GPU
(and stops where there is one that torch cannot use, `glam.devices`), hands DeepSpeed the gloo backend there, and checks that the accelerator sees every launched
process before anything is built.
"""

from __future__ import annotations

import os

import torch
from accelerate import Accelerator, PartialState
from accelerate.utils import DistributedType

from glam.devices import unusable_gpu


class LaunchError(RuntimeError):
    """The processes were launched in a way this run cannot use (the message says what to do)."""


def launched_world_size() -> int:
    """Processes the launcher started (`WORLD_SIZE`; 1 for a plain `python` run)."""
    return int(os.environ.get("WORLD_SIZE", "1"))


def uses_deepspeed_launch() -> bool:
    """`accelerate launch` was given a DeepSpeed config (it sets this for every process)."""
    return os.environ.get("ACCELERATE_USE_DEEPSPEED", "false").lower() == "true"


def build_accelerator(*, cpu: bool = False) -> Accelerator:
    """The Accelerator of this process.

    Args:
        cpu: stay on the CPU even where CUDA is available (`train.cpu`).

    Where there is no GPU the CPU is chosen without asking; DeepSpeed then runs on its CPU
    accelerator (`DS_ACCELERATOR=cpu` is set if the user did not set it) over gloo. A GPU that
    torch cannot use (a CPU-only wheel, a driver older than the wheel: `glam.devices`) stops the
    run instead of training on the CPU without a word.

    Raises:
        LaunchError: the accelerator does not see the processes the launcher started, a GPU is
            there that torch cannot use (without `cpu`), or DeepSpeed was asked for on the CPU
            of a machine with a GPU.
    """
    world = launched_world_size()
    if not cpu and (problem := unusable_gpu("train.cpu=true")) is not None:
        raise LaunchError(problem)
    on_cpu = cpu or not torch.cuda.is_available()
    if uses_deepspeed_launch():
        if on_cpu and torch.cuda.is_available():
            raise LaunchError(
                "train.cpu=true with a DeepSpeed launch on a machine with a GPU: DeepSpeed picks "
                "its accelerator at import; hide the GPUs (CUDA_VISIBLE_DEVICES='') and set "
                "DS_ACCELERATOR=cpu, or drop train.cpu=true"
            )
        if on_cpu:
            os.environ.setdefault("DS_ACCELERATOR", "cpu")
        # `cpu=True` would turn a DeepSpeed launch into plain DDP; the gloo backend keeps it
        # DeepSpeed and lets accelerate count the processes of the group DeepSpeed initialises.
        if on_cpu and world > 1:
            PartialState(backend="gloo")  # the shared state the Accelerator then takes up
        accelerator = Accelerator()
    else:
        accelerator = Accelerator(cpu=on_cpu)
    check_world_size(accelerator, world)
    return accelerator


def check_world_size(accelerator: Accelerator, launched: int) -> None:
    """Stop unless the accelerator runs as one job of all `launched` processes."""
    if accelerator.num_processes == launched:
        return
    raise LaunchError(
        f"the launcher started {launched} processes but this one runs as "
        f"{accelerator.num_processes} of {accelerator.distributed_type.value}: they would train "
        "as independent runs in one folder. On the CPU use "
        "`accelerate launch --config_file configs/accelerate/multi_cpu.yaml --num_processes N`; "
        "with GPUs, check that every process sees one (nvidia-smi, CUDA_VISIBLE_DEVICES)"
    )


def describe(accelerator: Accelerator) -> str:
    """One line saying how the run is distributed, e.g. `2 process(es) (DEEPSPEED ZeRO-2, cpu)`."""
    kind = accelerator.distributed_type.value
    if accelerator.distributed_type == DistributedType.DEEPSPEED:
        kind += f" ZeRO-{accelerator.state.deepspeed_plugin.zero_stage}"
    return f"{accelerator.num_processes} process(es) ({kind}, {accelerator.device.type})"
