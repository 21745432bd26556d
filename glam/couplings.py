"""The trainer hooks a training run's config asks for: the one place that knows the couplings'
names (the trainer does not; the training scripts ask here)."""

from __future__ import annotations

from glam.config import TrainingRunConfig
from glam.ppo.hooks import TrainerHook
from glam.probe import ProbeHook
from glam.teach.hook import TeachHook


def coupling_hooks(cfg: TrainingRunConfig) -> list[TrainerHook]:
    """The hooks of `cfg`'s couplings and diagnostics, in the order the trainer calls them."""
    hooks: list[TrainerHook] = []
    if cfg.train.probe_every:
        hooks.append(ProbeHook())
    if cfg.teach.teacher != "none":
        hooks.append(TeachHook(cfg.teach))
    return hooks
