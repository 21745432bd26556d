"""Atomic, pickle-free training checkpoints in the run folder, checked before a resume.

Layout of `RUN_DIR/checkpoints/`::

    update_000012/
        policy/               the policy's `save_pretrained` folder and its glam_policy.json: an
                              LLM's LoRA adapter in peft format (or full model) and
                              heads.safetensors, or a symbolic policy's model.safetensors
        optimizer.pt          optimizer state (tensors and numbers only); under DeepSpeed instead:
        deepspeed/state/        DeepSpeed's checkpoint: every process's optimizer shard
        scheduler.json        learning-rate scheduler state
        trainer_state.json    counters (update, frames, episodes), world size
        config.yaml           the resolved config of the run that wrote it
        rank_0/               one folder per process:
            rng.pt              python, numpy and torch RNG states, and the process's own GPU's
                                (tensors and numbers only)
            envs.json           the environments' seed schedule (`TextVectorEnv.state_dict`)
        manifest.json         every other file of the checkpoint with its size in bytes
    latest                    text file: the name of the newest complete checkpoint
    abandoned-<time>/         checkpoints set aside by a resume from an older one

A checkpoint is written into `.tmp-update_000012/`, renamed into place once every process has
written its part, and only then named in `latest` (itself replaced atomically), so `latest` always
points at a complete checkpoint, even if the run is killed half-way through a save. A save that
fails (a full disk) removes its temporary folder on every process and raises
`CheckpointWriteError`. Before a resume `check_checkpoint` verifies that every file is there, has
its recorded size and parses. Loading uses JSON, safetensors and `torch.load(weights_only=True)`:
it never runs pickled code. Finding a run's newest checkpoint and its policy, without torch, is
`glam.runs.folder`'s.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import random
import re
import shutil
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

import numpy as np
import torch
from accelerate import Accelerator
from accelerate.utils import DistributedType
from omegaconf import OmegaConf
from safetensors import SafetensorError

from glam.runs.errors import RunWriteError
from glam.runs.folder import (
    CHECKPOINT_PATTERN,
    CHECKPOINTS_DIR,
    LATEST_POINTER,
    checkpoint_name,
    describe_error,
    read_pointer,
)

MANIFEST = "manifest.json"
ROLLOUTS_DIR = "rollouts"
"""Run-folder part of `train.save_rollouts`: `rollouts/rank_R/update_N/` per checkpoint."""
METRICS_CSV = "metrics.csv"
DEEPSPEED_DIR = "deepspeed"
"""Folder of a checkpoint holding DeepSpeed's own checkpoint (optimizer shards) under DeepSpeed."""
DEEPSPEED_TAG = "state"
_TEMPORARY = re.compile(r"^(\.tmp-.*|\..*\.tmp)$")
# What a full disk or a failing file system raises: OSError from Python's writes, RuntimeError
# from torch's C++ writer (DeepSpeed's files), SafetensorError from safetensors' Rust writer.
_WRITE_ERRORS = (OSError, RuntimeError, SafetensorError)


class UnusableCheckpoint(ValueError):
    """A checkpoint that cannot be resumed: a file missing, truncated or unreadable (named)."""


class CheckpointWriteError(RunWriteError):
    """A checkpoint could not be written (full disk, read-only folder...); nothing was kept."""


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


def _rng_state(device: torch.device) -> dict[str, Any]:
    """This process's RNG states; on a GPU, its own device's generator only.

    Not every visible GPU's (`get_rng_state_all`): a resume may see fewer GPUs than the launch
    that wrote the checkpoint (one per task under SLURM's `--gpus-per-task=1`, where rank 3's
    device is `cuda:0`), and restoring device 3's state there fails; a process draws on its own
    device alone."""
    version, internal, gauss = random.getstate()
    kind, keys, pos, has_gauss, cached = np.random.get_state()
    state: dict[str, Any] = {
        "python": [version, list(internal), gauss],
        "numpy": [kind, torch.from_numpy(keys.astype(np.int64)), pos, has_gauss, cached],
        "torch": torch.get_rng_state(),
    }
    if device.type == "cuda":
        state["cuda"] = torch.cuda.get_rng_state(device)
    return state


