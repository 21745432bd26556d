"""The sections `symbolic` and `drrn` of a training run: the networks of the agents GLAM is
compared with (`glam.baselines.symbolic`, `glam.baselines.drrn`), declared with
`glam.config.config_section`. A light module (no torch): the baselines' schema
(`glam.baselines.run_config`) imports it.
"""

from __future__ import annotations

from dataclasses import dataclass

from glam.config import (
    CoreRunConfig,
    check_choice,
    check_positive,
    check_recurrence,
    config_section,
)


@config_section("symbolic")
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
            check_positive(f"symbolic.{name}", getattr(self, name))
        if self.vocabulary_buckets < 2:
            raise ValueError(
                f"symbolic.vocabulary_buckets must be >= 2, got {self.vocabulary_buckets}"
            )

    def check_run(self, run: CoreRunConfig) -> None:
        """A network with memory is updated in whole sequences of `ppo.recurrence` steps (the
        algorithms that cannot train it: `glam.baselines.run_config`)."""
        if run.policy.kind == "symbolic" and self.memory:
            check_recurrence(run.ppo)


@config_section("drrn")
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
    demos: str = ""
    """A demonstrations folder (`scripts/collect_bot_demos.py`'s) DRRN also learns from, as
    DQfD does (Hester et al. 2018): its episodes replayed from their seeds into transitions in
    the run's own prompt format, kept apart from the agent's replay and never dropped, a share
    of every TD batch (`demo_share`) with a large-margin loss toward the demonstrated action
    (`demo_margin`, `demo_loss_coef`), after `demo_pretrain_steps` steps on them alone. Empty:
    none. The episodes `demo_held_out` and `demo_split_seed` hold out are left out, as the
    clones of `scripts/clone_policy.py` leave them out (its `clone.eval_fraction`,
    `clone.seed`): DRRN learns from the demonstrations a clone is trained on."""
    demo_share: float = 0.25
    """With `demos`: the share of each TD batch drawn from the demonstrations (DQfD draws them
    by priority; a fixed share here)."""
    demo_margin: float = 0.8
    """With `demos`: the margin l of DQfD's supervised loss max_a [Q(s, a) + l (a != a_E)] -
    Q(s, a_E) on demonstrated states (DQfD's value)."""
    demo_loss_coef: float = 1.0
    """With `demos`: the weight of the margin loss beside the TD loss (DQfD's lambda_2)."""
    demo_pretrain_steps: int = 0
    """With `demos`: gradient steps on demonstrations alone before the first env step of a
    fresh run (DQfD's pre-training phase)."""
    demo_held_out: float = 0.2
    """With `demos`: the share of its episodes left out (`glam.demos.split_pairs`)."""
    demo_split_seed: int = 0
    """With `demos`: the seed of that split."""

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
            check_positive(f"drrn.{name}", getattr(self, name))
        check_choice("drrn.exploration", self.exploration, ("softmax", "epsilon"))
        if not 0.0 <= self.gamma <= 1.0:
            raise ValueError(f"drrn.gamma must be in [0, 1], got {self.gamma}")
        if self.updates_per_step < 0 or self.learning_starts < 0:
            raise ValueError("drrn.updates_per_step and drrn.learning_starts must be >= 0")
        if self.vocabulary_buckets < 2:
            raise ValueError(f"drrn.vocabulary_buckets must be >= 2, got {self.vocabulary_buckets}")
        if not 0.0 <= self.demo_share < 1.0 or not 0.0 <= self.demo_held_out < 1.0:
            raise ValueError(
                "drrn.demo_share and drrn.demo_held_out must be in [0, 1), got "
                f"{self.demo_share} and {self.demo_held_out}"
            )
        if self.demo_margin < 0 or self.demo_loss_coef < 0 or self.demo_pretrain_steps < 0:
            raise ValueError(
                "drrn.demo_margin, drrn.demo_loss_coef and drrn.demo_pretrain_steps must be >= 0"
            )
