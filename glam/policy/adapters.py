"""What of the language model is trained: a LoRA adapter (through peft) or every weight.

TWOSOME's recipe, which the defaults follow: freeze the base model and train LoRA (r=8, alpha=16)
on the attention's query and value projections. Those modules have different names per family,
hence the table; families not in it fall back to peft's own table.
"""

from __future__ import annotations

import contextlib
import json
import re
import warnings
from collections.abc import Iterator
from pathlib import Path

from peft import LoraConfig, PeftModel, TaskType, get_peft_model, set_peft_model_state_dict
from peft.utils import TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING
from safetensors.torch import load_file
from torch import nn
from transformers import PreTrainedModel

from glam.config import AdapterConfig
from glam.scoring import model_kind
from glam.trunk import layer_stack, resolve_layers

LORA_TARGETS: dict[str, list[str]] = {
    # Llama family (SmolLM2, Llama 2/3, Mistral, Qwen, Gemma...): separate q/k/v projections.
    "llama": ["q_proj", "v_proj"],
    "mistral": ["q_proj", "v_proj"],
    "qwen2": ["q_proj", "v_proj"],
    "qwen3": ["q_proj", "v_proj"],
    "gemma": ["q_proj", "v_proj"],
    "gemma2": ["q_proj", "v_proj"],
    "phi": ["q_proj", "v_proj"],
    "phi3": ["qkv_proj"],
    "opt": ["q_proj", "v_proj"],
    # T5 family (Flan-T5, the paper's model): attention projections are named q, k, v, o.
    "t5": ["q", "v"],
    "mt5": ["q", "v"],
    "umt5": ["q", "v"],
    # GPT-2 family: one fused query/key/value projection.
    "gpt2": ["c_attn"],
    "gpt_neox": ["query_key_value"],
}


def default_lora_targets(model: PreTrainedModel) -> list[str]:
    """The modules LoRA adapts by default for this model's architecture."""
    model_type = model.config.model_type
    targets = LORA_TARGETS.get(
        model_type
    ) or TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING.get(model_type)
    if not targets:
        raise ValueError(
            f"no default LoRA target modules for model type {model_type!r}; set "
            "model.lora.target_modules to the names of its attention projections"
        )
    return list(targets)


def apply_lora(model: PreTrainedModel, adapter: AdapterConfig) -> PeftModel:
    """Freeze `model` and wrap it with a trainable LoRA adapter described by `adapter`.

    `adapter.layers` puts it on some layers only (peft's `layers_to_transform`), counted in the
    model's layer stack (`glam.trunk.layer_stack`: the decoder's for an encoder-decoder model,
    whose encoder then gets none).

    Raises:
        ValueError: `adapter.layers` names layers the model does not have.
    """
    task_type = (
        TaskType.SEQ_2_SEQ_LM if model_kind(model) == "encoder_decoder" else TaskType.CAUSAL_LM
    )
    placement = {}
    if adapter.layers is not None:
        name, stack = layer_stack(model)
        placement = {
            "layers_to_transform": resolve_layers(adapter.layers, len(stack)),
            # The stack's full name, so that an encoder's layers of the same name do not match.
            "layers_pattern": re.escape(name),
        }
    config = LoraConfig(
        r=adapter.r,
        lora_alpha=adapter.alpha,
        lora_dropout=adapter.dropout,
        target_modules=adapter.target_modules or default_lora_targets(model),
        # GPT-2's projections are Conv1D layers, whose weights are stored transposed.
        fan_in_fan_out=model.config.model_type == "gpt2",
        task_type=task_type,
        **placement,
    )
    with quiet_peft():
        adapted = get_peft_model(model, config)
    if adapter.init:
        load_adapter_weights(adapted, adapter.init)
    return adapted


