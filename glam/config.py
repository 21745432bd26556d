"""Typed configuration of glam, registered with Hydra so a misspelt key fails at start-up.

Each dataclass documents its fields once (the docstring under each field) and validates itself in
`__post_init__`. The dataclass defaults ARE the default preset (`configs/smollm2_lora_cpu.yaml`
only restates them): `TrainingRunConfig()` in Python is what the training script runs with no
`--config-name`. The other presets in `configs/` set every value they change.

Every Hydra script turns its composed config into these objects through one function,
`validate_config` (via the `config_main` decorator): keys outside the schema, added with `+` or
not, and values that fail a `__post_init__` check become a `ConfigError` that names the key and
what to do, and the script exits with status 1.
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


def _check_choice(name: str, value: str, choices: tuple[str, ...]) -> None:
    if value not in choices:
        raise ValueError(f"{name}={value!r} is not one of {list(choices)}")


def _check_positive(name: str, value: float) -> None:
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

    def __post_init__(self) -> None:
        _check_positive("model.lora.r", self.r)
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"model.lora.dropout must be in [0, 1), got {self.dropout}")
        self.layers = check_lora_layers(self.layers)


DEFAULT_LORA_LAYERS = 4
"""The training presets' `model.lora.layers` unless they say otherwise (`TrainingRunConfig`);
`AdapterConfig` itself (behavioural cloning's too) adapts every layer by default."""


def check_lora_layers(layers: Any) -> int | list[int] | None:
    """`model.lora.layers` as a number of top layers, a sorted list of layer indices or None.

    Raises:
        ValueError: anything else (a zero or negative count, a negative or repeated index...).
    """
    if layers is None:
        return None
    if isinstance(layers, int) and not isinstance(layers, bool):
        if layers < 1:
            raise ValueError(
                f"model.lora.layers={layers}: a number of top layers must be at least 1 "
                "(null adapts every layer)"
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
            raise ValueError(
                f"model.lora.layers={indices}: a list must hold distinct layer indices >= 0"
            )
        return sorted(indices)
    raise ValueError(
        f"model.lora.layers={layers!r}: give a number of top layers (4), a list of layer "
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
    append_eos: bool = False
    """Also score the EOS token after each candidate (its probability of ending there)."""
    value_hidden_sizes: list[int] = field(default_factory=lambda: [1024, 1024])
    """Hidden layer widths of the value MLP (and of the action-heads MLP)."""
    value_activation: str = "sigmoid"
    """Activation of the head MLPs: sigmoid (as in the original), relu, tanh or gelu."""
    value_from_base: bool = False
    """Compute the value from the base model with the adapter off (TWOSOME) instead of sharing."""
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
        _check_choice("policy.kind", self.kind, ("llm", "generate", "symbolic", "drrn"))
        _check_choice("policy.head", self.head, ("scoring", "action_heads"))
        if not self.temperature > 0:
            raise ValueError(f"policy.temperature must be > 0, got {self.temperature}")
        _check_choice("policy.normalization", self.normalization, ("sum", "token", "word"))
        _check_choice(
            "policy.value_activation", self.value_activation, ("sigmoid", "relu", "tanh", "gelu")
        )
        _check_choice("policy.prompt_format", self.prompt_format, ("glam", "chat", "balrog"))


@dataclass
class SymbolicConfig:
    """BabyAI's actor-critic on minigrid's symbolic observation (`policy.kind=symbolic`): the
    7x7x3 egocentric grid through a convolutional encoder, the mission through a GRU over its
    words, FiLM layers conditioning the image features on the mission, and actor and critic
    MLPs (Chevalier-Boisvert et al. 2019); with `memory`, BabyAI's LSTM memory between the
    pooled features and the two MLPs (`glam.baselines.symbolic`)."""

    image_dim: int = 128
    """Channels of the image encoder and of the FiLM layers."""
    instr_dim: int = 128
    """Word embedding and mission GRU width."""
    film_layers: int = 2
    """FiLM-conditioned convolutional blocks."""
    hidden_dim: int = 64
    """Hidden width of the actor and critic MLPs."""
    vocabulary_buckets: int = 1024
    """Words are hashed (crc32) into this many embedding rows: no vocabulary file, the same ids
    on every process, and paraphrased or translated missions still encode."""
    memory: bool = False
    """BabyAI's LSTM memory (its `use_memory`): an LSTM cell of `image_dim` units reads the
    pooled features of each step, and its hidden state, not the features, feeds the actor and
    the critic. The policy then carries a memory per env, `(h, c)` of `2 * image_dim` numbers,
    zero at the start of an episode, and PPO's update replays it over sequences of
    `ppo.recurrence` steps. False: each step sees only the current view (enough where the target
    stays in view; an object that left the view is forgotten)."""

    def __post_init__(self) -> None:
        for name in ("image_dim", "instr_dim", "film_layers", "hidden_dim"):
            _check_positive(f"symbolic.{name}", getattr(self, name))
        if self.vocabulary_buckets < 2:
            raise ValueError(
                f"symbolic.vocabulary_buckets must be >= 2, got {self.vocabulary_buckets}"
            )


@dataclass
class DRRNConfig:
    """The Deep Reinforcement Relevance Network (He et al. 2016; `policy.kind=drrn`): GRU
    encoders of the prompt and of each action string, Q(s, a) from their joint features, TD
    learning from a replay buffer with a target network, trained from scratch on the same
    BabyAI-Text prompts as the LLM."""

    embedding_dim: int = 64
    """Word embedding width (words hashed into `vocabulary_buckets` rows)."""
    hidden_dim: int = 128
    """Width of the GRU encoders and of the Q MLP."""
    vocabulary_buckets: int = 4096
    """Embedding rows words are hashed into (crc32; no vocabulary file)."""
    lr: float = 1e-3
    """Adam learning rate."""
    gamma: float = 0.99
    """Discount factor of the TD target."""
    replay_size: int = 50_000
    """Transitions kept in the replay buffers, over all processes (each process keeps
    replay_size / world_size of its own envs'; oldest dropped first)."""
    batch_size: int = 64
    """Transitions per TD gradient step, over all processes (each samples batch_size /
    world_size from its own buffer; DDP averages the gradients)."""
    learning_starts: int = 500
    """Frames collected before the first gradient step."""
    updates_per_step: float = 0.25
    """TD gradient steps per frame collected over all processes (0.25: one step per 4 frames)."""
    target_update_every: int = 250
    """Gradient steps between copies of the online network into the target network."""
    exploration: str = "softmax"
    """`softmax`: sample from softmax(Q / temperature) (He et al.); `epsilon`: epsilon-greedy."""
    temperature: float = 1.0
    """Softmax exploration temperature (Q values scale with `env.reward_scale`)."""
    epsilon_start: float = 1.0
    """Epsilon-greedy: epsilon at the start."""
    epsilon_end: float = 0.05
    """Epsilon-greedy: epsilon after `epsilon_decay_frames`."""
    epsilon_decay_frames: int = 20_000
    """Epsilon-greedy: frames of linear decay."""
    max_grad_norm: float = 5.0
    """Gradient norm clip."""
    log_every: int = 1024
    """Frames between two rows of metrics.csv, rounded up to a multiple of `env.num_envs`: the
    "update" of a DRRN run (`train.save_every` counts them)."""

    def __post_init__(self) -> None:
        for name in (
            "embedding_dim",
            "hidden_dim",
            "lr",
            "replay_size",
            "batch_size",
            "target_update_every",
            "temperature",
            "max_grad_norm",
            "log_every",
        ):
            _check_positive(f"drrn.{name}", getattr(self, name))
        _check_choice("drrn.exploration", self.exploration, ("softmax", "epsilon"))
        if not 0.0 <= self.gamma <= 1.0:
            raise ValueError(f"drrn.gamma must be in [0, 1], got {self.gamma}")
        if self.updates_per_step < 0 or self.learning_starts < 0:
            raise ValueError("drrn.updates_per_step and drrn.learning_starts must be >= 0")
        if self.vocabulary_buckets < 2:
            raise ValueError(f"drrn.vocabulary_buckets must be >= 2, got {self.vocabulary_buckets}")


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
        _check_positive("env.num_envs", self.num_envs)
        _check_positive("env.nbr_obs", self.nbr_obs)
        _check_positive("env.reward_scale", self.reward_scale)
        _check_choice("env.language", self.language, ("en", "fr"))


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
        _check_positive("ppo.lr", self.lr)
        _check_choice("ppo.lr_schedule", self.lr_schedule, ("constant", "linear", "cosine"))
        for name in (
            "frames_per_env",
            "epochs",
            "minibatch_size",
            "clip_eps",
            "max_grad_norm",
            "recurrence",
        ):
            _check_positive(f"ppo.{name}", getattr(self, name))
        if self.micro_batch_size is not None:
            _check_positive("ppo.micro_batch_size", self.micro_batch_size)
        if len(self.adam_betas) != 2 or not all(0.0 <= b < 1.0 for b in self.adam_betas):
            raise ValueError(f"ppo.adam_betas must be two numbers in [0, 1), got {self.adam_betas}")
        for name in ("gamma", "gae_lambda"):
            if not 0.0 <= getattr(self, name) <= 1.0:
                raise ValueError(f"ppo.{name} must be in [0, 1], got {getattr(self, name)}")
        if self.warmup_updates < 0:
            raise ValueError(f"ppo.warmup_updates must be >= 0, got {self.warmup_updates}")
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
    """torch.set_num_threads per process; None: torch's default."""
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
    label: str = ""
    """Name of the run's variant in comparisons (`scripts/compare_runs.py` groups runs by it);
    empty: the preset's name (`--config-name`), written into the run's config.yaml."""

    def __post_init__(self) -> None:
        _check_positive("train.total_frames", self.total_frames)
        if not 0 <= self.seed < MAX_RUN_SEED:
            raise ValueError(
                f"train.seed must be in [0, {MAX_RUN_SEED}), got {self.seed}: larger seeds "
                "would reach the evaluation episodes' seeds (10**12 and up)"
            )
        if self.save_every < 0 or self.keep_checkpoints < 0:
            raise ValueError("train.save_every and train.keep_checkpoints must be >= 0")
        if self.torch_threads is not None:
            _check_positive("train.torch_threads", self.torch_threads)
        if self.probe_every < 0:
            raise ValueError(f"train.probe_every must be >= 0, got {self.probe_every}")
        if self.resume_from:
            self.resume = True


TEACHERS: tuple[str, ...] = ("none", "llm", "bot", "uniform")
"""`none`: plain PPO; `llm`: a language model weighs the candidate subgoals (LLM4Teach);
`bot`: BabyAI's bot (an oracle control); `uniform`: every candidate subgoal equally (a null
control: the skills without anybody choosing among them)."""


@dataclass
class TeachConfig:
    """A teacher's action distribution distilled into the student (LLM4Teach's kickstarting).

    The student's loss is PPO's plus `coef_k * CE(pi_teacher, pi_student)` on the states it
    visits. `coef_k = max(coef_start - coef_decay * (k - 1), coef_floor)` at update k (1, 2, ...);
    0 from update `off_after` + 1 on: from then the teacher is not consulted at all. The authors'
    values are 10, 0.005 per update, 0.1 and 3000 updates (../shared/REFERENCE.md); presets scale
    the schedule to their shorter runs.
    """

    teacher: str = "none"
    """`none`, `llm`, `bot` or `uniform` (see `TEACHERS`)."""
    model: str = DEFAULT_MODEL
    """`teacher=llm`: the scoring model (embedded name, local folder, .gguf file or hub id)."""
    backend: str = "local"
    """`teacher=llm`: `local` (the model runs in this process) or `openai` (scores come from an
    OpenAI-compatible `/v1/completions` endpoint at `base_url`, with echoed prompt
    log-probabilities: vLLM, llama.cpp's server, `scripts/serve_openai.py`)."""
    base_url: str = "http://127.0.0.1:8080/v1"
    """`backend=openai`: the endpoint, up to and including `/v1`."""
    model_id: str = ""
    """`backend=openai`: the model name sent; empty: the first the server lists."""
    timeout: float = 60.0
    """`backend=openai`: seconds to wait for an answer (then retried, see `max_retries`)."""
    max_retries: int = 4
    """`backend=openai`: retries of a failed request (connection, time-out, 429, 5xx)."""
    temperature: float = 1.0
    """Subgoal probabilities are `softmax(log P(subgoal | situation) / temperature)`."""
    coef_start: float = 10.0
    """Weight of the distillation term at update 1."""
    coef_decay: float = 0.005
    """Subtracted from the weight at each update."""
    coef_floor: float = 0.1
    """Lowest weight while the term is on."""
    off_after: int = 3000
    """Last update with the term; from the next one the student learns from rewards alone."""
    cache: bool = True
    """Keep the subgoal probabilities of each distinct situation text (the model is asked once
    per situation). Off, every state asks the model."""

    def __post_init__(self) -> None:
        if self.teacher not in TEACHERS:
            raise ValueError(f"teach.teacher={self.teacher!r} is not one of {list(TEACHERS)}")
        if self.backend not in ("local", "openai"):
            raise ValueError(f"teach.backend={self.backend!r} is not 'local' or 'openai'")
        if not self.temperature > 0:
            raise ValueError(f"teach.temperature must be > 0, got {self.temperature}")
        if self.coef_start < 0 or self.coef_decay < 0 or self.coef_floor < 0:
            raise ValueError(
                "teach.coef_start, teach.coef_decay and teach.coef_floor must be >= 0, got "
                f"{self.coef_start}, {self.coef_decay} and {self.coef_floor}"
            )
        if self.coef_floor > self.coef_start:
            raise ValueError(
                f"teach.coef_floor={self.coef_floor} is above teach.coef_start={self.coef_start}"
            )
        if self.off_after < 0:
            raise ValueError(f"teach.off_after must be >= 0, got {self.off_after}")
        if not self.timeout > 0 or self.max_retries < 0:
            raise ValueError("teach.timeout must be > 0 and teach.max_retries >= 0")

    def coef(self, update: int) -> float:
        """The distillation weight of update `update` (1 for the first update of the run)."""
        if self.teacher == "none" or update > self.off_after:
            return 0.0
        return max(self.coef_start - self.coef_decay * (update - 1), self.coef_floor)


ASK_MODES: tuple[str, ...] = ("none", "learned", "always", "skill_end", "random")
"""When the agent asks the planner (besides the forced queries when a skill ends or fails):
`none`: no planner (plain RL over primitive actions); `learned`: the mediator policy's choice;
`always`: at every step; `skill_end`: never by choice; `random`: with probability
`ask.probability` at each step."""


@dataclass
class AskConfig:
    """LLM4RL's planner and mediator (`glam.ask`): a planner picks subgoals that skills carry
    out; the policy trained by PPO is the mediator, whose two actions are "ask" (the planner's
    subgoal replaces the current skill) and "continue" (the current skill acts). A skill that
    ends or cannot act forces a query. Each query costs `cost + repeat_cost * f_rep` (f_rep: 1
    when the planner repeats its previous subgoal of the episode, -0.1 when it changes it, 0 on
    the episode's first query), subtracted from the step's reward (the authors' lambda = 0.01 and
    0.1, ../shared/REFERENCE.md)."""

    mode: str = "none"
    """`none`, `learned`, `always`, `skill_end` or `random` (see `ASK_MODES`)."""
    planner: str = "llm"
    """`llm`: a language model scores the candidate subgoals of the situation, the best one is
    taken (the `teach` teacher's prompt); `bot`: BabyAI's bot's current subgoal (an oracle)."""
    model: str = DEFAULT_MODEL
    """`planner=llm`: the scoring model (embedded name, local folder, .gguf file or hub id)."""
    backend: str = "local"
    """`planner=llm`: `local` (in this process) or `openai` (an OpenAI-compatible
    `/v1/completions` endpoint at `base_url` that echoes prompt log-probabilities)."""
    base_url: str = "http://127.0.0.1:8080/v1"
    """`backend=openai`: the endpoint, up to and including `/v1`."""
    model_id: str = ""
    """`backend=openai`: the model name sent; empty: the first the server lists."""
    timeout: float = 60.0
    """`backend=openai`: seconds to wait for an answer (then retried, see `max_retries`)."""
    max_retries: int = 4
    """`backend=openai`: retries of a failed request (connection, time-out, 429, 5xx)."""
    cache: bool = False
    """Keep the planner's answer per distinct situation (mission, objects in view, carried
    object, candidates). Off (the default), every query asks the model: its latency is real."""
    cost: float = 0.01
    """lambda: the cost of a query, subtracted from the step's reward."""
    repeat_cost: float = 0.1
    """Weight of f_rep in a query's cost (see the class docstring)."""
    probability: float = 0.1
    """`mode=random`: the probability of asking at each step."""
    budget: int = 0
    """Most queries by choice (not forced) per episode, in every mode; 0: no limit."""
    show_subgoal: bool = True
    """Append the current subgoal to the mission the policy reads ("<mission> | subgoal:
    <subgoal>"): without it a memoryless policy cannot tell whether the skill running is the
    one the view calls for."""

    def __post_init__(self) -> None:
        _check_choice("ask.mode", self.mode, ASK_MODES)
        _check_choice("ask.planner", self.planner, ("llm", "bot"))
        _check_choice("ask.backend", self.backend, ("local", "openai"))
        if self.cost < 0 or self.repeat_cost < 0:
            raise ValueError(
                f"ask.cost and ask.repeat_cost must be >= 0, got {self.cost} and {self.repeat_cost}"
            )
        if not 0.0 <= self.probability <= 1.0:
            raise ValueError(f"ask.probability must be in [0, 1], got {self.probability}")
        if self.budget < 0:
            raise ValueError(f"ask.budget must be >= 0, got {self.budget}")
        if not self.timeout > 0 or self.max_retries < 0:
            raise ValueError("ask.timeout must be > 0 and ask.max_retries >= 0")


ONI_REWARD_MODELS: tuple[str, ...] = ("none", "retrieval", "classification", "ranking")
"""ONI's reward models: `none` (no intrinsic reward, no annotator: plain RL), `retrieval` (a
table of the labelled messages; 0 for the others), `classification` (a small text classifier
trained online on the labels, so unseen messages get a reward too), `ranking` (Motif's: the
annotator prefers one of two messages of a goal, and a score fitted to the preferences ranks
every message)."""
ONI_BACKENDS: tuple[str, ...] = ("local", "openai", "oracle", "random", "yes")
"""Who labels (`oni.backend`): a language model (`local`, `openai`), or a control that reads
nothing of the event's meaning: `oracle` (the task's progress), `random` ("yes" at
`oni.random_rate`), `yes` (every event helps)."""


@dataclass
class OniConfig:
    """ONI's intrinsic reward from an LLM's labels of the agent's events (`glam.oni`).

    The env's event messages (`info["events"]` of BabyAI-Text, with the episode's mission) are
    sent once each to an annotator in its own process, which labels the newest first, in
    batches: 1 when its judge says the event helps reach the goal, else 0. The learner never
    waits: it polls, and a message not labelled yet is worth 0. A reward model turns the labels
    into `r_llm(message)`; a step's reward is `extrinsic_coef * r_env + intrinsic_coef *
    sum_m r_llm(m) / N_episode(m) ** beta`, N counting m's occurrences in the episode so far
    (ONI's count decay; ../shared/REFERENCE.md).
    """

    reward_model: str = "none"
    """`none`, `retrieval` or `classification` (see `ONI_REWARD_MODELS`); `none` is plain RL."""
    backend: str = "local"
    """Who labels: `local` (the scoring model `model` in the annotator's process: label 1 when
    it prefers "yes" to "no" after the judging prompt), `openai` (the same question to an
    OpenAI-compatible `/v1/completions` endpoint at `base_url` that echoes prompt
    log-probabilities: vLLM, llama.cpp's server, `scripts/serve_openai.py`) or `oracle` (the
    task's own definition of progress, `glam.oni.oracle`: a control), `random` ("yes" with
    probability `random_rate`, the same answer for a message every time: a control for the
    label content at a judge's positive rate) or `yes` ("yes" to every event: a control)."""
    random_rate: float = 0.51
    """`backend=random`: the probability of a "yes"; the default is the share of the messages
    of the UnlockPickup runs that the calibrated SmolLM2 called helpful (docs/oni.md)."""
    random_seed: int | None = None
    """`backend=random`: which messages get a "yes" (a hash of the seed and the message); None:
    the run's `train.seed`, so the seeds of a campaign label differently."""
    model: str = DEFAULT_MODEL
    """`backend=local`: the judging model (embedded name, local folder, .gguf file or hub id)."""
    base_url: str = "http://127.0.0.1:8080/v1"
    """`backend=openai`: the endpoint, up to and including `/v1`."""
    model_id: str = ""
    """`backend=openai`: the model name sent; empty: the first the server lists."""
    timeout: float = 60.0
    """`backend=openai`: seconds to wait for an answer (then retried, see `max_retries`)."""
    max_retries: int = 4
    """`backend=openai`: retries of a failed request (connection, time-out, 429, 5xx)."""
    calibrate: bool = True
    """`local`/`openai`: compare the judge's margin `log P(yes) - log P(no)` with its margin for
    content-free events under the same goal (contextual calibration) instead of with 0: the
    embedded SmolLM2 answers "no" to every event uncalibrated (docs/oni.md)."""
    extrinsic_coef: float = 1.0
    """Weight of the env's reward."""
    intrinsic_coef: float = 0.1
    """Weight of the intrinsic reward (a helpful event is worth 1 at its first occurrence)."""
    beta: float = 3.0
    """Count decay: the m-th occurrence of a message in an episode is worth `1 / m ** beta`."""
    batch_size: int = 100
    """Messages the annotator labels per batch (the newest pending ones)."""
    delay: float = 0.0
    """Seconds the annotator sleeps after each batch: a deliberately slow annotator, to measure
    that the learner does not wait for it."""
    hang_timeout: float = 600.0
    """Seconds without any answer from the annotator (it starts, labels or fails) while
    messages are pending, after which it is declared hung and the run stops."""
    threads: int = 1
    """Torch threads of the annotator's process."""
    classifier_steps: int = 32
    """`classification`, `ranking`: gradient steps on the labels (preferences) after each
    update that brought new ones."""
    classifier_max_examples: int = 25_000
    """`classification`: the classifier trains while it has at most this many labels."""
    classifier_lr: float = 1e-2
    """`classification`, `ranking`: Adam's learning rate."""
    ranking_pairs: int = 2
    """`ranking`: each new message is paired with this many earlier messages of its goal
    (drawn at random, seeded), each pair sent to the annotator for a preference."""
    ranking_threshold: float = 0.5
    """`ranking`: a message's reward is its win rate (the fitted probability that it is
    preferred to a message met, averaged over them), and 0 below this (Motif's threshold: the
    events that lose to most others earn nothing)."""

    def __post_init__(self) -> None:
        _check_choice("oni.reward_model", self.reward_model, ONI_REWARD_MODELS)
        _check_choice("oni.backend", self.backend, ONI_BACKENDS)
        if self.extrinsic_coef < 0 or self.intrinsic_coef < 0 or self.beta < 0:
            raise ValueError(
                "oni.extrinsic_coef, oni.intrinsic_coef and oni.beta must be >= 0, got "
                f"{self.extrinsic_coef}, {self.intrinsic_coef} and {self.beta}"
            )
        if self.batch_size < 1 or self.threads < 1 or self.classifier_steps < 0:
            raise ValueError(
                "oni.batch_size and oni.threads must be >= 1 and oni.classifier_steps >= 0, got "
                f"{self.batch_size}, {self.threads} and {self.classifier_steps}"
            )
        if self.delay < 0 or not self.hang_timeout > 0:
            raise ValueError(
                f"oni.delay must be >= 0 and oni.hang_timeout > 0, got {self.delay} and "
                f"{self.hang_timeout}"
            )
        if not self.timeout > 0 or self.max_retries < 0:
            raise ValueError("oni.timeout must be > 0 and oni.max_retries >= 0")
        if not self.classifier_lr > 0 or self.classifier_max_examples < 1:
            raise ValueError("oni.classifier_lr must be > 0 and oni.classifier_max_examples >= 1")
        if not 0.0 <= self.random_rate <= 1.0:
            raise ValueError(f"oni.random_rate must be in [0, 1], got {self.random_rate}")
        if self.ranking_pairs < 1 or not 0.0 <= self.ranking_threshold < 1.0:
            raise ValueError(
                "oni.ranking_pairs must be >= 1 and oni.ranking_threshold in [0, 1), got "
                f"{self.ranking_pairs} and {self.ranking_threshold}"
            )


CODEACT_CHOOSERS: tuple[str, ...] = ("none", "scored", "chat", "random", "fixed")
"""Who chooses the sub-actions to code (`codeact.chooser`); `none`: no coded actions."""
CODEACT_WRITERS: tuple[str, ...] = ("library", "chat")
"""Who writes their code (`codeact.writer`)."""
CODEACT_CRITICS: tuple[str, ...] = ("rules", "chat")
"""Who reviews each phase (`codeact.critic`)."""


@dataclass
class CodeactConfig:
    """RL-GPT's coded actions (`glam.codeact`, docs/rlgpt.md): a slow agent chooses which
    sub-actions of the level to write as code, a fast agent writes them, they join the
    policy's actions next to the primitive ones, and after each RL phase a critic keeps, drops
    or rewrites each from its statistics.

    The run is `iterations` phases of `phase_frames` primitive frames (the last runs to
    `train.total_frames`). The policy has `num_actions` coded-action slots after the primitive
    actions: an action carried over keeps its slot, a new one takes a freed slot (its output
    starts afresh).
    """

    chooser: str = "none"
    """`scored` (a language model scores each candidate after a description of the level and
    the feedback: `model` in this process or `base_url`'s `/v1/completions`), `chat` (a chat
    model at `base_url` is asked in words), `random` (the control), `fixed` (the names in
    `actions`, in order: a hand-written reference) or `none` (no coded actions: plain RL)."""
    actions: list[str] = field(default_factory=list)
    """`chooser=fixed`: the sub-actions to code (skill names of `glam.codeact.library`, e.g.
    "go to the object in the mission", "pick up a key", "open the door")."""
    writer: str = "library"
    """`library` (our skills, selected and parameterised by name: what the embedded model can
    use) or `chat` (a code-writing chat model at `base_url` writes each function)."""
    critic: str = "rules"
    """Who decides after each phase what becomes of each coded action: `rules` (keep, drop or
    rewrite by its statistics, `glam.codeact.critic.judge`) or `chat` (a chat model at
    `base_url` reads the statistics and the errors and decides, as RL-GPT's critic does; an
    action it leaves undecided gets the rules' verdict)."""
    num_actions: int = 4
    """Coded actions in the policy's action set (slots)."""
    iterations: int = 3
    """Outer iterations (RL phases, each followed by the critic's review)."""
    phase_frames: int = 0
    """Primitive frames per RL phase; 0: `train.total_frames // iterations`."""
    max_steps_per_action: int = 32
    """Primitive steps after which an execution of a coded action is stopped."""
    family_episodes: int = 8
    """Episodes of the level whose missions and first views describe it to the slow agent."""
    max_failure_rate: float = 0.5
    """The critic drops (library) or rewrites (generated) an action failing more often."""
    min_uses: int = 5
    """Uses an action needs before its failure rate is judged (an unused one is dropped)."""
    backend: str = "local"
    """`chooser=scored`: `local` (`model` in this process) or `openai` (`base_url`)."""
    model: str = DEFAULT_MODEL
    """`chooser=scored`, `backend=local`: the scoring model."""
    base_url: str = "http://127.0.0.1:8080/v1"
    """The OpenAI-compatible endpoint of `backend=openai`, `chooser=chat`, `writer=chat` and
    `critic=chat`."""
    model_id: str = ""
    """The model name sent to `base_url`; empty: the first the server lists."""
    temperature: float = 0.0
    """Chat answers' sampling temperature (0: greedy)."""
    max_tokens: int = 1024
    """Most tokens of a chat answer."""
    timeout: float = 120.0
    """Seconds to wait for an answer of `base_url`."""
    max_retries: int = 4
    """Retries of a failed request to `base_url`."""
    call_timeout: float = 1.0
    """Wall-clock seconds one call of a coded action's `step` may take in the sandbox."""
    line_budget: int = 10_000
    """Lines one call may execute."""
    memory_mb: int = 512
    """Memory the sandbox's worker may add to what it had at start."""

    def __post_init__(self) -> None:
        _check_choice("codeact.chooser", self.chooser, CODEACT_CHOOSERS)
        _check_choice("codeact.writer", self.writer, CODEACT_WRITERS)
        _check_choice("codeact.critic", self.critic, CODEACT_CRITICS)
        if (self.chooser == "fixed") != bool(self.actions):
            raise ValueError(
                "codeact.actions lists the sub-actions of codeact.chooser=fixed, and only those "
                f"(chooser={self.chooser!r}, actions={list(self.actions)})"
            )
        _check_choice("codeact.backend", self.backend, ("local", "openai"))
        if self.num_actions < 1 or self.iterations < 1 or self.phase_frames < 0:
            raise ValueError(
                "codeact.num_actions and codeact.iterations must be >= 1 and "
                f"codeact.phase_frames >= 0, got {self.num_actions}, {self.iterations} and "
                f"{self.phase_frames}"
            )
        if self.max_steps_per_action < 1 or self.family_episodes < 1 or self.min_uses < 1:
            raise ValueError(
                "codeact.max_steps_per_action, codeact.family_episodes and codeact.min_uses "
                "must be >= 1"
            )
        if not 0.0 <= self.max_failure_rate < 1.0:
            raise ValueError(
                f"codeact.max_failure_rate must be in [0, 1), got {self.max_failure_rate}"
            )
        if self.temperature < 0 or self.max_tokens < 1:
            raise ValueError("codeact.temperature must be >= 0 and codeact.max_tokens >= 1")
        if not self.timeout > 0 or self.max_retries < 0:
            raise ValueError("codeact.timeout must be > 0 and codeact.max_retries >= 0")
        if not self.call_timeout > 0 or self.line_budget < 1 or self.memory_mb < 1:
            raise ValueError(
                "codeact.call_timeout must be > 0, codeact.line_budget and codeact.memory_mb >= 1"
            )


# --------------------------------------------------------------------------------------------
# Written actions and the algorithm of the update
# --------------------------------------------------------------------------------------------

LANGUAGE_MODEL_KINDS: tuple[str, ...] = ("llm", "generate")
"""`policy.kind`s whose policy is a language model (section `model` applies)."""

ANSWER_FORMATS: tuple[str, ...] = ("action", "think")
"""`action`: the answer is the action, exactly (after normalisation); `think`: free reasoning
ending in "ACTION: <action>" (BALROG's chain-of-thought agent)."""


@dataclass
class GenerationConfig:
    """A policy that writes its action (`policy.kind=generate`, `glam.policy.writer`): the model
    samples an answer after the prompt, the answer is read into one of the env's actions, and
    the log-probability of the whole answer (its sampled tokens, temperature included) is the
    action's. docs/written_actions.md."""

    max_new_tokens: int = 8
    """Most tokens of an answer. An `action` answer ends earlier at the end-of-text token or a
    newline (a GLAM prompt would otherwise go on with the next observation); a `think` answer
    ends at the end-of-text token only, and needs room (64-256)."""
    temperature: float = 1.0
    """Sampling temperature (no top-k or top-p cut): the old log-probabilities of PPO's ratio
    are those of this distribution. `policy.temperature` is the scoring policy's, unused here."""
    answer: str = "action"
    """`action`: the answer, lower-cased, spaces collapsed and surrounding punctuation stripped,
    must be one of the action words; `think`: the text after the answer's last "ACTION:" must
    be (BALROG's cot reading; needs `policy.prompt_format=chat` or `balrog`)."""
    invalid_action: str = "noop"
    """What an invalid answer plays: `noop` (minigrid's `done`, which does nothing in BabyAI;
    the step and its time pass) or an action word (BALROG plays `go forward`)."""
    invalid_penalty: float = 0.0
    """Subtracted from the reward of a step whose answer was invalid (in BabyAI's reward units,
    then scaled by `env.reward_scale` like the reward). 0: none."""
    feedback: bool = True
    """Start the observation after an invalid answer with BALROG's notice ("Your previous output
    did not contain a valid action. Defaulted to action: ...")."""
    max_history: int = 16
    """`policy.prompt_format=balrog`: observations kept in the dialogue, and as many answers
    (BALROG: 16). The GLAM and chat formats keep `env.nbr_obs` observations."""
    kv_cache: bool = True
    """Keep each env's keys and values from one turn to the next and read only the tokens a
    prompt adds to the last one (the longest common prefix is reused; the rest is computed).
    Exact (tests/test_writer.py); it pays where prompts grow (BALROG's dialogue)."""
    collapse_share: float = 0.95
    """The degenerate-output guard (RAGEN's "Echo Trap"): the run stops, saying so, when one
    answer string is at least this share of a rollout's answers for `collapse_updates`
    rollouts in a row."""
    collapse_updates: int = 3
    """Rollouts in a row the guard waits for (0: the guard is off; the answer statistics are
    logged anyway)."""

    def __post_init__(self) -> None:
        _check_positive("generate.max_new_tokens", self.max_new_tokens)
        _check_positive("generate.temperature", self.temperature)
        _check_positive("generate.max_history", self.max_history)
        _check_choice("generate.answer", self.answer, ANSWER_FORMATS)
        if not self.invalid_action:
            raise ValueError("generate.invalid_action is empty: give `noop` or an action word")
        if self.invalid_penalty < 0:
            raise ValueError(
                f"generate.invalid_penalty must be >= 0 (it is subtracted), got "
                f"{self.invalid_penalty}"
            )
        if not 0.0 < self.collapse_share <= 1.0:
            raise ValueError(
                f"generate.collapse_share must be in (0, 1], got {self.collapse_share}"
            )
        if self.collapse_updates < 0:
            raise ValueError(f"generate.collapse_updates must be >= 0, got {self.collapse_updates}")


ALGORITHMS: tuple[str, ...] = ("ppo", "grpo", "gigpo")
"""The update's algorithm (`glam.ppo.algorithms`): PPO (GAE with a value head), GRPO (group-
normalised episode returns, no value head, KL to the reference) and GiGPO (GRPO plus step-level
advantages from identical observations across a group's episodes)."""

CLIP_LEVELS: tuple[str, ...] = ("sequence", "token")


@dataclass
class AlgorithmConfig:
    """How an update turns a rollout into advantages and a loss. `ppo` is the trainer's PPO,
    bit for bit; `grpo` and `gigpo` play groups of `group_size` envs on the same episode seeds,
    start every rollout on new episodes, and train on the episodes that end within it
    (docs/written_actions.md). The PPO keys (`ppo.clip_eps`, `ppo.entropy_coef`, `ppo.gamma`,
    epochs, minibatches, learning rate) apply to all three."""

    name: str = "ppo"
    """`ppo`, `grpo` or `gigpo` (see `ALGORITHMS`)."""
    group_size: int = 4
    """`grpo`, `gigpo`: envs per group, playing the same seeds (G); it divides each process's
    envs. Ignored by `ppo`."""
    kl_coef: float = 0.01
    """`grpo`, `gigpo`: weight of the KL penalty to the reference, the base model with the LoRA
    adapter switched off (GRPO's k3 estimator per answer token; verl-agent's GiGPO recipe uses
    0.01). Needs `policy.kind=generate` when above 0."""
    clip_level: str | None = None
    """Where the ratio is clipped: `sequence` (the whole answer's probability ratio: turn-level
    PPO) or `token` (each answer token's, GRPO's and GiGPO's; needs `policy.kind=generate`).
    None: `sequence` for `ppo`, `token` for `grpo` and `gigpo`."""
    std_normalize: bool = True
    """`grpo`, `gigpo`: divide by the group's standard deviation after subtracting its mean
    (GRPO); false subtracts the mean only (GiGPO's `mean_norm` mode, Dr. GRPO)."""
    step_advantage_weight: float = 1.0
    """`gigpo`: omega, the weight of the step-level advantage added to the episode-level one.
    Step returns are discounted by `ppo.gamma` (GiGPO's recipe: 0.95)."""

    def __post_init__(self) -> None:
        _check_choice("algorithm.name", self.name, ALGORITHMS)
        _check_positive("algorithm.group_size", self.group_size)
        if self.kl_coef < 0 or self.step_advantage_weight < 0:
            raise ValueError("algorithm.kl_coef and algorithm.step_advantage_weight must be >= 0")
        if self.clip_level is None:
            self.clip_level = "sequence" if self.name == "ppo" else "token"
        _check_choice("algorithm.clip_level", self.clip_level, CLIP_LEVELS)
        if self.name == "ppo" and self.clip_level != "sequence":
            raise ValueError(
                "algorithm.clip_level=token with algorithm.name=ppo: turn-level PPO clips the "
                "ratio of the whole answer (`sequence`); token-level clipping is GRPO's and GiGPO's"
            )
        if self.name != "ppo" and self.group_size < 2:
            raise ValueError(
                f"algorithm.group_size={self.group_size}: {self.name} compares the episodes of a "
                "group; give at least 2"
            )


def check_written_actions(cfg: TrainingRunConfig) -> None:
    """The combinations of `policy.kind=generate` and of the algorithms that a run can train.

    Raises:
        ValueError: naming the keys to change.
    """
    generate, algorithm = cfg.policy.kind == "generate", cfg.algorithm
    if cfg.policy.prompt_format == "balrog" and not generate:
        raise ValueError(
            "policy.prompt_format=balrog is BALROG's dialogue for a policy that writes its "
            "action: set policy.kind=generate"
        )
    if generate and cfg.generate.answer == "think" and cfg.policy.prompt_format == "glam":
        raise ValueError(
            'generate.answer=think asks the model to reason before "ACTION:", which needs a '
            "request in the prompt: set policy.prompt_format=chat or balrog"
        )
    if generate and (cfg.policy.head != "scoring" or cfg.policy.value_from_base):
        raise ValueError(
            "policy.head and policy.value_from_base are the scoring policy's: leave them at "
            "`scoring` and false with policy.kind=generate (its value head reads the prompt)"
        )
    if generate:
        clash = {
            "teach.teacher": cfg.teach.teacher,
            "ask.mode": cfg.ask.mode,
            "codeact.chooser": cfg.codeact.chooser,
        }
        used = [f"{key}={value!r}" for key, value in clash.items() if value != "none"]
        if used or cfg.train.save_rollouts:
            used += ["train.save_rollouts=true"] if cfg.train.save_rollouts else []
            raise ValueError(
                f"policy.kind=generate does not run with {', '.join(used)} yet: a written answer "
                "is not one of a fixed list of actions that a teacher, a mediator, coded actions "
                "or the demonstrations format expect"
            )
    if algorithm.name == "ppo":
        return
    if cfg.policy.kind == "drrn":
        raise ValueError(f"algorithm.name={algorithm.name!r} is a policy gradient: not for DRRN")
    if not generate and (algorithm.kl_coef > 0 or algorithm.clip_level == "token"):
        raise ValueError(
            f"algorithm.name={algorithm.name!r} with policy.kind={cfg.policy.kind!r}: the KL "
            "penalty to the reference and token-level clipping need the answer's tokens "
            "(policy.kind=generate); set algorithm.kl_coef=0 algorithm.clip_level=sequence"
        )
    if cfg.env.num_envs % algorithm.group_size:
        raise ValueError(
            f"algorithm.group_size={algorithm.group_size} must divide env.num_envs="
            f"{cfg.env.num_envs} (each group is G envs on the same seeds)"
        )
    if cfg.policy.kind == "symbolic" and cfg.symbolic.memory:
        raise ValueError(
            f"algorithm.name={algorithm.name!r} with symbolic.memory=true: the group "
            "estimators train on whole episodes of a policy without memory"
        )


def check_trained_precision(cfg: TrainingRunConfig) -> None:
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


@hydra_schema("training_run_schema")
@dataclass
class TrainingRunConfig:
    """Everything `scripts/train_language_agent.py` needs: the root of the Hydra presets.

    `TrainingRunConfig()` is the default preset, `smollm2_lora_cpu`: the embedded SmolLM2-135M
    with a LoRA adapter, on the CPU, going to the red ball (docs/training.md).
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
    symbolic: SymbolicConfig = field(default_factory=SymbolicConfig)
    """The symbolic agent's network (`policy.kind=symbolic`; unused otherwise)."""
    drrn: DRRNConfig = field(default_factory=DRRNConfig)
    """The DRRN agent and its TD learning (`policy.kind=drrn`; unused otherwise)."""
    teach: TeachConfig = field(default_factory=TeachConfig)
    """A teacher whose action distribution the student distils early on (`glam.teach`)."""
    ask: AskConfig = field(default_factory=AskConfig)
    """A planner asked for subgoals, and when to ask it (`glam.ask`)."""
    oni: OniConfig = field(default_factory=OniConfig)
    """An intrinsic reward from an LLM's labels of the agent's events (`glam.oni`)."""
    codeact: CodeactConfig = field(default_factory=CodeactConfig)
    """Coded actions chosen by a slow LLM agent and refined by a critic (`glam.codeact`)."""
    generate: GenerationConfig = field(default_factory=GenerationConfig)
    """How a policy that writes its action samples and reads it (`policy.kind=generate`)."""
    algorithm: AlgorithmConfig = field(default_factory=AlgorithmConfig)
    """The update's advantages and loss: PPO (default), GRPO or GiGPO (`glam.ppo.algorithms`)."""

    @property
    def frames_per_update(self) -> int:
        """Transitions collected per update, over all environments and processes."""
        return self.env.num_envs * self.ppo.frames_per_env

    @property
    def num_updates(self) -> int:
        """Updates a fresh run needs to collect `train.total_frames` (the last one may overshoot;
        a resumed run counts the frames it has)."""
        return -(-self.train.total_frames // self.frames_per_update)

    def __post_init__(self) -> None:
        if self.teach.teacher != "none" and self.policy.kind == "drrn":
            raise ValueError(
                f"teach.teacher={self.teach.teacher!r}: a teacher is distilled into a PPO "
                "student (policy.kind=symbolic or llm), not into DRRN's Q-values"
            )
        if self.ask.mode != "none" and self.policy.kind != "symbolic":
            raise ValueError(
                f"ask.mode={self.ask.mode!r}: the mediator is the symbolic network "
                f"(policy.kind=symbolic), not policy.kind={self.policy.kind!r}"
            )
        if self.ask.mode != "none" and self.teach.teacher != "none":
            raise ValueError(
                f"ask.mode={self.ask.mode!r} with teach.teacher={self.teach.teacher!r}: a teacher "
                "advises primitive actions, the mediator's actions are ask and continue"
            )
        if self.oni.reward_model != "none" and self.policy.kind == "drrn":
            raise ValueError(
                f"oni.reward_model={self.oni.reward_model!r}: the intrinsic reward joins the PPO "
                "trainer's rollouts (policy.kind=symbolic or llm), not DRRN's"
            )
        if self.oni.reward_model != "none" and self.ask.mode != "none":
            raise ValueError(
                f"oni.reward_model={self.oni.reward_model!r} with ask.mode={self.ask.mode!r}: the "
                "mediated env's steps are skills', whose events are not reported one by one"
            )
        if self.codeact.chooser != "none":
            others = {"teach.teacher": self.teach.teacher, "ask.mode": self.ask.mode}
            clash = [f"{key}={value!r}" for key, value in others.items() if value != "none"]
            if self.policy.kind == "drrn" or clash:
                raise ValueError(
                    f"codeact.chooser={self.codeact.chooser!r}: coded actions join the PPO "
                    "trainer's action set (policy.kind=symbolic or llm), alone or with ONI; "
                    f"not with {', '.join(clash) or 'policy.kind=drrn'}"
                )
        check_written_actions(self)
        check_trained_precision(self)
        if self.train.probe_every and self.policy.kind != "llm":
            raise ValueError(
                f"train.probe_every={self.train.probe_every}: the action-probability probe is "
                f"for language-model policies, not policy.kind={self.policy.kind!r}; set it to 0"
            )
        if self.policy.kind == "symbolic" and self.symbolic.memory:
            check_recurrence(self.ppo)
        if self.frames_per_update % self.ppo.minibatch_size:
            raise ValueError(
                f"ppo.minibatch_size={self.ppo.minibatch_size} must divide the transitions per "
                f"update, env.num_envs * ppo.frames_per_env = {self.frames_per_update}"
            )


def register_configs() -> None:
    """Register the structured configs with Hydra, so presets can extend them.

    A preset starts with `defaults: [training_run_schema, _self_]`; then any key it sets or a
    command line overrides is checked against these dataclasses (a misspelt key is an error).
    Registered: every schema declared so far, that is the training run's and those of the
    config modules imported (`glam.eval.config`, `glam.bc.config`).
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
    overrides: Sequence[str] = (),
    schema_cls: type[Schema] | None = None,
    config_dir: Path | str = CONFIG_DIR,
) -> Schema:
    """Compose a preset of `config_dir` with Hydra's compose API and validate it.

    The same checks as the scripts run (`check_override_keys`, then `validate_config`), for
    code that needs a script's config without running it: campaigns, benchmarks, tests.
    `schema_cls` defaults to `TrainingRunConfig`; the schemas declared so far (`schema_cls`'s
    among them) are registered first.

    Raises:
        ConfigError: an unknown preset, bad override syntax, unknown key or invalid value.
    """
    schema = schema_cls or TrainingRunConfig
    register_configs()
    check_override_keys(overrides, schema)
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
    return validate_config(raw, schema)
