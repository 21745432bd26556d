"""A throughput and memory model of PPO training with the packed scorer, for sizing GPU runs.

Pure arithmetic on a model's shape and a run's workload (no torch): how many FLOPs one env-step
of rollout and one transition of the update cost, how much memory a device needs, and how long a
campaign takes on given hardware at a given fraction of its peak (MFU). `calibrate` turns a
measured seconds-per-update into the MFU the measuring machine achieved; `project` turns an MFU
back into seconds, env-steps/s and hours. docs/scaling.md explains the counts and what they
leave out; `scripts/estimate_throughput.py` is the command-line front end.

What one forward computes (`glam.scoring`, one prompt of P tokens, C candidates of W tokens):

- causal: one row of `T = (P - 1) + C * W` tokens (the prompt but its last token, then C slots
  of W tokens, each starting with the last prompt token again) under a custom 4-D mask; logits
  only at the C * W slot positions (`logits_to_keep`).
- encoder-decoder: the encoder over the P prompt tokens; the decoder over `D = C * W` tokens
  (C slots of `[start, c_1, ..., c_{W-1}]`) with cross-attention keys and values projected once
  from the P encoder states per decoder layer; logits at the D decoder positions.

W is the slot width: every slot is padded to the longest candidate's tokens. Prompts are taken to
be all P tokens long (no padding, one prompt per row).

Counting rules (FLOPs = 2 x multiply-accumulates; matrix products only: norms, activations,
softmax, rotary embeddings and the embedding lookup are left out, a few percent at most):

- a linear layer `n_in -> n_out` over t tokens: `2 * n_in * n_out * t`;
- attention, per layer: `4 * heads * head_dim * queries * keys` (Q.K^T and A.V), counted dense
  over the whole row: the packed layout's custom mask rules out kernels that skip masked blocks,
  so the masked-out products are computed and count as executed work;
- LoRA of rank r on a linear layer: `2 * r * (n_in + n_out) * t`;
- the value head (hidden -> value_hidden_sizes -> 1) once per prompt.

Backward, per transition: the gradient with respect to a layer's input costs one forward of that
layer, the gradient with respect to its weight another. Fully fine-tuned: 2x forward everywhere.
With LoRA the base weights are frozen, so frozen linear layers and the LM head pay only the input
gradient (1x forward), while LoRA's own layers, the value head and the attention products (both
operands are activations) pay 2x. We count the input gradient through every layer; the first
layer's q/k/v projections read the frozen embeddings and in fact need none, which makes the LoRA
count high by those (1/num_layers of the q/k/v share; `tests/test_scaling.py` measures it).
Gradient checkpointing adds one more forward of the transformer layers.

Top layers only (`tuned_layers`: `model.lora.layers`, or `model.trained_layers` fully fine-tuned;
counted in the layer stack, the decoder's for an encoder-decoder model): LoRA's products, its
parameters and the trained weights are those of the tuned layers only. Nothing below the lowest
tuned layer requires a gradient, so the backward runs from the top down to that layer only (the
layers above it, the LM head, the value head) with the rules above, its own q/k/v input gradients
counted as the first layer's are; the LM head is trained only by a full fine-tuning of every
layer. With the encoder frozen, T5's cross-attention keys and values read states that need no
gradient: their projections pay a weight gradient when trained, nothing otherwise.

The trunk's cache (`cache_trunk`, `glam.trunk`): the rollout keeps the hidden states entering the
lowest tuned layer (an encoder-decoder model: the encoder's output), and every forward of the
update (each epoch's, and the recompute's) runs from them: the stack's layers from the lowest
tuned one up (an encoder-decoder model: the whole decoder, no encoder), the LM head, the value
head. The rollout still runs the whole model at every step. Without the cache the update's
forwards run the whole model and its backward stops at the lowest tuned layer all the same.

Per update of `envs * frames_per_env` transitions: one forward per env-step, one more per env to
bootstrap the last value, then `epochs` forward + backward passes per transition, plus one
forward per transition when old log-probs are recomputed (the trainer does so by default unless
weights and compute are fp32).
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

GIB = 2**30
"""Bytes in a GiB; memory figures are GiB (an "80 GB" A100 holds 80 GiB)."""

KINDS = ("causal", "encoder_decoder")

PRECISIONS: dict[str, tuple[str, int, int]] = {
    # name: (compute class for the peak, bytes per base weight, bytes per activation)
    "fp32": ("fp32", 4, 4),
    "tf32": ("tf32", 4, 4),  # fp32 storage, TensorFloat-32 matmuls (GPUs; off by default)
    "bf16": ("bf16", 2, 2),  # weights stored in bf16 (model.dtype=bfloat16)
    "amp-bf16": ("bf16", 4, 2),  # fp32 weights, bf16 autocast (model.autocast_bf16)
}
"""Precisions: which peak applies, how base weights are stored, how activations are kept."""

LORA_TARGETS = ("q", "k", "v", "o", "gate", "up", "down")
"""Generic names of the linear layers LoRA can adapt (T5's q/k/v/o match self- and
cross-attention alike, as peft's suffix match does)."""

TARGET_ALIASES = {
    "q_proj": "q",
    "k_proj": "k",
    "v_proj": "v",
    "o_proj": "o",
    "gate_proj": "gate",
    "up_proj": "up",
    "down_proj": "down",
    "wi_0": "gate",
    "wi_1": "up",
    "wi": "up",
    "wo": "down",
}
"""Module names of the Llama and T5 families, mapped to the generic names."""


def _check_choice(name: str, value: object, choices: tuple) -> None:
    if value not in choices:
        raise ValueError(f"{name}={value!r} is not one of {list(choices)}")


def _check_positive(name: str, value: float) -> None:
    if not (isinstance(value, int | float) and math.isfinite(value) and value > 0):
        raise ValueError(f"{name} must be > 0, got {value!r}")


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _checked_layers(layers: object) -> int | tuple[int, ...] | None:
    """`tuned_layers` as a count >= 1, a sorted tuple of distinct indices >= 0, or None."""
    if layers is None:
        return None
    if _is_int(layers):
        _check_positive("tuned_layers", layers)
        return layers
    indices = list(layers) if isinstance(layers, Sequence) else []
    if not indices or not all(_is_int(i) and i >= 0 for i in indices):
        raise ValueError(f"tuned_layers={layers!r}: give a count, layer indices >= 0, or None")
    if len(set(indices)) != len(indices):
        raise ValueError(f"tuned_layers={layers!r}: an index is repeated")
    return tuple(sorted(indices))


# --------------------------------------------------------------------------------------------
# Model shapes
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ModelShape:
    """The dimensions of a transformer that the counts depend on."""

    name: str
    kind: str
    """`causal` (decoder-only) or `encoder_decoder` (T5 family)."""
    num_layers: int
    """Decoder layers (all layers of a causal model)."""
    hidden_size: int
    intermediate_size: int
    num_heads: int
    num_kv_heads: int
    """Key/value heads (grouped-query attention); T5: equal to num_heads."""
    head_dim: int
    vocab_size: int
    gated_mlp: bool = True
    """Three MLP matrices (SwiGLU, gated-GELU) rather than two."""
    tie_embeddings: bool = True
    """The LM head shares the input embedding matrix (parameters, not FLOPs)."""
    num_encoder_layers: int = 0
    """Encoder layers (encoder-decoder models only)."""

    def __post_init__(self) -> None:
        _check_choice("kind", self.kind, KINDS)
        for name in ("num_layers", "hidden_size", "intermediate_size", "num_heads", "head_dim"):
            _check_positive(name, getattr(self, name))
        for name in ("num_kv_heads", "vocab_size"):
            _check_positive(name, getattr(self, name))
        if self.num_heads % self.num_kv_heads:
            raise ValueError(
                f"num_heads ({self.num_heads}) must be a multiple of num_kv_heads "
                f"({self.num_kv_heads})"
            )
        if (self.kind == "encoder_decoder") != (self.num_encoder_layers > 0):
            raise ValueError(
                "num_encoder_layers must be > 0 for an encoder-decoder model and 0 for a causal one"
            )

    @property
    def attention_width(self) -> int:
        """num_heads * head_dim: the width of the queries and of the attention output."""
        return self.num_heads * self.head_dim

    @property
    def kv_width(self) -> int:
        """num_kv_heads * head_dim: the width of the keys and of the values."""
        return self.num_kv_heads * self.head_dim


MODEL_PRESETS: dict[str, ModelShape] = {
    # The embedded default model: /root/.cache/glam/models/smollm2-135m/config.json.
    "smollm2-135m": ModelShape(
        name="smollm2-135m",
        kind="causal",
        num_layers=30,
        hidden_size=576,
        intermediate_size=1536,
        num_heads=9,
        num_kv_heads=3,
        head_dim=64,
        vocab_size=49152,
        tie_embeddings=True,
    ),
    # google/flan-t5-large (the paper's model): T5 v1.1 layout, untied LM head.
    "flan-t5-large": ModelShape(
        name="flan-t5-large",
        kind="encoder_decoder",
        num_layers=24,
        num_encoder_layers=24,
        hidden_size=1024,
        intermediate_size=2816,
        num_heads=16,
        num_kv_heads=16,
        head_dim=64,
        vocab_size=32128,
        tie_embeddings=False,
    ),
    # The shape of meta-llama/Llama-3.2-1B.
    "llama-1b-like": ModelShape(
        name="llama-1b-like",
        kind="causal",
        num_layers=16,
        hidden_size=2048,
        intermediate_size=8192,
        num_heads=32,
        num_kv_heads=8,
        head_dim=64,
        vocab_size=128256,
        tie_embeddings=True,
    ),
}


def shape_from_hf_config(config: Mapping[str, Any], name: str = "model") -> ModelShape:
    """The shape of a Llama-like or T5-family model from its `config.json` contents."""
    if config.get("is_encoder_decoder") or "d_model" in config:
        if "d_model" not in config:
            raise ValueError(f"{name}: only T5-family encoder-decoder configs are understood")
        heads = config["num_heads"]
        return ModelShape(
            name=name,
            kind="encoder_decoder",
            num_layers=config.get("num_decoder_layers") or config["num_layers"],
            num_encoder_layers=config["num_layers"],
            hidden_size=config["d_model"],
            intermediate_size=config["d_ff"],
            num_heads=heads,
            num_kv_heads=heads,
            head_dim=config.get("d_kv", config["d_model"] // heads),
            vocab_size=config["vocab_size"],
            gated_mlp="gated" in config.get("feed_forward_proj", "relu"),
            tie_embeddings=config.get("tie_word_embeddings", True),
        )
    needed = ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads")
    missing = [key for key in needed if key not in config]
    if missing:
        raise ValueError(f"{name}: not a Llama-like config (no {', '.join(missing)})")
    heads = config["num_attention_heads"]
    return ModelShape(
        name=name,
        kind="causal",
        num_layers=config["num_hidden_layers"],
        hidden_size=config["hidden_size"],
        intermediate_size=config["intermediate_size"],
        num_heads=heads,
        num_kv_heads=config.get("num_key_value_heads") or heads,
        head_dim=config.get("head_dim") or config["hidden_size"] // heads,
        vocab_size=config["vocab_size"],
        gated_mlp=True,
        tie_embeddings=config.get("tie_word_embeddings", True),
    )


def resolve_shape(spec: str) -> ModelShape:
    """A preset name, or the path of a Hugging Face `config.json` (or of its folder)."""
    if spec in MODEL_PRESETS:
        return MODEL_PRESETS[spec]
    path = Path(spec)
    if path.is_dir():
        path = path / "config.json"
    if not path.is_file():
        raise ValueError(
            f"unknown model {spec!r}: give one of {sorted(MODEL_PRESETS)} or a config.json path"
        )
    return shape_from_hf_config(json.loads(path.read_text()), name=str(spec))


# --------------------------------------------------------------------------------------------
# The workload and the hardware
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class WorkloadConfig:
    """One PPO run's shape: prompts, candidates, rollout, update, fine-tuning, precision.

    Defaults are the GLAM paper's run (`configs/glam_paper.yaml`) with the project's default
    fine-tuning (LoRA r=8 on q and v) and precision (fp32).
    """

    prompt_tokens: int = 240
    """P: tokens of a prompt (all prompts taken to be this long)."""
    candidates: int = 6
    """C: candidate actions scored per prompt."""
    candidate_tokens: int = 2
    """W: tokens per candidate slot (the longest candidate's tokens)."""
    envs: int = 32
    """Environments stepped together, over all devices."""
    frames_per_env: int = 40
    """Env-steps per environment per update."""
    epochs: int = 4
    """PPO passes over the rollout per update."""
    minibatch_size: int = 64
    """Transitions per optimizer step, over all devices."""
    micro_batch_size: int | None = 8
    """Transitions per forward/backward on one device; None: the whole local minibatch."""
    lora_rank: int | None = 8
    """LoRA rank; None: full fine-tuning."""
    lora_targets: tuple[str, ...] = ("q", "v")
    """Linear layers LoRA adapts (names of `LORA_TARGETS`, or Llama/T5 module names)."""
    tuned_layers: int | tuple[int, ...] | None = None
    """The layers that train, in the layer stack (a causal model's layers, an encoder-decoder
    model's decoder layers): LoRA's (`model.lora.layers`) or, fully fine-tuned, the only ones
    trained (`model.trained_layers`, everything else frozen). A number K: the top K; a tuple:
    those indices, from 0 at the bottom; None: every layer (under LoRA the encoder's too; fully
    fine-tuned, the embeddings and the LM head as well)."""
    precision: str = "fp32"
    """One of `PRECISIONS`."""
    gradient_checkpointing: bool = False
    """Recompute the layers' activations in backward (one more forward, far less memory)."""
    recompute_logprobs: bool | None = None
    """One extra forward per transition per update; None: on unless the precision is fp32/tf32
    (the trainer's default)."""
    value_hidden_sizes: tuple[int, ...] = (1024, 1024)
    """Hidden widths of the value head's MLP."""
    cache_trunk: bool = False
    """The update runs from the hidden states the rollout kept at the lowest tuned layer (the
    encoder's output for an encoder-decoder model): `ppo.cache_trunk` as the trainer resolved
    it; `trunk_cache_problem` says where it applies."""

    def __post_init__(self) -> None:
        for name in (
            "prompt_tokens",
            "candidates",
            "candidate_tokens",
            "envs",
            "frames_per_env",
            "epochs",
            "minibatch_size",
        ):
            _check_positive(name, getattr(self, name))
        if self.micro_batch_size is not None:
            _check_positive("micro_batch_size", self.micro_batch_size)
        if self.lora_rank is not None:
            _check_positive("lora_rank", self.lora_rank)
            if not self.lora_targets:
                raise ValueError("lora_targets is empty: name the layers LoRA adapts")
        _check_choice("precision", self.precision, tuple(PRECISIONS))
        object.__setattr__(self, "lora_targets", _generic_targets(self.lora_targets))
        object.__setattr__(self, "tuned_layers", _checked_layers(self.tuned_layers))
        object.__setattr__(self, "value_hidden_sizes", tuple(self.value_hidden_sizes))

    @property
    def full_finetune(self) -> bool:
        return self.lora_rank is None

    @property
    def layers_key(self) -> str:
        """The config key that chooses `tuned_layers`, for messages."""
        return "model.trained_layers" if self.full_finetune else "model.lora.layers"

    @property
    def frames_per_update(self) -> int:
        return self.envs * self.frames_per_env

    @property
    def recomputes(self) -> bool:
        if self.recompute_logprobs is not None:
            return self.recompute_logprobs
        return self.precision not in ("fp32", "tf32")


@dataclass(frozen=True)
class HardwareSpec:
    """One device: its dense peak FLOP/s per compute class and its memory."""

    name: str
    peak_tflops: Mapping[str, float] = field(default_factory=dict)
    """Dense peak TFLOP/s by compute class (`fp32`, `tf32`, `bf16`); empty: ask the user."""
    memory_gib: float | None = None

    def peak_flops(self, precision: str) -> float:
        """Peak FLOP/s for a precision of `PRECISIONS`."""
        _check_choice("precision", precision, tuple(PRECISIONS))
        compute = PRECISIONS[precision][0]
        if compute not in self.peak_tflops:
            raise ValueError(
                f"hardware {self.name!r} has no {compute} peak: give one (for a CPU, "
                "cores x GHz x FLOPs per cycle: cpu_peak_tflops)"
            )
        return self.peak_tflops[compute] * 1e12


HARDWARE_PRESETS: dict[str, HardwareSpec] = {
    # NVIDIA A100 SXM 80GB datasheet, dense (no sparsity): FP32 19.5, TF32 156, BF16 312.
    "a100": HardwareSpec("a100", {"fp32": 19.5, "tf32": 156.0, "bf16": 312.0}, 80.0),
    # NVIDIA H100 SXM datasheet, dense: FP32 67, TF32 494.7, BF16 989.4.
    "h100": HardwareSpec("h100", {"fp32": 67.0, "tf32": 494.7, "bf16": 989.4}, 80.0),
    # A CPU's peak depends on the part: cores x GHz x FLOPs per cycle (`cpu_peak_tflops`).
    "cpu": HardwareSpec("cpu", {}, None),
}


def cpu_peak_tflops(cores: int, ghz: float, flops_per_cycle: float) -> float:
    """A CPU's peak TFLOP/s: cores x clock x FLOPs per cycle and core.

    FLOPs per cycle: 2 (FMA) x SIMD lanes x FMA units, e.g. 2 x 16 fp32 lanes x 2 units = 64 for
    AVX-512 with two FMA units, 32 with one; twice that for bf16 dot products (AVX512-BF16).
    """
    for name, value in (("cores", cores), ("ghz", ghz), ("flops_per_cycle", flops_per_cycle)):
        _check_positive(name, value)
    return cores * ghz * 1e9 * flops_per_cycle / 1e12


# --------------------------------------------------------------------------------------------
# The layers, as the counts see them
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Linear:
    target: str
    """Generic name (`LORA_TARGETS`)."""
    fan_in: int
    fan_out: int
    role: str
    """Which tokens it reads: `row` (causal row), `encoder`, `decoder`, `cross_kv` (the encoder
    states, projected in every decoder layer)."""
    layers: int


def _layer_linears(shape: ModelShape, role: str, layers: int) -> list[_Linear]:
    d, f = shape.hidden_size, shape.intermediate_size
    attention = [
        _Linear("q", d, shape.attention_width, role, layers),
        _Linear("k", d, shape.kv_width, role, layers),
        _Linear("v", d, shape.kv_width, role, layers),
        _Linear("o", shape.attention_width, d, role, layers),
    ]
    mlp = [_Linear("gate", d, f, role, layers)] if shape.gated_mlp else []
    mlp += [_Linear("up", d, f, role, layers), _Linear("down", f, d, role, layers)]
    return attention + mlp


def _linears(shape: ModelShape, top_layers: int | None = None) -> list[_Linear]:
    """Every weight matrix of the transformer layers; with `top_layers`, those of the top
    `top_layers` layers of the layer stack only (an encoder-decoder model's encoder left out)."""
    layers = shape.num_layers if top_layers is None else top_layers
    if shape.kind == "causal":
        return _layer_linears(shape, "row", layers)
    d = shape.hidden_size
    cross = [
        _Linear("q", d, shape.attention_width, "decoder", layers),
        _Linear("k", d, shape.kv_width, "cross_kv", layers),
        _Linear("v", d, shape.kv_width, "cross_kv", layers),
        _Linear("o", shape.attention_width, d, "decoder", layers),
    ]
    decoder = _layer_linears(shape, "decoder", layers) + cross
    if top_layers is not None:
        return decoder
    return _layer_linears(shape, "encoder", shape.num_encoder_layers) + decoder


def _attention_blocks(
    shape: ModelShape, w: WorkloadConfig, top_layers: int | None = None
) -> list[tuple[int, int, int]]:
    """(queries, keys, layers) of every attention product of one prompt's forward (of the top
    `top_layers` layers of the stack only, as `_linears`)."""
    p, d = w.prompt_tokens, w.candidates * w.candidate_tokens
    layers = shape.num_layers if top_layers is None else top_layers
    if shape.kind == "causal":
        t = _row_tokens(w)
        return [(t, t, layers)]
    decoder = [(d, d, layers), (d, p, layers)]
    return decoder if top_layers is not None else [(p, p, shape.num_encoder_layers), *decoder]


def _row_tokens(w: WorkloadConfig) -> int:
    """T: tokens of a causal packed row, `(P - 1) + C * W`."""
    return w.prompt_tokens - 1 + w.candidates * w.candidate_tokens


def _tokens(role: str, w: WorkloadConfig) -> int:
    return {
        "row": _row_tokens(w),
        "encoder": w.prompt_tokens,
        "cross_kv": w.prompt_tokens,
        "decoder": w.candidates * w.candidate_tokens,
    }[role]


def _generic_targets(targets: Sequence[str]) -> tuple[str, ...]:
    generic = []
    for target in targets:
        name = TARGET_ALIASES.get(target, target)
        if name not in LORA_TARGETS:
            raise ValueError(
                f"LoRA target {target!r} is not one of {list(LORA_TARGETS)} "
                f"(or {sorted(TARGET_ALIASES)})"
            )
        if name not in generic:
            generic.append(name)
    return tuple(generic)


def _adapted(shape: ModelShape, w: WorkloadConfig) -> list[_Linear]:
    """The linear layers that carry LoRA, each counted over the tuned layers."""
    if w.full_finetune:
        return []
    if "gate" in w.lora_targets and not shape.gated_mlp:
        raise ValueError(f"{shape.name} has no gate projection to adapt (its MLP is not gated)")
    return [layer for layer in _tuned_linears(shape, w) if layer.target in w.lora_targets]


def _tuned_linears(shape: ModelShape, w: WorkloadConfig) -> list[_Linear]:
    """The weight matrices of the tuned layers (`WorkloadConfig.tuned_layers`): every layer's,
    or those of as many layers of the stack (any K layers of a stack have the same matrices)."""
    if w.tuned_layers is None:
        return _linears(shape)
    return _linears(shape, len(tuned_layer_indices(shape, w)))


def tuned_layer_indices(shape: ModelShape, w: WorkloadConfig) -> list[int]:
    """The indices, from 0 at the bottom of the layer stack, of the layers that train (every
    layer when `tuned_layers` is None), as `glam.trunk.resolve_layers` reads the config.

    Raises:
        ValueError: more layers than the stack has, or an index past its top.
    """
    count, layers = shape.num_layers, w.tuned_layers
    if layers is None:
        return list(range(count))
    if isinstance(layers, int):
        if layers > count:
            raise ValueError(f"{w.layers_key}={layers}: {shape.name} has {count} layers")
        return list(range(count - layers, count))
    if layers[-1] >= count:
        raise ValueError(
            f"{w.layers_key}={list(layers)}: {shape.name}'s layers are numbered 0 to {count - 1}"
        )
    return list(layers)


def trunk_cache_problem(shape: ModelShape, w: WorkloadConfig) -> str | None:
    """Why the update cannot run from the rollout's kept trunk states, or None when it can:
    `LLMActorCritic.trunk_cache_problem`'s rule on the workload's numbers (something below the
    tuned layers trains, or nothing is below them).

    Raises:
        ValueError: `tuned_layers` names layers the model does not have.
    """
    lowest = tuned_layer_indices(shape, w)[0]  # checks the layers first
    if w.tuned_layers is None and w.full_finetune:
        return (
            "the whole model is fine-tuned (model.lora.enabled=false): every layer changes with "
            "each step, so there is no frozen trunk to keep (model.trained_layers=K trains the "
            "top K layers only)"
        )
    if shape.kind == "encoder_decoder":
        if w.tuned_layers is None:
            return (
                "the encoder is trained: set model.lora.layers to train only the decoder's "
                "layers, and the encoder's output is kept instead"
            )
        return None
    if lowest > 0:
        return None
    if w.full_finetune:
        return (
            "model.trained_layers includes the lowest layer: nothing below it is frozen; set "
            "model.trained_layers=K to train the top K layers"
        )
    return (
        "LoRA adapts the lowest layer (model.lora.layers=null adapts every layer): nothing "
        "below it is frozen; set model.lora.layers=K to adapt the top K layers"
    )


def _grad_layers(shape: ModelShape, w: WorkloadConfig) -> int | None:
    """How many top layers of the stack the backward runs through (from the lowest tuned one
    up); None: the whole model."""
    if w.tuned_layers is None:
        return None
    return shape.num_layers - tuned_layer_indices(shape, w)[0]


def _update_layers(shape: ModelShape, w: WorkloadConfig) -> int | None:
    """How many top layers of the stack the update's forwards run (from the trunk's kept
    states: a causal model's from the lowest tuned layer up, an encoder-decoder model's whole
    decoder); None: the whole model, without the cache.

    Raises:
        ValueError: `cache_trunk` where the cache does not apply.
    """
    if not w.cache_trunk:
        return None
    problem = trunk_cache_problem(shape, w)
    if problem is not None:
        raise ValueError(f"cache_trunk=True, but {problem}")
    if shape.kind == "encoder_decoder":
        return shape.num_layers
    return _grad_layers(shape, w)


# --------------------------------------------------------------------------------------------
# Parameters
# --------------------------------------------------------------------------------------------


def count_parameters(shape: ModelShape) -> int:
    """Weights of the language model: every matrix and the embeddings (norm scales, biases and
    T5's relative position buckets, well under 0.1%, are left out)."""
    matrices = sum(m.fan_in * m.fan_out * m.layers for m in _linears(shape))
    embeddings = shape.vocab_size * shape.hidden_size
    return matrices + embeddings * (1 if shape.tie_embeddings else 2)


def lora_parameters(shape: ModelShape, w: WorkloadConfig) -> int:
    """LoRA's A and B matrices: `r * (n_in + n_out)` per adapted layer; 0 when fully tuned."""
    if w.full_finetune:
        return 0
    return sum(w.lora_rank * (m.fan_in + m.fan_out) * m.layers for m in _adapted(shape, w))


def tuned_weights(shape: ModelShape, w: WorkloadConfig) -> int:
    """The language model's own weights that train: every one (`count_parameters`) in a full
    fine-tuning of every layer, the tuned layers' matrices in one of some layers, none with
    LoRA."""
    if not w.full_finetune:
        return 0
    if w.tuned_layers is None:
        return count_parameters(shape)
    return sum(m.fan_in * m.fan_out * m.layers for m in _tuned_linears(shape, w))


def value_head_parameters(shape: ModelShape, w: WorkloadConfig) -> int:
    """The value MLP's weights and biases."""
    widths = [shape.hidden_size, *w.value_hidden_sizes, 1]
    return sum(a * b + b for a, b in zip(widths[:-1], widths[1:], strict=True))


# --------------------------------------------------------------------------------------------
# FLOPs
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ForwardFlops:
    """FLOPs of one scoring forward: one prompt and all its candidates, plus the value head."""

    linear: float
    """The transformer layers' weight matrices."""
    attention: float
    """Q.K^T and A.V, dense over the packed layout."""
    lm_head: float
    """Logits at the C * W candidate positions only."""
    lora: float
    """LoRA's A and B products (0 when fully fine-tuned)."""
    value_head: float
    cross_kv: float = 0.0
    """Of `linear`: the cross-attention key and value projections of the encoder's states
    (encoder-decoder models), whose input needs a gradient only when the encoder trains."""

    @property
    def total(self) -> float:
        return self.linear + self.attention + self.lm_head + self.lora + self.value_head

    @property
    def layers(self) -> float:
        """What gradient checkpointing recomputes: the transformer layers."""
        return self.linear + self.attention + self.lora


def forward_flops(
    shape: ModelShape, w: WorkloadConfig, top_layers: int | None = None
) -> ForwardFlops:
    """FLOPs of one scoring forward of one prompt (see the module docstring for the layout).

    `top_layers`: a forward from kept states through the top `top_layers` layers of the layer
    stack only (no encoder), the LM head and the value head: the update's forward from the
    trunk's cache, or the part of a forward the backward runs through. None: the whole model.
    """
    linears = _linears(shape, top_layers)
    linear = sum(2 * m.fan_in * m.fan_out * _tokens(m.role, w) * m.layers for m in linears)
    cross_kv = sum(
        2 * m.fan_in * m.fan_out * _tokens(m.role, w) * m.layers
        for m in linears
        if m.role == "cross_kv"
    )
    attention = sum(
        4 * shape.attention_width * queries * keys * layers
        for queries, keys, layers in _attention_blocks(shape, w, top_layers)
    )
    positions = w.candidates * w.candidate_tokens
    lm_head = 2 * shape.hidden_size * shape.vocab_size * positions
    lora = sum(
        2 * w.lora_rank * (m.fan_in + m.fan_out) * _tokens(m.role, w) * m.layers
        for m in _adapted(shape, w)
    )
    widths = [shape.hidden_size, *w.value_hidden_sizes, 1]
    value_head = sum(2 * a * b for a, b in zip(widths[:-1], widths[1:], strict=True))
    return ForwardFlops(linear, attention, lm_head, lora, value_head, cross_kv)


def backward_flops(forward: ForwardFlops, w: WorkloadConfig) -> float:
    """FLOPs of one transition's backward (gradient checkpointing's recompute included), from
    `forward`, the FLOPs of what it runs through: the whole forward, or with tuned top layers
    only `forward_flops(shape, w, top_layers)` from the lowest tuned layer up."""
    weights = 1 if w.full_finetune else 0  # the layers' own weight gradients
    encoder_trains = 1 if w.tuned_layers is None else 0  # the cross keys' and values' input
    lm_head_trains = 1 if w.full_finetune and w.tuned_layers is None else 0
    total = (
        (1 + weights) * (forward.linear - forward.cross_kv)
        + (encoder_trains + weights) * forward.cross_kv
        + (1 + lm_head_trains) * forward.lm_head
        + 2 * (forward.attention + forward.lora + forward.value_head)
    )
    return total + (forward.layers if w.gradient_checkpointing else 0.0)


@dataclass(frozen=True)
class StepFlops:
    """FLOPs of a PPO run, per frame (env-step) and per update."""

    forward: ForwardFlops
    """One scoring forward (one env-step of rollout)."""
    update_forward: ForwardFlops
    """One forward of the update (each epoch's, the recompute's): from the trunk's kept states
    when it is cached, else the same as `forward`."""
    backward: float
    """One transition's backward."""
    rollout_per_frame: float
    """The env-step's forward plus its share of the bootstrap forward at the rollout's end."""
    update_per_frame: float
    """`epochs * (update_forward + backward)`, plus the recompute's `update_forward` when on."""
    frames_per_update: int

    @property
    def per_frame(self) -> float:
        return self.rollout_per_frame + self.update_per_frame

    @property
    def rollout_per_update(self) -> float:
        return self.rollout_per_frame * self.frames_per_update

    @property
    def update_per_update(self) -> float:
        return self.update_per_frame * self.frames_per_update

    @property
    def per_update(self) -> float:
        return self.per_frame * self.frames_per_update


def step_flops(shape: ModelShape, w: WorkloadConfig) -> StepFlops:
    """Rollout and update FLOPs of one frame of the run `w` on model `shape`.

    Raises:
        ValueError: `cache_trunk` where the cache does not apply (`trunk_cache_problem`), or
            `tuned_layers` the model does not have.
    """
    forward = forward_flops(shape, w)
    update_forward = forward_flops(shape, w, _update_layers(shape, w))
    backward = backward_flops(forward_flops(shape, w, _grad_layers(shape, w)), w)
    rollout = forward.total * (1 + 1 / w.frames_per_env)
    once = update_forward.total
    update = w.epochs * (once + backward) + (once if w.recomputes else 0.0)
    return StepFlops(forward, update_forward, backward, rollout, update, w.frames_per_update)


# --------------------------------------------------------------------------------------------
# Memory
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class MemoryEstimate:
    """Bytes on one device (see `estimate_memory` for what each term counts)."""

    parameters: int
    trainable_parameters: int
    """LoRA and value head, or the trained weights (every weight, or the tuned layers') and the
    value head."""
    weights: float
    autocast_copies: float
    """bf16 copies of the weights autocast keeps during a forward (amp-bf16 only)."""
    trainable_bytes: float
    """Bytes of the trainable parameters: one full gradient, the size of a data-parallel
    all-reduce per optimizer step."""
    gradients: float
    optimizer: float
    """Adam's two moments."""
    activations_per_transition: float
    micro_batch: int
    activations: float
    """Saved activations of one micro-batch (forward kept for backward, in the layers the
    backward runs through)."""
    rollout_batch: int
    """Prompts per device in one rollout forward."""
    rollout_working: float
    """Transient memory of one rollout forward (no gradients) of `rollout_batch` prompts."""
    mask_per_prompt: float
    """The packed layout's attention mask (and T5's position bias), once per prompt."""
    attention_scores_per_prompt: float
    """One layer's attention probabilities of one prompt (materialised by eager/math kernels)."""
    kv_per_prompt: float
    """Keys and values of one prompt over all layers in the packed layout (the prompt's once)."""
    kv_per_prompt_copied: float
    """The same if every candidate held its own copy of the prompt's keys and values (a
    per-candidate cache, as Lamorel does)."""
    trunk_cache_per_transition: float
    """The trunk's kept states of one transition (0 without the cache)."""
    trunk_cache: float
    """The kept states of the device's transitions, filled by the rollout and held through the
    update (`memory/trunk_cache_mib`)."""

    @property
    def update_total(self) -> float:
        static = self.weights + self.autocast_copies + self.gradients + self.optimizer
        return static + self.activations + self.trunk_cache

    @property
    def rollout_total(self) -> float:
        """Gradients are freed after each step (`zero_grad` sets them to None): not counted; the
        trunk's cache is, full at the rollout's last step."""
        static = self.weights + self.autocast_copies + self.optimizer
        return static + self.rollout_working + self.trunk_cache

    @property
    def peak(self) -> float:
        return max(self.update_total, self.rollout_total)


def _activation_elements(
    shape: ModelShape, w: WorkloadConfig, top_layers: int | None = None
) -> tuple[float, float]:
    """Elements saved for backward by one prompt's forward: (all layers, largest single layer);
    with `top_layers`, of the top `top_layers` layers of the stack only (no encoder).

    Per token and layer (after Korthikanti et al. 2022, "Reducing Activation Recomputation in
    Large Transformer Models", without dropout masks): the two norms'
    inputs and outputs (4 hidden), q, k, v and the attention output, the attention probabilities
    (one row of keys per head), and the MLP's hidden activations (4 x intermediate when gated:
    gate, up, activation, product; 2x otherwise). T5's decoder layers add a third norm and the
    cross-attention's q, output and probabilities per decoder token, and cross k, v per encoder
    token. Frozen layers under LoRA do not need their inputs; this count keeps them (an upper
    bound there).
    """
    d, hd = shape.hidden_size, shape.head_dim
    heads, kv = shape.num_heads, shape.num_kv_heads
    mlp = (4 if shape.gated_mlp else 2) * shape.intermediate_size
    qkvo = (2 * heads + 2 * kv) * hd
    layers = shape.num_layers if top_layers is None else top_layers
    if shape.kind == "causal":
        t = _row_tokens(w)
        layer = t * (4 * d + qkvo + heads * t + mlp)
        return layer * layers, layer
    p, n = w.prompt_tokens, w.candidates * w.candidate_tokens
    decoder = n * (6 * d + qkvo + heads * n + 2 * heads * hd + heads * p + mlp) + 2 * kv * hd * p
    if top_layers is not None:
        return decoder * layers, decoder
    encoder = p * (4 * d + qkvo + heads * p + mlp)
    total = encoder * shape.num_encoder_layers + decoder * layers
    return total, max(encoder, decoder)


def estimate_memory(
    shape: ModelShape, w: WorkloadConfig, devices: int = 1, zero_stage: int = 0
) -> MemoryEstimate:
    """Memory of one device under data parallelism (ZeRO stages shard the training state).

    - weights: parameters x bytes of the precision (fp32 4, bf16 2; amp-bf16 keeps fp32 weights
      plus the bf16 copies autocast caches for the forward);
    - trainable state, as `torch.optim.AdamW` keeps it: gradient and two moments in the
      parameter's dtype (LoRA and the heads stay fp32 whatever the base's dtype); ZeRO-1 shards
      the moments over devices, ZeRO-2 also the gradients, ZeRO-3 also the weights;
    - activations of one micro-batch: `_activation_elements` x bytes of an activation, plus the
      packed mask (T x T in the weights' dtype and a boolean copy), and the candidate positions'
      logits kept in fp32 for the log-softmax (2 x 4 bytes x vocab each). Gradient
      checkpointing keeps each layer's input (hidden per token) and one layer's activations.
      With tuned top layers only the layers the backward runs through keep anything (below
      them nothing requires a gradient);
    - rollout: one layer's activations, the mask and the logits per prompt, no training state
      beyond what lives on the device anyway;
    - the trunk's cache: per transition, the hidden states entering the lowest tuned layer at
      the T positions of the packed row (an encoder-decoder model: the encoder's output, P
      positions), in the weights' dtype (the residual stream stays fp32 under autocast), for
      the device's share of the update's transitions, during the rollout and the update.
    """
    _check_positive("devices", devices)
    _check_choice("zero_stage", zero_stage, (0, 1, 2, 3))
    _, weight_bytes, act_bytes = PRECISIONS[w.precision]
    shard = devices
    parameters = count_parameters(shape)
    extra = lora_parameters(shape, w) + value_head_parameters(shape, w)
    weights = (parameters * weight_bytes + extra * 4) / (shard if zero_stage == 3 else 1)
    autocast_copies = parameters * 2 if w.precision == "amp-bf16" else 0
    if w.full_finetune:
        tuned = tuned_weights(shape, w)
        trainable = tuned + value_head_parameters(shape, w)
        state_bytes = tuned * weight_bytes + value_head_parameters(shape, w) * 4
    else:
        trainable = extra
        state_bytes = extra * 4
    gradients = state_bytes / (shard if zero_stage >= 2 else 1)
    optimizer = 2 * state_bytes / (shard if zero_stage >= 1 else 1)

    mask = _mask_bytes(shape, w, weight_bytes, act_bytes)
    logits = w.candidates * w.candidate_tokens * shape.vocab_size * 8
    grad_layers = _grad_layers(shape, w)
    saved, one_layer = _activation_elements(shape, w, grad_layers)
    if w.gradient_checkpointing:
        saved = _layer_inputs(shape, w, grad_layers) + one_layer
    per_transition = saved * act_bytes + mask + logits
    local_minibatch = max(w.minibatch_size // devices, 1)
    micro = min(w.micro_batch_size or local_minibatch, local_minibatch)
    rollout_batch = max(w.envs // devices, 1)
    _, rollout_layer = _activation_elements(shape, w)
    rollout_working = rollout_batch * (rollout_layer * act_bytes + mask + logits)
    scores = shape.num_heads * max(q * k for q, k, _ in _attention_blocks(shape, w)) * act_bytes
    kv, copied = _kv_bytes(shape, w, act_bytes)
    kept = 0.0
    if _update_layers(shape, w) is not None:
        kept = _trunk_tokens(shape, w) * shape.hidden_size * weight_bytes
    return MemoryEstimate(
        parameters=parameters,
        trainable_parameters=trainable,
        weights=weights,
        autocast_copies=autocast_copies,
        trainable_bytes=state_bytes,
        gradients=gradients,
        optimizer=optimizer,
        activations_per_transition=per_transition,
        micro_batch=micro,
        activations=micro * per_transition,
        rollout_batch=rollout_batch,
        rollout_working=rollout_working,
        mask_per_prompt=mask,
        attention_scores_per_prompt=scores,
        kv_per_prompt=kv,
        kv_per_prompt_copied=copied,
        trunk_cache_per_transition=kept,
        trunk_cache=kept * rollout_batch * w.frames_per_env,
    )


def _trunk_tokens(shape: ModelShape, w: WorkloadConfig) -> int:
    """Positions the trunk's cache keeps per transition: the packed row's (causal), or the
    prompt's (the encoder's output)."""
    return _row_tokens(w) if shape.kind == "causal" else w.prompt_tokens


def _mask_bytes(shape: ModelShape, w: WorkloadConfig, weight_bytes: int, act_bytes: int) -> float:
    """The custom 4-D mask (additive, in the weights' dtype, plus its boolean) of one prompt;
    for T5 also the relative position bias of both stacks (heads x L x L)."""
    if shape.kind == "causal":
        return _row_tokens(w) ** 2 * (weight_bytes + 1)
    p, n = w.prompt_tokens, w.candidates * w.candidate_tokens
    return n * n * (weight_bytes + 1) + shape.num_heads * (p * p + n * n) * act_bytes


def _layer_inputs(shape: ModelShape, w: WorkloadConfig, top_layers: int | None = None) -> float:
    """Elements of the layer inputs gradient checkpointing keeps (hidden per token and layer),
    of the top `top_layers` layers of the stack only (no encoder) when given."""
    d = shape.hidden_size
    layers = shape.num_layers if top_layers is None else top_layers
    if shape.kind == "causal":
        return _row_tokens(w) * d * layers
    n = w.candidates * w.candidate_tokens
    encoder = 0 if top_layers is not None else w.prompt_tokens * shape.num_encoder_layers
    return d * (encoder + n * layers)


def _kv_bytes(shape: ModelShape, w: WorkloadConfig, act_bytes: int) -> tuple[float, float]:
    """Keys and values of one prompt over all layers: packed, and with per-candidate copies."""
    per_token = 2 * shape.kv_width * act_bytes
    p, n, c = w.prompt_tokens, w.candidates * w.candidate_tokens, w.candidates
    if shape.kind == "causal":
        packed = per_token * _row_tokens(w) * shape.num_layers
        copied = per_token * (c * (p - 1) + n) * shape.num_layers
        return packed, copied
    encoder = per_token * p * shape.num_encoder_layers
    decoder = per_token * (n + p) * shape.num_layers  # self-attention, then cross-attention
    copied = encoder + per_token * (n + c * p) * shape.num_layers
    return encoder + decoder, copied


# --------------------------------------------------------------------------------------------
# Time: projection and calibration
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Projection:
    """How fast a run goes at a given MFU on given hardware."""

    mfu: float
    achieved_flops: float
    """FLOP/s over all devices: peak x devices x MFU."""
    rollout_seconds_per_update: float
    update_seconds_per_update: float
    env_steps_per_s: float
    """Frames per second of wall time, rollout and update together."""
    hours: float
    """Wall hours for `frames` frames."""
    frames: int

    @property
    def seconds_per_update(self) -> float:
        return self.rollout_seconds_per_update + self.update_seconds_per_update


def project(
    flops: StepFlops, peak_flops: float, devices: int, mfu: float, frames: int
) -> Projection:
    """Time at `mfu` of `devices` devices of `peak_flops` FLOP/s each (compute only)."""
    _check_positive("peak_flops", peak_flops)
    _check_positive("devices", devices)
    _check_positive("frames", frames)
    if not 0 < mfu <= 1:
        raise ValueError(f"mfu must be in (0, 1], got {mfu}")
    achieved = peak_flops * devices * mfu
    rollout = flops.rollout_per_update / achieved
    update = flops.update_per_update / achieved
    rate = flops.frames_per_update / (rollout + update)
    return Projection(mfu, achieved, rollout, update, rate, frames / rate / 3600, frames)


@dataclass(frozen=True)
class Calibration:
    """What a measured run achieved."""

    seconds_per_update: float
    achieved_flops: float
    """FLOP/s over all devices of the measured run."""
    achieved_flops_per_device: float
    mfu: float
    """Fraction of the devices' peak."""


def calibrate(
    flops: StepFlops, seconds_per_update: float, peak_flops: float, devices: int = 1
) -> Calibration:
    """The FLOP/s and MFU of a run of `flops` that took `seconds_per_update` (rollout and update,
    as `scripts/bench_ppo.py` reports it) on `devices` devices of `peak_flops` FLOP/s each."""
    _check_positive("seconds_per_update", seconds_per_update)
    _check_positive("peak_flops", peak_flops)
    _check_positive("devices", devices)
    achieved = flops.per_update / seconds_per_update
    return Calibration(
        seconds_per_update, achieved, achieved / devices, achieved / (peak_flops * devices)
    )


def seconds_per_update_from_hours(hours: float, frames: int, frames_per_update: int) -> float:
    """Mean seconds per update of a run of `frames` frames that took `hours`."""
    _check_positive("hours", hours)
    _check_positive("frames", frames)
    return hours * 3600 / (frames / frames_per_update)
