"""A training run's folder from start to resume: open and check it, pick and check the
checkpoint to resume, check that it continues the same run, restore its state, and set aside
what the resume abandons.

Every process calls these functions together (collective): the main process alone creates the
folder and picks the checkpoint, and a problem on any process stops them all with a `SetupError`
that names it. The PPO trainer (`glam.ppo.trainer`) and DRRN's (`glam.baselines.drrn_trainer`)
open their run folders through them; evaluation finds a run's policy with `glam.runs.folder`.
"""

from __future__ import annotations

import pickle
import sys
from pathlib import Path
from typing import Any

import torch
from accelerate import Accelerator
from accelerate.utils import DistributedType, broadcast_object_list
from omegaconf import OmegaConf

from glam.config import CoreRunConfig
from glam.outputs import TRAINING_RUN, OutputDirError
from glam.outputs import check_output_dir as check_output_dir_for
from glam.runs.checkpoint import (
    TrainerState,
    UnusableCheckpoint,
    first_problem,
    load_training_state,
    read_trainer_state,
    remove_temporaries,
    resume_checkpoint,
    set_aside_after,
)
from glam.runs.errors import SetupError
from glam.runs.folder import describe_error


def open_run_dir(cfg: CoreRunConfig, accelerator: Accelerator, run_dir: Path) -> Path | None:
    """Create and check the run folder (main process), then pick and check the checkpoint to
    resume (None: a fresh start); a problem stops every process (collective)."""
    problem = None
    if accelerator.is_main_process:  # it alone creates the folder; every process stops on it
        try:
            check_output_dir(cfg, run_dir)
        except SetupError as error:
            problem = str(error)
    raise_on_any(accelerator, problem)
    resume_from = pick_resume_checkpoint(cfg, accelerator, run_dir) if cfg.train.resume else None
    if resume_from is not None:
        check_same_run(cfg, resume_from, accelerator.num_processes)
        if changed := changed_settings(cfg, resume_from):
            accelerator.print(
                f"[glam] resuming {resume_from.name} with settings changed since it was "
                "written (config.yaml records the new ones):\n  " + "\n  ".join(changed)
            )
    return resume_from


def check_output_dir(cfg: CoreRunConfig, run_dir: Path) -> None:
    """Check the run folder (`glam.outputs.check_output_dir`: not a file, writable, holding no
    other kind of output; a used one needs `train.resume=true`, unless the run there stopped
    before its first update: nothing to lose, it starts afresh), then create it."""
    again = not cfg.train.resume and stopped_before_first_update(run_dir)
    if again:
        print(
            f"[glam] {run_dir} holds a run that stopped before its first update (no checkpoint, "
            "no metrics): starting it afresh"
        )
    try:
        check_output_dir_for(
            run_dir,
            TRAINING_RUN,
            key="train.output_dir",
            overwrite=cfg.train.resume or again,
            overwrite_key="train.resume",
            again="continue it",
        )
        run_dir.mkdir(parents=True, exist_ok=True)
    except OutputDirError as error:
        raise SetupError(str(error)) from None
    except OSError as error:  # created by another process in between, a full disk...
        raise SetupError(
            f"train.output_dir={str(run_dir)!r} cannot be created: {describe_error(error)}"
        ) from None


def stopped_before_first_update(run_dir: Path) -> bool:
    """Whether `run_dir` holds a run's start and nothing more: its config.yaml, no checkpoint,
    no metrics row (a coupling's server that could not be reached stops a run there)."""
    if not (run_dir / "config.yaml").is_file():
        return False
    checkpoints = run_dir / "checkpoints"
    if checkpoints.exists() and (not checkpoints.is_dir() or any(checkpoints.iterdir())):
        return False
    metrics = run_dir / "metrics.csv"
    try:
        return not metrics.exists() or len(metrics.read_text().splitlines()) <= 1
    except (OSError, UnicodeDecodeError):
        return False


