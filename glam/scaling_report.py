"""The throughput estimate's command line (`scripts/estimate_throughput.py`): its options, the
projection they ask for (`glam.scaling`'s arithmetic: FLOPs, memory and wall time of a PPO run
on given hardware, no model loaded), and the table it prints.

`main`: `parse_args` -> `run` (a JSON-ready record) -> `format_table`, and `--out`'s JSON.
`build` turns the options into the model's shape, the workload, the hardware and the MFU to
project at.
"""

from __future__ import annotations

import argparse
import math
from dataclasses import asdict, replace

from glam.cli import exit_on
from glam.outputs import add_output_file_options, check_output_file, write_json
from glam.scaling import (
    GIB,
    HARDWARE_PRESETS,
    MODEL_PRESETS,
    PRECISIONS,
    HardwareSpec,
    MemoryEstimate,
    ModelShape,
    StepFlops,
    WorkloadConfig,
    calibrate,
    count_parameters,
    cpu_peak_tflops,
    estimate_memory,
    project,
    resolve_shape,
    seconds_per_update_from_hours,
    step_flops,
    trunk_cache_problem,
    tuned_layer_indices,
)

DEFAULT_MFUS = (0.1, 0.2, 0.4)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description="Project FLOPs, memory and wall time of a PPO run on given hardware "
        "(no model is loaded)."
    )
    model = parser.add_argument_group("model")
    model.add_argument(
        "--model",
        default="smollm2-135m",
        help=f"one of {', '.join(MODEL_PRESETS)}, or a Hugging Face config.json (or its folder)",
    )
    tuning = model.add_mutually_exclusive_group()
    tuning.add_argument("--lora-rank", type=int, default=8, help="LoRA rank (default 8)")
    tuning.add_argument("--full", action="store_true", help="full fine-tuning instead of LoRA")
    model.add_argument("--lora-targets", nargs="+", default=["q", "v"], help="default: q v")
    model.add_argument(
        "--lora-layers",
        type=_layers,
        help="model.lora.layers: K (the top K layers) or indices (26,27,28,29); default: every "
        "layer (the training presets use 4)",
    )
    model.add_argument(
        "--trained-layers",
        type=_layers,
        help="model.trained_layers, with --full: train the top K layers (or these indices) only",
    )
    model.add_argument(
        "--cache-trunk",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="ppo.cache_trunk: the update runs from the rollout's kept trunk states (default: on "
        "where it applies, as the trainer)",
    )
    model.add_argument("--precision", default="fp32", choices=list(PRECISIONS))
    model.add_argument("--gradient-checkpointing", action="store_true")
    model.add_argument(
        "--recompute-logprobs",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="one extra forward per transition (default: on unless fp32/tf32, as the trainer)",
    )
    model.add_argument("--value-hidden-sizes", type=int, nargs="*", default=[1024, 1024])

    work = parser.add_argument_group("workload")
    work.add_argument("--prompt-tokens", type=int, default=240)
    work.add_argument("--candidates", type=int, default=6)
    work.add_argument(
        "--candidate-tokens", type=int, default=2, help="tokens per candidate slot (the longest)"
    )
    work.add_argument("--envs", type=int, default=32, help="environments over all devices")
    work.add_argument("--frames-per-env", type=int, default=40)
    work.add_argument("--epochs", type=int, default=4)
    work.add_argument("--minibatch-size", type=int, default=64, help="over all devices")
    work.add_argument("--micro-batch-size", type=int, default=8, help="per device; 0: minibatch")
    work.add_argument("--frames", type=float, default=1.5e6, help="frames of the whole run")

    hardware = parser.add_argument_group("hardware")
    hardware.add_argument("--hardware", default="a100", choices=list(HARDWARE_PRESETS))
    hardware.add_argument("--peak-tflops", type=float, help="per device (overrides the preset)")
    hardware.add_argument("--memory-gb", type=float, help="GiB per device (overrides the preset)")
    hardware.add_argument("--devices", type=int, default=1)
    hardware.add_argument("--zero-stage", type=int, default=0, choices=[0, 1, 2, 3])
    hardware.add_argument("--cpu-cores", type=int, help="CPU peak = cores x GHz x FLOPs/cycle")
    hardware.add_argument("--cpu-ghz", type=float)
    hardware.add_argument("--cpu-flops-per-cycle", type=float, help="per core (64: AVX-512 fp32)")

    speed = parser.add_argument_group("speed")
    speed.add_argument("--mfu", type=float, nargs="+", help="fraction(s) of peak achieved")
    measured = speed.add_mutually_exclusive_group()
    measured.add_argument(
        "--calibrate-seconds-per-update", type=float, help="measured seconds per update"
    )
    measured.add_argument(
        "--calibrate-hours", type=float, help="measured hours for --frames frames"
    )
    speed.add_argument(
        "--calibrate-peak-tflops",
        type=float,
        help="peak of the measuring device (default: the projected device's peak)",
    )
    speed.add_argument("--calibrate-devices", type=int, default=1)
    speed.add_argument(
        "--calibrate-envs", type=int, help="envs of the measured run (default --envs)"
    )
    add_output_file_options(parser)

    args = parser.parse_args(argv)
    if args.full and args.lora_layers is not None:
        parser.error("--lora-layers chooses LoRA's layers: with --full, give --trained-layers")
    if args.trained_layers is not None and not args.full:
        parser.error("--trained-layers chooses the layers a full fine-tuning trains (--full)")
    calibrating = args.calibrate_seconds_per_update is not None or args.calibrate_hours is not None
    if calibrating and args.mfu:
        parser.error("give --mfu or a calibration (--calibrate-...), not both")
    if not calibrating and (args.calibrate_peak_tflops or args.calibrate_envs):
        parser.error(
            "--calibrate-peak-tflops/--calibrate-envs need --calibrate-seconds-per-update "
            "or --calibrate-hours"
        )
    cpu = (args.cpu_cores, args.cpu_ghz, args.cpu_flops_per_cycle)
    if any(v is not None for v in cpu) and not all(v is not None for v in cpu):
        parser.error("a CPU peak needs all of --cpu-cores, --cpu-ghz and --cpu-flops-per-cycle")
    if all(v is not None for v in cpu) and args.peak_tflops is not None:
        parser.error("give --peak-tflops or the --cpu-* flags, not both")
    return args


