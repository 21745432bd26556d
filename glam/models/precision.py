"""Which precision a run computes in: bf16 autocast where the hardware computes bf16 natively.

`model.autocast_bf16=null` (the default) asks for it to be chosen here: on for a CUDA GPU that
computes bf16 natively (compute capability 8.0, Ampere, or newer) and for a CPU with AVX512-BF16
or AMX-BF16 instructions, off elsewhere (a V100, a T4 or a CPU without them emulates bf16 and
runs slower than in fp32). docs/benchmarks.md has the measured A/B on the default preset.
"""

from __future__ import annotations

import torch


def bf16_is_native(device: torch.device) -> tuple[bool, str]:
    """Whether `device` computes bf16 matrix products natively, and what was found."""
    if device.type == "cuda":
        # Asked of `device` itself, and natively: `torch.cuda.is_bf16_supported()` asks the
        # current device and counts emulation, so it says yes on a V100 or a T4 (compute
        # capability 7.x), where bf16 autocast runs slower than fp32.
        name = torch.cuda.get_device_name(device)
        major, minor = torch.cuda.get_device_capability(device)
        if major >= 8:
            return True, f"the GPU ({name}, compute capability {major}.{minor}) computes bf16"
        return False, (
            f"the GPU ({name}, compute capability {major}.{minor}) has no native bf16 "
            "(it needs 8.0, Ampere, or newer)"
        )
    if device.type == "cpu":
        capabilities = getattr(torch.cpu, "get_capabilities", dict)()  # torch >= 2.6
        found = [name for name in ("amx_bf16", "avx512_bf16") if capabilities.get(name)]
        if found:
            return True, f"this CPU has {found[0].upper().replace('_', '-')}"
        return False, "this CPU has neither AVX512-BF16 nor AMX-BF16 (bf16 would be emulated)"
    return False, f"no bf16 check for {device.type} devices"


def resolve_autocast_bf16(setting: bool | None, device: torch.device) -> tuple[bool, str]:
    """`model.autocast_bf16` made definite for `device`, and a sentence saying why."""
    if setting is not None:
        return setting, f"model.autocast_bf16={str(setting).lower()}"
    native, found = bf16_is_native(device)
    return native, f"model.autocast_bf16=null (auto): {found}"


def use_tf32(device: torch.device) -> bool:
    """Let fp32 matrix products on `device` run on TF32 tensor cores (compute capability 8.0,
    Ampere, or newer), and say whether it did.

    For the fp32 paths of a GPU: evaluation (no autocast, `agent.dtype=float32`) and behavioural
    cloning without bf16. TF32 keeps fp32's range with a 10-bit mantissa in the products'
    inputs, at several times fp32's throughput (an H100: about 495 against 67 TFLOP/s); torch
    leaves it off for matrix products. The PPO trainer computes in bf16 on those GPUs anyway.
    """
    if device.type != "cuda" or torch.cuda.get_device_capability(device)[0] < 8:
        return False
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = True
    return True


def gpu_mixed_precision(setting: bool | None) -> tuple[bool, bool]:
    """bf16 and TF32 for a trainer whose `model.autocast_bf16=null` means bf16 on a CUDA GPU
    that computes it natively and fp32 elsewhere: behavioural cloning, whose CPU figures are
    fp32's (the PPO trainer's null also picks bf16 on a CPU that has it, `resolve_autocast_bf16`).
    TF32 is on wherever the GPU has it, for the products left in fp32."""
    if not torch.cuda.is_available():
        return bool(setting), False
    device = torch.device("cuda", torch.cuda.current_device())
    bf16 = bf16_is_native(device)[0] if setting is None else setting
    return bf16, torch.cuda.get_device_capability(device)[0] >= 8
