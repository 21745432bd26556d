"""The section `ask` of a training run: LLM4RL's planner and when the mediator asks it
(`glam.ask`), declared with `glam.config.config_section`. A light module (no torch): the
training run's schema (`glam.run_config`) and evaluation's configs import it.
"""

from __future__ import annotations

from dataclasses import dataclass

from glam.config import DEFAULT_MODEL, CoreRunConfig, check_choice, config_section

ASK_MODES: tuple[str, ...] = ("none", "learned", "always", "skill_end", "random")
"""When the agent asks the planner (besides the forced queries when a skill ends or fails):
`none`: no planner (plain RL over primitive actions); `learned`: the mediator policy's choice;
`always`: at every step; `skill_end`: never by choice; `random`: with probability
`ask.probability` at each step."""


@config_section("ask")
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
        check_choice("ask.mode", self.mode, ASK_MODES)
        check_choice("ask.planner", self.planner, ("llm", "bot"))
        check_choice("ask.backend", self.backend, ("local", "openai"))
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

    def check_run(self, run: CoreRunConfig) -> None:
        """The mediator is the symbolic network (its actions are not a teacher's:
        `glam.run_config.TrainingRunConfig.check_sections`)."""
        if self.mode == "none":
            return
        if run.policy.kind != "symbolic":
            raise ValueError(
                f"ask.mode={self.mode!r}: the mediator is the symbolic network "
                f"(policy.kind=symbolic), not policy.kind={run.policy.kind!r}"
            )
