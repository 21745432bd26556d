"""Why a training run stops with an error (torch-free, for every trainer and policy)."""

from __future__ import annotations


class SetupError(RuntimeError):
    """The run cannot start as configured (bad env, model, layout or output folder)."""


class TrainingDiverged(RuntimeError):
    """The PPO loss or gradient became NaN or infinite; nothing of that update was saved."""


class RunWriteError(RuntimeError):
    """A file of the run folder could not be written (a full disk, a read-only folder): the run
    stops with status 2; its last complete checkpoint stays as it was."""


class MetricsWriteError(RunWriteError):
    """`metrics.csv` could not be written."""
