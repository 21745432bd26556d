"""Why a training run stops with an error (torch-free, for every trainer and policy)."""

from __future__ import annotations


class SetupError(RuntimeError):
    """The run cannot start as configured (bad env, model, layout or output folder)."""


class TrainingDiverged(RuntimeError):
    """The PPO loss or gradient became NaN or infinite; nothing of that update was saved."""
