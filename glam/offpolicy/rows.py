"""The loop of the learners that learn as they play (DRRN, SAC): rows of frames, each logged and
checkpointed as a PPO update is.

A learner of this kind builds its training state (a `glam.ppo.learner.LearnerTraining`: its
runner, logs, counters and checkpoint writer) and gives two functions: `play` steps the envs for
one row, learning as it goes, and returns what the row gathered (with its `frames`); `metrics`
turns that into the row's metrics. `train_in_rows` runs them until `train.total_frames` or a stop signal, with PPO's run
folder, logs and checkpoints.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, Protocol, TypeVar

from accelerate import Accelerator

from glam.offpolicy.run_config import SacRunConfig
from glam.ppo.learner import (
    LearnerTraining,
    StopSignal,
    TrainResult,
    checkpoint_due,
    log_update,
)
from glam.runs.checkpoint import TrainerState

__all__ = ["train_in_rows"]


class _Row(Protocol):
    frames: int


Training = TypeVar("Training", bound=LearnerTraining)
Row = TypeVar("Row", bound=_Row)


def train_in_rows(
    cfg: SacRunConfig,
    accelerator: Accelerator,
    stop: StopSignal | None,
    build: Callable[[], Training],
    play: Callable[[Training, StopSignal], Row],
    metrics: Callable[[Training, Row], dict[str, float]],
    summary: Callable[[Training, dict[str, float]], str],
) -> TrainResult:
    """Build the training state, then per row: `play` it (a stop signal ends it early: it is
    logged with the frames it has and saved), count it, log `metrics` with the `summary` line,
    checkpoint when due; the last row is saved. The state is closed however the
    run ends."""
    own_stop = stop is None
    stop = StopSignal() if stop is None else stop
    t: Any = None
    try:
        t = build()
        checkpoint = t.resumed_from
        state: TrainerState = t.state
        start_time = time.perf_counter() - state.elapsed_seconds
        while state.frames < cfg.train.total_frames and not stop.requested(accelerator):
            row = play(t, stop)
            state.update += 1
            state.frames += row.frames
            values = metrics(t, row)
            state.episodes += int(values["charts/episodes"])
            state.elapsed_seconds = time.perf_counter() - start_time
            log_update(t.logger, t.progress, state, values, summary(t, values))
            if checkpoint_due(cfg, state):
                checkpoint = t.save()
        if stop.stopping or checkpoint is None:
            checkpoint = t.save()  # a no-op if this row was just saved
    finally:
        if t is not None:
            t.close()
        if own_stop:
            stop.restore()
    stopped_by = stop.name if stop.stopping else None
    return TrainResult(state=t.state, checkpoint=checkpoint, stopped_by=stopped_by)
