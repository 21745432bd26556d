"""Typed configuration of glam, registered with Hydra so a misspelt key fails at start-up.

Each dataclass documents its fields once (the docstring under each field) and validates itself in
`__post_init__`. The dataclass defaults ARE the default preset (`configs/smollm2_lora_cpu.yaml`
only restates them): `TrainingRunConfig()` in Python is what the training script runs with no
`--config-name`. The other presets in `configs/` set every value they change.

This module holds the core of a training run, its sections `model`, `policy`, `env`, `ppo` and
`train` (`CoreRunConfig`), and the machinery every config goes through. It knows no coupling
and no algorithm: each of those declares its own section in its own package, in a light module
(no torch) that imports only this one:

- the section is a dataclass decorated with `@config_section("key")`, `key` being its name in
  the presets (`teach.teacher=llm`); its `__post_init__` checks its own values;
- what it requires of the core (`policy.kind`, the env's layout...) is its method
  `check_run(self, run: CoreRunConfig)`, which raises `ValueError` naming the keys to change;
- the schema is assembled layer by layer, each trainer's layer adding the sections it reads:
  `glam.ppo.run_config.PPORunConfig` (`generate`, `algorithm`), `glam.offpolicy.run_config`
  (`sac`), `glam.baselines.run_config` (`symbolic`, `drrn`), and at the top, above every
  coupling, `glam.run_config.TrainingRunConfig` (`teach`, `ask`, `oni`, `codeact`). What two
  sections require of each other is checked by the layer that holds both (`check_sections`).
  The run's `__post_init__` calls every section's `check_run` in the schema's order, then
  `check_sections`, then the core's own checks across its sections.

A new coupling or algorithm thus adds its package's config module and its field in the layer
whose code reads it, and never edits this file (tests/test_config.py checks that this file names
no section).

Every Hydra script turns its composed config into these objects through one function,
`validate_config` (via the `config_main` decorator): keys outside the schema, added with `+` or
not, and values that fail a `__post_init__` or `check_run` check become a `ConfigError` that
names the key and what to do, and the script exits with status 1.
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import inspect
import sys
import types
import typing
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import hydra
from hydra import compose, initialize_config_dir
from hydra._internal.utils import get_args_parser
from hydra.core.config_store import ConfigStore
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.errors import HydraException, MissingConfigException
from omegaconf import (
    MISSING,  # noqa: F401  (re-exported for configs that need a required key)
    DictConfig,
    OmegaConf,
)
from omegaconf.errors import OmegaConfBaseException

from glam.cli import fail

CONFIG_DIR = Path(__file__).resolve().parents[1] / "configs"
"""The repository's Hydra presets (training presets at the top, `eval/`, `bc/`, `demos/`)."""

Schema = TypeVar("Schema")

DEFAULT_MODEL = "smollm2-135m"
"""The model of the default preset: SmolLM2-135M-Instruct, embedded in a PyPI package as a Q4_1
GGUF file and de-quantized to fp32 (`glam.models.loading.EMBEDDED_MODELS`)."""


def check_choice(name: str, value: str, choices: tuple[str, ...]) -> None:
    """Raise `ValueError` unless `value` (of the key `name`) is one of `choices`."""
    if value not in choices:
        raise ValueError(f"{name}={value!r} is not one of {list(choices)}")


def check_positive(name: str, value: float) -> None:
    """Raise `ValueError` unless `value` (of the key `name`) is above 0."""
    if not value > 0:
        raise ValueError(f"{name} must be > 0, got {value}")


_SCHEMAS: dict[str, type] = {}
"""Hydra schema name -> dataclass, for every schema declared with `hydra_schema` so far."""


def hydra_schema(name: str) -> Callable[[type[Schema]], type[Schema]]:
    """Class decorator: the dataclass is the schema `name` of the presets that start with
    `defaults: [name, _self_]`; `register_configs` gives it to Hydra."""

    def declare(schema_cls: type[Schema]) -> type[Schema]:
        _SCHEMAS[name] = schema_cls
        return schema_cls

    return declare


_CORE_KEYS = ("model", "policy", "env", "ppo", "train")
"""The sections of `CoreRunConfig`, which `config_section` cannot declare (checked by a test)."""

SECTIONS: dict[str, type] = {}
"""Section key -> the dataclass declared for it with `config_section` (in the modules imported
so far; `glam.run_config` imports those of the training run)."""


def config_section(key: str) -> Callable[[type[Schema]], type[Schema]]:
    """Class decorator: the dataclass is the training run's section `key` (its settings are the
    `key.*` keys of the presets), declared in the package of its coupling or algorithm.

    The dataclass checks its own values in `__post_init__`; it may define
    `check_run(self, run: CoreRunConfig)`, which the run calls to check what the section
    requires of the core, raising `ValueError` with the keys to change. The schema of the layer
    whose code reads the section holds it as its field `key` (module docstring).

    Raises:
        ValueError: `key` is a core section's, or already another dataclass's.
    """

    def declare(section_cls: type[Schema]) -> type[Schema]:
        if key in _CORE_KEYS:
            raise ValueError(f"section {key!r} is a core section of glam.config")
        known = SECTIONS.get(key)
        if known is not None and _qualified_name(known) != _qualified_name(section_cls):
            raise ValueError(
                f"section {key!r} is declared twice: {_qualified_name(known)} and "
                f"{_qualified_name(section_cls)}"
            )
        SECTIONS[key] = section_cls
        return section_cls

    return declare


