"""Fine-tune a language model as a BabyAI-Text agent with online PPO (GLAM).

    # one CPU process (default preset: the embedded SmolLM2-135M + LoRA; `tiny`: a few seconds)
    python scripts/train_language_agent.py train.output_dir=runs/smollm2
    python scripts/train_language_agent.py --config-name tiny train.output_dir=runs/tiny
    # one GPU
    accelerate launch --num_processes 1 scripts/train_language_agent.py \
        --config-name glam_paper env.num_envs=8 train.output_dir=runs/paper_1gpu
    # several GPUs: DDP, or DeepSpeed ZeRO-2 / ZeRO-3 with configs/accelerate/zero{2,3}.yaml
    accelerate launch --config_file configs/accelerate/multi_gpu.yaml --num_processes 8 \
        scripts/train_language_agent.py --config-name glam_paper train.output_dir=runs/paper
    # N CPU processes over gloo (this file really starts N; `--cpu --num_processes N` starts 1)
    accelerate launch --config_file configs/accelerate/multi_cpu.yaml --num_processes 2 \
        scripts/train_language_agent.py --config-name tiny train.output_dir=runs/2p
    # DeepSpeed ZeRO-2 / ZeRO-3 on the CPU (no CUDA: DS_ACCELERATOR=cpu is set for you)
    accelerate launch --config_file configs/accelerate/zero2.yaml --num_processes 2 \
        scripts/train_language_agent.py --config-name tiny train.output_dir=runs/zero2
    # continue a run from its newest checkpoint (starts fresh if it has none), or from an older one
    python scripts/train_language_agent.py --config-name tiny train.output_dir=runs/tiny \
        train.resume=true
    python scripts/train_language_agent.py --config-name tiny train.output_dir=runs/tiny \
        train.resume_from=update_000002

Presets live in configs/ (`glam_paper`, `smollm2_lora_cpu`, `tiny`); any key of
`glam.config.TrainingRunConfig` can be overridden, and a misspelt key stops the run at start-up.
SIGTERM, SIGUSR1 or SIGINT (Ctrl-C) writes a checkpoint and exits with status 0; a second Ctrl-C
stops at once. Exit status: 0 done (or checkpointed on a signal), 1 bad config (Hydra), 2 the run
cannot start or a checkpoint cannot be written, 3 the loss became NaN, 130 a second Ctrl-C.
See docs/training.md and the README's "Checkpoints".
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

from glam.config import TrainingRunConfig, config_main, register_configs

register_configs()


@config_main(TrainingRunConfig, config_path="../configs", config_name="smollm2_lora_cpu")
def main(cfg: TrainingRunConfig) -> None:
    """Train with the validated config (exit 1 before this on a bad one); report how it ended."""
    sys.exit(run(cfg, config_name=_config_name()))


def run(cfg: TrainingRunConfig, *, config_name: str = "run") -> int:
    """Train with `cfg` in this process (one of `accelerate launch`'s); return the exit status."""
    import torch
    import transformers
    from accelerate.utils import broadcast_object_list

    from glam.ppo.checkpoint import CheckpointWriteError
    from glam.ppo.launch import LaunchError, build_accelerator, describe
    from glam.ppo.trainer import SetupError, StopSignal, TrainingDiverged, train

    # Installed for the life of the process, never restored: a stop signal during set-up, the
    # last save or the exit is recorded instead of killing the process half-way.
    stop = StopSignal()
    if cfg.train.torch_threads is not None:
        torch.set_num_threads(cfg.train.torch_threads)
    transformers.utils.logging.disable_progress_bar()
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
    cfg.train.label = cfg.train.label or config_name
    accelerator.print(f"[glam] run folder {run_dir}, {describe(accelerator)}")

    hooks = []
    if cfg.train.probe_every:
        from glam.probe import ProbeHook

        hooks.append(ProbeHook())
    try:
        result = train(cfg, accelerator, run_dir, stop, hooks=hooks)
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
