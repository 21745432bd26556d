"""The section `teach` of a training run: LLM4Teach's teacher and its distillation schedule
(`glam.teach.hook`), declared with `glam.config.config_section`. A light module (no torch): the
training run's schema (`glam.run_config`) and evaluation's configs import it.
"""

from __future__ import annotations

from dataclasses import dataclass

from glam.config import DEFAULT_MODEL, CoreRunConfig, config_section

TEACHERS: tuple[str, ...] = ("none", "llm", "bot", "uniform")
"""`none`: plain PPO; `llm`: a language model weighs the candidate subgoals (LLM4Teach);
`bot`: BabyAI's bot (an oracle control); `uniform`: every candidate subgoal equally (a null
control: the skills without anybody choosing among them)."""


@config_section("teach")
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

    def check_run(self, run: CoreRunConfig) -> None:
        """A teacher is distilled into a PPO student."""
        if self.teacher != "none" and run.policy.kind == "drrn":
            raise ValueError(
                f"teach.teacher={self.teacher!r}: a teacher is distilled into a PPO "
                "student (policy.kind=symbolic or llm), not into DRRN's Q-values"
            )

    def coef(self, update: int) -> float:
        """The distillation weight of update `update` (1 for the first update of the run)."""
        if self.teacher == "none" or update > self.off_after:
            return 0.0
        return max(self.coef_start - self.coef_decay * (update - 1), self.coef_floor)