def _qualified_name(cls: type) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


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
    layers: Any = None
    """Which transformer layers get the adapter: null, every layer; a number K, the top K layers
    (`model.lora.layers=4`, the training presets' default: `DEFAULT_LORA_LAYERS`); a list, those
    layers by index from 0 at the bottom (`model.lora.layers=[26,27,28,29]`); peft's
    `layers_to_transform`. For an encoder-decoder model the layers are the decoder's, and the
    encoder gets no adapter. With the layers below the adapted ones frozen, the PPO update runs
    from their cached output (`ppo.cache_trunk`)."""
    init: str = ""
    """A LoRA adapter in peft's format (a folder with `adapter_config.json` and
    `adapter_model.safetensors`, as behavioural cloning writes into `bc.output_dir`) whose
    weights start the adapter, instead of LoRA's zero update: a warm start. Its rank, alpha,
    target modules and layers must be this adapter's. Empty: LoRA's own initialisation. A
    resumed run starts from its checkpoint's adapter whatever this says."""

    def __post_init__(self) -> None:
        check_positive("model.lora.r", self.r)
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"model.lora.dropout must be in [0, 1), got {self.dropout}")
        self.layers = check_lora_layers(self.layers)


DEFAULT_LORA_LAYERS = 4
"""The training presets' `model.lora.layers` unless they say otherwise (`TrainingRunConfig`);
`AdapterConfig` itself (behavioural cloning's too) adapts every layer by default."""


def check_lora_layers(layers: Any, key: str = "model.lora.layers") -> int | list[int] | None:
    """`model.lora.layers` (or `key`) as a number of top layers, a sorted list of layer indices
    or None.

    Raises:
        ValueError: anything else (a zero or negative count, a negative or repeated index...).
    """
    if layers is None:
        return None
    if isinstance(layers, int) and not isinstance(layers, bool):
        if layers < 1:
            raise ValueError(
                f"{key}={layers}: a number of top layers must be at least 1 (null: every layer)"
            )
        return layers
    if isinstance(layers, (list, tuple)) or OmegaConf.is_list(layers):
        indices = list(layers)
        if (
            not indices
            or not all(isinstance(i, int) and not isinstance(i, bool) for i in indices)
            or min(indices) < 0
            or len(set(indices)) != len(indices)
        ):
            raise ValueError(f"{key}={indices}: a list must hold distinct layer indices >= 0")
        return sorted(indices)
    raise ValueError(
        f"{key}={layers!r}: give a number of top layers (4), a list of layer "
        "indices ([26,27,28,29]) or null (every layer)"
    )


@dataclass
class ModelConfig:
    """Which language model to load and how."""

    name_or_path: str = DEFAULT_MODEL
    """Embedded model name, local Hugging Face folder or .gguf file, or hub id."""
    dtype: str = "float32"
    """Weights dtype: float32, bfloat16 or float16."""
    trust_remote_code: bool = False
    """Allow model code from the model folder/hub (off unless asked for)."""
    pretrained: bool = True
    """False: random weights with the pretrained input embeddings (the paper's NPAE)."""
    lora: AdapterConfig = field(default_factory=AdapterConfig)
    """LoRA adapter settings."""
    trained_layers: Any = None
    """Full fine-tuning (`model.lora.enabled=false`) of some layers only: a number K, the top K
    transformer layers; a list, those layers by index from 0 at the bottom; null, the whole
    model. Everything else (embeddings, the layers below and beside, the final norm, the LM
    head) stays frozen, so the update runs from the rollout's cached trunk (`ppo.cache_trunk`);
    the heads train as always. Counted as `model.lora.layers` is (the decoder's for T5)."""
    gradient_checkpointing: bool = False
    """Recompute activations in the backward pass to save memory."""
    autocast_bf16: bool | None = None
    """Run the language model's forward passes under bf16 autocast. null (auto): the trainer
    turns it on where the hardware computes bf16 natively (a CUDA GPU with bf16, a CPU with
    AVX512-BF16 or AMX-BF16; on this project's CPU it cut the default preset's update from 149
    to 120 s, docs/benchmarks.md) and off elsewhere, and writes its choice into config.yaml;
    outside the trainer null is off. Off, an outer autocast still applies (Accelerate's
    `mixed_precision: bf16`); the heads run in fp32 either way."""
    disable_dropout: bool = True
    """Set the base model's dropout to 0 (Flan-T5 has 0.1; LoRA's own is `lora.dropout`). PPO's
    ratio compares the update's forward (train mode) with the rollout's (eval mode): with
    dropout on in one of them, the ratio is noise before any step."""

    def __post_init__(self) -> None:
        check_choice("model.dtype", self.dtype, ("float32", "bfloat16", "float16"))
        if not self.name_or_path:
            raise ValueError("model.name_or_path is empty")
        self.trained_layers = check_lora_layers(self.trained_layers, "model.trained_layers")
        if self.trained_layers is not None and self.lora.enabled:
            raise ValueError(
                f"model.trained_layers={self.trained_layers} chooses the layers a full "
                "fine-tuning trains (model.lora.enabled=false); with LoRA, the adapted layers "
                "are model.lora.layers"
            )


