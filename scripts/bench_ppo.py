"""End-to-end PPO throughput: env-steps/s of the rollout and of the update, and peak memory.

    # CPU preset (embedded SmolLM2-135M + LoRA), 2 updates after a warm-up one
    python scripts/bench_ppo.py --config-name smollm2_lora_cpu --updates 2 --out bench.json
    # the tiny preset, or any override of the training config
    python scripts/bench_ppo.py --config-name tiny --updates 5 env.num_envs=16
    # one GPU (bf16 autocast)
    python scripts/bench_ppo.py --config-name glam_paper --updates 2 env.num_envs=8 \
        model.autocast_bf16=true

It runs the real training loop (`glam.ppo.trainer.train`) in a temporary run folder for
`--updates` updates plus one warm-up update that is left out of the figures, then prints a table
and writes JSON: rollout and update env-steps/s (transitions per second of update wall time, all
epochs included), seconds per update, and peak memory (process RSS; CUDA peak allocated on GPU).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import statistics
import sys
import tempfile
from pathlib import Path

import torch
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from glam.config import TrainingRunConfig, register_configs

CONFIG_DIR = Path(__file__).resolve().parents[1] / "configs"


def bench(cfg: TrainingRunConfig, updates: int) -> dict[str, object]:
    """Train `updates + 1` updates of `cfg` in a temporary folder; return the measurements."""
    import transformers
    from accelerate import Accelerator

    from glam.ppo.logger import read_metrics
    from glam.ppo.trainer import train

    transformers.utils.logging.disable_progress_bar()
    if cfg.train.torch_threads is not None:
        torch.set_num_threads(cfg.train.torch_threads)
    cfg.train.total_frames = (updates + 1) * cfg.frames_per_update
    cfg.train.save_every = 0
    cfg.train.progress_bar = False
    accelerator = Accelerator(cpu=cfg.train.cpu)
    with tempfile.TemporaryDirectory(prefix="glam-bench-") as folder:
        cfg.train.output_dir = folder
        train(cfg, accelerator, Path(folder))
        rows = read_metrics(folder)[1:]  # the first update warms up caches and allocators
    rollout_fps = [row["charts/rollout_fps"] for row in rows]
    update_fps = [row["charts/update_fps"] for row in rows]
    frames = cfg.frames_per_update
    result: dict[str, object] = {
        "model": cfg.model.name_or_path,
        "lora": cfg.model.lora.enabled,
        "env": cfg.env.name,
        "num_envs": cfg.env.num_envs,
        "frames_per_update": frames,
        "epochs": cfg.ppo.epochs,
        "minibatch_size": cfg.ppo.minibatch_size,
        "micro_batch_size": cfg.ppo.micro_batch_size,
        "updates_measured": len(rows),
        "rollout_env_steps_per_s": statistics.mean(rollout_fps),
        "update_env_steps_per_s": statistics.mean(update_fps),
        "seconds_per_update": statistics.mean(
            frames / r + frames / u for r, u in zip(rollout_fps, update_fps, strict=True)
        ),
        "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "device": str(accelerator.device),
        "torch_threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "cpu": platform.processor() or platform.machine(),
        "cpu_count": os.cpu_count(),
        # Other work on the machine slows every figure: the load says how busy it was.
        "load_average_1min": os.getloadavg()[0],
    }
    if torch.cuda.is_available() and accelerator.device.type == "cuda":
        result["cuda_peak_allocated_mib"] = torch.cuda.max_memory_allocated() / 2**20
        result["gpu"] = torch.cuda.get_device_name()
    return result


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config-name", default="smollm2_lora_cpu", help="training preset")
    parser.add_argument("--updates", type=int, default=2, help="updates measured (after warm-up)")
    parser.add_argument("--out", type=Path, help="write the JSON here too")
    parser.add_argument("overrides", nargs="*", help="Hydra overrides, e.g. env.num_envs=8")
    args = parser.parse_args(argv)
    register_configs()
    with initialize_config_dir(str(CONFIG_DIR), version_base="1.3"):
        raw = compose(args.config_name, overrides=args.overrides)
    cfg: TrainingRunConfig = OmegaConf.to_object(raw)
    result = bench(cfg, max(args.updates, 1))
    result["command"] = " ".join(["python", "scripts/bench_ppo.py", *argv])
    width = max(len(key) for key in result)
    for key, value in result.items():
        shown = f"{value:.1f}" if isinstance(value, float) else value
        print(f"{key:<{width}}  {shown}")
    if args.out:
        args.out.write_text(json.dumps(result, indent=2) + "\n")
        print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
