"""Typed configuration of behavioural cloning: collecting bot demonstrations, the SFT run, and
the cloning of the policy's choice.

The three scripts read these through Hydra (`configs/demos/collect.yaml`, `configs/bc/train.yaml`,
`configs/bc/clone.yaml`); the schemas are registered with Hydra's ConfigStore (`glam.config.register_configs`) so that a
misspelt key fails at start-up.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from glam.baselines.config import SymbolicConfig
from glam.config import (
    DEFAULT_LORA_LAYERS,
    AdapterConfig,
    ModelConfig,
    PolicyConfig,
    check_positive,
    hydra_schema,
)
from glam.outputs import BC_POLICY, CLONED_POLICY, check_output_dir

BOT_UNSUPPORTED_LEVELS: frozenset[str] = frozenset(
    {
        "BabyAI-PutNextS5N2Carrying-v0",
        "BabyAI-PutNextS6N3Carrying-v0",
        "BabyAI-PutNextS7N4Carrying-v0",
        "BabyAI-KeyInBox-v0",
    }
)
"""Levels minigrid's `BabyAIBot` documents it cannot solve (checked when the config is built)."""


@dataclass
class DemosConfig:
    """Which bot demonstrations to collect and where to save them."""

    level: str = "BabyAI-GoToLocal-v0"
    """BabyAI level id, minigrid's or babyai_text's (`BabyAI-MixedTrainLocal-v0`...)."""
    episodes: int = 100
    """Number of bot episodes to play (ignored when `pairs` is set)."""
    pairs: int | None = None
    """Stop once this many (prompt, action) pairs are collected; the last episode is cut."""
    seed: int = 0
    """Episode i is reset with seed `seed + i`; the same seed gives the same dataset."""
    output_dir: str = "runs/demos/BabyAI-GoToLocal-v0-seed0"
    """Dataset folder, written with `Dataset.save_to_disk` (loadable with `load_from_disk`)."""
    overwrite: bool = False
    """Replace an existing dataset folder instead of refusing to."""
    nbr_obs: int = 3
    """Observations kept in the prompt (the policy's history length)."""
    action_space: str = "default"
    """Action space name of `babyai_text.actions.ACTION_SPACES`."""
    language: str | None = None
    """`en` or `fr`; None: the level's own."""
    prompt_format: str = "glam"
    """`glam` (the original text prompt) or `chat` (the model's chat template around it)."""
    chat_model: str | None = None
    """Model whose tokenizer's chat template renders `chat` prompts (its name or path)."""
    keep_failed: bool = False
    """Keep the pairs of episodes the bot did not finish (they are dropped by default)."""
    min_bot_success: float = 0.5
    """Abort with an error when the bot solves fewer episodes than this fraction."""

    def __post_init__(self) -> None:
        if self.level in BOT_UNSUPPORTED_LEVELS:
            raise ValueError(
                f"demos.level={self.level}: BabyAI's bot cannot solve it (minigrid documents it "
                "as unsolved); pick another level"
            )
        if self.pairs is None:
            check_positive("demos.episodes", self.episodes)
        else:
            check_positive("demos.pairs", self.pairs)
        check_positive("demos.nbr_obs", self.nbr_obs)
        if self.prompt_format not in ("glam", "chat"):
            raise ValueError(f"demos.prompt_format={self.prompt_format!r} is not glam or chat")
        if self.prompt_format == "chat" and not self.chat_model:
            raise ValueError("demos.prompt_format=chat needs demos.chat_model (its chat template)")
        if not 0.0 <= self.min_bot_success <= 1.0:
            raise ValueError(f"demos.min_bot_success must be in [0, 1], got {self.min_bot_success}")


@hydra_schema("collect_demos_schema")
@dataclass
class CollectDemosConfig:
    """Top level of `scripts/collect_bot_demos.py`."""

    demos: DemosConfig = field(default_factory=DemosConfig)
    """What to collect."""
    progress: bool = True
    """Show a progress bar."""


