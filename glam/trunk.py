"""The frozen trunk of a language model: computed once per rollout, replayed by the update.

When LoRA adapts only the top layers of a model (`model.lora.layers`), everything below the
lowest adapted layer is a fixed function of the prompt: the rollout's forward already computes
it, and every epoch of the update, and the recomputation of the old log-probabilities, would
compute it again to the same numbers. Instead the rollout keeps the hidden states that enter the
lowest adapted layer (for an encoder-decoder model with adapters in the decoder only, the
encoder's output), and the update runs only the adapted layers from them. With 4 adapted layers
of 30, an update's forward and backward cost about a seventh of the whole model's.

This module is the model-level half: where a model's layers are, which of them LoRA trains, and
two context managers around an ordinary forward, one that keeps a layer's input and one that
replaces it while the layers below pass their input through untouched (their weights are never
read, so no work is done there). The scorer (`glam.scoring`) says which positions of a batch
belong to which prompt; the policy (`glam.policy.llm_policy`) stores one `TrunkStates` per
transition. Torch only: the policy package imports it without the language-model stack.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass

import torch
from torch import Tensor, nn


@dataclass
class TrunkStates:
    """What the frozen trunk computed for one transition (one prompt and its candidates)."""

    hidden: Tensor
    """`(tokens, hidden)` the hidden states entering the first adapted layer at each of the
    transition's positions, in the scorer's canonical order (`glam.scoring`), or the encoder's
    output for an encoder-decoder model."""
    base_hidden: Tensor | None = None
    """`(hidden,)` the state the value head reads with the adapter switched off
    (`policy.value_from_base`): a fixed function of the prompt too; None otherwise."""

    @property
    def nbytes(self) -> int:
        """Bytes the stored tensors take."""
        extra = 0 if self.base_hidden is None else self.base_hidden.nbytes
        return self.hidden.nbytes + extra


def layer_stack(model: nn.Module) -> tuple[str, nn.ModuleList]:
    """The qualified name and the `ModuleList` of a model's transformer layers: a decoder-only
    model's (`model.layers` for Llama, `transformer.h` for GPT-2), an encoder-decoder model's
    decoder's (`decoder.block` for T5, `model.decoder.layers` for BART). It is the outermost
    module list with as many modules as the config has layers.

    Raises:
        ValueError: no such list (the message names what was looked for).
    """
    config = getattr(model, "config", None)
    if config is not None and getattr(config, "is_encoder_decoder", False):
        count = getattr(config, "num_decoder_layers", None) or getattr(
            config, "decoder_layers", None
        )
        part = "decoder"
    else:
        text_config = config.get_text_config() if hasattr(config, "get_text_config") else config
        count = getattr(text_config, "num_hidden_layers", None)
        part = ""
    found = [
        (name, module)
        for name, module in model.named_modules()
        if isinstance(module, nn.ModuleList)
        and len(module) == count
        and (not part or part in name.split("."))
    ]
    depth = min((name.count(".") for name, _ in found), default=None)
    outermost = [(name, module) for name, module in found if name.count(".") == depth]
    if len(outermost) != 1:
        raise ValueError(
            f"cannot tell which module list of {type(model).__name__} holds its {count} "
            f"{part or 'transformer'} layers (found {[n for n, _ in outermost] or 'none'})"
        )
    return outermost[0]


def resolve_layers(
    layers: int | list[int], count: int, key: str = "model.lora.layers"
) -> list[int]:
    """`model.lora.layers` or `key` (a number of top layers, or indices) as indices of a stack of
    `count`.

    Raises:
        ValueError: more layers than the stack has, or an index past its top.
    """
    if isinstance(layers, int):
        if layers > count:
            raise ValueError(f"{key}={layers}: the model has {count} layers")
        return list(range(count - layers, count))
    if max(layers) >= count:
        raise ValueError(f"{key}={layers}: the model's layers are numbered 0 to {count - 1}")
    return sorted(layers)


def trainable_layers(layers: nn.ModuleList) -> list[int]:
    """Indices of the layers of `layers` with a parameter that requires a gradient."""
    return [i for i, layer in enumerate(layers) if any(p.requires_grad for p in layer.parameters())]


def _hidden_argument(args: tuple, kwargs: dict) -> Tensor:
    return args[0] if args else kwargs["hidden_states"]


def _pass_through(*args: object, **kwargs: object) -> object:
    """A layer that returns its input hidden states (transformers 5's layers return a tensor)."""
    return _hidden_argument(args, kwargs)


@contextlib.contextmanager
def keep_layer_input(layers: nn.ModuleList, first: int) -> Iterator[list[Tensor]]:
    """Within the block, each forward appends the hidden states entering `layers[first]`
    (detached) to the yielded list."""
    kept: list[Tensor] = []

    def keep(module: nn.Module, args: tuple, kwargs: dict) -> None:
        kept.append(_hidden_argument(args, kwargs).detach())

    handle = layers[first].register_forward_pre_hook(keep, with_kwargs=True)
    try:
        yield kept
    finally:
        handle.remove()


@contextlib.contextmanager
def run_from_layer(layers: nn.ModuleList, first: int, hidden: Tensor) -> Iterator[None]:
    """Within the block, a forward of the model skips `layers[:first]` (each returns its input)
    and feeds `hidden` to `layers[first]` in place of what came from below.

    The rest of the forward is the model's own: embeddings (looked up and discarded), rotary
    tables from the position ids, the mask, the adapted layers, the final norm and the head, so
    whatever a family does there (logit scaling, soft-capping) is done as usual. Hooks on the
    skipped layers still run (DeepSpeed ZeRO-3 still gathers their weights).
    """

    def replace(module: nn.Module, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
        if args:
            return (hidden.to(args[0].dtype), *args[1:]), kwargs
        return args, {**kwargs, "hidden_states": hidden.to(kwargs["hidden_states"].dtype)}

    handle = layers[first].register_forward_pre_hook(replace, with_kwargs=True)
    try:
        with _passing_through(list(layers[:first])):
            yield
    finally:
        handle.remove()


@contextlib.contextmanager
def _passing_through(skipped: list[nn.Module]) -> Iterator[None]:
    for layer in skipped:
        layer.forward = _pass_through
    try:
        yield
    finally:
        for layer in skipped:
            del layer.forward


def stack_hidden(trunk: list[TrunkStates], device: torch.device) -> Tensor:
    """`(sum of tokens, hidden)`: every transition's trunk states one after the other."""
    return torch.cat([states.hidden for states in trunk]).to(device)