@dataclass
class PolicyConfig:
    """How the language model becomes an actor-critic over text actions."""

    head: str = "scoring"
    """`scoring`: softmax of candidate log-likelihoods; `action_heads`: one logit per action."""
    normalization: str = "sum"
    """Candidate score: `sum` of token log-probs, or mean per `token`, or per `word`."""
    append_eos: bool = False
    """Also score the EOS token after each candidate (its probability of ending there)."""
    value_hidden_sizes: list[int] = field(default_factory=lambda: [1024, 1024])
    """Hidden layer widths of the value MLP (and of the action-heads MLP)."""
    value_activation: str = "sigmoid"
    """Activation of the head MLPs: sigmoid (as in the original), relu, tanh or gelu."""
    value_norm: bool = False
    """Standardise the value head's input per dimension with running statistics of the
    rollouts' states (`glam.policy.heads.RunningNorm`): a pretrained model's last-token state
    holds a few large, nearly constant dimensions that dwarf what differs between states."""
    value_from_base: bool = False
    """Compute the value from the base model with the adapter off (TWOSOME) instead of sharing."""
    value_time: bool = False
    """The value head also reads how much of its time limit the episode has used (step /
    max_steps), which a prompt does not show: BabyAI's reward shrinks with the episode's length
    and a time-out pays 0, so the same view is worth less late in an episode (Pardo et al., 2018,
    "Time limits in reinforcement learning"). The policy's scores do not read it. On the
    GoToRedBall agent's own states the step alone explains R^2 0.35 of the return where the
    prompt's features explain none (docs/diagnosis_gotoredball.md, section 7)."""
    prompt_format: str = "glam"
    """`glam`: the original text format; `chat`: the model's chat template around it; `balrog`
    (`kind=generate` only): BALROG's dialogue, the episode's last `generate.max_history`
    observations and answers as chat turns (`glam.policy.balrog`)."""
    kind: str = "llm"
    """The agent: `llm` (a language model scores the actions; the rest of this section and
    `model` apply), `generate` (the language model writes its action, section `generate`;
    `glam.policy.writer`), `symbolic` (BabyAI's convolutional actor-critic on the grid, section
    `symbolic`) or `drrn` (a text Q-learner trained from scratch, section `drrn`)."""
    temperature: float = 5.0
    """The policy is softmax(scores / temperature). GLAM's is 1 (`glam_paper`). The default 5
    flattens a prior that a small model concentrates on a few actions (SmolLM2-135M gives
    "go forward" p < 0.01 zero-shot; /5 starts it near 0.13), so that PPO can sample, and be
    rewarded for, the others."""

    def __post_init__(self) -> None:
        check_choice("policy.kind", self.kind, ("llm", "generate", "symbolic", "drrn"))
        check_choice("policy.head", self.head, ("scoring", "action_heads"))
        if self.value_time and self.kind != "llm":
            raise ValueError(
                f"policy.value_time=true applies to the scoring agent (policy.kind=llm), not to "
                f"policy.kind={self.kind}"
            )
        if not self.temperature > 0:
            raise ValueError(f"policy.temperature must be > 0, got {self.temperature}")
        check_choice("policy.normalization", self.normalization, ("sum", "token", "word"))
        check_choice(
            "policy.value_activation", self.value_activation, ("sigmoid", "relu", "tanh", "gelu")
        )
        check_choice("policy.prompt_format", self.prompt_format, ("glam", "chat", "balrog"))


# --------------------------------------------------------------------------------------------
# Environment, PPO and training run
# --------------------------------------------------------------------------------------------


@dataclass
class EnvConfig:
    """Which BabyAI-Text level the agent is trained on, and how many copies run at once.

    The defaults are a task the embedded SmolLM2-135M learns on a CPU in about an hour; GLAM's
    set-up (MixedTrainLocal, 32 envs, six actions, 3 observations, rewards x 20) is `glam_paper`.
    """

    name: str = "BabyAI-GoToRedBallNoDists-v0"
    """Registered BabyAI-Text (or minigrid BabyAI) level id. GLAM: BabyAI-MixedTrainLocal-v0."""
    num_envs: int = 8
    """Environments in total, over all processes; each process steps num_envs / world_size.
    GLAM: 32."""
    nbr_obs: int = 1
    """Observations kept in the prompt (with the actions between them). GLAM: 3; one keeps the
    prompt near 60 tokens, and the default level needs only the current view."""
    action_space: str = "nav"
    """Action space name in `babyai_text.actions.ACTION_SPACES` (`default`, `nav`, `noop`...).
    GLAM: `default` (six actions); the default level needs only the three of `nav`."""
    reward_scale: float = 1.0
    """Factor applied to BabyAI's reward (1 - 0.9 t / max_steps on success) before GAE. GLAM:
    20; with 20 the value loss dominates the clipped gradient of a LoRA-tuned small model."""
    language: str = "en"
    """Language of the prompt and observations (`en`, or `fr` for GoTo levels)."""

    def __post_init__(self) -> None:
        if not self.name:
            raise ValueError("env.name is empty")
        check_positive("env.num_envs", self.num_envs)
        check_positive("env.nbr_obs", self.nbr_obs)
        check_positive("env.reward_scale", self.reward_scale)
        check_choice("env.language", self.language, ("en", "fr"))


