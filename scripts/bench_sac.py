"""SAC's gradient step with and without the trunk cache: seconds per step, the memory it keeps,
and how far its bfloat16 entries move the policy.

    # the default preset (SmolLM2-135M, LoRA on the top 4 layers), 8 steps per mode
    python scripts/bench_sac.py --steps 8 --out bench_sac.json
    # any override of the training config
    python scripts/bench_sac.py --config-name tiny --steps 4 model.lora.layers=1

The config is composed as the training script composes it, with `algorithm.name=sac`. In a
temporary run folder the real SAC setup (`glam.offpolicy.trainer`) plays `--fill` frames into
the replay by sampling the policy (no gradient step), then times `--steps` gradient steps
(`sac_step`, `sac.batch_size` transitions each) in three modes, each from the same weights and
seed: the whole model run on every replayed observation (`sac.cache_trunk=false`), and from the
cache held in bfloat16 and as computed (`sac.trunk_cache_dtype`), each cache first filled with
the played observations as a run's is. Filling it from the replay is timed too (the cost of a
miss: one forward without gradient). For the bfloat16 entries it measures, on a batch of replayed
observations, the largest difference of the policy's log-probabilities and of the Q heads' input
from the whole model's. It prints a table and writes JSON with the machine and its load.
"""

from __future__ import annotations

import argparse
import copy
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch
import transformers

from glam.cli import report
from glam.config import ConfigError
from glam.offpolicy.trainer import SacTraining, build_sac_training, play_and_learn, sac_step
from glam.offpolicy.trunk_cache import TrunkCache
from glam.outputs import OutputDirError, add_output_file_options, check_output_file, write_json
from glam.policy.observations import TextObservations, policy_inputs
from glam.ppo.launch import LaunchError, build_accelerator
from glam.ppo.learner import StopSignal
from glam.ppo.setup import build_policy
from glam.ppo.timing import peak_rss_mib
from glam.run_config import TrainingRunConfig, compose_run
from glam.threads import set_torch_threads

MODES = ("whole model", "cache bfloat16", "cache as computed")


def bench(cfg: TrainingRunConfig, steps: int, fill: int) -> dict[str, object]:
    """Fill a replay with `fill` frames of `cfg`'s SAC run, then time `steps` gradient steps per
    mode; return the measurements.

    Raises:
        LaunchError: several processes (the figures are those of one), or a policy without a
            frozen trunk to keep (the message says why).
    """
    transformers.utils.logging.disable_progress_bar()
    threads = set_torch_threads(cfg.train.torch_threads, "train.torch_threads")
    print(f"[bench] {threads.describe()}", flush=True)
    cfg.sac.log_every = fill
    cfg.sac.learning_starts = 10**12  # no gradient step while the replay fills
    cfg.sac.cache_trunk = None
    cfg.train.total_frames = fill
    cfg.train.save_every = 0
    cfg.train.progress_bar = False
    accelerator = build_accelerator(cpu=cfg.train.cpu)
    if accelerator.num_processes > 1:
        raise LaunchError("bench_sac measures one process: run it with `python`, not a launcher")
    with tempfile.TemporaryDirectory(prefix="glam-bench-sac-") as folder:
        cfg.train.output_dir = folder
        t = build_sac_training(cfg, accelerator, Path(folder), build_policy)
        if t.trunks is None:
            raise LaunchError(
                "the policy has no frozen trunk to keep (the run said why above): set "
                "model.lora.layers=K or model.trained_layers=K"
            )
        cut = t.agent.policy.trunk_cut
        started = time.perf_counter()
        stop = StopSignal()
        try:
            play_and_learn(t, stop)
        finally:
            stop.restore()
        play_seconds = time.perf_counter() - started
        observations = _replayed(t)
        start_state = copy.deepcopy(t.agent.state_dict()), copy.deepcopy(t.target.state_dict())
        optimizer_state = copy.deepcopy(t.optimizer.state_dict())

        result: dict[str, object] = {}
        for mode in MODES:
            t.agent.load_state_dict(start_state[0])
            t.target.load_state_dict(start_state[1])
            t.optimizer.load_state_dict(optimizer_state)
            if mode == "whole model":
                t.trunks, t.agent.policy.trunk_cut = None, None
            else:
                t.agent.policy.trunk_cut = cut
                dtype = torch.bfloat16 if mode == "cache bfloat16" else None
                t.trunks = TrunkCache(2**40, dtype)
                started, size = time.perf_counter(), len(observations)
                for start in range(0, size, cfg.sac.batch_size):
                    t.trunks.attach(
                        t.agent.policy,
                        observations.select(range(start, min(start + cfg.sac.batch_size, size))),
                    )
                result[f"{mode}: fill seconds per observation"] = (
                    time.perf_counter() - started
                ) / len(observations)
                result[f"{mode}: bytes per observation"] = t.trunks.nbytes / len(t.trunks)
                t.trunks.take_stats()  # the lookups of the gradient steps only
            torch.manual_seed(cfg.train.seed)
            seconds = []
            for _ in range(steps + 1):  # the first warms up allocators: left out
                started = time.perf_counter()
                sac_step(t)
                seconds.append(time.perf_counter() - started)
            result[f"{mode}: seconds per gradient step"] = statistics.mean(seconds[1:])
            if mode != "whole model":
                result[f"{mode}: hit rate"] = t.trunks.take_stats().hit_rate

        t.agent.load_state_dict(start_state[0])
        differences = _bfloat16_difference(
            t, cut, observations.select(range(min(cfg.sac.batch_size, len(observations))))
        )
        whole = result["whole model: seconds per gradient step"]
        return {
            "model": cfg.model.name_or_path,
            "lora_layers": cfg.model.lora.layers,
            "trained_layers": cfg.model.trained_layers,
            "head": cfg.policy.head,
            "env": cfg.env.name,
            "num_envs": cfg.env.num_envs,
            "batch_size": cfg.sac.batch_size,
            "replayed_observations": len(observations),
            "play_seconds_per_frame": play_seconds / fill,
            **result,
            "speed-up, bfloat16 cache": whole / result["cache bfloat16: seconds per gradient step"],
            "speed-up, cache as computed": whole
            / result["cache as computed: seconds per gradient step"],
            **differences,
            "peak_rss_mib": peak_rss_mib(),
            "torch_threads": torch.get_num_threads(),
            "torch": torch.__version__,
            "cpu": platform.processor() or platform.machine(),
            "cpu_count": os.cpu_count(),
            "load_average_1min": os.getloadavg()[0],
        }


