"""The section `oni` of a training run: ONI's annotator and intrinsic reward (`glam.oni`),
declared with `glam.config.config_section`. A light module (no torch): the training run's schema
(`glam.run_config`) imports it.
"""

from __future__ import annotations

from dataclasses import dataclass

from glam.config import DEFAULT_MODEL, CoreRunConfig, check_choice, config_section

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


@config_section("oni")
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
        check_choice("oni.reward_model", self.reward_model, ONI_REWARD_MODELS)
        check_choice("oni.backend", self.backend, ONI_BACKENDS)
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

    def check_run(self, run: CoreRunConfig) -> None:
        """The intrinsic reward joins the PPO trainer's rollouts (of primitive steps:
        `glam.run_config.TrainingRunConfig.check_sections`)."""
        if self.reward_model == "none":
            return
        if run.policy.kind == "drrn":
            raise ValueError(
                f"oni.reward_model={self.reward_model!r}: the intrinsic reward joins the PPO "
                "trainer's rollouts (policy.kind=symbolic or llm), not DRRN's"
            )