@dataclass
class BCConfig:
    """Supervised fine-tuning on (prompt, action) pairs: data, optimisation, evaluation, output.

    Defaults follow the original: AdamW, learning rate 5e-4, cosine schedule, one epoch.
    """

    dataset: str = "runs/demos/BabyAI-GoToLocal-v0-seed0"
    """Demonstrations folder (`scripts/collect_bot_demos.py` output, or PPO rollouts)."""
    output_dir: str = "runs/bc"
    """Where the adapter (or full model), tokenizer, `bc_policy.json`, metrics and the run's
    `config.yaml` go."""
    overwrite: bool = False
    """Replace a BC policy already saved in `output_dir`; false refuses to start when the
    folder already holds one. A folder holding anything else (a training run, a dataset, other
    files) is refused either way."""
    max_pairs: int | None = None
    """Use only the first this many pairs of the dataset (None: all)."""
    eval_fraction: float = 0.2
    """Fraction of the episodes held out for evaluation (split by episode, not by pair)."""
    max_eval_pairs: int | None = 200
    """Cap on held-out pairs scored for action accuracy (scoring 6 actions costs a forward each)."""
    learning_rate: float = 5e-4
    """AdamW learning rate."""
    lr_scheduler: str = "cosine"
    """Learning-rate schedule name of transformers (`cosine`, `linear`, `constant`...)."""
    warmup_steps: float = 0.0
    """Learning-rate warm-up: optimizer steps when >= 1, a fraction of all steps when < 1."""
    weight_decay: float = 0.0
    """AdamW weight decay."""
    epochs: float = 1.0
    """Passes over the training pairs."""
    max_steps: int = -1
    """Stop after this many optimizer steps (-1: run the epochs)."""
    batch_size: int = 8
    """Pairs per device per forward."""
    gradient_accumulation_steps: int = 1
    """Forwards per optimizer step."""
    max_grad_norm: float = 1.0
    """Gradient-norm clip."""
    max_length: int = 1024
    """Longest prompt + action in tokens; a longer pair is an error, not silently truncated."""
    seed: int = 0
    """Seed of the split, the adapter initialisation and the data order."""
    eval_before_training: bool = True
    """Measure the zero-shot model on the held-out pairs first (the baseline of the run)."""
    eval_steps: int | None = None
    """Evaluate every this many steps as well as at the end (None: only at the end)."""
    score_batch_size: int = 8
    """Prompts scored together when measuring action accuracy."""
    normalization: str = "sum"
    """Candidate score used for action accuracy, as the policy's (`sum`, `token`, `word`)."""
    success_episodes: int = 0
    """After training, play this many seeded episodes greedily, zero-shot and BC (0: skip)."""
    success_level: str | None = None
    """Level of those episodes; None: the dataset's level."""
    success_seed: int = 1_000_000_000
    """Episode i of the success test is reset with seed `success_seed + i` (far from demos)."""
    logging_steps: int = 5
    """Log the training loss every this many steps."""
    report_to: str = "none"
    """Where transformers logs: `none`, `tensorboard`, `wandb`."""
    progress: bool = True
    """Show progress bars."""

    def __post_init__(self) -> None:
        if not 0.0 < self.eval_fraction < 1.0:
            raise ValueError(f"bc.eval_fraction must be in (0, 1), got {self.eval_fraction}")
        check_positive("bc.learning_rate", self.learning_rate)
        check_positive("bc.batch_size", self.batch_size)
        check_positive("bc.gradient_accumulation_steps", self.gradient_accumulation_steps)
        check_positive("bc.max_length", self.max_length)
        check_positive("bc.score_batch_size", self.score_batch_size)
        if self.epochs <= 0 and self.max_steps <= 0:
            raise ValueError("bc.epochs or bc.max_steps must be > 0")
        if self.normalization not in ("sum", "token", "word"):
            raise ValueError(f"bc.normalization={self.normalization!r} is not sum, token or word")
        if self.success_episodes < 0:
            raise ValueError(f"bc.success_episodes must be >= 0, got {self.success_episodes}")
        for name in ("max_pairs", "max_eval_pairs", "eval_steps"):
            value = getattr(self, name)
            if value is not None:
                check_positive(f"bc.{name}", value)

    def check_output_dir(self) -> Path:
        """`glam.outputs.check_output_dir` on `output_dir`, before anything loads.

        Raises:
            glam.outputs.OutputDirError: naming the problem and what to do.
        """
        return check_output_dir(
            self.output_dir,
            BC_POLICY,
            key="bc.output_dir",
            overwrite=self.overwrite,
            overwrite_key="bc.overwrite",
        )


@hydra_schema("bc_schema")
@dataclass
class BCRunConfig:
    """Top level of `scripts/clm_behavioral_cloning.py`."""

    model: ModelConfig = field(default_factory=ModelConfig)
    """Base model, dtype and LoRA settings (`model.lora.enabled=false`: full fine-tune)."""
    bc: BCConfig = field(default_factory=BCConfig)
    """Data, optimisation, evaluation and output of the SFT run."""


