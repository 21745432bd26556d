"""End-to-end PPO throughput: env-steps/s of the rollout and of the update, and peak memory.

    # CPU preset (embedded SmolLM2-135M + LoRA), 2 updates after a warm-up one
    python scripts/bench_ppo.py --config-name smollm2_lora_cpu --updates 2 --out bench.json
    # the tiny preset, or any override of the training config
    python scripts/bench_ppo.py --config-name tiny --updates 5 env.num_envs=16
    # one GPU (bf16 autocast)
    python scripts/bench_ppo.py --config-name glam_paper --updates 2 env.num_envs=8 \
        model.autocast_bf16=true

The config is composed and checked as the training script does (`glam.config.compose_config`:
an unknown key, `+key` or not, or a bad value exits 1 before anything runs) and the accelerator
is the training script's (`glam.ppo.launch.build_accelerator`: the CPU where there is no CUDA,
or with `train.cpu=true`). It runs the real training loop (`glam.ppo.trainer.train`) in one
process, in a temporary run folder, for `--updates` updates plus one warm-up update that is left
out of the figures, then prints a table and writes JSON: rollout and update env-steps/s
(transitions per second of update wall time, all epochs included), seconds per update, peak
memory (process RSS; CUDA peak allocated on GPU), the seconds of each phase of an update
(`glam.ppo.timing`: rollout forwards, env steps, the update's forwards, backwards and optimizer
steps, and the recomputation of old log-probs under reduced precision), the memory of the frozen
trunk's cached states (`model.lora.layers=4`: the update runs from them, `glam.trunk`), and the
machine it ran on.

    # the default preset with LoRA on the top 4 layers, the update run from the trunk's cache
    python scripts/bench_ppo.py --updates 2 model.lora.layers=4
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import tempfile
from pathlib import Path

import torch
import transformers

from glam.cli import report
from glam.config import ConfigError
from glam.outputs import OutputDirError, add_output_file_options, check_output_file, write_json
from glam.ppo.launch import LaunchError, build_accelerator, describe
from glam.ppo.logger import read_metrics
from glam.ppo.timing import PHASES, peak_rss_mib
from glam.ppo.trainer import train
from glam.run_config import TrainingRunConfig, compose_run
from glam.threads import set_torch_threads


def bench(cfg: TrainingRunConfig, updates: int) -> dict[str, object]:
    """Train `updates + 1` updates of `cfg` in a temporary folder; return the measurements.

    Raises:
        LaunchError: the accelerator does not see the launched processes, or there are several
            (the figures are those of one process).
    """
    transformers.utils.logging.disable_progress_bar()
    threads = set_torch_threads(cfg.train.torch_threads, "train.torch_threads")
    print(f"[bench] {threads.describe()}", flush=True)
    cfg.train.total_frames = (updates + 1) * cfg.frames_per_update
    cfg.train.save_every = 0
    cfg.train.progress_bar = False
    accelerator = build_accelerator(cpu=cfg.train.cpu)
    if accelerator.num_processes > 1:
        raise LaunchError(
            f"bench_ppo measures one process, not {accelerator.num_processes}: run it with "
            "`python scripts/bench_ppo.py`, not `accelerate launch`"
        )
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
        # None: every layer; K or a list: the adapted layers (glam.trunk).
        "lora_layers": cfg.model.lora.layers,
        # As the trainer resolved it: the update ran from the rollout's trunk states.
        "cache_trunk": cfg.ppo.cache_trunk,
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
        "peak_rss_mib": peak_rss_mib(),
        "trunk_cache_mib": statistics.mean(row.get("memory/trunk_cache_mib", 0.0) for row in rows),
        # Where an update's time goes (glam.ppo.timing): mean seconds per phase.
        **{
            f"phase_{name}_s": statistics.mean(row[f"time/{name}_s"] for row in rows)
            for name in PHASES
        },
        "device": str(accelerator.device),
        "distributed": describe(accelerator),
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


WRITER = "scripts/bench_ppo.py"
"""The mark of the JSON this script writes (`glam.outputs.write_json`)."""


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config-name", default="smollm2_lora_cpu", help="training preset")
    parser.add_argument("--updates", type=int, default=2, help="updates measured (after warm-up)")
    add_output_file_options(parser, help="write the JSON here too")
    parser.add_argument("overrides", nargs="*", help="Hydra overrides, e.g. env.num_envs=8")
    args = parser.parse_args(argv)
    if args.out is not None:  # before any work
        try:
            check_output_file(args.out, key="--out", writer=WRITER, overwrite=args.overwrite)
        except OutputDirError as error:
            return report(error)
    try:
        cfg = compose_run(args.config_name, args.overrides)
    except ConfigError as error:
        return report(f"invalid configuration: {error}", status=1)
    try:
        result = bench(cfg, max(args.updates, 1))
    except LaunchError as error:
        return report(error)
    result["command"] = " ".join(["python", "scripts/bench_ppo.py", *argv])
    width = max(len(key) for key in result)
    for key, value in result.items():
        shown = f"{value:.4g}" if isinstance(value, float) else value
        print(f"{key:<{width}}  {shown}")
    if args.out:
        write_json(args.out, result, WRITER)
        print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