@dataclass
class PPOConfig:
    """Proximal Policy Optimisation hyperparameters.

    Clipping, discounting, loss weights and Adam's betas and epsilon are GLAM's; the rollout
    length, epochs, minibatches and learning rate are sized for LoRA on a small model on a CPU
    (GLAM's values are in `glam_paper`).
    """

    lr: float = 2e-3
    """Adam learning rate. GLAM's full fine-tune of Flan-T5 used 1e-6; a LoRA adapter on a
    135M model needs far more."""
    lr_schedule: str = "constant"
    """Learning-rate schedule over updates: `constant`, `linear` (to 0) or `cosine` (to 0)."""
    warmup_updates: int = 0
    """Updates of linear warm-up from 0 before the schedule starts."""
    adam_betas: list[float] = field(default_factory=lambda: [0.9, 0.999])
    """Adam betas."""
    adam_eps: float = 1e-5
    """Adam epsilon."""
    weight_decay: float = 0.0
    """Decoupled weight decay (AdamW); 0 is plain Adam."""
    frames_per_env: int = 32
    """Environment steps per environment between two updates (the rollout length). GLAM: 40."""
    epochs: int = 2
    """Passes over the rollout per update. GLAM: 4."""
    minibatch_size: int = 64
    """Transitions per gradient step, over all processes (each takes minibatch / world_size)."""
    micro_batch_size: int | None = 8
    """Transitions per forward/backward on one process (gradient accumulation); None: whole
    local minibatch at once. It bounds the memory of an update and not its arithmetic: on the
    default preset (bf16 autocast) 8 instead of 16 took the peak from 2,988 to 2,015 MiB at the
    same 120 s per update (docs/benchmarks.md)."""
    clip_eps: float = 0.2
    """Clipping range of the probability ratio."""
    value_clip_eps: float | None = 0.2
    """Clipping range of the value update around the rollout value; None: unclipped loss."""
    gamma: float = 0.99
    """Discount factor."""
    gae_lambda: float = 0.99
    """GAE lambda."""
    entropy_coef: float = 0.01
    """Weight of the entropy bonus."""
    value_coef: float = 0.5
    """Weight of the value loss."""
    value_lr: float | None = None
    """Learning rate of the value head (its own optimizer group, on the same schedule as
    `ppo.lr`); None: `ppo.lr`. A preset that moves a warm-started policy slowly (a small
    `ppo.lr`) can let its fresh critic learn faster."""
    value_warmup_updates: int = 0
    """The run's first updates (counted from its start, a resumed run included) in which only
    the value head learns: their loss is the value loss alone and every other parameter's learning rate is 0,
    so a warm-started policy keeps acting as it was while its critic learns its returns."""
    max_grad_norm: float = 0.5
    """Gradient norm clip (over all trainable parameters)."""
    normalize_advantages: bool = True
    """Normalise advantages to zero mean, unit std over the whole rollout (all processes)."""
    target_kl: float | None = None
    """Stop the update's epochs early once the approximate KL of an epoch exceeds this."""
    recompute_logprobs: bool | None = None
    """Recompute old log-probs and values with the update's forward pass before the first
    epoch, so the first ratio is exactly 1; None: on when the model runs in bf16/fp16."""
    cache_trunk: bool | None = None
    """Keep, from the rollout's forward, the hidden states that enter the lowest adapted layer
    (the encoder's output for an encoder-decoder model), and run the update's forwards and
    backwards, and the recomputed log-probs, from them through the adapted layers only
    (`glam.trunk`). It applies when LoRA adapts only the top layers (`model.lora.layers`).
    None: on where it applies, and the run says once why not where it does not; true where it
    does not apply stops the run at start-up, saying why. The trainer writes its choice into
    config.yaml."""
    bootstrap_truncated: bool = False
    """At a time-out, bootstrap the return from the value of the episode's final observation
    instead of treating the time-out as a terminal state (GLAM: false; BabyAI's prompt does not
    show the step count, so the final state looks like any other)."""
    recurrence: int = 20
    """Steps per sequence in the update of a policy with memory (`symbolic.memory=true`): the
    rollout of each env is cut into sequences of this many consecutive steps, minibatches are
    made of whole sequences, and each sequence starts from the memory the rollout stored and
    carries it through its steps (gradients flow back through them), as BabyAI's PPO does.
    BabyAI's 20 (torch-ac's own default is 4). It must divide `ppo.frames_per_env` and each
    process's minibatch and micro-batch; a policy without memory ignores it."""

    def __post_init__(self) -> None:
        check_positive("ppo.lr", self.lr)
        check_choice("ppo.lr_schedule", self.lr_schedule, ("constant", "linear", "cosine"))
        for name in (
            "frames_per_env",
            "epochs",
            "minibatch_size",
            "clip_eps",
            "max_grad_norm",
            "recurrence",
        ):
            check_positive(f"ppo.{name}", getattr(self, name))
        if self.micro_batch_size is not None:
            check_positive("ppo.micro_batch_size", self.micro_batch_size)
        if len(self.adam_betas) != 2 or not all(0.0 <= b < 1.0 for b in self.adam_betas):
            raise ValueError(f"ppo.adam_betas must be two numbers in [0, 1), got {self.adam_betas}")
        for name in ("gamma", "gae_lambda"):
            if not 0.0 <= getattr(self, name) <= 1.0:
                raise ValueError(f"ppo.{name} must be in [0, 1], got {getattr(self, name)}")
        for name in ("warmup_updates", "value_warmup_updates"):
            if getattr(self, name) < 0:
                raise ValueError(f"ppo.{name} must be >= 0, got {getattr(self, name)}")
        if self.value_lr is not None:
            check_positive("ppo.value_lr", self.value_lr)
        for name in ("entropy_coef", "value_coef", "weight_decay"):
            if getattr(self, name) < 0:
                raise ValueError(f"ppo.{name} must be >= 0, got {getattr(self, name)}")