def _replayed(t: SacTraining) -> TextObservations:
    """Every observation of the replay and what followed each step, once each."""
    slots = [obs for obs in t.replay.obs + t.replay.next_obs if obs is not None]
    every = TextObservations.cat(slots)  # type: ignore[arg-type]
    first = {}
    for i, key in enumerate(zip(every.prompts, map(tuple, every.candidates), strict=True)):
        first.setdefault(key, i)
    return every.select(sorted(first.values()))


def _bfloat16_difference(t: SacTraining, cut: object, batch: TextObservations) -> dict:
    """The largest differences of the policy's log-probabilities and of its features on
    `batch`, from bfloat16 entries against the whole model."""
    policy = t.agent.policy
    with torch.no_grad():
        policy.trunk_cut = None
        whole = policy(**policy_inputs(batch))
        policy.trunk_cut = cut
        cached = policy(**policy_inputs(TrunkCache(2**40).attach(policy, batch)))
    mask = whole.mask
    log_probs = whole.dist.logits[mask], cached.dist.logits[mask]
    return {
        "bfloat16: max |log-prob difference|": (log_probs[0] - log_probs[1]).abs().max().item(),
        "bfloat16: max |feature difference| / max |feature|": (
            (whole.features - cached.features).abs().max() / whole.features.abs().max()
        ).item(),
    }


WRITER = "scripts/bench_sac.py"
"""The mark of the JSON this script writes (`glam.outputs.write_json`)."""


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config-name", default="smollm2_lora_cpu", help="training preset")
    parser.add_argument("--steps", type=int, default=8, help="gradient steps timed per mode")
    parser.add_argument("--fill", type=int, default=256, help="frames played into the replay")
    add_output_file_options(parser, help="write the JSON here too")
    parser.add_argument("overrides", nargs="*", help="Hydra overrides, e.g. sac.batch_size=32")
    args = parser.parse_args(argv)
    if args.steps < 1 or args.fill < 1:
        return report("--steps and --fill must be >= 1", status=1)
    if args.out is not None:  # before any work
        try:
            check_output_file(args.out, key="--out", writer=WRITER, overwrite=args.overwrite)
        except OutputDirError as error:
            return report(error)
    try:
        cfg = compose_run(args.config_name, ["algorithm.name=sac", *args.overrides])
    except ConfigError as error:
        return report(f"invalid configuration: {error}", status=1)
    try:
        result = bench(cfg, args.steps, args.fill)
    except LaunchError as error:
        return report(error)
    result["command"] = " ".join(["python", "scripts/bench_sac.py", *argv])
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
