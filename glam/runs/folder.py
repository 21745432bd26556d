"""A run folder as its readers see it: its checkpoints, the newest one, and that one's policy.

The trainers write run folders (`glam.runs.checkpoint` writes the checkpoints,
`glam.runs.lifecycle` opens and resumes a run); evaluation and the scripts find a run's policy
here, without importing a trainer. Torch-free. The part of the layout read here::

    RUN_DIR/checkpoints/
        update_000012/        the checkpoint written after 12 updates
            policy/           the policy's `save_pretrained` folder
        latest                text file: the name of the newest complete checkpoint
"""

from __future__ import annotations

import errno
import os
import re
import shutil
from pathlib import Path

CHECKPOINTS_DIR = "checkpoints"
LATEST_POINTER = "latest"
CHECKPOINT_PATTERN = re.compile(r"^update_(\d+)$")
"""The name of a checkpoint folder (`checkpoint_name`), its update as the first group."""


def checkpoint_name(update: int) -> str:
    """Folder name of the checkpoint written after `update` updates."""
    return f"update_{update:06d}"


def latest_checkpoint(run_dir: str | Path) -> Path | None:
    """The checkpoint the `latest` pointer of a run names, or None without a pointer.

    Raises:
        FileNotFoundError: the pointer is unreadable or names no checkpoint folder.
    """
    checkpoints = Path(run_dir) / CHECKPOINTS_DIR
    pointer = checkpoints / LATEST_POINTER
    if not pointer.is_file():
        return None
    name, problem = read_pointer(pointer)
    if problem is not None:
        raise FileNotFoundError(f"{pointer} {problem}")
    return checkpoints / name


def read_pointer(pointer: Path) -> tuple[str, str | None]:
    """The name `latest` holds, and what is wrong with it (None if it names a folder)."""
    try:
        name = pointer.read_text().strip()
    except (OSError, UnicodeDecodeError) as error:
        return "", f"is unreadable ({describe_error(error)})"
    if not name:
        return name, "is empty"
    if not CHECKPOINT_PATTERN.match(name):
        return name, f"holds {name[:40]!r}, not a checkpoint name (update_NNNNNN)"
    if not (pointer.parent / name).is_dir():
        return name, f"names {name}, which is missing"
    return name, None


def policy_dir(run_dir_or_checkpoint: str | Path) -> Path:
    """The `policy/` folder (`glam.baselines.loading.load_policy`) of a checkpoint or of the
    newest checkpoint of a run folder."""
    path = Path(run_dir_or_checkpoint)
    if (path / "policy").is_dir():
        return path / "policy"
    checkpoint = latest_checkpoint(path)
    if checkpoint is None:
        raise FileNotFoundError(f"{path} is neither a checkpoint nor a run with checkpoints")
    return checkpoint / "policy"


def describe_error(error: BaseException, folder: Path | None = None) -> str:
    """An error in a few words: `permission denied`, `no space left on device` on a full disk
    whichever library's error said it (torch's C++ writer names no cause: then, if `folder` is
    given, its disk is asked)."""
    code = getattr(error, "errno", None)
    text = str(error).strip()
    if code is None and ("os error 28" in text or "No space left" in text):
        code = errno.ENOSPC
    if code is None and folder is not None and _disk_full(folder):
        code = errno.ENOSPC
    if code is not None:
        words = os.strerror(code)
        return words[:1].lower() + words[1:]
    return text.splitlines()[0] if text else type(error).__name__


def _disk_full(folder: Path) -> bool:
    while not folder.exists() and folder != folder.parent:
        folder = folder.parent
    try:
        return shutil.disk_usage(folder).free < 1 << 20
    except OSError:
        return False