def check_recurrence(ppo: PPOConfig, processes: int = 1) -> None:
    """Check that a policy with memory can be updated in sequences of `ppo.recurrence` steps:
    they tile each env's rollout, and each process's minibatch and micro-batch hold whole
    sequences (`processes` share every minibatch equally).

    Raises:
        ValueError: naming the key to change.
    """
    recurrence = ppo.recurrence
    local = ppo.minibatch_size // processes
    micro = min(ppo.micro_batch_size or local, local)
    why = "a policy with memory is updated in whole sequences of ppo.recurrence steps"
    if ppo.frames_per_env % recurrence:
        raise ValueError(
            f"ppo.recurrence={recurrence} must divide ppo.frames_per_env={ppo.frames_per_env} "
            f"({why} of one env's rollout)"
        )
    if local % recurrence:
        per_process = "" if processes == 1 else f" / {processes} processes = {local}"
        raise ValueError(
            f"ppo.recurrence={recurrence} must divide the minibatch of each process, "
            f"ppo.minibatch_size={ppo.minibatch_size}{per_process} ({why})"
        )
    if micro % recurrence:
        raise ValueError(
            f"ppo.recurrence={recurrence} must divide ppo.micro_batch_size={micro} ({why}; "
            "null: the whole minibatch at once)"
        )


MAX_RUN_SEED = 10_000
"""`train.seed` is below this, so that training episode seeds (`glam.envs.env_seed`) stay
below the evaluation seeds (`glam.eval.config.SEED_BASE`)."""