def _set_rng_state(state: dict[str, Any], device: torch.device) -> None:
    """Restore `_rng_state`'s states, the GPU's into this process's `device`."""
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    kind, keys, pos, has_gauss, cached = state["numpy"]
    np.random.set_state((kind, keys.numpy().astype(np.uint32), pos, has_gauss, cached))
    torch.set_rng_state(state["torch"])
    cuda = state.get("cuda")
    if cuda is None or device.type != "cuda":
        return
    if isinstance(cuda, (list, tuple)):  # written before: every GPU the writer saw, by index
        index = device.index if device.index is not None else torch.cuda.current_device()
        if index >= len(cuda):
            return
        cuda = cuda[index]
    torch.cuda.set_rng_state(cuda, device)


def _write_text_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    try:
        tmp.write_text(text)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def _torch_save(obj: Any, path: Path) -> None:
    # Through a Python file: a full disk is then an OSError that says so, where torch's own
    # writer raises "[enforce fail at inline_container.cc]".
    with path.open("wb") as file:
        torch.save(obj, file)


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
    write_extra: Callable[[Path], None] | None = None,
) -> Path:
    """Write the checkpoint of `state.update` (collective: every process calls it).

    Returns the checkpoint folder. A folder of the same update already there (left by a branch
    of the run that a resume abandoned) is moved to `checkpoints/abandoned-<time>/` first.
    `write_extra(folder)`, when given, adds a trainer's own state on every process, after the
    rank files: this process's part into `folder / f"rank_{rank}"`, and shared files into
    `folder` from the main process (DRRN's replay buffers and target network); the manifest
    covers them like the rest.

    Raises:
        CheckpointWriteError: on every process when a write failed on any (a full disk...):
            the temporary folder is removed and `latest` names the previous checkpoint.
    """
    checkpoints = run_dir / CHECKPOINTS_DIR
    name = checkpoint_name(state.update)
    final, tmp = checkpoints / name, checkpoints / f".tmp-{name}"
    main = accelerator.is_main_process

    def stop_if_failed(problem: str | None) -> None:
        problem = first_problem(accelerator, problem)
        if problem is not None:
            if main:
                shutil.rmtree(tmp, ignore_errors=True)
            raise CheckpointWriteError(f"could not write checkpoint {final}: {problem}")

    def start() -> None:
        shutil.rmtree(tmp, ignore_errors=True)  # left by a run killed while saving
        tmp.mkdir(parents=True)

    stop_if_failed(_attempt(start, checkpoints) if main else None)
    stop_if_failed(_attempt(lambda: save_policy(accelerator, model, tmp / "policy"), checkpoints))

    def write_rank_files() -> None:
        rank_dir = tmp / f"rank_{accelerator.process_index}"
        rank_dir.mkdir()
        _torch_save(_rng_state(accelerator.device), rank_dir / "rng.pt")
        (rank_dir / "envs.json").write_text(json.dumps(env_state, indent=1))

    def write_main_files() -> None:
        if accelerator.distributed_type != DistributedType.DEEPSPEED:
            # Data parallel: every process holds the same optimizer state.
            _torch_save(optimizer.state_dict(), tmp / "optimizer.pt")
        (tmp / "scheduler.json").write_text(json.dumps(scheduler.state_dict(), indent=1))
        (tmp / "config.yaml").write_text(config_yaml)
        (tmp / "trainer_state.json").write_text(json.dumps(state.__dict__, indent=1))

    problem = _attempt(write_rank_files, checkpoints)
    if write_extra is not None:
        problem = problem or _attempt(lambda: write_extra(tmp), checkpoints)
    if accelerator.distributed_type == DistributedType.DEEPSPEED:
        # Each process holds its shard of the optimizer state: DeepSpeed's own checkpoint writes
        # every shard (and the trainable weights; the frozen base stays in the model's folder).
        # Every process takes part even after a failed write: DeepSpeed's save is collective.
        problem = _save_deepspeed_state(model, tmp) or problem
    if main:
        problem = problem or _attempt(write_main_files, checkpoints)
    stop_if_failed(problem)

    def publish() -> None:
        _write_manifest(tmp)
        if final.exists():
            aside = _abandoned_folder(checkpoints)
            os.replace(final, aside / name)
            print(f"[glam] {final} was from an abandoned branch of the run: moved to {aside}")
        os.replace(tmp, final)
        _write_text_atomic(checkpoints / LATEST_POINTER, name + "\n")
        if keep:
            _prune(checkpoints, keep=keep, protect=name)

    stop_if_failed(_attempt(publish, checkpoints) if main else None)
    return final


def _attempt(write: Any, folder: Path) -> str | None:
    """Run `write()`; None if it worked, else what went wrong in a few words."""
    try:
        write()
    except _WRITE_ERRORS as error:
        return describe_error(error, folder)
    return None


