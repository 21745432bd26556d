"""Typed configuration of the evaluation scripts, registered with Hydra's ConfigStore.

`configs/eval/*.yaml` fill these dataclasses; a misspelt key fails at start-up because the
schema is structured. Each field is documented once, under it, and checked in `__post_init__`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

from babyai_text.actions import get_action_space
from glam.ask.config import AskConfig
from glam.config import DEFAULT_MODEL, check_choice, hydra_schema
from glam.llm.config import ClientConfig
from glam.outputs import EVALUATION

__all__ = [
    "AGENT_KINDS",
    "AgentConfig",
    "EvalConfig",
    "GENERATION_KINDS",
    "GenerationConfig",
    "MEDIATOR_MODES",
    "PostTrainingTestsConfig",
    "RESULT_FILES",
    "ResultsTableConfig",
]

AGENT_KINDS: tuple[str, ...] = (
    "checkpoint",
    "zero_shot",
    "bc",
    "random",
    "constant",
    "fixed",
    "bot",
    "teacher",
    "mediator",
)
"""Agents the harness can evaluate."""
GENERATION_KINDS: tuple[str, ...] = ("zero_shot", "bc", "checkpoint")
"""Agents that can write their actions in BALROG's dialogue (`agent.protocol=generation`)."""

RESULT_FILES: tuple[str, ...] = EVALUATION.files
"""What `glam.eval.harness.evaluate` writes into `eval.output_dir`, in this order; a folder holding
any of them is refused (`eval.overwrite`), one holding them all is a finished evaluation."""

SEED_BASE = 10**12
"""Evaluation episodes use seeds from here up. PPO training seeds stay below it
(`glam.envs.SEEDS_PER_RANK`: `train.seed * 10**8 + rank * 10**6 + ...`, with
`train.seed < 10**4`), so no evaluation episode is ever a training episode. (The original used
`1e9 * seed + i`, which its training seeds `100 * seed + i` could reach.)"""
MEDIATOR_MODES: tuple[str, ...] = ("always", "skill_end", "random")
"""`agent.ask.mode`s of `agent.kind=mediator`: the modes that need no trained network."""
SEEDS_PER_RUN = 10**6
"""Seeds reserved per `eval.seed`; also the most episodes one suite can play."""
DEFAULT_NBR_OBS = 3
DEFAULT_LEVEL = "BabyAI-MixedTrainLocal-v0"
"""The level played where `eval.level` is null and the agent records none (GLAM's training
mix)."""
"""Observations per prompt when neither the config nor the agent says (GLAM's)."""