def _layers(text: str) -> int | tuple[int, ...]:
    """`4` (the top 4 layers) or `26,27,28,29` (those indices), as the config's keys take them."""
    try:
        values = tuple(int(part) for part in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: give K or comma-separated indices") from None
    return values if "," in text else values[0]


def build(args: argparse.Namespace) -> tuple[ModelShape, WorkloadConfig, HardwareSpec, float]:
    """The model shape, the workload, the hardware and its peak FLOP/s (ValueError if bad).

    The trunk's cache is on where `--cache-trunk` asks for it or, unset, wherever it applies
    (`trunk_cache_problem`), as the trainer resolves `ppo.cache_trunk`.
    """
    shape = resolve_shape(args.model)
    workload = WorkloadConfig(
        prompt_tokens=args.prompt_tokens,
        candidates=args.candidates,
        candidate_tokens=args.candidate_tokens,
        envs=args.envs,
        frames_per_env=args.frames_per_env,
        epochs=args.epochs,
        minibatch_size=args.minibatch_size,
        micro_batch_size=args.micro_batch_size or None,
        lora_rank=None if args.full else args.lora_rank,
        lora_targets=tuple(args.lora_targets),
        tuned_layers=args.trained_layers if args.full else args.lora_layers,
        precision=args.precision,
        gradient_checkpointing=args.gradient_checkpointing,
        recompute_logprobs=args.recompute_logprobs,
        value_hidden_sizes=tuple(args.value_hidden_sizes),
    )
    problem = trunk_cache_problem(shape, workload)
    if args.cache_trunk and problem is not None:
        raise ValueError(f"--cache-trunk, but {problem}")
    workload = replace(workload, cache_trunk=args.cache_trunk is not False and problem is None)
    if args.devices < 1 or args.envs % args.devices or args.minibatch_size % args.devices:
        raise ValueError(
            f"--devices {args.devices} must be >= 1 and divide --envs ({args.envs}) and "
            f"--minibatch-size ({args.minibatch_size}), as the trainer requires"
        )
    if workload.frames_per_update % workload.minibatch_size:
        raise ValueError(
            f"--minibatch-size {workload.minibatch_size} must divide the transitions per update, "
            f"--envs x --frames-per-env = {workload.frames_per_update}, as the trainer requires"
        )
    preset = HARDWARE_PRESETS[args.hardware]
    peak_tflops = dict(preset.peak_tflops)
    compute = PRECISIONS[args.precision][0]
    if args.cpu_cores is not None:
        peak_tflops[compute] = cpu_peak_tflops(
            args.cpu_cores, args.cpu_ghz, args.cpu_flops_per_cycle
        )
    if args.peak_tflops is not None:
        if args.peak_tflops <= 0:
            raise ValueError(f"--peak-tflops must be > 0, got {args.peak_tflops}")
        peak_tflops[compute] = args.peak_tflops
    if compute not in peak_tflops:
        raise ValueError(
            f"--hardware {args.hardware} has no {compute} peak: give --peak-tflops, or "
            "--cpu-cores, --cpu-ghz and --cpu-flops-per-cycle (peak = cores x GHz x FLOPs/cycle)"
        )
    memory = args.memory_gb if args.memory_gb is not None else preset.memory_gib
    hardware = HardwareSpec(preset.name, peak_tflops, memory)
    return shape, workload, hardware, hardware.peak_flops(args.precision)


def run(args: argparse.Namespace) -> dict[str, object]:
    """Compute everything; return the JSON-ready results."""
    shape, workload, hardware, peak = build(args)
    flops = step_flops(shape, workload)
    memory = estimate_memory(shape, workload, args.devices, args.zero_stage)
    frames = int(args.frames)
    calibration, measuring_peak = None, peak
    if args.calibrate_seconds_per_update is not None or args.calibrate_hours is not None:
        measured = WorkloadConfig(**{**asdict(workload), "envs": args.calibrate_envs or args.envs})
        measured_flops = step_flops(shape, measured)
        if args.calibrate_seconds_per_update is not None:
            seconds = args.calibrate_seconds_per_update
            if not seconds > 0:
                raise ValueError(f"--calibrate-seconds-per-update must be > 0, got {seconds:g}")
        else:
            if not args.calibrate_hours > 0:
                raise ValueError(f"--calibrate-hours must be > 0, got {args.calibrate_hours:g}")
            seconds = seconds_per_update_from_hours(
                args.calibrate_hours, frames, measured.frames_per_update
            )
        measuring_peak = args.calibrate_peak_tflops * 1e12 if args.calibrate_peak_tflops else peak
        calibration = calibrate(measured_flops, seconds, measuring_peak, args.calibrate_devices)
        mfus = [calibration.mfu]
    else:
        mfus = args.mfu or list(DEFAULT_MFUS)
    projections = [project(flops, peak, args.devices, mfu, frames) for mfu in mfus]
    fits = None if hardware.memory_gib is None else memory.peak <= hardware.memory_gib * GIB
    steps = workload.epochs * math.ceil(workload.frames_per_update / workload.minibatch_size)
    measured_run = None
    if calibration is not None:
        measured_run = {
            **asdict(calibration),
            "envs": args.calibrate_envs or args.envs,
            "devices": args.calibrate_devices,
            "peak_tflops_per_device": measuring_peak / 1e12,
        }
    problem = trunk_cache_problem(shape, workload)
    return {
        "model": {**asdict(shape), "parameters": count_parameters(shape)},
        "workload": asdict(workload),
        "trunk": {
            "tuned_layers": tuned_layer_indices(shape, workload),
            "cache": workload.cache_trunk,
            "cache_off_because": None
            if workload.cache_trunk
            else ("--no-cache-trunk" if problem is None else problem),
        },
        "hardware": {
            "name": hardware.name,
            "precision": args.precision,
            "peak_tflops_per_device": peak / 1e12,
            "memory_gib_per_device": hardware.memory_gib,
            "devices": args.devices,
            "zero_stage": args.zero_stage,
        },
        "flops": _flops_record(flops),
        "memory_bytes": _memory_record(memory),
        "fits_in_memory": fits,
        "optimizer_steps_per_update": steps,
        "calibration": measured_run,
        "projections": [
            {**asdict(p), "seconds_per_update": p.seconds_per_update} for p in projections
        ],
    }


def _flops_record(flops: StepFlops) -> dict[str, float]:
    return {
        **{f"forward_{k}": v for k, v in asdict(flops.forward).items()},
        "forward": flops.forward.total,
        "update_forward": flops.update_forward.total,
        "backward": flops.backward,
        "rollout_per_frame": flops.rollout_per_frame,
        "update_per_frame": flops.update_per_frame,
        "per_frame": flops.per_frame,
        "per_update": flops.per_update,
        "frames_per_update": flops.frames_per_update,
    }


def _memory_record(memory: MemoryEstimate) -> dict[str, float]:
    record = asdict(memory)
    record |= {
        "update_total": memory.update_total,
        "rollout_total": memory.rollout_total,
        "peak": memory.peak,
    }
    return record


# --------------------------------------------------------------------------------------------
# The table
# --------------------------------------------------------------------------------------------


def _flop(value: float) -> str:
    for unit, scale in (("PFLOP", 1e15), ("TFLOP", 1e12), ("GFLOP", 1e9), ("MFLOP", 1e6)):
        if value >= scale:
            return f"{value / scale:.4g} {unit}"
    return f"{value:.4g} FLOP"


def _bytes(value: float) -> str:
    for unit, scale in (("GiB", GIB), ("MiB", 2**20), ("KiB", 2**10)):
        if value >= scale:
            return f"{value / scale:.4g} {unit}"
    return f"{value:.4g} B"


def _count(value: float) -> str:
    return f"{value / 1e6:.4g}M" if value >= 1e6 else f"{value:,.0f}"


def _row(label: str, value: str) -> str:
    return f"  {label:<44} {value}"


def _layer_span(indices: list[int]) -> str:
    """`26-29` for a run of layers, `29` for one, `10, 29` otherwise."""
    if len(indices) > 1 and indices == list(range(indices[0], indices[-1] + 1)):
        return f"{indices[0]}-{indices[-1]}"
    return ", ".join(map(str, indices))


def _tuning(m: dict, w: dict, trunk: dict) -> str:
    """What trains: `LoRA r=8 on q/v of layers 26-29 (of 0-29)`, `full fine-tuning`..."""
    stack = m["num_layers"]
    layers = ""
    if w["tuned_layers"] is not None:
        kind = "decoder layers" if m["kind"] == "encoder_decoder" else "layers"
        layers = f" of {kind} {_layer_span(trunk['tuned_layers'])} (of 0-{stack - 1})"
    if w["lora_rank"] is None:
        return f"full fine-tuning{layers}"
    return f"LoRA r={w['lora_rank']} on {'/'.join(w['lora_targets'])}{layers or ' of every layer'}"


def _trunk_line(m: dict, trunk: dict, mem: dict) -> str:
    """What the trunk's cache was taken to do, or why it is off."""
    if not trunk["cache"]:
        return f"trunk     cache off ({trunk['cache_off_because']})"
    if m["kind"] == "encoder_decoder":
        where = "the encoder's output", "the decoder only"
    else:
        first, top = trunk["tuned_layers"][0], m["num_layers"] - 1
        where = f"the input of layer {first}", f"layers {first}-{top} from it"
    return (
        f"trunk     cache on: the rollout keeps {where[0]} "
        f"({_bytes(mem['trunk_cache_per_transition'])} per transition); the update runs "
        f"{where[1]}"
    )


def format_table(result: dict) -> str:
    """The results as text: FLOPs, memory, calibration, projection."""
    m, w, h = result["model"], result["workload"], result["hardware"]
    f, mem, trunk = result["flops"], result["memory_bytes"], result["trunk"]
    recompute = f["update_per_frame"] > w["epochs"] * (f["update_forward"] + f["backward"])
    rollout_share = f["rollout_per_frame"] / f["per_frame"]
    if h["memory_gib_per_device"] is None:
        verdict = "memory per device unknown (give --memory-gb)"
    else:
        fits = "fits" if result["fits_in_memory"] else "does NOT fit"
        verdict = f"{fits} in {h['memory_gib_per_device']:g} GiB"
    lines = [
        f"model     {m['name']} ({m['kind']}, {_count(m['parameters'])} parameters), "
        f"{_tuning(m, w, trunk)}, {h['precision']}",
        _trunk_line(m, trunk, mem),
        f"workload  prompt {w['prompt_tokens']} tokens, {w['candidates']} candidates x "
        f"{w['candidate_tokens']} tokens; {w['envs']} envs x {w['frames_per_env']} frames = "
        f"{f['frames_per_update']} transitions per update; {w['epochs']} epochs, minibatch "
        f"{w['minibatch_size']}",
        f"hardware  {h['name']} x {h['devices']}, peak {h['peak_tflops_per_device']:.4g} TFLOP/s "
        f"per device ({h['precision']}), ZeRO stage {h['zero_stage']}",
        "",
        "FLOPs",
        _row("forward, one env-step (prompt + candidates)", _flop(f["forward"])),
        _row("  linear layers", _flop(f["forward_linear"])),
        _row("  attention (dense over the packed row)", _flop(f["forward_attention"])),
        _row("  LM head (candidate positions only)", _flop(f["forward_lm_head"])),
        _row("  LoRA", _flop(f["forward_lora"])),
        _row("  value head", _flop(f["forward_value_head"])),
        *(
            [_row("forward of the update (from the kept states)", _flop(f["update_forward"]))]
            if trunk["cache"]
            else []
        ),
        _row("backward, one transition", _flop(f["backward"])),
        _row("rollout per frame (with bootstrap)", _flop(f["rollout_per_frame"])),
        _row(
            f"update per frame ({w['epochs']} x (fwd + bwd){' + recompute' if recompute else ''})",
            _flop(f["update_per_frame"]),
        ),
        _row(
            "total per frame",
            f"{_flop(f['per_frame'])} (rollout {rollout_share:.1%}, update "
            f"{1 - rollout_share:.1%})",
        ),
        _row("per update", _flop(f["per_update"])),
        "",
        "Memory per device",
        _row(
            "parameters (trainable)",
            f"{_count(mem['parameters'])} ({_count(mem['trainable_parameters'])})",
        ),
        _row("weights", _bytes(mem["weights"])),
        _row("bf16 autocast copies of the weights", _bytes(mem["autocast_copies"])),
        _row("gradients", _bytes(mem["gradients"])),
        _row("Adam moments", _bytes(mem["optimizer"])),
        _row(
            f"activations, micro-batch of {mem['micro_batch']}",
            f"{_bytes(mem['activations'])} ({_bytes(mem['activations_per_transition'])} "
            "per transition)",
        ),
        _row(
            "trunk's cache (rollout and update)",
            f"{_bytes(mem['trunk_cache'])} ({_bytes(mem['trunk_cache_per_transition'])} per "
            "transition)",
        ),
        _row("packed layout, one prompt: mask", _bytes(mem["mask_per_prompt"])),
        _row("  attention scores, one layer", _bytes(mem["attention_scores_per_prompt"])),
        _row(
            "  K/V over all layers",
            f"{_bytes(mem['kv_per_prompt'])} (per-candidate copies would take "
            f"{_bytes(mem['kv_per_prompt_copied'])})",
        ),
        _row("update peak", _bytes(mem["update_total"])),
        _row(
            f"rollout peak ({mem['rollout_batch']} prompts per forward)",
            _bytes(mem["rollout_total"]),
        ),
        _row("verdict", verdict),
        _row("gradient all-reduce per optimizer step", _bytes(mem["trainable_bytes"])),
        _row("optimizer steps per update", str(result["optimizer_steps_per_update"])),
        "",
    ]
    calibration = result["calibration"]
    if calibration is not None:
        lines += [
            "Calibration",
            _row(
                "measured run",
                f"{calibration['seconds_per_update']:.4g} s per update, {calibration['envs']} "
                f"envs, {calibration['devices']} device(s) of "
                f"{calibration['peak_tflops_per_device']:.4g} TFLOP/s peak",
            ),
            _row(
                "achieved",
                f"{calibration['achieved_flops'] / 1e12:.4g} TFLOP/s "
                f"({calibration['achieved_flops_per_device'] / 1e12:.4g} per device), "
                f"MFU {calibration['mfu']:.4g}",
            ),
            "",
        ]
    frames = result["projections"][0]["frames"]
    lines += [
        f"Projection for {frames:,} frames (compute only: env stepping, communication and "
        "overhead left out)",
        "| MFU | achieved TFLOP/s | s/update (rollout + update) | env-steps/s | hours |",
        "|---:|---:|---:|---:|---:|",
    ]
    for p in result["projections"]:
        lines.append(
            f"| {p['mfu']:.4g} | {p['achieved_flops'] / 1e12:.4g} | "
            f"{p['seconds_per_update']:.4g} ({p['rollout_seconds_per_update']:.3g} + "
            f"{p['update_seconds_per_update']:.3g}) | {p['env_steps_per_s']:.4g} | "
            f"{p['hours']:.4g} |"
        )
    return "\n".join(lines)


WRITER = "scripts/estimate_throughput.py"
"""The mark of the JSON this script writes (`glam.outputs.write_json`)."""


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    with exit_on(ValueError):  # OutputDirError is one
        if args.out is not None:
            check_output_file(args.out, key="--out", writer=WRITER, overwrite=args.overwrite)
        result = run(args)
    print(format_table(result))
    if args.out is not None:
        write_json(args.out, result, WRITER)
        print(f"\nwrote json  {args.out}")
    return 0
