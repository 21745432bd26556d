"""The section `sac` of a training run: discrete Soft Actor-Critic over a scoring policy's
candidate actions (`algorithm.name=sac`, `glam.offpolicy.trainer`), declared with
`glam.config.config_section`. A light module (no torch): SAC's schema
(`glam.offpolicy.run_config`) imports it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from glam.config import check_positive, config_section

SAC_POLICIES: tuple[str, ...] = ("llm", "symbolic")
"""The policies SAC trains: those that score a fixed list of actions (the language model's
scoring or action heads, BabyAI's symbolic network)."""

TRUNK_CACHE_DTYPES: tuple[str, ...] = ("bfloat16", "model")
"""How `sac.trunk_cache_dtype` may keep the trunk's states."""


@config_section("sac")
@dataclass
class SacConfig:
    """Discrete SAC (Christodoulou 2019) as SAC-GLAM uses it: twin Q heads on the policy's state
    representation (what its value head reads), target heads by Polyak averaging, n-step
    returns from a replay buffer, an entropy temperature tuned toward a target entropy. Its
    settings are read only with `algorithm.name=sac`; MAGELLAN's are lr 1e-4 for the policy,
    1e-3 for the temperature, 3-step returns, a 500k replay, minibatches of 256, an update
    every 64 steps."""

    gamma: float = 0.99
    """Discount of the returns."""
    n_step: int = 3
    """Rewards summed before the bootstrapped value (`glam.offpolicy.returns`)."""
    tau: float = 0.005
    """Polyak averaging of the target Q heads after each gradient step."""
    actor_lr: float = 1e-4
    """Adam learning rate of the policy's trainable weights (LoRA or the network)."""
    critic_lr: float = 3e-4
    """Adam learning rate of the Q heads."""
    alpha_lr: float = 1e-3
    """Adam learning rate of log(alpha), the entropy temperature."""
    initial_alpha: float = 0.1
    """The temperature at the start (in reward units, after `env.reward_scale`)."""
    target_entropy_scale: float = 0.5
    """The target entropy, as a share of the uniform policy's (log of the action count)."""
    critic_hidden_sizes: list[int] = field(default_factory=lambda: [256, 256])
    """Hidden widths of each Q head's MLP."""
    critic_trains_features: bool = True
    """Whether the Q heads' loss trains the policy's representation too (the language model's
    adapter, the symbolic network's body), as PPO's shared value head does; false: the heads
    read it as a fixed input and only the actor's loss moves it (on GoToRedBallNoDists the
    symbolic network then did not learn in 8,192 frames, where it reached 1.00 with it:
    docs/offpolicy.md)."""
    replay_size: int = 50_000
    """Transitions kept, over all processes (each keeps replay_size / world_size of its own
    envs'; oldest dropped first)."""
    batch_size: int = 64
    """Transitions per gradient step, over all processes (each samples its share)."""
    learning_starts: int = 512
    """Frames collected before the first gradient step."""
    replay_ratio: float = 0.25
    """Gradient steps per frame collected over all processes (0.25: one per 4 frames); each
    frame is replayed about batch_size x replay_ratio times."""
    update_every: int = 8
    """Env steps (of every local env) between two bursts of the gradient steps due."""
    max_grad_norm: float = 1.0
    """Gradient norm clip, of the policy's and of the Q heads' gradients each."""
    log_every: int = 512
    """Frames between two rows of metrics.csv, rounded up to a multiple of `env.num_envs`: the
    "update" of a SAC run (`train.save_every` counts them)."""
    cache_trunk: bool | None = None
    """Keep the frozen trunk's states (`glam.trunk`) of the observations played and replayed,
    so that a gradient step runs the adapted layers only (`glam.offpolicy.trunk_cache`). None: on
    where it applies (a language model adapted on its top layers), and said at start; true:
    required; false: off (every replayed observation runs the whole model)."""
    trunk_cache_mib: float = 2048.0
    """Memory of the kept states, per process; past it the least recently used are dropped (and
    computed again when replayed)."""
    trunk_cache_dtype: str = "bfloat16"
    """How the states are kept: `bfloat16` (half of float32's memory; the adapted layers then
    read them rounded) or `model` (as computed: the same numbers as running the whole model)."""
    her: bool = False
    """Hindsight relabelling (HER's "future" strategy, `glam.offpolicy.hindsight`): each
    finished episode is stored again with the goals it reached instead of its own (the objects
    the agent faced), as episodes that ended there with BabyAI's reward. GoTo levels only."""
    her_ratio: float = 0.5
    """With `her`: the share of each batch drawn from the relabelled transitions (once there
    are some)."""
    her_goals: int = 4
    """With `her`: goals relabelled per episode at most (drawn among those it reached)."""
    her_size: int = 50_000
    """With `her`: relabelled transitions kept per process (oldest dropped first)."""

    def __post_init__(self) -> None:
        for name in (
            "n_step",
            "actor_lr",
            "critic_lr",
            "alpha_lr",
            "initial_alpha",
            "replay_size",
            "batch_size",
            "update_every",
            "max_grad_norm",
            "log_every",
            "her_goals",
            "her_size",
        ):
            check_positive(f"sac.{name}", getattr(self, name))
        if not 0.0 <= self.gamma <= 1.0:
            raise ValueError(f"sac.gamma must be in [0, 1], got {self.gamma}")
        if not 0.0 < self.tau <= 1.0:
            raise ValueError(f"sac.tau must be in (0, 1], got {self.tau}")
        if not 0.0 <= self.target_entropy_scale <= 1.0:
            raise ValueError(
                f"sac.target_entropy_scale is a share of the uniform policy's entropy, in [0, 1], "
                f"got {self.target_entropy_scale}"
            )
        if self.trunk_cache_mib < 0:
            raise ValueError(f"sac.trunk_cache_mib must be >= 0, got {self.trunk_cache_mib}")
        if self.trunk_cache_dtype not in TRUNK_CACHE_DTYPES:
            raise ValueError(
                f"sac.trunk_cache_dtype must be one of {', '.join(TRUNK_CACHE_DTYPES)}, got "
                f"{self.trunk_cache_dtype!r}"
            )
        if not 0.0 < self.her_ratio < 1.0:
            raise ValueError(f"sac.her_ratio must be in (0, 1), got {self.her_ratio}")
        if self.replay_ratio < 0 or self.learning_starts < 0:
            raise ValueError("sac.replay_ratio and sac.learning_starts must be >= 0")
        self.critic_hidden_sizes = [int(width) for width in self.critic_hidden_sizes]
        if not self.critic_hidden_sizes or min(self.critic_hidden_sizes) < 1:
            raise ValueError(
                f"sac.critic_hidden_sizes must be positive widths, got {self.critic_hidden_sizes}"
            )
