"""Stand-in for scripts/train_language_agent.py with the same run-folder and signal contract.

    python slurm/local/fake_trainer.py --config-name tiny train.output_dir=runs/fake \
        train.total_frames=400 train.resume=true

It lets the SLURM templates and the requeue path be tested without a model: it counts frames
(`env.num_envs` per step, `GLAM_FAKE_STEP_SECONDS` apart), appends them to `metrics.csv`, saves
`checkpoints/frames_N/state.json` every `train.save_every` frames with a `checkpoints/latest`
pointer, and on SIGUSR1 or SIGTERM saves a checkpoint, prints "preempted: checkpoint saved" and
exits 0. With `train.resume=true` it continues from the newest checkpoint, or starts fresh.
Under a multi-process launcher every rank counts and stops on the signal; rank 0 alone writes.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from pathlib import Path

DEFAULTS = {
    "train.output_dir": "runs/fake",
    "train.total_frames": "400",
    "train.save_every": "40",
    "train.resume": "false",
    "train.seed": "1",
    "env.num_envs": "4",
}


def parse_overrides(argv: list[str]) -> dict[str, str]:
    """Read `--config-name NAME` and Hydra-style `key=value` arguments over `DEFAULTS`."""
    config = dict(DEFAULTS, config_name="default")
    args = iter(argv)
    for arg in args:
        if arg == "--config-name":
            config["config_name"] = next(args)
        elif "=" in arg:
            key, value = arg.split("=", 1)
            config[key.lstrip("+")] = value
        else:
            raise SystemExit(f"fake_trainer: cannot read argument {arg!r}")
    return config


def save_checkpoint(run_dir: Path, frames: int) -> Path:
    """Write the state, then point `checkpoints/latest` at it (so `latest` is always complete)."""
    checkpoint = run_dir / "checkpoints" / f"frames_{frames}"
    checkpoint.mkdir(parents=True, exist_ok=True)
    (checkpoint / "state.json").write_text(json.dumps({"frames": frames}))
    pointer = run_dir / "checkpoints" / "latest"
    tmp = pointer.with_suffix(".tmp")
    tmp.write_text(checkpoint.name)
    tmp.replace(pointer)
    return checkpoint


def load_frames(run_dir: Path) -> int | None:
    """Frames of the newest complete checkpoint, or None when there is none."""
    pointer = run_dir / "checkpoints" / "latest"
    if not pointer.is_file():
        return None
    state = run_dir / "checkpoints" / pointer.read_text().strip() / "state.json"
    return json.loads(state.read_text())["frames"]


def main(argv: list[str]) -> int:
    config = parse_overrides(argv)
    rank, world_size = int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))
    is_main = rank == 0
    run_dir = Path(config["train.output_dir"])
    if is_main:
        run_dir.mkdir(parents=True, exist_ok=True)
        (run_dir / "config.yaml").write_text(
            "".join(f"{key}: {value}\n" for key, value in sorted(config.items()))
        )
    total_frames = int(config["train.total_frames"])
    save_every = int(config["train.save_every"])
    frames_per_step = int(config["env.num_envs"])
    step_seconds = float(os.environ.get("GLAM_FAKE_STEP_SECONDS", "0.1"))

    stop_signal: list[int] = []
    for signum in (signal.SIGUSR1, signal.SIGTERM):
        signal.signal(signum, lambda signum, frame: stop_signal.append(signum))

    frames = load_frames(run_dir) if config["train.resume"] == "true" else None
    if is_main:
        start = (
            "starting fresh" if frames is None else f"resumed from checkpoint at frames {frames}"
        )
        print(f"{start}; world size {world_size}", flush=True)
    frames = frames or 0

    metrics = run_dir / "metrics.csv"
    if is_main and not metrics.exists():
        metrics.write_text("frames\n")
    while frames < total_frames:
        time.sleep(step_seconds)
        frames += frames_per_step
        if is_main:
            with metrics.open("a") as file:
                file.write(f"{frames}\n")
        if stop_signal:
            if is_main:
                save_checkpoint(run_dir, frames)
                print(f"preempted: checkpoint saved at frames {frames}", flush=True)
            print(f"rank {rank}: stopped by signal {stop_signal[0]}", flush=True)
            return 0
        if is_main and frames % save_every == 0:
            save_checkpoint(run_dir, frames)
    if is_main:
        save_checkpoint(run_dir, frames)
        print(f"done at frames {frames}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
