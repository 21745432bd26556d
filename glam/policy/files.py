"""The files of a saved policy folder, whatever its kind: `glam_policy.json` and safetensors.

`glam_policy.json` says what the folder holds (`format_version`, the policy `kind`, its settings,
the action words, the env it was trained on); the weights are safetensors files, so loading runs
no code from the folder. Reading checks every file first: a missing, truncated or malformed one
is a `CheckpointError` that names it. `LLMActorCritic` and the baselines' small networks
(`model.safetensors` beside the JSON, written by `save_policy_folder`) share these helpers.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import asdict
from pathlib import Path
from typing import Any

from safetensors import SafetensorError, safe_open
from safetensors.torch import load_file, save_file
from torch import nn

from glam.config import EnvConfig

CONFIG_FILE = "glam_policy.json"
FORMAT_VERSION = 1
WEIGHTS_FILE = "model.safetensors"
"""The weights of a policy saved whole by `save_policy_folder` (the baselines' networks)."""


class CheckpointError(ValueError):
    """A policy folder that cannot be loaded: a file missing, truncated or malformed, or model
    code that is not allowed to run. The message names the file."""


def read_policy_config(path: str | Path) -> dict[str, Any]:
    """The `glam_policy.json` of the policy folder `path`, as a JSON object of a known format.

    Raises:
        CheckpointError: the file is missing, not JSON, not an object, or of an unknown format
            version (the message names it).
    """
    file = Path(path) / CONFIG_FILE
    if not file.is_file():
        what = "folder does not exist" if not file.parent.is_dir() else "file is missing"
        raise CheckpointError(f"{file}: {what} (not a policy saved by save_pretrained)")
    try:
        meta = json.loads(file.read_text())
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        raise CheckpointError(f"{file}: not valid JSON ({error})") from None
    if not isinstance(meta, dict):
        raise CheckpointError(f"{file}: not a JSON object")
    if meta.get("format_version") != FORMAT_VERSION:
        raise CheckpointError(f"{file}: unknown format {meta.get('format_version')!r}")
    return meta


def check_words_and_env(file: Path, meta: dict[str, Any]) -> None:
    """`meta` (read from `file`) has a non-empty list of action words and an env record or none.

    Raises:
        CheckpointError: naming `file` and the key that is wrong.
    """
    words = meta.get("action_words")
    if not (isinstance(words, list) and words and all(isinstance(w, str) for w in words)):
        raise CheckpointError(f"{file}: 'action_words' must be a non-empty list of strings")
    check_env_record(file, meta)


def check_env_record(file: Path, meta: dict[str, Any]) -> None:
    """`meta`'s `env` (read from `file`) is a dict of env settings, or absent or null."""
    if not isinstance(meta.get("env"), (dict, type(None))):
        raise CheckpointError(f"{file}: 'env' has the wrong type ({meta['env']!r})")


def env_record(env: EnvConfig | Mapping[str, Any] | None) -> dict[str, Any] | None:
    """The env settings as `glam_policy.json` records them: a plain dict of `EnvConfig`'s fields."""
    if env is None:
        return None
    return asdict(env) if isinstance(env, EnvConfig) else dict(env)


def save_policy_folder(path: str | Path, module: nn.Module, meta: dict[str, Any]) -> Path:
    """Write `module`'s weights to `model.safetensors` and `meta` (after the format version) to
    `glam_policy.json` in the folder `path`, created if needed; return the folder."""
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    weights = {k: v.detach().contiguous().cpu() for k, v in module.state_dict().items()}
    save_file(weights, path / WEIGHTS_FILE)
    meta = {"format_version": FORMAT_VERSION, **meta}
    (path / CONFIG_FILE).write_text(json.dumps(meta, indent=2) + "\n")
    return path


def load_weights(module: nn.Module, path: Path, settings: str) -> None:
    """Load the folder's `model.safetensors` into `module`, built from `settings` (what of
    `glam_policy.json` shaped it, for the message).

    Raises:
        CheckpointError: the file is missing, truncated or malformed, or its tensors do not fit
            the module (the first mismatch named).
    """
    weights = path / WEIGHTS_FILE
    check_safetensors(weights)
    try:
        module.load_state_dict(load_file(weights))
    except (SafetensorError, RuntimeError) as error:  # RuntimeError: missing keys, shapes
        raise CheckpointError(
            f"{weights}: the weights do not load with the {settings} of {CONFIG_FILE}: "
            f"{_first_problem(error)}"
        ) from None


def check_safetensors(file: Path) -> None:
    """The file exists, its header parses and the file holds every byte the header describes."""
    if not file.is_file():
        raise CheckpointError(f"{file}: file is missing")
    size = file.stat().st_size
    with file.open("rb") as stream:
        prefix = stream.read(8)
        if len(prefix) < 8:
            raise CheckpointError(f"{file}: truncated ({size} bytes, not even a header)")
        header_size = int.from_bytes(prefix, "little")
        if 8 + header_size > size:
            raise CheckpointError(
                f"{file}: truncated or not a safetensors file (its first 8 bytes announce a "
                f"{header_size}-byte header, the file has {size} bytes)"
            )
        try:
            header = json.loads(stream.read(header_size))
            end = max(
                (v["data_offsets"][1] for k, v in header.items() if k != "__metadata__"),
                default=0,
            )
        except (UnicodeDecodeError, json.JSONDecodeError, AttributeError, KeyError, TypeError):
            raise CheckpointError(f"{file}: not a safetensors file (unreadable header)") from None
    if 8 + header_size + end > size:
        raise CheckpointError(
            f"{file}: truncated ({size} bytes, its header describes {8 + header_size + end})"
        )
    try:
        safe_open(file, framework="pt").keys()
    except SafetensorError as error:  # safetensors' own checks: offsets, dtypes, overlaps
        raise CheckpointError(f"{file}: not a valid safetensors file ({error})") from None


def _first_problem(error: BaseException) -> str:
    """torch's list of state-dict mismatches (one line each) shortened to the first."""
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    details = lines[1:] if len(lines) > 1 and lines[0].startswith("Error(s) in loading") else lines
    more = f" (and {len(details) - 1} more)" if len(details) > 1 else ""
    return (details[0] if details else type(error).__name__) + more
