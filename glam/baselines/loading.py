"""Load any saved policy folder: its `glam_policy.json` says which kind of agent it holds.

| `kind` | class | reads |
|---|---|---|
| absent or `llm` | `glam.policy.llm_policy.LLMActorCritic` | the prompt |
| `generate` | `glam.policy.writer.WritingActorCritic` | the prompt (it writes its action) |
| `symbolic` | `glam.baselines.symbolic.SymbolicActorCritic` | minigrid's grid and the mission |
| `drrn` | `glam.baselines.drrn.DRRNPolicy` | the prompt |

The classes are entry points looked up by name when a folder of their kind is loaded, so a kind
whose module is not installed is reported as such.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from torch import nn

from glam.config import EnvConfig
from glam.policy.files import CONFIG_FILE, CheckpointError, read_policy_config

__all__ = ["POLICY_CLASSES", "load_policy", "policy_kind", "read_policy_config"]

POLICY_CLASSES: dict[str, str] = {
    "llm": "glam.policy.llm_policy:LLMActorCritic",
    "generate": "glam.policy.writer:WritingActorCritic",
    "symbolic": "glam.baselines.symbolic:SymbolicActorCritic",
    "drrn": "glam.baselines.drrn:DRRNPolicy",
}
"""The class of each policy kind, as `module:Class`; each has `from_pretrained(path, *,
training_env=None)` (the LLM's also takes `trust_remote_code`)."""


def policy_kind(path: str | Path) -> str:
    """The kind of policy saved in the folder `path` (`llm` when the file names none).

    Raises:
        CheckpointError: an unreadable `glam_policy.json`, or a kind this version does not know.
    """
    kind = read_policy_config(path).get("kind", "llm")
    if kind not in POLICY_CLASSES:
        raise CheckpointError(
            f"{Path(path) / CONFIG_FILE}: unknown policy kind {kind!r}; known kinds: "
            f"{', '.join(POLICY_CLASSES)}"
        )
    return kind


def load_policy(
    path: str | Path,
    *,
    trust_remote_code: bool = False,
    training_env: EnvConfig | Mapping[str, Any] | None = None,
) -> nn.Module:
    """The policy saved in the folder `path`, by the `from_pretrained` of its kind.

    `trust_remote_code` (language models only) is the caller's decision, never the folder's;
    `training_env` replaces the env recorded in the folder.

    Raises:
        CheckpointError: a missing, truncated or malformed file (named), an unknown kind, or a
            kind whose module is not installed.
    """
    kind = policy_kind(path)
    module_name, class_name = POLICY_CLASSES[kind].split(":")
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as error:
        if error.name != module_name:
            raise  # the module is there, something it imports is not
        raise CheckpointError(
            f"{Path(path) / CONFIG_FILE}: a {kind!r} policy needs {module_name}, which this "
            "installation of glam does not have"
        ) from None
    policy_class = getattr(module, class_name)
    if kind in ("llm", "generate"):
        return policy_class.from_pretrained(
            path, trust_remote_code=trust_remote_code, training_env=training_env
        )
    return policy_class.from_pretrained(path, training_env=training_env)
