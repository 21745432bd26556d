"""Points where code outside the trainer joins a PPO run, without the trainer knowing its name.

A hook is an object with any of the methods of `TrainerHook` (each a no-op there); `train`
calls every hook's method at its point of the loop, in the order given. Diagnostics (GLAM's
action-probability probe) and the couplings of later packages (a teacher, a reward model, a
planner) plug in here; with no hook the loop is exactly the plain PPO loop.

The points, in the order of one update:

- `wrap_env`: once per local env, when the envs are built (before `start`): the env the policy
  plays instead (another action set, rewards, observations: LLM4RL's mediator);
- `start`: once, before the first rollout (keep what you need: the runner, the accelerator);
- `observe`: at each rollout step, before the policy acts: tensors to store with the step's
  transitions (the teacher's action distribution...), read back as `batch.extras[name]`;
- `after_step`: at each rollout step, after the envs applied the actions;
- `loss`: for each micro-batch of the update, a term added to PPO's loss;
- `after_update`: after the optimizer steps, metrics to add to the update's row;
- `finish`: once, when the loop has run its frames (not on an error or a stop signal), before
  the last checkpoint: the helpers that work beside the loop are checked a last time;
- `close`: once, when the run ends (normally or not).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np
import torch

if TYPE_CHECKING:
    from glam.policy.observations import Observations
    from glam.policy.output import PolicyOutput
    from glam.ppo.buffer import Transitions
    from glam.ppo.setup import Training


class HookError(RuntimeError):
    """A hook's outside part (a server, a helper process) failed: the run stops with this
    message and exit status 4; the last complete checkpoint stays as it was."""


class TrainerHook:
    """Base class of the hooks: every method does nothing."""

    def wrap_env(self, env: Any) -> Any:
        """Called once per local env (a `babyai_text.TextEnv`, or what an earlier hook made of
        it) when the run's envs are built, before `start`; returns the env to step instead. A
        wrapper keeps `TextEnv`'s interface (`action_words`, `reset(seed=)`, `step`,
        `info["success"]`, `info["task_type"]`, `info["descriptions"]`); when it changes the
        action words, the run's policy must be built over the new ones (its factory), or the
        run stops at start-up. The default returns `env` itself: the run is unchanged."""
        return env

    def start(self, training: Training) -> None:
        """Called once, after everything is built (and a checkpoint restored), before the
        first rollout; `training.model` is the prepared (wrapped) model."""

    def observe(self, observations: Observations) -> dict[str, torch.Tensor]:
        """Called at every rollout step with what each local env's policy reads before it
        acts (`training.runner`'s envs are in that state). Returns tensors `(envs, ...)` to
        store with this step's transitions, under their names; the update reads them back as
        `batch.extras[name]`. A name must come at every step of a rollout or at none."""
        return {}

    def after_step(self, actions: torch.Tensor, rewards: np.ndarray, dones: np.ndarray) -> None:
        """Called at every rollout step after the envs applied `actions` `(envs,)`; envs whose
        episode ended (`dones`) have already started the next one."""

    def loss(self, output: PolicyOutput, batch: Transitions) -> torch.Tensor | None:
        """Called for every micro-batch of the update with the policy's output on `batch`;
        returns a scalar to add to PPO's loss (it is backpropagated with it), or None to add
        nothing. Keep the term's statistics yourself and report them in `after_update`.

        Row i of `output` is the policy's output on row i of `batch`, with or without memory
        (with memory, `batch` holds whole sequences of `ppo.recurrence` steps, step by step, and
        each row's output was computed with its memory: a mean over rows is a mean over steps)."""
        return None

    def after_update(
        self, training: Training, model: torch.nn.Module, metrics: dict[str, float]
    ) -> dict[str, float]:
        """Called on every process after each update's optimizer steps (the counters in
        `training.state` already count it), before the metrics are logged; returns metrics to
        add to the update's row (namespaced, e.g. `probe/...`). Collective calls (a forward
        under ZeRO-3) must run on every process."""
        return {}

    def finish(self, training: Training) -> None:
        """Called once when the loop has run its frames, before the last checkpoint (not when
        the run stops on an error or a signal): check what works beside the loop (a helper
        process, a server) as the loop does, so that a run too short to meet its failure does
        not end as a success. Raise `HookError` to end the run with status 4."""

    def close(self) -> None:
        """Called once when `train` returns or raises: release models, servers, files."""