@dataclass
class AgentConfig:
    """Which agent plays: a trained policy, a pretrained model zero-shot, BC, or a baseline."""

    kind: str = "zero_shot"
    """`checkpoint` (a trained run or saved policy: language model, BabyAI's symbolic
    actor-critic or DRRN), `zero_shot` (any model), `bc` (behavioural cloning adapter), `random`,
    `constant` (`agent.action` every step), `fixed` (a state-blind policy: `agent.probs` every
    step), `bot` (BabyAI's planner, which reads the grid, not
    the text), `teacher` (LLM4Teach's teacher alone, `agent.teacher`) or `mediator` (LLM4RL's
    planner and skills asked by a rule, `agent.ask`, no network). A checkpoint of a run trained
    with `ask.mode` other than `none` plays its mediated envs, built from the run's `ask`
    settings."""
    path: str = ""
    """`checkpoint`: a run folder, one of its checkpoint folders or a saved policy folder.
    `bc`: the folder of the saved adapter (or of a full fine-tuned model)."""
    model: str = DEFAULT_MODEL
    """`zero_shot`: model spec (embedded name, local folder, hub id). `bc`: base model when the
    adapter does not name a loadable one."""
    teacher: str = "llm"
    """`teacher`: `llm` (`agent.model` weighs the skills' subgoals, `glam.teach`), `bot` or
    `uniform` (every subgoal equally); subgoal probabilities at `agent.temperature` (1 if
    unset)."""
    protocol: str = "scoring"
    """`scoring`: softmax over the log-likelihood of each action (GLAM), or for a checkpoint the
    way it was trained (a writing policy writes in its own prompt format); `generation`: the
    model writes the action in BALROG's dialogue (`eval.generation`, `eval.client`), invalid
    answers become `go forward`. zero_shot, bc, and a checkpoint of a language policy that
    writes its actions or scores them with its language-model head (its adapter folded in)."""
    prompt_format: str = "glam"
    """Scoring protocol of zero_shot/bc: `glam` text, or `chat` (the chat template around it).
    A checkpoint uses the format it was trained with."""
    normalization: str = "sum"
    """Scoring protocol of zero_shot/bc: candidate score is the `sum` of token log-probs, or the
    mean per `token` or per `word`."""
    temperature: float | None = None
    """Scoring protocol: the policy is softmax(scores / temperature). None: a language-model
    checkpoint's own (`policy.temperature` of its run), 1 otherwise (GLAM's; a symbolic or DRRN
    policy's). Only sampling sees it (greedy play takes the best score whatever the
    temperature)."""
    dtype: str = "float32"
    """Weights dtype of a language model: float32, bfloat16 or float16 (symbolic and DRRN
    policies run in float32)."""
    device: str = "auto"
    """`auto` (CUDA when available), `cpu`, `cuda`, `cuda:1`..."""
    batch_size: int = 0
    """Most prompts per forward pass (generation protocol, in-process: conversations answered
    together); 0 puts every running env in one batch."""
    ask: AskConfig = field(default_factory=AskConfig)
    """`mediator`: the planner, the rule that asks it (`agent.ask.mode`: always, skill_end or
    random) and the query cost (`glam.ask.config.AskConfig`, the `ask.*` keys of training). A
    checkpoint takes its run's instead (its config.yaml): leave it at `mode=none` then."""
    action: str = "go forward"
    """`constant`: the action played every step, a word of the default actions (`go forward`:
    what BALROG's protocol plays for an answer that names no action, so a model that never names
    one scores exactly this agent's episodes)."""
    probs: list[float] | None = None
    """`fixed`: the probability of each action of the suite's action space, in its order
    (`nav`: turn left, turn right, go forward), drawn afresh every step whatever the
    observation; `[0.25, 0.25, 0.5]` goes forward half the time. It always samples (greedy play
    would be a constant agent). `scripts/state_blind_ceiling.py` finds the best such policy of a
    level: what an agent that never reads the observation can reach."""
    planner: str | None = None
    """A checkpoint of a mediator: consult this planner (`llm` or `bot`) instead of its run's,
    a language model's settings (model, backend, endpoint, cache) taken from `agent.ask`; the
    rest of the run's `ask` settings stay. For example a mediator trained with the bot as an
    oracle planner, played with the language model. None: the run's planner."""

    def __post_init__(self) -> None:
        check_choice("agent.kind", self.kind, AGENT_KINDS)
        check_choice("agent.protocol", self.protocol, ("scoring", "generation"))
        check_choice("agent.teacher", self.teacher, ("llm", "bot", "uniform"))
        check_choice("agent.prompt_format", self.prompt_format, ("glam", "chat"))
        check_choice("agent.normalization", self.normalization, ("sum", "token", "word"))
        check_choice("agent.dtype", self.dtype, ("float32", "bfloat16", "float16"))
        if self.temperature is not None and not self.temperature > 0:
            raise ValueError(f"agent.temperature must be > 0, got {self.temperature}")
        if self.kind == "constant":
            check_choice("agent.action", self.action, get_action_space("default").words)
        self.probs = check_probs(self.probs, self.kind)
        if self.kind in ("checkpoint", "bc") and not self.path:
            raise ValueError(f"agent.kind={self.kind} needs agent.path (the trained folder)")
        if self.protocol == "generation" and self.kind not in GENERATION_KINDS:
            raise ValueError(
                f"agent.protocol=generation needs agent.kind {', '.join(GENERATION_KINDS)}, not "
                f"{self.kind}"
            )
        if self.batch_size < 0:
            raise ValueError(f"agent.batch_size must be >= 0, got {self.batch_size}")
        if self.kind == "mediator" and self.ask.mode not in MEDIATOR_MODES:
            raise ValueError(
                f"agent.kind=mediator with agent.ask.mode={self.ask.mode!r}: a mediator without "
                f"a network asks by a rule, agent.ask.mode one of {list(MEDIATOR_MODES)}; a "
                "learned mediator is a checkpoint (agent.kind=checkpoint agent.path=<its run>)"
            )
        if self.planner is not None:
            check_choice("agent.planner", self.planner, ("llm", "bot"))
            if self.kind != "checkpoint":
                raise ValueError(
                    f"agent.planner={self.planner} swaps the planner of a mediator's checkpoint "
                    f"(agent.kind=checkpoint), not of agent.kind={self.kind}"
                    + ("; a rule's planner is agent.ask.planner" if self.kind == "mediator" else "")
                )
            if self.protocol == "generation":
                raise ValueError(
                    f"agent.planner={self.planner} swaps the planner of a mediator, and "
                    "agent.protocol=generation plays none (the model writes the env's actions)"
                )
        if self.kind != "mediator" and self.ask.mode != "none":
            raise ValueError(
                f"agent.ask.mode={self.ask.mode!r} is for agent.kind=mediator, not "
                f"agent.kind={self.kind}; a checkpoint plays with its run's own ask settings "
                "(its config.yaml)"
            )


