"""Points where code outside the trainer joins a PPO run, without the trainer knowing its name.

A hook is an object with any of the methods of `TrainerHook` (each a no-op there); `train`
calls every hook's method at its point of the loop, in the order given. Diagnostics (GLAM's
action-probability probe) and the couplings of later packages (a teacher, a reward model, a
planner) plug in here; with no hook the loop is exactly the plain PPO loop.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from glam.ppo.trainer import Training


class TrainerHook:
    """Base class of the hooks: every method does nothing."""

    def start(self, training: Training) -> None:
        """Called once, after everything is built (and a checkpoint restored), before the
        first rollout; `training.model` is the prepared (wrapped) model."""

    def after_update(
        self, training: Training, model: torch.nn.Module, metrics: dict[str, float]
    ) -> dict[str, float]:
        """Called on every process after each update's optimizer steps (the counters in
        `training.state` already count it), before the metrics are logged; returns metrics to
        add to the update's row (namespaced, e.g. `probe/...`). Collective calls (a forward
        under ZeRO-3) must run on every process."""
        return {}
