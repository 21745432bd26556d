"""Typed configuration of glam, registered with Hydra so a misspelt key fails at start-up.

Each dataclass documents its fields once (the docstring under each field) and validates itself in
`__post_init__`. The YAML presets in `configs/` fill these; scripts receive the validated objects
(`to_object`), never loose keyword arguments.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from omegaconf import MISSING  # noqa: F401  (re-exported for configs that need a required key)


def _check_choice(name: str, value: str, choices: tuple[str, ...]) -> None:
    if value not in choices:
        raise ValueError(f"{name}={value!r} is not one of {list(choices)}")


def _check_positive(name: str, value: float) -> None:
    if not value > 0:
        raise ValueError(f"{name} must be > 0, got {value}")


# --------------------------------------------------------------------------------------------
# Model and policy
# --------------------------------------------------------------------------------------------


@dataclass
class AdapterConfig:
    """LoRA adapter trained on top of the frozen base model (through peft)."""

    enabled: bool = True
    """Train a LoRA adapter; false fine-tunes the whole model."""
    r: int = 8
    """LoRA rank."""
    alpha: int = 16
    """LoRA scaling numerator (scale = alpha / r)."""
    dropout: float = 0.0
    """Dropout on the LoRA branch."""
    target_modules: list[str] | None = None
    """Module names to adapt; None picks a default for the architecture (Llama, T5, GPT-2...)."""

    def __post_init__(self) -> None:
        _check_positive("model.lora.r", self.r)
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"model.lora.dropout must be in [0, 1), got {self.dropout}")


@dataclass
class ModelConfig:
    """Which language model to load and how."""

    name_or_path: str = "smollm2-135m"
    """Embedded model name, local Hugging Face folder or .gguf file, or hub id."""
    dtype: str = "float32"
    """Weights dtype: float32, bfloat16 or float16."""
    trust_remote_code: bool = False
    """Allow model code from the model folder/hub (off unless asked for)."""
    pretrained: bool = True
    """False: random weights with the pretrained input embeddings (the paper's NPAE)."""
    lora: AdapterConfig = field(default_factory=AdapterConfig)
    """LoRA adapter settings."""
    gradient_checkpointing: bool = False
    """Recompute activations in the backward pass to save memory."""
    autocast_bf16: bool = False
    """Run forward passes under bf16 autocast (GPU, or CPUs with AVX512-BF16)."""

    def __post_init__(self) -> None:
        _check_choice("model.dtype", self.dtype, ("float32", "bfloat16", "float16"))
        if not self.name_or_path:
            raise ValueError("model.name_or_path is empty")


@dataclass
class PolicyConfig:
    """How the language model becomes an actor-critic over text actions."""

    head: str = "scoring"
    """`scoring`: softmax of candidate log-likelihoods; `action_heads`: one logit per action."""
    normalization: str = "sum"
    """Candidate score: `sum` of token log-probs, or mean per `token`, or per `word`."""
    value_hidden_sizes: list[int] = field(default_factory=lambda: [1024, 1024])
    """Hidden layer widths of the value MLP (and of the action-heads MLP)."""
    value_activation: str = "sigmoid"
    """Activation of the head MLPs: sigmoid (as in the original), relu, tanh or gelu."""
    value_from_base: bool = False
    """Compute the value from the base model with the adapter off (TWOSOME) instead of sharing."""
    prompt_format: str = "glam"
    """`glam`: the original text format; `chat`: the model's chat template around it."""

    def __post_init__(self) -> None:
        _check_choice("policy.head", self.head, ("scoring", "action_heads"))
        _check_choice("policy.normalization", self.normalization, ("sum", "token", "word"))
        _check_choice(
            "policy.value_activation", self.value_activation, ("sigmoid", "relu", "tanh", "gelu")
        )
        _check_choice("policy.prompt_format", self.prompt_format, ("glam", "chat"))