def check_probs(probs: Sequence[float] | None, kind: str) -> list[float] | None:
    """`agent.probs` as a list of floats: given with `agent.kind=fixed` only, non-negative and
    summing to 1 (within 1e-6).

    Raises:
        ValueError: otherwise, naming what to change.
    """
    if kind != "fixed":
        if probs is not None:
            raise ValueError(f"agent.probs is for agent.kind=fixed, not agent.kind={kind}")
        return None
    if probs is None or len(probs) == 0:
        raise ValueError(
            "agent.kind=fixed needs agent.probs, one probability per action of the action space "
            "(e.g. agent.probs=[0.25,0.25,0.5] for turn left, turn right, go forward)"
        )
    values = [float(p) for p in probs]
    if not all(math.isfinite(p) and p >= 0 for p in values) or abs(sum(values) - 1) > 1e-6:
        raise ValueError(f"agent.probs={values} must be non-negative and sum to 1")
    return values


@dataclass
class GenerationConfig:
    """BALROG's dialogue for the generation protocol (`glam.eval.generation`)."""

    agent_type: str = "naive"
    """BALROG's agent type: `naive` (answer with one action) or `cot` (think step by step,
    end with "ACTION: <action>")."""
    max_history: int = 16
    """Observations kept in the dialogue, and as many actions (BALROG's `max_history`)."""
    max_cot_history: int = 1
    """cot: latest actions shown with their whole reasoning ("Previous plan:")."""
    feedback_on_invalid_action: bool = True
    """After an answer that is not an action, the next observation says so."""

    def __post_init__(self) -> None:
        check_choice("eval.generation.agent_type", self.agent_type, ("naive", "cot"))
        if self.max_history < 1 or self.max_cot_history < 0:
            raise ValueError(
                "eval.generation.max_history must be >= 1 and max_cot_history >= 0, got "
                f"{self.max_history} and {self.max_cot_history}"
            )


