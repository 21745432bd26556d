"""Which precision a run computes in: bf16 autocast where the hardware computes bf16 natively.

`model.autocast_bf16=null` (the default) asks for it to be chosen here: on for a CUDA GPU that
supports bf16 and for a CPU with AVX512-BF16 or AMX-BF16 instructions, off elsewhere (a CPU
without them emulates bf16 and runs slower than in fp32). docs/benchmarks.md has the measured
A/B on the default preset.
"""

from __future__ import annotations

import torch


def bf16_is_native(device: torch.device) -> tuple[bool, str]:
    """Whether `device` computes bf16 matrix products natively, and what was found."""
    if device.type == "cuda":
        name = torch.cuda.get_device_name(device)
        if torch.cuda.is_bf16_supported():
            return True, f"the GPU ({name}) supports bf16"
        return False, f"the GPU ({name}) does not support bf16"
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