@dataclass
class TrainConfig:
    """Length of the run, seeding, outputs, checkpoints and logging."""

    total_frames: int = 6144
    """Environment steps to collect in total, over all environments and processes (the default:
    24 updates of 256; GLAM: 1.5M)."""
    seed: int = 1
    """Seed of the run: torch/numpy/python RNGs (plus rank) and the environments' episodes."""
    output_dir: str = ""
    """Run folder (config.yaml, metrics.csv, TensorBoard events, checkpoints/); empty: the main
    process picks runs/<config name>-<date>-<time>."""
    save_every: int = 4
    """Write a checkpoint every this many updates (and always at the end); 0: only at the end."""
    keep_checkpoints: int = 3
    """Most recent checkpoints kept on disk; 0 keeps them all."""
    save_rollouts: bool = False
    """Also save the policy's decisions in finished episodes, in the demonstrations format of
    behavioural cloning (`glam.demos`), as `rollouts/rank_R/update_N/` datasets written with
    each checkpoint; `bc.dataset=<run>/rollouts` clones them all."""
    resume: bool = False
    """Continue the run in output_dir from its newest checkpoint (starts fresh if it has none)."""
    resume_from: str = ""
    """Continue the run from this checkpoint of it instead (implies `resume`): a folder of
    `output_dir/checkpoints/`, by name (`update_000008`) or path. Later checkpoints belong to the
    branch this abandons: they move to `checkpoints/abandoned-<time>/`, nothing is deleted."""
    torch_threads: int | None = None
    """Torch's intra-op threads per process. None: `OMP_NUM_THREADS` where set (`accelerate
    launch` sets it), else the cores free when the run starts (`glam.threads`: other busy
    processes' cores are left to them). Pin it for bit-identical seeded reruns (another count
    sums fp32 in another order) and where other jobs will start during the run."""
    cpu: bool = False
    """Run on the CPU even where a GPU is present."""
    progress_bar: bool = True
    """Show a rich progress bar (main process only)."""
    wandb: bool = False
    """Also log to Weights & Biases (needs `pip install wandb`)."""
    wandb_project: str = "glam"
    """Weights & Biases project."""
    probe_every: int = 0
    """Every this many updates, score GLAM's fixed probe prompts (`glam.probe`) and append the
    action probabilities to probe.csv (LLM policies; 0: off)."""
    init_policy: str = ""
    """A saved policy folder PPO starts from (a clone's `clone.output_dir/policy`, a run's
    `checkpoints/update_N/policy`): its model weights (adapter and base, or the whole model) and
    action heads, or the symbolic network but its critic; the critic starts untrained. It must
    be the same kind of policy (actions, head, temperature, score normalisation, prompt format,
    adapter or whole model, pretrained or not; the same `symbolic` settings). Empty: the model
    as `model` builds it. A resumed run reads its checkpoint instead."""
    label: str = ""
    """Name of the run's variant in comparisons (`scripts/compare_runs.py` groups runs by it);
    empty: the preset's name (`--config-name`), written into the run's config.yaml."""

    def __post_init__(self) -> None:
        check_positive("train.total_frames", self.total_frames)
        if not 0 <= self.seed < MAX_RUN_SEED:
            raise ValueError(
                f"train.seed must be in [0, {MAX_RUN_SEED}), got {self.seed}: larger seeds "
                "would reach the evaluation episodes' seeds (10**12 and up)"
            )
        if self.save_every < 0 or self.keep_checkpoints < 0:
            raise ValueError("train.save_every and train.keep_checkpoints must be >= 0")
        if self.torch_threads is not None:
            check_positive("train.torch_threads", self.torch_threads)
        if self.probe_every < 0:
            raise ValueError(f"train.probe_every must be >= 0, got {self.probe_every}")
        if self.resume_from:
            self.resume = True


# --------------------------------------------------------------------------------------------
# The core of a training run
# --------------------------------------------------------------------------------------------

LANGUAGE_MODEL_KINDS: tuple[str, ...] = ("llm", "generate")
"""`policy.kind`s whose policy is a language model (section `model` applies)."""


def check_trained_precision(cfg: CoreRunConfig) -> None:
    """Refuse to fine-tune every weight of a language model stored in bf16 or fp16.

    AdamW would update those weights in place: bf16 keeps 8 bits of mantissa, so a step of lr
    1e-6 (GLAM's full fine-tune) rounds away on most weights, and fp16 has no loss scaling here;
    the run would go on without learning. A LoRA adapter stays fp32 over a low-precision base.

    Raises:
        ValueError: naming the settings that compute in bf16 with fp32 weights instead.
    """
    model = cfg.model
    if cfg.policy.kind not in LANGUAGE_MODEL_KINDS or model.lora.enabled:
        return
    if model.dtype != "float32":
        raise ValueError(
            f"model.dtype={model.dtype} with full fine-tuning (model.lora.enabled=false): AdamW "
            f"would update {model.dtype} weights in place, where steps of ppo.lr={cfg.ppo.lr:g} "
            "mostly round away (and float16 has no loss scaling), so the run would not learn. "
            "Keep model.dtype=float32 and compute in bf16 with model.autocast_bf16=true (fp32 "
            "weights, bf16 matrix products), or train an adapter (model.lora.enabled=true)"
        )


