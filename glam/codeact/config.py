"""The section `codeact` of a training run: RL-GPT's coded actions, who chooses, writes and
reviews them (`glam.codeact`), declared with `glam.config.config_section`. A light module (no
torch): the training run's schema (`glam.run_config`) and evaluation's agents import it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from glam.config import DEFAULT_MODEL, CoreRunConfig, check_choice, config_section

CODEACT_CHOOSERS: tuple[str, ...] = ("none", "scored", "chat", "random", "fixed")
"""Who chooses the sub-actions to code (`codeact.chooser`); `none`: no coded actions."""
CODEACT_WRITERS: tuple[str, ...] = ("library", "chat")
"""Who writes their code (`codeact.writer`)."""
CODEACT_CRITICS: tuple[str, ...] = ("rules", "chat")
"""Who reviews each phase (`codeact.critic`)."""


@config_section("codeact")
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
        check_choice("codeact.chooser", self.chooser, CODEACT_CHOOSERS)
        check_choice("codeact.writer", self.writer, CODEACT_WRITERS)
        check_choice("codeact.critic", self.critic, CODEACT_CRITICS)
        if (self.chooser == "fixed") != bool(self.actions):
            raise ValueError(
                "codeact.actions lists the sub-actions of codeact.chooser=fixed, and only those "
                f"(chooser={self.chooser!r}, actions={list(self.actions)})"
            )
        check_choice("codeact.backend", self.backend, ("local", "openai"))
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

    def check_run(self, run: CoreRunConfig) -> None:
        """Coded actions join the PPO trainer's action set (alone or with ONI:
        `glam.run_config.TrainingRunConfig.check_sections`)."""
        if self.chooser != "none" and run.policy.kind == "drrn":
            raise ValueError(self.clash(["policy.kind=drrn"]))

    def clash(self, used: list[str]) -> str:
        """Why coded actions refuse the settings `used` (`key=value` each)."""
        return (
            f"codeact.chooser={self.chooser!r}: coded actions join the PPO trainer's action set "
            f"(policy.kind=symbolic or llm), alone or with ONI; not with {', '.join(used)}"
        )