def load_adapter_weights(model: PeftModel, folder: str | Path) -> None:
    """Copy the LoRA weights saved in `folder` (peft's format) into `model`'s adapter, which
    must have the same rank, alpha, target modules and layers (`model.lora.init`).

    Raises:
        FileNotFoundError: `folder` holds no adapter_config.json or adapter_model.safetensors.
        ValueError: the saved adapter is shaped otherwise, or its weights do not cover the
            model's adapter exactly.
    """
    folder = Path(folder)
    files = [folder / "adapter_config.json", folder / "adapter_model.safetensors"]
    missing = [path.name for path in files if not path.is_file()]
    if missing:
        raise FileNotFoundError(
            f"model.lora.init={str(folder)!r} holds no {' or '.join(missing)}: give the folder of "
            "a LoRA adapter in peft's format (a behavioural-cloning policy's bc.output_dir, or a "
            "clone's clone.output_dir/policy/adapter)"
        )
    saved = json.loads(files[0].read_text())
    built = model.peft_config["default"]
    for key in ("r", "lora_alpha", "target_modules", "layers_to_transform"):
        ours, theirs = _comparable(key, getattr(built, key)), _comparable(key, saved.get(key))
        if ours != theirs:
            raise ValueError(
                f"model.lora.init={str(folder)!r}: its adapter has {key}={theirs}, this run's "
                f"{ours}; set model.lora to the saved adapter's shape"
            )
    result = set_peft_model_state_dict(model, load_file(files[1]))
    trained = {name for name, p in model.named_parameters() if p.requires_grad}
    missing_keys = trained & set(result.missing_keys)
    if result.unexpected_keys or missing_keys:
        raise ValueError(
            f"model.lora.init={str(folder)!r}: its weights do not match this adapter "
            f"({len(result.unexpected_keys)} unexpected, {len(missing_keys)} missing)"
        )


def _comparable(key: str, value: object) -> object:
    """A LoRA setting as either config may hold it: modules as a set or a list, one layer bare
    or in a list."""
    if isinstance(value, (set, list, tuple)):
        return sorted(value)
    return [value] if key == "layers_to_transform" and isinstance(value, int) else value


def train_only_layers(model: PreTrainedModel, layers: int | list[int]) -> list[int]:
    """Freeze `model` but the transformer layers `layers` (the top K, or these indices) of its
    layer stack (`glam.trunk.layer_stack`), for a full fine-tuning of those layers only; the
    indices trained.

    Raises:
        ValueError: `layers` names layers the model does not have.
    """
    _, stack = layer_stack(model)
    chosen = resolve_layers(layers, len(stack), "model.trained_layers")
    model.requires_grad_(False)
    for index in chosen:
        stack[index].requires_grad_(True)
    return chosen


@contextlib.contextmanager
def quiet_peft() -> Iterator[None]:
    """Silence peft's read of transformers' deprecated `is_gradient_checkpointing` (a
    FutureWarning on every wrap or load that is not ours to fix)."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", ".*is_gradient_checkpointing.*", FutureWarning)
        yield


DROPOUT_ATTRIBUTES = ("dropout", "attention_dropout", "hidden_dropout", "activation_dropout")
"""Float attributes attention layers pass to their attention kernel (T5's `dropout`, Llama's
`attention_dropout`), beside their `nn.Dropout` modules."""


def disable_dropout(model: nn.Module) -> None:
    """Make every dropout of `model` the identity, in train mode too (call before adding LoRA,
    whose own dropout is configured apart)."""
    for module in model.modules():
        if isinstance(module, nn.Dropout):
            module.p = 0.0
        for name in DROPOUT_ATTRIBUTES:
            if isinstance(getattr(module, name, None), float):
                setattr(module, name, 0.0)


def enable_gradient_checkpointing(model: nn.Module) -> None:
    """Recompute activations in backward. Non-reentrant, so it works with a frozen base model."""
    kwargs = {"use_reentrant": False}
    if hasattr(model, "activation_checkpointing_enable"):  # transformers >= 5.x name
        model.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs)
    else:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)