def pick_resume_checkpoint(
    cfg: CoreRunConfig, accelerator: Accelerator, run_dir: Path
) -> Path | None:
    """The checked checkpoint to resume (None: a fresh start), picked by the main process after
    removing what interrupted saves left (collective: a problem stops every process)."""
    found: list[str | None] = [None, None]  # checkpoint, problem
    if accelerator.is_main_process:
        if removed := remove_temporaries(run_dir):
            print(f"[glam] removed {', '.join(removed)} (left by an interrupted or failed save)")
        deepspeed = accelerator.distributed_type == DistributedType.DEEPSPEED
        try:
            checkpoint = resume_checkpoint(run_dir, cfg.train.resume_from, deepspeed=deepspeed)
            found[0] = None if checkpoint is None else str(checkpoint)
        except UnusableCheckpoint as error:
            found[1] = f"cannot resume: {error}"
    if accelerator.num_processes > 1:
        broadcast_object_list(found)
    if found[1] is not None:
        raise SetupError(found[1])
    return None if found[0] is None else Path(found[0])


_SAME_RUN_SECTIONS = ("model", "policy", "env", "symbolic", "drrn")
_SAME_RUN_KEYS = ("algorithm.name", "algorithm.group_size", "sac.critic_hidden_sizes")
"""Settings outside those sections that a checkpoint is bound to: the algorithm's heads and
optimizer state, (for the group algorithms) how the envs are grouped, and SAC's Q heads."""


def check_same_run(cfg: CoreRunConfig, checkpoint: Path, world: int) -> None:
    """Refuse to resume a checkpoint with another model, policy or environment setup, or with
    another number of processes (each process's envs and RNGs are saved apart)."""
    written_by = read_trainer_state(checkpoint).world_size
    if written_by != world:
        raise SetupError(
            f"cannot resume {checkpoint}: it was written by {written_by} process(es), this run "
            f"has {world}; resume with the same number of processes"
        )
    saved = _flat(OmegaConf.to_container(OmegaConf.load(checkpoint / "config.yaml")))
    now = _flat(OmegaConf.to_container(OmegaConf.structured(cfg)))
    # Setting by setting (`model.lora.r`), and only those the checkpoint's config has: a key
    # added to the schema since it was written (`model.lora.layers`) keeps its old meaning.
    bound = [
        key
        for key in _SAME_RUN_KEYS
        if (key != "algorithm.group_size" or _grouped(saved))
        and (not key.startswith("sac.") or saved.get("algorithm.name") == "sac")
    ]
    changed = [
        f"{key}: {saved[key]!r} -> {value!r}"
        for key, value in now.items()
        if (key.split(".", 1)[0] in _SAME_RUN_SECTIONS or key in bound)
        and key in saved
        and saved[key] != value
    ]
    if changed:
        raise SetupError(
            f"cannot resume {checkpoint}: the model/policy/env/algorithm settings differ from "
            "the run's:\n  " + "\n  ".join(changed)
        )


_RESUME_KEYS = ("train.resume", "train.resume_from")
"""Keys that differ in every resume: not worth a note."""
_DECIDED_KEYS = ("ppo.cache_trunk", "sac.cache_trunk")
"""Keys left unset (None: decided at start) that config.yaml records as decided: unset again in
the resumed session, they are not a change."""


def changed_settings(cfg: CoreRunConfig, checkpoint: Path) -> list[str]:
    """The settings outside the same-run sections (`check_same_run`) that differ between the
    checkpoint's config and this session's (`ppo.lr: 0.001 -> 0.0003`): a resume may change
    them, and says so. Keys the checkpoint's config lacks (added to the schema since) are left
    out."""
    saved = _flat(OmegaConf.to_container(OmegaConf.load(checkpoint / "config.yaml")))
    now = _flat(OmegaConf.to_container(OmegaConf.structured(cfg)))
    return [
        f"{key}: {saved[key]!r} -> {value!r}"
        for key, value in now.items()
        if key in saved
        and saved[key] != value
        and key.split(".", 1)[0] not in _SAME_RUN_SECTIONS
        and key not in _RESUME_KEYS
        and not (key in _DECIDED_KEYS and value is None)
    ]


def _grouped(saved: dict) -> bool:
    """Whether a checkpoint's run grouped its envs (GRPO, GiGPO: `algorithm.group_size`)."""
    return saved.get("algorithm.name", "ppo") in ("grpo", "gigpo")