@dataclass
class CloneConfig:
    """Cloning of the policy's own choice (`glam.bc.choice`): data, optimisation, output."""

    dataset: str = "runs/demos/BabyAI-GoToLocal-v0-seed0"
    """Demonstrations folder (`scripts/collect_bot_demos.py` output)."""
    output_dir: str = "runs/clone"
    """Where `clone.csv` (one row per epoch), `clone.json`, `config.yaml` and the policy folder
    `policy/` go."""
    overwrite: bool = False
    """Replace a cloned policy already saved in `output_dir` (finished or not)."""
    resume: bool = False
    """Continue the unfinished clone in `output_dir` from its last finished epoch (the
    `checkpoint/` written after each epoch, with the same settings); a finished one is left as
    it is. Without it (or `overwrite`) a folder holding a clone is refused."""
    eval_fraction: float = 0.2
    """Fraction of the episodes held out (split by episode, as `scripts/clm_behavioral_cloning.py`
    splits them with the same seed)."""
    max_eval_pairs: int | None = 200
    """The first this many held-out pairs are measured (None: all); 200 are the decisions SFT's
    action accuracy is measured on."""
    learning_rate: float = 5e-4
    """AdamW learning rate (SFT's default; PPO's preset takes 2e-3)."""
    lr_scheduler: str = "cosine"
    """Learning-rate schedule name of transformers (`cosine`, `linear`, `constant`...)."""
    weight_decay: float = 0.0
    """AdamW weight decay."""
    epochs: int = 2
    """Passes over the training pairs."""
    batch_size: int = 8
    """Pairs per optimizer step."""
    max_grad_norm: float = 1.0
    """Gradient-norm clip."""
    seed: int = 0
    """Seed of the split, the adapter and heads' initialisation and the data order."""
    cache_trunk: bool = True
    """Compute the frozen trunk's states of each pair once and run only the adapted layers in
    every epoch (`glam.trunk`); false recomputes the whole model (the same numbers, slower)."""
    torch_threads: int | None = None
    """Torch's intra-op threads (None: `OMP_NUM_THREADS`, else the cores free at the start,
    `glam.threads`); 1 when several jobs share the cores."""
    progress: bool = True
    """Show progress bars."""

    def __post_init__(self) -> None:
        if not 0.0 < self.eval_fraction < 1.0:
            raise ValueError(f"clone.eval_fraction must be in (0, 1), got {self.eval_fraction}")
        check_positive("clone.learning_rate", self.learning_rate)
        check_positive("clone.epochs", self.epochs)
        check_positive("clone.batch_size", self.batch_size)
        check_positive("clone.max_grad_norm", self.max_grad_norm)
        for name in ("max_eval_pairs", "torch_threads"):
            value = getattr(self, name)
            if value is not None:
                check_positive(f"clone.{name}", value)

    def check_output_dir(self) -> Path:
        """`glam.outputs.check_output_dir` on `output_dir`, before anything loads.

        Raises:
            glam.outputs.OutputDirError: naming the problem and what to do.
        """
        return check_output_dir(
            self.output_dir,
            CLONED_POLICY,
            key="clone.output_dir",
            overwrite=self.overwrite or self.resume,
            overwrite_key="clone.overwrite",
            again="replace them (clone.resume=true continues an unfinished clone)",
        )


@hydra_schema("clone_schema")
@dataclass
class CloneRunConfig:
    """Top level of `scripts/clone_policy.py`: the policy is the training presets' by default
    (LoRA on the top 4 layers, scoring at temperature 5), so that what it learns is what PPO
    would start from."""

    model: ModelConfig = field(
        default_factory=lambda: ModelConfig(lora=AdapterConfig(layers=DEFAULT_LORA_LAYERS))
    )
    """Base model, dtype and LoRA settings, as a training run's."""
    policy: PolicyConfig = field(default_factory=PolicyConfig)
    """The policy cloned (`policy.head`, `policy.temperature`...), as a training run's:
    `policy.kind=llm` (a language model's choice among the actions) or `symbolic` (BabyAI's
    network on the grid of the same states, found by replaying each demonstrated episode)."""
    symbolic: SymbolicConfig = field(default_factory=SymbolicConfig)
    """The symbolic network's settings (`policy.kind=symbolic`), as a training run's: a PPO run
    starts from the clone only with the same ones (`train.init_policy`)."""
    clone: CloneConfig = field(default_factory=CloneConfig)
    """Data, optimisation and output."""

    def __post_init__(self) -> None:
        if self.policy.kind not in ("llm", "symbolic"):
            raise ValueError(
                f"policy.kind={self.policy.kind!r}: scripts/clone_policy.py clones a language "
                "model's choice among the actions (policy.kind=llm) or the symbolic network's "
                "(policy.kind=symbolic)"
            )
        if self.policy.kind == "symbolic" and self.symbolic.memory:
            raise ValueError(
                "symbolic.memory=true: a network with memory would be cloned along whole "
                "episodes; scripts/clone_policy.py fits memoryless policies to shuffled decisions"
            )
