"""What every learner shares (PPO's here, SAC's in `glam.offpolicy`, DRRN's in
`glam.baselines`): the training state's common part (`LearnerTraining`: the run, its envs,
model, optimizer, counters and logs, its checkpoint and closing), the stop signals of a cluster
or a terminal, how a run ended, an update's logs, the checkpoint schedule and the divergence
check that stops every process at once."""

from __future__ import annotations

import signal
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Generic, TypeVar

import torch
from accelerate import Accelerator

from glam.config import CoreRunConfig
from glam.envs import EnvRunner
from glam.ppo.logger import MetricsLogger, ProgressBar
from glam.runs.checkpoint import TrainerState, save_checkpoint
from glam.runs.errors import TrainingDiverged

__all__ = [
    "LearnerTraining",
    "StopSignal",
    "TrainResult",
    "checkpoint_due",
    "episode_metrics",
    "log_update",
    "raise_if_diverged",
]


Run = TypeVar("Run", bound=CoreRunConfig)


@dataclass(kw_only=True)
class LearnerTraining(Generic[Run]):
    """What every learner's training state holds, built by its set-up (PPO's `Training`, SAC's
    and DRRN's extend it): it writes the checkpoint of the current update once, with
    `write_extra`'s own state, and closes the logs and envs."""

    cfg: Run
    accelerator: Accelerator
    run_dir: Path
    config_yaml: str
    """The run's resolved config (`glam.runs.lifecycle.resolved_config_yaml`), kept in each
    checkpoint."""
    runner: EnvRunner
    model: torch.nn.Module
    """The trained model as `accelerator.prepare` returned it (DDP over several processes)."""
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LambdaLR
    state: TrainerState
    logger: MetricsLogger
    progress: ProgressBar
    resumed_from: Path | None
    num_updates: int
    """Updates of the whole run: those done plus those that reach `train.total_frames`."""
    saved: tuple[int, Path] | None = None
    """The update and folder of the newest checkpoint this session wrote or resumed."""

    def write_extra(self, folder: Path) -> None:
        """The learner's own state (a replay buffer, target networks) into a checkpoint
        (`save_checkpoint`'s `write_extra`); nothing by default."""

    def save(self) -> Path:
        """Write a checkpoint of the current update unless this session already has (every
        process calls it)."""
        if self.saved is not None and self.saved[0] == self.state.update:
            return self.saved[1]
        checkpoint = save_checkpoint(
            self.accelerator,
            self.run_dir,
            model=self.model,
            optimizer=self.optimizer,
            scheduler=self.scheduler,
            env_state=self.runner.state_dict(),
            state=self.state,
            config_yaml=self.config_yaml,
            keep=self.cfg.train.keep_checkpoints,
            write_extra=self.write_extra,
        )
        self.saved = (self.state.update, checkpoint)
        return checkpoint

    def close(self) -> None:
        """Close the logs, the progress bar and the environments."""
        self.progress.close()
        self.logger.close()
        self.runner.close()


@dataclass
class TrainResult:
    """How a call to `train` ended."""

    state: TrainerState
    """Counters at the end."""
    checkpoint: Path | None
    """The newest complete checkpoint."""
    stopped_by: str | None = None
    """Name of the signal that stopped the run early (SIGTERM, SIGUSR1, SIGINT), or None."""


class StopSignal:
    """Remembers SIGTERM / SIGUSR1 (cluster preemption) and SIGINT (Ctrl-C) so the loop can save
    and exit cleanly; a second SIGINT, a second or more after the first, raises KeyboardInterrupt
    at once (`accelerate launch` forwards the terminal's Ctrl-C, which its processes also get:
    that copy comes within milliseconds and is not a second Ctrl-C).

    Installed until `restore`: a script keeps it until the process exits, so that a signal that
    comes during the last save or the exit is recorded, never fatal.
    """

    SIGNALS = (signal.SIGTERM, signal.SIGUSR1, signal.SIGINT)
    REPEAT_SECONDS = 1.0
    """A SIGINT this long after the first is a second Ctrl-C."""

    def __init__(self) -> None:
        self.received: str | None = None
        """The first signal received, by name."""
        self.stopping = False
        """`requested` has said yes: every process is stopping."""
        self._interrupted_at: float | None = None
        self._previous = {s: signal.signal(s, self._handle) for s in self.SIGNALS}

    def _handle(self, signum: int, frame: object) -> None:
        if signum == signal.SIGINT:
            now = time.monotonic()
            if self._interrupted_at is None:
                self._interrupted_at = now
            elif now - self._interrupted_at >= self.REPEAT_SECONDS:
                raise KeyboardInterrupt
        self.received = self.received or signal.Signals(signum).name

    def requested(self, accelerator: Accelerator) -> bool:
        """True on every process as soon as any process received a stop signal (collective)."""
        if accelerator.num_processes == 1:  # nothing to share: no round trip through a GPU
            self.stopping = self.stopping or self.received is not None
            return self.stopping
        flag = torch.tensor([float(self.received is not None)], device=accelerator.device)
        if accelerator.num_processes > 1:
            flag = accelerator.reduce(flag, reduction="sum")
        self.stopping = self.stopping or bool(flag.item() > 0)
        return self.stopping

    @property
    def name(self) -> str:
        """What stopped the run: the signal this process received, or another's."""
        return self.received or "a stop signal on another process"

    def restore(self) -> None:
        """Put back the handlers that were there before."""
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)


def log_update(
    logger: MetricsLogger,
    progress: ProgressBar,
    state: TrainerState,
    metrics: dict[str, float],
    summary: str,
) -> None:
    """Write an update's metrics to the logs, move the progress bar and print `summary`."""
    logger.log(state.update, state.frames, state.elapsed_seconds, metrics)
    progress.update(state.frames, metrics["charts/fps"], metrics["charts/success_rate"])
    progress.print(summary)


def checkpoint_due(cfg: CoreRunConfig, state: TrainerState) -> bool:
    """The update just done is saved: every `train.save_every` updates, and the last one."""
    every = cfg.train.save_every
    return bool(every and state.update % every == 0) or state.frames >= cfg.train.total_frames


def episode_metrics(sums: torch.Tensor) -> dict[str, float]:
    """Success rate, mean return and length from `[count, successes, returns, lengths]` sums
    (NaN when no episode ended)."""
    count, successes, returns, lengths = sums.tolist()
    if count == 0:
        nan = float("nan")
        return {
            "charts/success_rate": nan,
            "charts/episode_return": nan,
            "charts/episode_length": nan,
            "charts/episodes": 0.0,
        }
    return {
        "charts/success_rate": successes / count,
        "charts/episode_return": returns / count,
        "charts/episode_length": lengths / count,
        "charts/episodes": count,
    }


def raise_if_diverged(accelerator: Accelerator, bad: bool | torch.Tensor) -> None:
    """Raise `TrainingDiverged` on every process as soon as `bad` is true on one (collective).

    `bad` may be a flag on the device: one process then reads it once, and several sum it first.
    """
    if accelerator.num_processes == 1:
        flagged = bool(bad)
    else:
        flag = torch.as_tensor(bad, device=accelerator.device).float().reshape(1)
        flagged = accelerator.reduce(flag, "sum").item() > 0
    if flagged:
        raise TrainingDiverged("the PPO loss or its gradient became NaN or infinite")
