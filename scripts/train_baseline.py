"""Train one of the agents GLAM is compared with, in the same envs and run folders as GLAM.

    # one CPU process: DRRN (He et al. 2016) on GoToRedBallNoDists
    python scripts/train_baseline.py --config-name drrn train.output_dir=runs/drrn
    # BabyAI's symbolic actor-critic, trained by PPO on the grid
    python scripts/train_baseline.py --config-name symbolic_ppo train.output_dir=runs/symbolic
    # one GPU
    accelerate launch --num_processes 1 scripts/train_baseline.py --config-name drrn \
        train.output_dir=runs/drrn_gpu
    # N processes (DDP; N CPU processes over gloo here, GPUs with multi_gpu.yaml)
    accelerate launch --config_file configs/accelerate/multi_cpu.yaml --num_processes 2 \
        scripts/train_baseline.py --config-name drrn train.output_dir=runs/drrn_2p
    # continue a run from its newest checkpoint
    python scripts/train_baseline.py --config-name drrn train.output_dir=runs/drrn \
        train.resume=true

The agent is `policy.kind`: `drrn` (its own TD learner, `glam.baselines.drrn_trainer`, section
`drrn`) or `symbolic` (the PPO trainer, section `symbolic`); language models (`llm`) train with
scripts/train_language_agent.py. The `env.*` and `train.*` keys are those of
train_language_agent.py, and so are the run folder, the checkpoints, resuming, and stop signals:
SIGTERM, SIGUSR1 or SIGINT (Ctrl-C) writes a checkpoint and exits with status 0; a second
Ctrl-C stops at once. Exit status: 0 done (or checkpointed on a signal), 1 bad config (Hydra),
2 the run cannot start (`policy.kind=llm` among the reasons) or a checkpoint cannot be written,
3 the loss became NaN, 130 a second Ctrl-C.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

from glam.config import TrainingRunConfig, config_main, register_configs

register_configs()


@config_main(TrainingRunConfig, config_path="../configs", config_name="drrn")
def main(cfg: TrainingRunConfig) -> None:
    """Train with the validated config (exit 1 before this on a bad one); report how it ended."""
    sys.exit(run(cfg, config_name=_config_name()))


def run(cfg: TrainingRunConfig, *, config_name: str = "run") -> int:
    """Train the baseline `cfg` names in this process (one of `accelerate launch`'s); return
    the exit status."""
    if cfg.policy.kind == "llm":
        print(
            "error: policy.kind=llm trains a language model: use scripts/train_language_agent.py "
            "(this script trains policy.kind=drrn or symbolic)",
            file=sys.stderr,
        )
        return 2
    import torch
    from accelerate.utils import broadcast_object_list

    from glam.baselines.drrn_trainer import train_drrn
    from glam.ppo.checkpoint import CheckpointWriteError
    from glam.ppo.launch import LaunchError, build_accelerator, describe
    from glam.ppo.trainer import SetupError, StopSignal, TrainingDiverged, train

    trainer = train_drrn if cfg.policy.kind == "drrn" else train
    # Installed for the life of the process, never restored: a stop signal during set-up, the
    # last save or the exit is recorded instead of killing the process half-way.
    stop = StopSignal()
    if cfg.train.torch_threads is not None:
        torch.set_num_threads(cfg.train.torch_threads)
    try:
        accelerator = build_accelerator(cpu=cfg.train.cpu)
    except LaunchError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    # Every process must write into the same folder: the main process picks it.
    output_dir = [cfg.train.output_dir or f"runs/{config_name}-{time.strftime('%Y%m%d-%H%M%S')}"]
    broadcast_object_list(output_dir)
    run_dir = Path(output_dir[0]).resolve()
    cfg.train.output_dir = str(run_dir)
    accelerator.print(
        f"[glam] run folder {run_dir}, {describe(accelerator)}, policy.kind={cfg.policy.kind}"
    )

    try:
        result = trainer(cfg, accelerator, run_dir, stop)
    except SetupError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    except CheckpointWriteError as error:
        print(f"error: {error}; {_last_checkpoint(run_dir)}", file=sys.stderr)
        return 2
    except TrainingDiverged as error:
        print(
            f"error: stopping: {error}; nothing of that update was saved; "
            f"{_last_checkpoint(run_dir)}",
            file=sys.stderr,
        )
        return 3
    except KeyboardInterrupt:
        print(
            f"error: interrupted twice: stopped without saving; {_last_checkpoint(run_dir)}",
            file=sys.stderr,
        )
        return 130
    if result.stopped_by is not None:
        accelerator.print(
            f"preempted by {result.stopped_by}: checkpoint saved at update "
            f"{result.state.update} (frames {result.state.frames}) in {result.checkpoint}"
        )
    else:
        accelerator.print(
            f"done: {result.state.frames} frames in {result.state.update} updates; "
            f"checkpoint {result.checkpoint}"
        )
    accelerator.end_training()
    return 0


def _last_checkpoint(run_dir: Path) -> str:
    from glam.ppo.checkpoint import latest_checkpoint

    try:
        last = latest_checkpoint(run_dir)
    except FileNotFoundError as error:
        return f"no complete checkpoint to point at ({error})"
    return f"the last complete checkpoint is {last}" if last else "no checkpoint had been written"


def _config_name() -> str:
    from hydra.core.hydra_config import HydraConfig

    return HydraConfig.get().job.config_name or "run"


if __name__ == "__main__":
    main()