@dataclass
class EvalConfig:
    """What is played: level, suites, episodes and seeds, and where the results go."""

    level: str | None = None
    """Level of every suite that does not bring its own (any BabyAI id); None: the level a
    checkpoint's policy was trained on (`agent.kind=checkpoint`, from its record), else
    `DEFAULT_LEVEL` (MixedTrainLocal). The evaluation says which it played."""
    suites: list[str] = field(default_factory=lambda: ["no_change"])
    """Suites to run, by name (see `glam.eval.suites.SUITES`)."""
    episodes: int = 1000
    """Episodes per suite, counted exactly (seeds `seed_base` to `seed_base + episodes - 1`)."""
    num_envs: int = 32
    """Environments stepped together (one batched model call per step)."""
    seed: int = 0
    """Evaluation seed; episodes use seeds from `10**12 + seed * 10**6` on (never training's)."""
    nbr_obs: int | None = None
    """Observations kept in the prompt (with the actions between them); None: the agent's own
    (a checkpoint's `env.nbr_obs`, a BC folder's), else `DEFAULT_NBR_OBS` (3)."""
    action_space: str | None = None
    """Action space of the suites that keep it; None: the one the agent was trained with (a
    checkpoint's `env.action_space`, a BC folder's), else the level's default."""
    episodes_per_task_type: int | None = None
    """Play this many episodes of each task type (the first seeds that draw it) instead of
    `episodes` in the level's random mix: BALROG's protocol is 10 of each of MixedTrainLocal's
    five task types."""
    greedy: bool = False
    """Take the most likely action instead of sampling from the policy."""
    max_steps: int | None = None
    """Episode step limit; None keeps BabyAI's (64 or 128 by task)."""
    distractors: int | None = None
    """Objects in the room besides those the task needs (BALROG's `num_dists`: 0); GLAM
    levels only. None keeps the level's own (8 objects in all)."""
    generation: GenerationConfig = field(default_factory=GenerationConfig)
    """Generation protocol: BALROG's agent type, history and invalid-action feedback."""
    client: ClientConfig = field(default_factory=ClientConfig)
    """Generation protocol: the model that answers (`local`: `agent.model` in this process;
    `openai`: a server at `base_url`), its sampling, time-out and retries."""
    output_dir: str = "runs/eval"
    """Folder for results.json/.csv/.md, the bar chart and episodes.jsonl."""
    overwrite: bool = False
    """Replace the results of an earlier evaluation in `output_dir`; false refuses to start
    when the folder already holds results."""
    resume: bool = False
    """Continue the evaluation in `output_dir` that stopped before its end: keep the episodes
    its journal holds (`glam.eval.journal`), play the others, write the results of all."""
    label: str = ""
    """Name of this agent in tables; empty: derived from the agent (kind and path/model)."""
    progress_bar: bool = True
    """Show the progress: a rich bar on a terminal; in a log file (SLURM, nohup), a line every
    tenth of the episodes and at least every 5 minutes while envs play; false shows neither."""
    torch_threads: int = 0
    """Torch's intra-op threads; 0: `OMP_NUM_THREADS`, else the cores free at the start
    (`glam.threads`)."""

    def __post_init__(self) -> None:
        if not 0 < self.episodes <= SEEDS_PER_RUN:
            raise ValueError(f"eval.episodes must be in [1, {SEEDS_PER_RUN}], got {self.episodes}")
        if self.num_envs < 1 or (self.nbr_obs is not None and self.nbr_obs < 1):
            raise ValueError("eval.num_envs and eval.nbr_obs must be >= 1")
        if self.episodes_per_task_type is not None and self.episodes_per_task_type < 1:
            raise ValueError(
                f"eval.episodes_per_task_type must be >= 1, got {self.episodes_per_task_type}"
            )
        if self.torch_threads < 0:
            raise ValueError(f"eval.torch_threads must be >= 0, got {self.torch_threads}")
        if self.seed < 0:
            raise ValueError(f"eval.seed must be >= 0, got {self.seed}")
        if self.max_steps is not None and self.max_steps < 1:
            raise ValueError(f"eval.max_steps must be >= 1, got {self.max_steps}")
        if self.distractors is not None and self.distractors < 0:
            raise ValueError(f"eval.distractors must be >= 0, got {self.distractors}")
        if not self.output_dir:
            raise ValueError("eval.output_dir is empty")
        if self.resume and self.overwrite:
            raise ValueError(
                "eval.resume=true continues the evaluation in eval.output_dir and "
                "eval.overwrite=true starts it again: choose one"
            )

    @property
    def seed_base(self) -> int:
        """Seed of the first episode of each suite."""
        return SEED_BASE + self.seed * SEEDS_PER_RUN


@hydra_schema("post_training_tests_schema")
@dataclass
class PostTrainingTestsConfig:
    """Root of `scripts/post_training_tests.py` and `scripts/zero_shot_generation.py`."""

    agent: AgentConfig = field(default_factory=AgentConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)

    def __post_init__(self) -> None:
        generation = self.agent.protocol == "generation"
        if generation and self.eval.greedy:
            raise ValueError(
                "eval.greedy is the scoring protocol's; the generation protocol samples at "
                "eval.client.temperature (0: greedy)"
            )
        if generation and self.eval.nbr_obs is not None:
            raise ValueError(
                "eval.nbr_obs is the scoring protocol's; the generation protocol keeps "
                "eval.generation.max_history observations and actions"
            )
        if self.eval.client.backend == "openai" and not (
            generation and self.agent.kind == "zero_shot"
        ):
            raise ValueError(
                "eval.client.backend=openai plays the served model: it needs agent.kind=zero_shot "
                f"and agent.protocol=generation (got {self.agent.kind}, {self.agent.protocol})"
            )


@hydra_schema("test_results_schema")
@dataclass
class ResultsTableConfig:
    """Root of `scripts/test_results.py`: which results to aggregate and where to write."""

    inputs: list[str] = field(default_factory=list)
    """results.json files, folders searched recursively for them, or glob patterns."""
    output_dir: str = "runs/eval/summary"
    """Folder for summary.md, summary.csv and summary.png."""
    overwrite: bool = False
    """Replace an earlier summary in `output_dir`; false refuses to start when the folder
    already holds one."""
    baseline: str = "no_change"
    """Suite the changes are measured against (in %)."""
    title: str = "Post-training tests"
    """Title of the chart."""

    def __post_init__(self) -> None:
        if not self.inputs:
            raise ValueError(
                "inputs is empty: give results.json files or folders, e.g. "
                "'inputs=[runs/a/eval,runs/b/eval]'"
            )