def first_problem(accelerator: Accelerator, problem: str | None) -> str | None:
    """The first process's problem, on every process (collective): what stops one process stops
    them all, together."""
    if accelerator.num_processes == 1:
        return problem
    from accelerate.utils import gather_object

    return next((p for p in gather_object([problem]) if p is not None), None)


def _write_manifest(folder: Path) -> None:
    files = {
        path.relative_to(folder).as_posix(): path.stat().st_size
        for path in sorted(folder.rglob("*"))
        if path.is_file()
    }
    (folder / MANIFEST).write_text(json.dumps({"files": files}, indent=1))


def _prune(checkpoints: Path, *, keep: int, protect: str) -> None:
    names = sorted(p.name for p in checkpoints.iterdir() if CHECKPOINT_PATTERN.match(p.name))
    for old in names[:-keep]:
        if old != protect:
            shutil.rmtree(checkpoints / old, ignore_errors=True)


def _updates(checkpoints: Path) -> dict[int, Path]:
    """The `update_N` folders of `checkpoints/` by update."""
    if not checkpoints.is_dir():
        return {}
    return {int(m[1]): p for p in checkpoints.iterdir() if (m := CHECKPOINT_PATTERN.match(p.name))}


def _abandoned_folder(checkpoints: Path) -> Path:
    stamp = time.strftime("%Y%m%d-%H%M%S")
    folder, n = checkpoints / f"abandoned-{stamp}", 1
    while folder.exists():
        n += 1
        folder = checkpoints / f"abandoned-{stamp}-{n}"
    folder.mkdir()
    return folder


def remove_temporaries(run_dir: Path) -> list[str]:
    """Delete what interrupted or failed saves left in `checkpoints/` (`.tmp-update_N/`,
    `.latest.tmp`): partial copies holding disk space. Main process only; returns their names."""
    checkpoints = run_dir / CHECKPOINTS_DIR
    if not checkpoints.is_dir():
        return []
    removed = sorted(p.name for p in checkpoints.iterdir() if _TEMPORARY.match(p.name))
    for name in removed:
        path = checkpoints / name
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path, ignore_errors=True)
        else:
            with contextlib.suppress(OSError):
                path.unlink()
    return removed


def set_aside_after(checkpoint: Path, update: int) -> Path | None:
    """Set aside what a run did after `checkpoint` (of update `update`), a branch that a resume
    from it abandons: later checkpoints and saved rollouts move to `abandoned-<time>/` in
    `checkpoints/`, with a copy of metrics.csv (the resumed run drops its later rows), and
    `latest` names `checkpoint`. Nothing is deleted. Returns that folder, or None when nothing
    was later. Main process only."""
    checkpoints = checkpoint.parent
    run_dir = checkpoints.parent
    later = [path for number, path in sorted(_updates(checkpoints).items()) if number > update]
    rollouts = [
        path
        for path in sorted((run_dir / ROLLOUTS_DIR).glob("rank_*/update_*"))
        if (m := CHECKPOINT_PATTERN.match(path.name)) and int(m[1]) > update
    ]
    folder = None
    if later or rollouts:
        folder = _abandoned_folder(checkpoints)
        for path in later:
            os.replace(path, folder / path.name)
        for path in rollouts:
            target = folder / ROLLOUTS_DIR / path.parent.name / path.name
            target.parent.mkdir(parents=True, exist_ok=True)
            os.replace(path, target)
        if (run_dir / METRICS_CSV).is_file():
            shutil.copy2(run_dir / METRICS_CSV, folder / METRICS_CSV)
    _write_text_atomic(checkpoints / LATEST_POINTER, checkpoint.name + "\n")
    return folder


# --------------------------------------------------------------------------------------------
# Checks before a resume
# --------------------------------------------------------------------------------------------


