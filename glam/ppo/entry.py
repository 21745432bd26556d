"""What a training script does around a trainer: threads, the accelerator, the run folder, the
stop signals, and the exit status and message of every way a run can end.

`scripts/train_language_agent.py` and `scripts/train_baseline.py` are both this function around
their trainer (the PPO loop with the language model, with the symbolic agent, or DRRN's TD
learner), so every entry point starts, stops and fails the same way.
"""

from __future__ import annotations

import gc
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import NoReturn

import transformers
from accelerate import Accelerator
from accelerate.utils import broadcast_object_list

from glam.cli import report
from glam.config import CoreRunConfig
from glam.llm.chat import ChatClientError
from glam.ppo.hooks import HookError
from glam.ppo.launch import LaunchError, build_accelerator, describe
from glam.ppo.learner import StopSignal
from glam.runs.errors import RunWriteError, SetupError, TrainingDiverged
from glam.runs.folder import latest_checkpoint
from glam.runs.summary import format_summary, write_summary
from glam.threads import set_torch_threads

Trainer = Callable[..., object]
"""`(cfg, accelerator, run_dir, stop) -> TrainResult`, e.g. `glam.ppo.trainer.train`."""

EXIT_STATUSES = (
    "0 done (or checkpointed on a signal), 1 bad config (Hydra), 2 the run cannot start or a "
    "checkpoint or metrics.csv cannot be written, 3 the loss became NaN, 4 a coupling's outside "
    "part failed (an annotator, a server that cannot be reached), 130 a second Ctrl-C"
)


def run_training(cfg: CoreRunConfig, trainer: Trainer, *, config_name: str = "run") -> int:
    """Train with `trainer` in this process (one of `accelerate launch`'s); return the exit
    status. An empty `train.output_dir` becomes `runs/<config_name>-<time>`, an empty
    `train.label` the preset's name."""
    # Installed for the life of the process, never restored: a stop signal during set-up, the
    # last save or the exit is recorded instead of killing the process half-way.
    stop = StopSignal()
    threads = set_torch_threads(cfg.train.torch_threads, "train.torch_threads")
    transformers.utils.logging.disable_progress_bar()
    try:
        accelerator = build_accelerator(cpu=cfg.train.cpu)
    except LaunchError as error:
        return report(error)
    # Every process must write into the same folder: the main process picks it.
    output_dir = [cfg.train.output_dir or f"runs/{config_name}-{time.strftime('%Y%m%d-%H%M%S')}"]
    broadcast_object_list(output_dir)
    run_dir = Path(output_dir[0]).resolve()
    cfg.train.output_dir = str(run_dir)
    cfg.train.label = cfg.train.label or config_name
    accelerator.print(
        f"[glam] run folder {run_dir}, {describe(accelerator)}, policy.kind={cfg.policy.kind}, "
        f"{threads.describe()}"
    )

    try:
        return _train_and_report(cfg, trainer, accelerator, run_dir, stop)
    finally:
        _release(accelerator)


def _train_and_report(
    cfg: CoreRunConfig,
    trainer: Trainer,
    accelerator: Accelerator,
    run_dir: Path,
    stop: StopSignal,
) -> int:
    try:
        result = trainer(cfg, accelerator, run_dir, stop)
    except SetupError as error:
        return report(error)
    except RunWriteError as error:  # a checkpoint or metrics.csv: a full disk...
        return report(f"{error}; {_last_checkpoint(run_dir)}")
    except (HookError, ChatClientError) as error:  # a coupling's server, annotator, sandbox
        reason = str(error).rstrip(".")
        return report(f"stopping: {reason}; {_last_checkpoint(run_dir)}", status=4)
    except TrainingDiverged as error:
        return report(
            f"stopping: {error}; nothing of that update was saved; {_last_checkpoint(run_dir)}",
            status=3,
        )
    except KeyboardInterrupt:
        return report(
            f"interrupted twice: stopped without saving; {_last_checkpoint(run_dir)}", status=130
        )
    if result.stopped_by is not None:
        accelerator.print(
            f"preempted by {result.stopped_by}: checkpoint saved at update "
            f"{result.state.update} (frames {result.state.frames}) in {result.checkpoint}"
        )
    else:
        if accelerator.is_main_process:  # the run's health; "done" stays the last line
            summary, path = write_summary(run_dir)
            print(f"{format_summary(summary)}\nwrote {path}", flush=True)
        accelerator.print(
            f"done: {result.state.frames} frames in {result.state.update} updates; "
            f"checkpoint {result.checkpoint}"
        )
    return 0


def _release(accelerator: Accelerator) -> None:
    """Tear the process group down before the interpreter exits. The prepared model (DDP) keeps
    gloo's process group alive, so `end_training` alone leaves its worker threads running into
    the interpreter's finalization, where one still releasing the tensors of the last collective
    aborts the process ("terminate called without an active exception", seen on rank 1 of
    2-process runs). Dropping the prepared objects and collecting them first lets the group's
    destructor join its threads."""
    accelerator.free_memory()
    gc.collect()
    accelerator.end_training()


def exit_training(status: int) -> NoReturn:
    """End a training script's process with `status`. A process of a multi-process launch
    (`WORLD_SIZE` > 1) ends at once after flushing its output (`os._exit`): at the interpreter's
    ordinary exit, a thread of gloo's process group still releasing the tensors of the last
    collective can abort the process ("terminate called without an active exception") and turn
    a finished run into a failed launch; DeepSpeed keeps the group alive past `end_training`,
    so `_release` cannot prevent it there. Logs, checkpoints and hooks are closed by then."""
    if int(os.environ.get("WORLD_SIZE", "1")) > 1:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(status)
    sys.exit(status)


def _last_checkpoint(run_dir: Path) -> str:
    try:
        last = latest_checkpoint(run_dir)
    except FileNotFoundError as error:
        return f"no complete checkpoint to point at ({error})"
    return f"the last complete checkpoint is {last}" if last else "no checkpoint had been written"


def hydra_config_name() -> str:
    """The `--config-name` of the running Hydra script."""
    from hydra.core.hydra_config import HydraConfig

    return HydraConfig.get().job.config_name or "run"