@dataclass
class CoreRunConfig:
    """The core of a training run's config: model, policy, env, ppo and train, and the checks
    across them. The schemas above it add the sections of the algorithms and couplings
    (`config_section`; module docstring); `__post_init__` calls each section's `check_run(run)`
    in the schema's order, then `check_sections`, then checks the core across its sections.
    """

    model: ModelConfig = field(
        default_factory=lambda: ModelConfig(lora=AdapterConfig(layers=DEFAULT_LORA_LAYERS))
    )
    """The model; LoRA on its top 4 layers, the update run from the rollout's cached trunk
    (`model.lora.layers`, `ppo.cache_trunk`): 0.28x the update time of LoRA on every layer on
    this project's CPU, and the empty room learnt in fewer wall-clock minutes though in more
    frames (docs/training.md). `model.lora.layers=null` adapts every layer."""
    policy: PolicyConfig = field(default_factory=PolicyConfig)
    env: EnvConfig = field(default_factory=EnvConfig)
    ppo: PPOConfig = field(default_factory=PPOConfig)
    train: TrainConfig = field(default_factory=TrainConfig)

    @property
    def frames_per_update(self) -> int:
        """Transitions collected per update, over all environments and processes."""
        return self.env.num_envs * self.ppo.frames_per_env

    @property
    def num_updates(self) -> int:
        """Updates a fresh run needs to collect `train.total_frames` (the last one may overshoot;
        a resumed run counts the frames it has)."""
        return -(-self.train.total_frames // self.frames_per_update)

    def sections(self) -> dict[str, Any]:
        """The run's sections beyond the core, by key, in the schema's order.

        Raises:
            TypeError: a field of the schema that is not a section declared under its name
                (`config_section`).
        """
        found = {}
        for item in dataclasses.fields(self):
            if item.name in _CORE_KEYS:
                continue
            section = getattr(self, item.name)
            if not isinstance(section, SECTIONS.get(item.name, ())):
                raise TypeError(
                    f"{type(self).__name__}.{item.name} is not a section declared with "
                    f"config_section({item.name!r})"
                )
            found[item.name] = section
        return found

    def check_sections(self) -> None:
        """What the sections require of each other: checked by the schema that holds them
        (each override calls its parent's first), raising `ValueError` with the keys to change.
        The core has none."""

    def __post_init__(self) -> None:
        for section in self.sections().values():
            check_run = getattr(section, "check_run", None)
            if check_run is not None:
                check_run(self)
        self.check_sections()
        check_trained_precision(self)
        if self.train.probe_every and self.policy.kind != "llm":
            raise ValueError(
                f"train.probe_every={self.train.probe_every}: the action-probability probe is "
                f"for language-model policies, not policy.kind={self.policy.kind!r}; set it to 0"
            )
        if self.train.init_policy and self.policy.kind not in ("llm", "symbolic"):
            raise ValueError(
                f"train.init_policy={self.train.init_policy!r} starts a language-model or "
                f"symbolic policy from a saved one, not policy.kind={self.policy.kind!r}; leave "
                "it empty"
            )
        if self.train.init_policy and self.model.lora.init:
            raise ValueError(
                f"train.init_policy={self.train.init_policy!r} and model.lora.init="
                f"{self.model.lora.init!r} both give the starting weights: keep one"
            )
        if self.frames_per_update % self.ppo.minibatch_size:
            raise ValueError(
                f"ppo.minibatch_size={self.ppo.minibatch_size} must divide the transitions per "
                f"update, env.num_envs * ppo.frames_per_env = {self.frames_per_update}"
            )


def register_configs() -> None:
    """Register the structured configs with Hydra, so presets can extend them.

    A preset starts with `defaults: [training_run_schema, _self_]`; then any key it sets or a
    command line overrides is checked against these dataclasses (a misspelt key is an error).
    Registered: every schema declared so far, that is the training run's once `glam.run_config`
    is imported, and those of the config modules imported (`glam.eval.config`, `glam.bc.config`).
    """
    store = ConfigStore.instance()
    for name, schema_cls in _SCHEMAS.items():
        store.store(name=name, node=schema_cls)


# --------------------------------------------------------------------------------------------
# Validation: the one path from a composed Hydra config to a checked dataclass
# --------------------------------------------------------------------------------------------


class ConfigError(ValueError):
    """A configuration that does not fit its schema; the message names the key and the fix."""


def validate_config(raw: DictConfig | Mapping[str, Any], schema_cls: type[Schema]) -> Schema:
    """The `schema_cls` object of a composed config, after checking every key and value.

    Keys that are not fields of the schema (at any depth) are errors: Hydra's `+key=value` adds
    them to a structured config, and `OmegaConf.to_object` would then drop them silently. The
    values go through the schema's types and each dataclass's `__post_init__` checks.

    Raises:
        ConfigError: unknown keys (each named with its section's valid keys or a close match),
            a value of the wrong type, or a failed `__post_init__` check.
    """
    data = OmegaConf.to_container(raw, resolve=False) if isinstance(raw, DictConfig) else raw
    data = {key: value for key, value in data.items() if key != "hydra"}
    if problems := unknown_key_errors(data, schema_cls):
        raise ConfigError("; ".join(problems))
    try:
        typed = OmegaConf.merge(OmegaConf.structured(schema_cls), data)
        return OmegaConf.to_object(typed)
    except OmegaConfBaseException as error:  # a wrong type, a missing or unresolvable value
        raise ConfigError(_first_line(error)) from error
    except ValueError as error:  # a __post_init__ check
        raise ConfigError(str(error)) from error


def unknown_key_errors(data: Mapping[str, Any], schema_cls: type, prefix: str = "") -> list[str]:
    """One message per key of `data` (nested mappings included) that `schema_cls` lacks."""
    names = [item.name for item in dataclasses.fields(schema_cls)]
    hints = typing.get_type_hints(schema_cls)
    problems = []
    for key, value in data.items():
        if key not in names:
            problems.append(_unknown_key_message(prefix, str(key), names))
            continue
        nested = _dataclass_of(hints[key])
        if nested is not None and isinstance(value, Mapping):
            problems += unknown_key_errors(value, nested, f"{prefix}{key}.")
    return problems


def check_override_keys(overrides: Iterable[str], schema_cls: type) -> None:
    """Refuse command-line overrides whose key is not in `schema_cls`, `+key=value` or not.

    Hydra's own message for `key=value` on an unknown key suggests the `+` form, which is
    refused as well (`validate_config`): both forms get the same message here, naming the
    section's valid keys. Hydra's own settings (`hydra.*`) and config groups (`a/b=...`) pass.

    Raises:
        ConfigError: the first unknown key of each override, with its section's valid keys.
    """
    try:
        parsed = OverridesParser.create().parse_overrides(list(overrides))
    except HydraException:
        return  # not valid override syntax: Hydra reports it
    problems = []
    for override in parsed:
        key = override.key_or_group
        if override.is_hydra_override() or override.package is not None or "/" in key:
            continue
        if problem := _unknown_path(key.split("."), schema_cls, ""):
            problems.append(problem)
    if problems:
        raise ConfigError("; ".join(problems))


def _unknown_path(parts: Sequence[str], schema_cls: type, prefix: str) -> str | None:
    names = [item.name for item in dataclasses.fields(schema_cls)]
    head, *rest = parts
    if head not in names:
        return _unknown_key_message(prefix, head, names)
    nested = _dataclass_of(typing.get_type_hints(schema_cls)[head])
    if not rest or nested is None:
        return None  # a leaf, or a free-form mapping below it
    return _unknown_path(rest, nested, f"{prefix}{head}.")


def _unknown_key_message(prefix: str, key: str, names: list[str]) -> str:
    section = prefix.rstrip(".")
    close = difflib.get_close_matches(key, names, n=1, cutoff=0.6)
    hint = f" (did you mean {prefix}{close[0]}?)" if close else ""
    where = f"of {section}" if section else "at the top level"
    return f"unknown key {prefix}{key}{hint}; valid keys {where}: {', '.join(names)}"


def _dataclass_of(hint: Any) -> type | None:
    """The dataclass a field holds (`X` or `X | None`), or None."""
    if dataclasses.is_dataclass(hint):
        return hint
    if isinstance(hint, types.UnionType) or typing.get_origin(hint) is typing.Union:
        for option in typing.get_args(hint):
            if dataclasses.is_dataclass(option):
                return option
    return None


def _first_line(error: BaseException) -> str:
    """An OmegaConf or Hydra message without its detail lines (`full_key:`, search path...)."""
    message = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
    key = getattr(error, "full_key", None)
    return f"{key}: {message}" if key and key not in message else message


def validate_or_exit(raw: DictConfig | Mapping[str, Any], schema_cls: type[Schema]) -> Schema:
    """`validate_config`, or print `error: invalid configuration: ...` and exit with status 1."""
    try:
        return validate_config(raw, schema_cls)
    except ConfigError as error:
        fail(f"invalid configuration: {error}", status=1)


def config_main(
    schema_cls: type[Schema], *, config_path: str, config_name: str
) -> Callable[[Callable[[Schema], Any]], Callable[[], Any]]:
    """`hydra.main` for a script whose `main` takes the validated `schema_cls` object.

    Before Hydra composes, the command line's override keys are checked against the schema
    (`check_override_keys`); after, the composed config goes through `validate_config`. Either
    failure prints `error: invalid configuration: ...` and exits with status 1, as Hydra does
    for its own errors. `config_path` is relative to the decorated function's file.
    """

    def decorate(function: Callable[[Schema], Any]) -> Callable[[], Any]:
        folder = Path(inspect.getfile(function)).resolve().parent / config_path

        @hydra.main(config_path=str(folder), config_name=config_name, version_base="1.3")
        def composed(raw: DictConfig) -> Any:
            return function(validate_or_exit(raw, schema_cls))

        @functools.wraps(function)
        def entry() -> Any:
            known, _ = get_args_parser().parse_known_args(sys.argv[1:])
            try:
                check_override_keys(known.overrides or [], schema_cls)
            except ConfigError as error:
                fail(f"invalid configuration: {error}", status=1)
            return composed()

        return entry

    return decorate


def compose_config(
    config_name: str,
    overrides: Sequence[str],
    schema_cls: type[Schema],
    config_dir: Path | str = CONFIG_DIR,
) -> Schema:
    """Compose a preset of `config_dir` with Hydra's compose API and validate it as `schema_cls`.

    The same checks as the scripts run (`check_override_keys`, then `validate_config`), for
    code that needs a script's config without running it: campaigns, benchmarks, tests. A
    training run's preset: `glam.run_config.compose_run`. The schemas declared so far
    (`schema_cls`'s among them) are registered first.

    Raises:
        ConfigError: an unknown preset, bad override syntax, unknown key or invalid value.
    """
    register_configs()
    check_override_keys(overrides, schema_cls)
    try:
        with initialize_config_dir(str(Path(config_dir).resolve()), version_base="1.3"):
            raw = compose(config_name, overrides=list(overrides))
    except (HydraException, OmegaConfBaseException) as error:
        message = _first_line(error)
        if error.__cause__ is not None:  # "Error merging override ...": the cause says why
            message += f": {_first_line(error.__cause__)}"
        if isinstance(error, MissingConfigException):
            presets = sorted(path.stem for path in Path(config_dir).glob("*.yaml"))
            message = f"{message.rstrip('.')}; presets in {config_dir}: {', '.join(presets)}"
        raise ConfigError(message) from error
    return validate_config(raw, schema_cls)