def _flat(tree: Any, prefix: str = "") -> dict[str, Any]:
    """`{"ppo": {"lr": 1}}` -> `{"ppo.lr": 1}` (lists are values)."""
    if not isinstance(tree, dict):
        return {prefix.rstrip("."): tree}
    flat: dict[str, Any] = {}
    for key, value in tree.items():
        flat.update(_flat(value, f"{prefix}{key}."))
    return flat


def restore_training_state(
    accelerator: Accelerator,
    checkpoint: Path,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    scheduler: torch.optim.lr_scheduler.LRScheduler,
) -> tuple[TrainerState, dict]:
    """`load_training_state`, with a file that passed the checks but does not load (its
    content) stopping every process with a message instead of a traceback."""
    problem, loaded = None, None
    try:
        loaded = load_training_state(
            accelerator, checkpoint, model=model, optimizer=optimizer, scheduler=scheduler
        )
    except (OSError, RuntimeError, ValueError, KeyError, pickle.UnpicklingError) as error:
        lines = str(error).strip().splitlines() or [type(error).__name__]
        problem = f"cannot resume from {checkpoint}: {lines[0]}"
    raise_on_any(accelerator, problem)
    return loaded


def announce_resume(
    cfg: CoreRunConfig,
    accelerator: Accelerator,
    run_dir: Path,
    resume_from: Path | None,
    state: TrainerState,
) -> None:
    """Say which checkpoint the run resumed from and set aside what the run did after it
    (collective), or that `train.resume=true` found none to resume."""
    if resume_from is not None:
        accelerator.print(
            f"[glam] resumed from {resume_from} (update {state.update}, frames {state.frames})"
        )
        if state.frames >= cfg.train.total_frames:
            accelerator.print(
                f"[glam] its {state.frames} frames already reach train.total_frames="
                f"{cfg.train.total_frames}: nothing left to train (raise train.total_frames to go "
                "on)"
            )
        set_aside_checkpoints_after(accelerator, resume_from, state.update)
    elif cfg.train.resume:
        accelerator.print(f"[glam] train.resume=true but {run_dir} has no checkpoint: fresh start")


def set_aside_checkpoints_after(accelerator: Accelerator, checkpoint: Path, update: int) -> None:
    """Move what the run did after `checkpoint` aside (main process; collective)."""
    problem = None
    if accelerator.is_main_process:
        try:
            aside = set_aside_after(checkpoint, update)
        except OSError as error:
            problem = (
                f"cannot set aside the checkpoints after {checkpoint}: {describe_error(error)}"
            )
        else:
            if aside is not None:
                print(
                    f"[glam] checkpoints after update {update} (a branch this resume abandons) "
                    f"moved to {aside}, with their rollouts and a copy of metrics.csv"
                )
    raise_on_any(accelerator, problem)


def raise_on_any(accelerator: Accelerator, problem: str | None) -> None:
    """Raise SetupError on every process if any process has a problem (collective)."""
    problem = first_problem(accelerator, problem)
    if problem is not None:
        raise SetupError(problem)


def resolved_config_yaml(
    cfg: CoreRunConfig,
    accelerator: Accelerator,
    num_updates: int,
    frames_per_update: int | None = None,
) -> str:
    """The run's config, plus a `launch` section recording how it was started
    (`frames_per_update`: PPO's `cfg.frames_per_update` unless given): the `config.yaml` of the
    run folder and of each checkpoint, which `check_same_run` reads back."""
    launch = {
        "world_size": accelerator.num_processes,
        "envs_per_process": cfg.env.num_envs // accelerator.num_processes,
        "distributed_type": str(accelerator.distributed_type.value),
        "deepspeed_stage": (
            accelerator.state.deepspeed_plugin.zero_stage
            if accelerator.distributed_type == DistributedType.DEEPSPEED
            else None
        ),
        "mixed_precision": str(accelerator.mixed_precision),
        "device": str(accelerator.device.type),
        "torch_threads": torch.get_num_threads(),
        "num_updates": num_updates,
        "frames_per_update": frames_per_update or cfg.frames_per_update,
        "command": " ".join(sys.argv),
    }
    container = OmegaConf.to_container(OmegaConf.structured(cfg))
    return OmegaConf.to_yaml({**container, "launch": launch})
