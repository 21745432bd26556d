"""The saved behavioural-cloning policy: a folder the evaluation harness loads as the `bc` agent.

`glam.bc.sft` writes it, `glam.eval` reads it; it lives here, below both.

A BC folder holds

- the LoRA adapter in peft's format (`adapter_config.json`, `adapter_model.safetensors`), or the
  whole fine-tuned model (`config.json`, `model.safetensors`) when LoRA was off;
- the tokenizer, `metrics.json`, and `config.yaml` (the settings of the run that wrote it);
- `bc_policy.json`: the base model spec (a portable name such as `smollm2-135m`, not the cache
  path peft records), whether the folder is an adapter, and the prompt settings the model was
  cloned with (`nbr_obs`, `action_space`, `prompt_format`, `normalization`) plus the run's
  metrics.

>>> model, tokenizer = load_bc_policy("runs/bc/gotolocal")  # doctest: +SKIP
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch
from peft import PeftModel
from transformers import AutoTokenizer, PreTrainedModel, PreTrainedTokenizerBase

from glam.models.loading import load_model
from glam.outputs import BC_POLICY
from glam.policy.adapters import quiet_peft

__all__ = [
    "BC_OUTPUT_FILES",
    "BC_POLICY_FILE",
    "BCPolicyInfo",
    "load_bc_policy",
    "read_bc_policy_info",
]

BC_POLICY_FILE = "bc_policy.json"
BC_OUTPUT_FILES = BC_POLICY.files
"""Files of a saved BC policy (`glam.outputs.BC_POLICY`); `train_bc` refuses a folder holding
any of them unless `bc.overwrite`."""
"""Name of the JSON file describing a BC folder."""


@dataclass
class BCPolicyInfo:
    """What `bc_policy.json` says about a BC folder."""

    base_model: str
    """Model spec of the base model (embedded name, absolute folder, hub id)."""
    adapter: bool
    """True: the folder is a peft adapter on `base_model`; False: a full model."""
    is_encoder_decoder: bool = False
    """Whether the base model is an encoder-decoder (T5-family) model."""
    dtype: str = "float32"
    """Dtype the model was trained in."""
    nbr_obs: int = 3
    """Observations in the prompts it was cloned on."""
    action_space: str = "default"
    """Action space of the demonstrations."""
    prompt_format: str = "glam"
    """Prompt format of the demonstrations (`glam` or `chat`)."""
    normalization: str = "sum"
    """Candidate score used to measure its action accuracy."""
    level: str | None = None
    """Level the demonstrations came from."""
    dataset: str | None = None
    """Demonstrations folder it was trained on."""
    metrics: dict[str, Any] = field(default_factory=dict)
    """Figures of the run (`eval/action_accuracy`, `eval/zero_shot_action_accuracy`...)."""
    format_version: int = 1
    """Version of this file's layout."""

    def save(self, folder: str | os.PathLike[str]) -> Path:
        """Write `bc_policy.json` into `folder`; return its path."""
        path = Path(folder) / BC_POLICY_FILE
        path.write_text(json.dumps(asdict(self), indent=2, sort_keys=True) + "\n")
        return path


def read_bc_policy_info(folder: str | os.PathLike[str]) -> BCPolicyInfo:
    """Read `bc_policy.json` of a BC folder.

    Raises:
        FileNotFoundError: the folder or its `bc_policy.json` is missing.
    """
    path = Path(folder) / BC_POLICY_FILE
    if not path.is_file():
        raise FileNotFoundError(
            f"{folder} is not a BC policy folder (no {BC_POLICY_FILE}); train one with "
            "`python scripts/clm_behavioral_cloning.py bc.dataset=... bc.output_dir=...`"
        )
    data = json.loads(path.read_text())
    known = set(BCPolicyInfo.__dataclass_fields__)
    return BCPolicyInfo(**{key: value for key, value in data.items() if key in known})


def load_bc_policy(
    folder: str | os.PathLike[str],
    *,
    base_model: str | None = None,
    dtype: str | torch.dtype | None = None,
    merge: bool = False,
    trust_remote_code: bool = False,
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """Load a BC folder as `(model, tokenizer)`, in eval mode.

    Args:
        folder: the folder `scripts/clm_behavioral_cloning.py` saved.
        base_model: base model spec, overriding the one in `bc_policy.json` (e.g. a local copy).
        dtype: weights dtype; None: the dtype it was trained in.
        merge: fold the LoRA weights into the base model (faster, no longer a `PeftModel`).
        trust_remote_code: run model or tokenizer code the folder names (an `auto_map` to a
            `.py` file): the caller's decision (`agent.trust_remote_code`), never the folder's.

    Raises:
        FileNotFoundError: `folder` is not a BC folder.
        ValueError: the folder's model or tokenizer needs its own code and `trust_remote_code`
            is false (transformers' message).
    """
    info = read_bc_policy_info(folder)
    dtype = dtype or info.dtype
    if not info.adapter:
        model, _ = load_model(str(folder), dtype=dtype, trust_remote_code=trust_remote_code)
    else:
        base, _ = load_model(
            base_model or info.base_model, dtype=dtype, trust_remote_code=trust_remote_code
        )
        with quiet_peft():
            model = PeftModel.from_pretrained(base, str(folder))
        if merge:
            model = model.merge_and_unload()
    tokenizer = AutoTokenizer.from_pretrained(str(folder), trust_remote_code=trust_remote_code)
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    model.eval()
    return model, tokenizer
