"""Atomic, pickle-free training checkpoints in the run folder.

Layout of `RUN_DIR/checkpoints/`::

    update_000012/
        policy/               the policy's `save_pretrained` folder: LoRA adapter in peft format
                              (or the full model), heads.safetensors, its config json
        optimizer.pt          optimizer state (tensors and numbers only)
        scheduler.json        learning-rate scheduler state
        trainer_state.json    counters (update, frames, episodes), world size, env and model
        config.yaml           the resolved config of the run that wrote it
        rank_0/               one folder per process:
            rng.pt              python, numpy and torch RNG states (tensors and numbers only)
            envs.json           the environments' seed schedule (`TextVectorEnv.state_dict`)
    latest                    text file: the name of the newest complete checkpoint

A checkpoint is written into `.tmp-update_000012/`, renamed into place once every process has
written its part, and only then named in `latest` (itself replaced atomically), so `latest` always
points at a complete checkpoint, even if the run is killed half-way through a save. Loading uses
JSON, safetensors and `torch.load(weights_only=True)`: it never runs pickled code.
"""

from __future__ import annotations

import json
import os
import random
import re
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from accelerate import Accelerator
from accelerate.utils import DistributedType

CHECKPOINTS_DIR = "checkpoints"
LATEST_POINTER = "latest"
_NAME = re.compile(r"^update_(\d+)$")


@dataclass
class TrainerState:
    """Counters of a run, saved in every checkpoint."""

    update: int = 0
    """Updates done."""
    frames: int = 0
    """Environment steps collected, over all processes."""
    episodes: int = 0
    """Episodes finished, over all processes."""
    elapsed_seconds: float = 0.0
    """Training wall time so far, over every session of the run."""
    world_size: int = 1
    """Processes of the run that wrote the checkpoint (resuming needs the same)."""


def checkpoint_name(update: int) -> str:
    """Folder name of the checkpoint written after `update` updates."""
    return f"update_{update:06d}"


def latest_checkpoint(run_dir: str | Path) -> Path | None:
    """The newest complete checkpoint of a run (from the `latest` pointer), or None."""
    checkpoints = Path(run_dir) / CHECKPOINTS_DIR
    pointer = checkpoints / LATEST_POINTER
    if not pointer.is_file():
        return None
    path = checkpoints / pointer.read_text().strip()
    if not (path / "trainer_state.json").is_file():
        raise FileNotFoundError(f"{pointer} names {path.name}, which is missing or incomplete")
    return path


def policy_dir(run_dir_or_checkpoint: str | Path) -> Path:
    """The `policy/` folder (`LLMActorCritic.from_pretrained`) of a checkpoint or of the newest
    checkpoint of a run folder."""
    path = Path(run_dir_or_checkpoint)
    if (path / "policy").is_dir():
        return path / "policy"
    checkpoint = latest_checkpoint(path)
    if checkpoint is None:
        raise FileNotFoundError(f"{path} is neither a checkpoint nor a run with checkpoints")
    return checkpoint / "policy"