def resume_checkpoint(
    run_dir: Path, requested: str = "", *, deepspeed: bool = False
) -> Path | None:
    """The checkpoint a resumed run continues from, checked by `check_checkpoint`: `requested`
    (`train.resume_from`: a folder of the run's `checkpoints/`, by name or path), else the one
    `latest` names; None when the run has no checkpoint.

    Raises:
        UnusableCheckpoint: naming the file and its problem and, when there is one, the newest
            older complete checkpoint with the option that continues from it.
    """
    checkpoints = run_dir / CHECKPOINTS_DIR
    if requested:
        checkpoint = _requested_checkpoint(checkpoints, requested)
    else:
        pointer = checkpoints / LATEST_POINTER
        if not pointer.is_file() and not pointer.is_symlink():
            if not _updates(checkpoints):
                return None
            raise UnusableCheckpoint(
                f"{pointer} is missing" + _fallback(checkpoints, None, deepspeed)
            )
        name, problem = read_pointer(pointer)
        if problem is not None:
            before = int(m[1]) if (m := CHECKPOINT_PATTERN.match(name)) else None
            raise UnusableCheckpoint(
                f"{pointer} {problem}" + _fallback(checkpoints, before, deepspeed)
            )
        checkpoint = checkpoints / name
    try:
        check_checkpoint(checkpoint, deepspeed=deepspeed)
    except UnusableCheckpoint as error:
        before = int(CHECKPOINT_PATTERN.match(checkpoint.name)[1])
        raise UnusableCheckpoint(
            f"{checkpoint}: {error}" + _fallback(checkpoints, before, deepspeed)
        ) from None
    return checkpoint


def _requested_checkpoint(checkpoints: Path, requested: str) -> Path:
    path = Path(requested)
    if not path.is_absolute() and (checkpoints / path).is_dir():
        path = checkpoints / path
    path = path.resolve()
    if (
        path.parent != checkpoints.resolve()
        or not CHECKPOINT_PATTERN.match(path.name)
        or not path.is_dir()
    ):
        names = ", ".join(sorted(p.name for p in _updates(checkpoints).values())) or "none"
        raise UnusableCheckpoint(
            f"train.resume_from={requested!r} is not a checkpoint of this run (in {checkpoints}: "
            f"{names})"
        )
    return checkpoints / path.name


def _fallback(checkpoints: Path, before: int | None, deepspeed: bool) -> str:
    """What to do instead: the newest complete checkpoint (before update `before`)."""
    for update, path in sorted(_updates(checkpoints).items(), reverse=True):
        if before is not None and update >= before:
            continue
        try:
            check_checkpoint(path, deepspeed=deepspeed)
        except UnusableCheckpoint:
            continue
        return (
            f"; the newest complete checkpoint is {path.name}: continue from it with "
            f"train.resume_from={path.name} (later checkpoints then move to "
            f"{CHECKPOINTS_DIR}/abandoned-<time>/)"
        )
    return "; no older checkpoint is complete"


def check_checkpoint(checkpoint: Path, *, deepspeed: bool = False) -> TrainerState:
    """Check that `checkpoint` can be resumed: every file its writer writes is there (for every
    process of its world size; DeepSpeed's shards under DeepSpeed, else optimizer.pt), has the
    size its manifest records, and its JSON, YAML and RNG files parse. Returns its counters.

    Raises:
        UnusableCheckpoint: naming the first file missing, truncated or unreadable.
    """
    if not checkpoint.is_dir():
        raise UnusableCheckpoint("the folder is missing")
    # Every checkpoint is published with its manifest: without it, no file's size can be
    # checked, so a truncated file of any kind would pass.
    _check_sizes(checkpoint, _read_json(checkpoint, MANIFEST).get("files"))
    state = _read_state(checkpoint)
    required = ["trainer_state.json", "config.yaml", "scheduler.json", "policy"]
    required += [
        f"rank_{k}/{file}" for k in range(state.world_size) for file in ("rng.pt", "envs.json")
    ]
    required.append(f"{DEEPSPEED_DIR}/{DEEPSPEED_TAG}" if deepspeed else "optimizer.pt")
    for name in required:
        path = checkpoint / name
        if path.exists() and not (path.is_dir() and not any(path.iterdir())):
            continue
        if name == "optimizer.pt" and (checkpoint / DEEPSPEED_DIR).is_dir():
            raise UnusableCheckpoint(
                "optimizer.pt is missing: the checkpoint was written under DeepSpeed (resume it "
                "under DeepSpeed)"
            )
        if name.startswith(DEEPSPEED_DIR) and (checkpoint / "optimizer.pt").is_file():
            raise UnusableCheckpoint(
                f"{name}/ is missing: the checkpoint was written without DeepSpeed (resume it "
                "without DeepSpeed)"
            )
        raise UnusableCheckpoint(f"{name} is {'empty' if path.exists() else 'missing'}")
    for name in ["scheduler.json", *(f"rank_{k}/envs.json" for k in range(state.world_size))]:
        _read_json(checkpoint, name)
    for path in sorted((checkpoint / "policy").rglob("*.json")):  # configs: parse, any shape
        _parse_json(checkpoint, path.relative_to(checkpoint).as_posix())
    try:
        if not isinstance(OmegaConf.to_container(OmegaConf.load(checkpoint / "config.yaml")), dict):
            raise ValueError("not a mapping")
    except Exception as error:  # noqa: BLE001  (YAML and OmegaConf raise many kinds)
        raise UnusableCheckpoint(f"config.yaml is unreadable ({_first_line(error)})") from None
    for k in range(state.world_size):
        try:
            torch.load(checkpoint / f"rank_{k}" / "rng.pt", map_location="cpu", weights_only=True)
        except Exception as error:  # noqa: BLE001  (a truncated zip, an unpickling error...)
            raise UnusableCheckpoint(
                f"rank_{k}/rng.pt is unreadable ({_first_line(error)})"
            ) from None
    return state


