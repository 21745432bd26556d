"""The teacher in the PPO loop: its distributions travel with the transitions, its
cross-entropy joins the loss while the schedule says so.

`TeachHook` is a `glam.ppo.hooks.TrainerHook`: at each rollout step it asks the teacher about
every local env (stored as the transitions' `teacher_probs` and `teacher_valid`), and for each
micro-batch of the update adds `coef_k * mean_i CE(pi_teacher(s_i), pi_student(s_i))`, a row
without advice adding 0 (LLM4Teach's kickstarting term). Once `teach.coef` is 0 the teacher is
no longer consulted and nothing is added: the update is PPO's exactly.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import numpy as np
import torch

from glam.ppo.hooks import TrainerHook
from glam.teach.config import TeachConfig
from glam.teach.scorers import SubgoalScorer, build_scorer
from glam.teach.teacher import BotTeacher, SubgoalTeacher, Teacher

if TYPE_CHECKING:
    from glam.policy.observations import Observations
    from glam.policy.output import PolicyOutput
    from glam.ppo.buffer import Transitions
    from glam.ppo.setup import Training

__all__ = ["TeachHook", "build_teacher", "distillation_loss"]

PROBS, VALID = "teacher_probs", "teacher_valid"
"""Names of the teacher's tensors in the rollout buffer."""


def build_teacher(
    cfg: TeachConfig, minigrid_actions: tuple[int, ...], *, scorer: SubgoalScorer | None = None
) -> Teacher:
    """The teacher `cfg.teacher` names, over an action space given as minigrid actions.

    `scorer`: the LLM teacher's, when the caller already has one (several teachers can share a
    model); otherwise built from `cfg` (`teach.backend`, `teach.model`).
    """
    if cfg.teacher == "bot":
        return BotTeacher(minigrid_actions)
    if cfg.teacher == "uniform":
        return SubgoalTeacher(minigrid_actions, None)
    if cfg.teacher == "llm" and scorer is None:
        scorer = build_scorer(cfg, "teach")
    if cfg.teacher == "llm":
        return SubgoalTeacher(
            minigrid_actions, scorer, temperature=cfg.temperature, cache=cfg.cache
        )
    raise ValueError(f"teach.teacher={cfg.teacher!r} has no teacher to build")


def distillation_loss(
    logits: torch.Tensor, teacher_probs: torch.Tensor, valid: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """`mean_i valid_i * CE(teacher_i, softmax(logits_i))` and the per-row CE `(batch,)`.

    Actions the teacher gives no probability add nothing (also where the student's logit is
    -inf: an absent candidate), so the term stays finite.
    """
    log_student = torch.log_softmax(logits.float(), dim=-1)
    teacher_probs = teacher_probs.to(log_student.device, log_student.dtype)
    terms = torch.where(teacher_probs > 0, teacher_probs * log_student, 0.0)
    ce = -terms.sum(-1) * valid.to(log_student.device, log_student.dtype)
    return ce.mean(), ce.detach()


class TeachHook(TrainerHook):
    """LLM4Teach's teacher joined to the PPO trainer (see the module docstring)."""

    def __init__(self, cfg: TeachConfig, teacher: Teacher | None = None) -> None:
        """`teacher`: built from `cfg` when first needed if None (a test may give its own)."""
        self.cfg = cfg
        self.teacher = teacher
        self._sums = torch.zeros(4, dtype=torch.float64)  # ce, agreement, valid rows, rows

    def start(self, training: Training) -> None:
        self.training = training
        self.runner = training.runner
        self._new_episode = [True] * self.runner.num_envs

    @property
    def coef(self) -> float:
        """The weight of the update being collected or computed (`state.update` counts the
        updates done)."""
        return self.cfg.coef(self.training.state.update + 1)

    def observe(self, observations: Observations) -> dict[str, torch.Tensor]:
        if self.coef == 0.0:
            return {}
        if self.teacher is None:  # not before: a run resumed after the schedule needs none
            space = self.runner.envs.envs[0].action_space_def
            self.teacher = build_teacher(self.cfg, space.minigrid_actions)
        envs = self.runner.envs.envs
        probs, valid = self.teacher.distributions(envs, list(range(len(envs))), self._new_episode)
        self._new_episode = [False] * len(envs)
        return {PROBS: probs, VALID: valid}

    def after_step(self, actions: torch.Tensor, rewards: np.ndarray, dones: np.ndarray) -> None:
        if self.coef == 0.0 or self.teacher is None:
            return
        self.teacher.record_actions(list(range(len(actions))), actions.tolist())
        self._new_episode = [bool(done) for done in dones]

    def loss(self, output: PolicyOutput, batch: Transitions) -> torch.Tensor | None:
        coef = self.coef
        if coef == 0.0 or PROBS not in batch.extras:
            return None
        valid = batch.extras[VALID]
        term, ce = distillation_loss(output.logits, batch.extras[PROBS], valid)
        with torch.no_grad():
            agree = output.logits.argmax(-1).cpu() == batch.extras[PROBS].argmax(-1)
            self._sums += torch.tensor(
                [
                    float(ce.sum()),
                    float((agree & valid).sum()),
                    float(valid.sum()),
                    float(len(valid)),
                ],
                dtype=torch.float64,
            )
        return coef * term

    def after_update(
        self, training: Training, model: torch.nn.Module, metrics: dict[str, float]
    ) -> dict[str, float]:
        counts = self.teacher.pop_counts() if self.teacher is not None else None
        local = torch.cat(
            [self._sums, torch.tensor(counts.as_list() if counts else [0.0] * 3).double()]
        )
        self._sums.zero_()
        total = training.accelerator.reduce(local.to(training.accelerator.device), "sum").cpu()
        ce, agree, valid, rows, states, calls, hits = total.tolist()
        return {
            "teach/coef": self.cfg.coef(training.state.update),
            "teach/ce": ce / valid if valid else math.nan,
            "teach/agreement": agree / valid if valid else math.nan,
            "teach/advice_fraction": valid / rows if rows else math.nan,
            "teach/llm_calls": calls,
            "teach/cache_hits": hits,
            "teach/states": states,
        }

    def close(self) -> None:
        """Release the teacher's model or connections."""
        if self.teacher is not None:
            self.teacher.close()
