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
    """`glam`: the original text format; `chat`: the model's chat template around it."""
    temperature: float = 1.0
    """The policy is softmax(scores / temperature). 1 is GLAM's. Above 1 flattens a prior that
    a small model concentrates on a few actions (SmolLM2-135M gives "go forward" p < 0.01
    zero-shot), so that PPO can sample, and be rewarded for, the others."""

    def __post_init__(self) -> None:
        _check_choice("policy.head", self.head, ("scoring", "action_heads"))
        if not self.temperature > 0:
            raise ValueError(f"policy.temperature must be > 0, got {self.temperature}")
        _check_choice("policy.normalization", self.normalization, ("sum", "token", "word"))
        _check_choice(
            "policy.value_activation", self.value_activation, ("sigmoid", "relu", "tanh", "gelu")
        )
        _check_choice("policy.prompt_format", self.prompt_format, ("glam", "chat"))


# --------------------------------------------------------------------------------------------
# Environment, PPO and training run
# --------------------------------------------------------------------------------------------


@dataclass
class EnvConfig:
    """Which BabyAI-Text level the agent is trained on, and how many copies run at once."""

    name: str = "BabyAI-GoToLocal-v0"
    """Registered BabyAI-Text (or minigrid BabyAI) level id."""
    num_envs: int = 4
    """Environments in total, over all processes; each process steps num_envs / world_size."""
    nbr_obs: int = 3
    """Observations kept in the prompt (with the actions between them)."""
    action_space: str = "default"
    """Action space name in `babyai_text.actions.ACTION_SPACES` (`default`, `nav`, `noop`...)."""
    reward_scale: float = 20.0
    """Factor applied to BabyAI's reward (1 - 0.9 t / max_steps on success) before GAE."""
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
    """Proximal Policy Optimisation hyperparameters (defaults: the original GLAM's, LoRA lr)."""

    lr: float = 1e-4
    """Adam learning rate (the original full fine-tune used 1e-6; LoRA wants more)."""
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
    frames_per_env: int = 40
    """Environment steps per environment between two updates (the rollout length)."""
    epochs: int = 4
    """Passes over the rollout per update."""
    minibatch_size: int = 32
    """Transitions per gradient step, over all processes (each takes minibatch / world_size)."""
    micro_batch_size: int | None = None
    """Transitions per forward/backward on one process (gradient accumulation); None: whole
    local minibatch at once."""
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

    def __post_init__(self) -> None:
        _check_positive("ppo.lr", self.lr)
        _check_choice("ppo.lr_schedule", self.lr_schedule, ("constant", "linear", "cosine"))
        for name in ("frames_per_env", "epochs", "minibatch_size", "clip_eps", "max_grad_norm"):
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


MAX_RUN_SEED = 10_000
"""`train.seed` is below this, so that training episode seeds (`glam.ppo.rollout.env_seed`) stay
below the evaluation seeds (`glam.eval.config.SEED_BASE`)."""


@dataclass
class TrainConfig:
    """Length of the run, seeding, outputs, checkpoints and logging."""

    total_frames: int = 2048
    """Environment steps to collect in total, over all environments and processes."""
    seed: int = 0
    """Seed of the run: torch/numpy/python RNGs (plus rank) and the environments' episodes."""
    output_dir: str = ""
    """Run folder (config.yaml, metrics.csv, TensorBoard events, checkpoints/); empty: the main
    process picks runs/<config name>-<date>-<time>."""
    save_every: int = 10
    """Write a checkpoint every this many updates (and always at the end); 0: only at the end."""
    keep_checkpoints: int = 3
    """Most recent checkpoints kept on disk; 0 keeps them all."""
    save_rollouts: bool = False
    """Also save the policy's decisions in finished episodes, in the demonstrations format of
    behavioural cloning (`glam.bc.demos`), as `rollouts/rank_R/update_N/` datasets written with
    each checkpoint; `bc.dataset=<run>/rollouts` clones them all."""
    resume: bool = False
    """Continue the run in output_dir from its newest checkpoint (starts fresh if it has none)."""
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


@dataclass
class TrainingRunConfig:
    """Everything `scripts/train_language_agent.py` needs: the root of the Hydra presets."""

    model: ModelConfig = field(default_factory=ModelConfig)
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
        """Updates needed to collect `train.total_frames` (the last one may overshoot)."""
        return -(-self.train.total_frames // self.frames_per_update)

    def __post_init__(self) -> None:
        if self.frames_per_update % self.ppo.minibatch_size:
            raise ValueError(
                f"ppo.minibatch_size={self.ppo.minibatch_size} must divide the transitions per "
                f"update, env.num_envs * ppo.frames_per_env = {self.frames_per_update}"
            )


def register_configs() -> None:
    """Register the structured configs with Hydra, so presets can extend them.

    A preset starts with `defaults: [training_run_schema, _self_]`; then any key it sets or a
    command line overrides is checked against these dataclasses (a misspelt key is an error).
    """
    from hydra.core.config_store import ConfigStore

    ConfigStore.instance().store(name="training_run_schema", node=TrainingRunConfig)