_STATE_MINIMA = {"update": 0, "frames": 0, "episodes": 0, "elapsed_seconds": 0, "world_size": 1}
"""The smallest value of each counter of `trainer_state.json` (all integers but the seconds)."""


def _read_state(checkpoint: Path) -> TrainerState:
    """The counters of `checkpoint`, each checked: a negative frame count resumed would train
    the wrong number of updates and report wrong frames; a text would fail in the middle of the
    run; an update that is not the folder's is a checkpoint copied or renamed by hand."""
    data = _read_json(checkpoint, "trainer_state.json")
    names = [f.name for f in fields(TrainerState)]
    if set(data) != set(names):
        raise UnusableCheckpoint(
            f"trainer_state.json has unexpected content (keys {sorted(data)}, expected "
            f"{sorted(names)})"
        )
    for name in names:
        value, least = data[name], _STATE_MINIMA[name]
        kind = "a number" if name == "elapsed_seconds" else "an integer"
        number = isinstance(value, (int, float) if name == "elapsed_seconds" else int)
        if isinstance(value, bool) or not number or not math.isfinite(value) or value < least:
            raise UnusableCheckpoint(
                f"trainer_state.json: {name} is {value!r}, it must be {kind} >= {least}"
            )
    state = TrainerState(**data)
    named = CHECKPOINT_PATTERN.match(checkpoint.name)
    if named and int(named[1]) != state.update:
        raise UnusableCheckpoint(
            f"trainer_state.json: update is {state.update}, but the folder is {checkpoint.name}"
        )
    return state


def _read_json(checkpoint: Path, name: str) -> dict[str, Any]:
    data = _parse_json(checkpoint, name)
    if not isinstance(data, dict):
        raise UnusableCheckpoint(f"{name} is not a JSON object")
    return data


def _parse_json(checkpoint: Path, name: str) -> Any:
    try:
        return json.loads((checkpoint / name).read_text())
    except FileNotFoundError:
        raise UnusableCheckpoint(f"{name} is missing") from None
    except (OSError, UnicodeDecodeError) as error:
        raise UnusableCheckpoint(f"{name} is unreadable ({describe_error(error)})") from None
    except json.JSONDecodeError as error:
        raise UnusableCheckpoint(f"{name} is not valid JSON ({error})") from None


def _check_sizes(checkpoint: Path, sizes: Any) -> None:
    if not isinstance(sizes, dict) or not all(isinstance(n, int) for n in sizes.values()):
        raise UnusableCheckpoint(f"{MANIFEST} has unexpected content")
    for name, size in sizes.items():
        path = checkpoint / name
        if not path.is_file():
            raise UnusableCheckpoint(f"{name} is missing")
        actual = path.stat().st_size
        if actual < size:
            raise UnusableCheckpoint(f"{name} is truncated ({actual} of {size} bytes)")
        if actual != size:
            raise UnusableCheckpoint(f"{name} has {actual} bytes, {size} were written")


def _first_line(error: BaseException) -> str:
    text = str(error).strip()
    return text.splitlines()[0] if text else type(error).__name__