def _rng_state() -> dict[str, Any]:
    version, internal, gauss = random.getstate()
    kind, keys, pos, has_gauss, cached = np.random.get_state()
    state: dict[str, Any] = {
        "python": [version, list(internal), gauss],
        "numpy": [kind, torch.from_numpy(keys.astype(np.int64)), pos, has_gauss, cached],
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def _set_rng_state(state: dict[str, Any]) -> None:
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    kind, keys, pos, has_gauss, cached = state["numpy"]
    np.random.set_state((kind, keys.numpy().astype(np.uint32), pos, has_gauss, cached))
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def _write_text_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def _uses_zero3(accelerator: Accelerator) -> bool:
    plugin = accelerator.state.deepspeed_plugin
    return accelerator.distributed_type == DistributedType.DEEPSPEED and plugin.zero_stage == 3


def save_policy(accelerator: Accelerator, model: torch.nn.Module, path: Path) -> None:
    """Write the policy's `save_pretrained` folder from the main process (collective call).

    Under DeepSpeed ZeRO-3 each process holds a shard of every parameter: the trainable ones
    (adapter and heads) are gathered on every process for the duration of the save.
    """
    policy = accelerator.unwrap_model(model)
    if _uses_zero3(accelerator):
        import deepspeed  # only installed with the `deepspeed` extra

        trainable = [p for p in policy.parameters() if p.requires_grad]
        with deepspeed.zero.GatheredParameters(trainable, modifier_rank=None):
            if accelerator.is_main_process:
                policy.save_pretrained(path)
    elif accelerator.is_main_process:
        policy.save_pretrained(path)


def save_checkpoint(
    accelerator: Accelerator,
    run_dir: Path,
    *,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    scheduler: torch.optim.lr_scheduler.LRScheduler,
    env_state: dict[str, Any],
    state: TrainerState,
    config_yaml: str,
    keep: int = 0,
) -> Path:
    """Write the checkpoint of `state.update` (collective: every process calls it).

    Returns the checkpoint folder. An existing checkpoint of the same update is left as it is
    (it was written from the same weights), never overwritten.
    """
    checkpoints = run_dir / CHECKPOINTS_DIR
    name = checkpoint_name(state.update)
    final = checkpoints / name
    tmp = checkpoints / f".tmp-{name}"
    if final.exists():
        accelerator.wait_for_everyone()
        if accelerator.is_main_process:
            _write_text_atomic(checkpoints / LATEST_POINTER, name + "\n")
        accelerator.wait_for_everyone()
        return final
    if accelerator.is_main_process:
        shutil.rmtree(tmp, ignore_errors=True)  # left by a run killed while saving
        tmp.mkdir(parents=True)
    accelerator.wait_for_everyone()

    save_policy(accelerator, model, tmp / "policy")
    rank_dir = tmp / f"rank_{accelerator.process_index}"
    rank_dir.mkdir()
    torch.save(_rng_state(), rank_dir / "rng.pt")
    (rank_dir / "envs.json").write_text(json.dumps(env_state, indent=1))
    if accelerator.distributed_type == DistributedType.DEEPSPEED:
        # Each process holds its shard of the optimizer state: DeepSpeed's own checkpoint writes
        # every shard (and the trainable weights; the frozen base stays in the model's folder).
        model.save_checkpoint(
            str(tmp / DEEPSPEED_DIR),
            tag=DEEPSPEED_TAG,
            exclude_frozen_parameters=True,
            save_latest=False,
        )
    elif accelerator.is_main_process:
        # Data parallel: every process holds the same optimizer state.
        torch.save(optimizer.state_dict(), tmp / "optimizer.pt")
    if accelerator.is_main_process:
        (tmp / "scheduler.json").write_text(json.dumps(scheduler.state_dict(), indent=1))
        (tmp / "config.yaml").write_text(config_yaml)
        (tmp / "trainer_state.json").write_text(json.dumps(state.__dict__, indent=1))
    accelerator.wait_for_everyone()

    if accelerator.is_main_process:
        os.replace(tmp, final)
        _write_text_atomic(checkpoints / LATEST_POINTER, name + "\n")
        if keep:
            _prune(checkpoints, keep=keep, protect=name)
    accelerator.wait_for_everyone()
    return final


def _prune(checkpoints: Path, *, keep: int, protect: str) -> None:
    names = sorted(p.name for p in checkpoints.iterdir() if _NAME.match(p.name))
    for old in names[:-keep]:
        if old != protect:
            shutil.rmtree(checkpoints / old, ignore_errors=True)


def read_trainer_state(checkpoint: Path) -> TrainerState:
    """The counters saved in a checkpoint."""
    return TrainerState(**json.loads((checkpoint / "trainer_state.json").read_text()))


def load_training_state(
    accelerator: Accelerator,
    checkpoint: Path,
    *,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    scheduler: torch.optim.lr_scheduler.LRScheduler,
) -> tuple[TrainerState, dict[str, Any]]:
    """Restore optimizer (Adam moments; under DeepSpeed every process's shard), scheduler and
    this process's RNG states from `checkpoint`.

    The policy weights are loaded separately, before `accelerator.prepare` (see
    `glam.ppo.trainer.build_policy`). Returns the counters and this process's env state.
    """
    state = read_trainer_state(checkpoint)
    if state.world_size != accelerator.num_processes:
        raise ValueError(
            f"checkpoint {checkpoint} was written by {state.world_size} processes, this run has "
            f"{accelerator.num_processes}: resume with the same number of processes"
        )
    if accelerator.distributed_type == DistributedType.DEEPSPEED:
        _load_deepspeed_state(model, checkpoint)
    else:
        # Saved from the CPU; load_state_dict moves the moments to the parameters' device.
        optimizer.load_state_dict(
            torch.load(checkpoint / "optimizer.pt", map_location="cpu", weights_only=True)
        )
    scheduler.load_state_dict(json.loads((checkpoint / "scheduler.json").read_text()))
    rank_dir = checkpoint / f"rank_{accelerator.process_index}"
    _set_rng_state(torch.load(rank_dir / "rng.pt", map_location="cpu", weights_only=True))
    env_state = json.loads((rank_dir / "envs.json").read_text())
    return state, env_state


DEEPSPEED_DIR = "deepspeed"
"""Folder of a checkpoint holding DeepSpeed's own checkpoint (optimizer shards) under DeepSpeed."""
DEEPSPEED_TAG = "state"


def _load_deepspeed_state(engine: torch.nn.Module, checkpoint: Path) -> None:
    """Restore DeepSpeed's checkpoint (optimizer shards, trainable weights) into `engine`,
    reading its files with `torch.load(weights_only=True)` instead of DeepSpeed's unpickler."""
    folder = checkpoint / DEEPSPEED_DIR
    if not (folder / DEEPSPEED_TAG).is_dir():
        raise FileNotFoundError(f"{folder / DEEPSPEED_TAG} is missing: not a DeepSpeed checkpoint")
    engine.checkpoint_engine = _SafeCheckpointEngine(engine.checkpoint_engine)
    try:
        path, _ = engine.load_checkpoint(
            str(folder),
            tag=DEEPSPEED_TAG,
            load_module_strict=False,  # the frozen base is not in it
            load_optimizer_states=True,
            load_lr_scheduler_states=False,  # ours is in scheduler.json
        )
    finally:
        engine.checkpoint_engine = engine.checkpoint_engine.inner
    if path is None:
        raise FileNotFoundError(f"DeepSpeed found no checkpoint in {folder}")


class _SafeCheckpointEngine:
    """DeepSpeed's checkpoint engine with a loader that never runs pickled code: only tensors,
    containers, numbers and the few plain DeepSpeed records its files hold."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def load(self, path: str, map_location: Any = None) -> Any:
        from deepspeed.runtime.fp16.loss_scaler import LossScaler
        from deepspeed.runtime.zero.config import ZeroStageEnum
        from deepspeed.utils.tensor_fragment import fragment_address

        with torch.serialization.safe_globals([ZeroStageEnum, fragment_address, LossScaler]):
            return torch.load(path, map_location=map_location, weights_only=True)