def read_trainer_state(checkpoint: Path) -> TrainerState:
    """The counters saved in a checkpoint, checked as `check_checkpoint` checks them.

    Raises:
        UnusableCheckpoint: trainer_state.json is missing, unreadable or holds a bad value.
    """
    return _read_state(checkpoint)


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
    `glam.ppo.setup.build_policy`). Returns the counters and this process's env state.

    Raises:
        UnusableCheckpoint: a file that passed `check_checkpoint` but does not load into this
            run (its content: garbage of the right size, another optimizer's state), naming the
            file and the newest older complete checkpoint, on one line (the caller names the
            checkpoint).
    """
    state = read_trainer_state(checkpoint)
    if state.world_size != accelerator.num_processes:
        raise ValueError(
            f"checkpoint {checkpoint} was written by {state.world_size} processes, this run has "
            f"{accelerator.num_processes}: resume with the same number of processes"
        )
    deepspeed = accelerator.distributed_type == DistributedType.DEEPSPEED
    rank_dir = f"rank_{accelerator.process_index}"
    with _naming_the_file(checkpoint, f"{DEEPSPEED_DIR}/{DEEPSPEED_TAG}", deepspeed):
        if deepspeed:
            _load_deepspeed_state(model, checkpoint)
    if not deepspeed:
        with _naming_the_file(checkpoint, "optimizer.pt", deepspeed):
            # Saved from the CPU; load_state_dict moves the moments to the parameters' device.
            optimizer.load_state_dict(
                torch.load(checkpoint / "optimizer.pt", map_location="cpu", weights_only=True)
            )
    with _naming_the_file(checkpoint, "scheduler.json", deepspeed):
        scheduler.load_state_dict(json.loads((checkpoint / "scheduler.json").read_text()))
    with _naming_the_file(checkpoint, f"{rank_dir}/rng.pt", deepspeed):
        _set_rng_state(
            torch.load(checkpoint / rank_dir / "rng.pt", map_location="cpu", weights_only=True),
            accelerator.device,
        )
    with _naming_the_file(checkpoint, f"{rank_dir}/envs.json", deepspeed):
        env_state = json.loads((checkpoint / rank_dir / "envs.json").read_text())
    return state, env_state


@contextlib.contextmanager
def _naming_the_file(checkpoint: Path, name: str, deepspeed: bool) -> Iterator[None]:
    """Turn a failure to load `name` into an `UnusableCheckpoint` that names it and the older
    checkpoint to resume instead. torch's own message names no file and proposes
    `weights_only=False`, that is, running whatever the file holds: never here."""
    try:
        yield
    except UnusableCheckpoint:
        raise
    except Exception as error:  # noqa: BLE001  (torch, json and the optimizer raise many kinds)
        text = _first_line(error)
        if "weights_only" in str(error) or "Weights only load failed" in text:
            text = "it holds objects other than tensors and numbers, which are never unpickled"
        update = CHECKPOINT_PATTERN.match(checkpoint.name)
        before = int(update[1]) if update else None
        raise UnusableCheckpoint(
            f"{name} does not load ({text})" + _fallback(checkpoint.parent, before, deepspeed)
        ) from None


def _save_deepspeed_state(engine: torch.nn.Module, folder: Path) -> str | None:
    """Write DeepSpeed's checkpoint of `engine` into `folder/deepspeed` (collective); None if
    this process's writes worked, else what went wrong.

    A write that fails is recorded, not raised, so that DeepSpeed's save goes on to the barriers
    every process waits at (an exception on one process would leave the others waiting there);
    the caller then stops every process together.
    """
    recorder = _RecordingCheckpointEngine(engine.checkpoint_engine)
    engine.checkpoint_engine = recorder
    # The main process also copies DeepSpeed's recovery scripts, outside the checkpoint engine.
    engine._copy_recovery_script = recorder.guard(engine._copy_recovery_script)
    try:
        engine.save_checkpoint(
            str(folder / DEEPSPEED_DIR),
            tag=DEEPSPEED_TAG,
            exclude_frozen_parameters=True,
            save_latest=False,
        )
    except _WRITE_ERRORS as error:
        return describe_error(error, folder)
    finally:
        engine.checkpoint_engine = recorder.inner
        del engine._copy_recovery_script  # the class's method again
    return None if recorder.error is None else describe_error(recorder.error, folder)


class _RecordingCheckpointEngine:
    """DeepSpeed's checkpoint engine recording its first failed write instead of raising it."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.error: BaseException | None = None

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def guard(self, write: Any) -> Any:
        """`write`, recording its failure instead of raising it (skipped after a failure)."""

        def guarded(*args: Any, **kwargs: Any) -> None:
            if self.error is not None:
                return
            try:
                write(*args, **kwargs)
            except _WRITE_ERRORS as error:
                self.error = error

        return guarded

    def save(self, state_dict: Any, path: str) -> None:
        self.guard(self.inner.save)(state_dict, path)

    def makedirs(self, path: str, exist_ok: bool = False) -> None:
        self.guard(self.inner.makedirs)(path, exist_ok=exist_ok)


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
