"""Where the training loop makes the host wait for the device, counted by the file that asks.

    from helpers_syncs import HostReads

    with HostReads("cuda") as reads:
        collect_rollout(...)
    reads.by_file["glam/ppo/trainer.py"]

On a GPU the host waits whenever it reads a value computed there: `.item()`, `bool()`,
`float()` (torch's `_local_scalar_dense`), a shape that depends on values (`nonzero`, which
boolean-mask indexing runs), or a copy back to the CPU. `HostReads` counts those operations on
tensors of one device type, each charged to the innermost frame of the repository that asked
for it. On the CPU the same operations are counted on CPU tensors: the trainer's own reads of
its outputs, flags and statistics are the ones it would make on a GPU.
"""

from __future__ import annotations

import os
import traceback
from collections import Counter
from pathlib import Path
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

ROOT = Path(__file__).resolve().parents[1]
_CODE = (str(ROOT / "glam") + "/", str(ROOT / "babyai_text") + "/")


class HostReads(TorchDispatchMode):
    """Counts the operations that read a `device_type` tensor's values on the host."""

    def __init__(self, device_type: str) -> None:
        super().__init__()
        self.device_type = device_type
        self.by_file: Counter[str] = Counter()
        """Reads by the repository file that asked for them (`glam/ppo/trainer.py`)."""

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        if self._reads(func, args, kwargs):
            self.by_file[self._asker()] += 1
        return func(*args, **kwargs)

    def _reads(self, func: Any, args: Any, kwargs: Any) -> bool:
        aten = torch.ops.aten
        source = args[0] if args and isinstance(args[0], torch.Tensor) else None
        if source is None or source.device.type != self.device_type:
            return False
        if func in (aten._local_scalar_dense.default, aten.nonzero.default):
            return True
        if func is aten.index.Tensor:  # boolean-mask indexing runs nonzero inside the kernel
            return any(i is not None and i.dtype == torch.bool for i in args[1])
        if func is aten._to_copy.default and self.device_type != "cpu":
            return torch.device(kwargs.get("device") or source.device).type == "cpu"
        return False

    @staticmethod
    def _asker() -> str:
        stack = traceback.extract_stack()[:-3]
        # An optimizer's step counters are CPU tensors whatever the device: not the loop's.
        if any(f"torch{os.sep}optim{os.sep}" in frame.filename for frame in stack):
            return "torch.optim"
        for frame in reversed(stack):
            if frame.filename.startswith(_CODE):
                return str(Path(frame.filename).relative_to(ROOT))
        return "elsewhere"

    def count(self, *files: str) -> int:
        """Reads asked for by `files`."""
        return sum(self.by_file[name] for name in files)


def rollout_and_update_reads(run_dir: Path, accelerator: Any, overrides: list[str]) -> dict:
    """One rollout and one update of the `tiny` preset with `overrides`, on the accelerator's
    device, counting the host's reads there: what the rollout and the update asked for, by file,
    with the number of forwards, micro-batches and optimizer steps, and the update's metrics."""
    from glam.ppo.learner import StopSignal
    from glam.ppo.setup import build_training
    from glam.ppo.trainer import collect_rollout
    from glam.ppo.update import ppo_update
    from glam.run_config import compose_run

    cfg = compose_run("tiny", [*overrides, f"train.output_dir={run_dir}"])
    training = build_training(cfg, accelerator, run_dir)
    stop = StopSignal()
    try:
        training.runner.reset()
        device_type = accelerator.device.type
        with HostReads(device_type) as rollout_reads:
            rollout = collect_rollout(
                training.model, training.runner, training.buffer, cfg, accelerator, stop
            )
        batch, _ = training.algorithm.advantages(training.buffer, rollout.last_values, accelerator)
        with HostReads(device_type) as update_reads:
            metrics = ppo_update(
                training.model,
                training.optimizer,
                batch,
                cfg.ppo,
                accelerator,
                training.recompute,
                algorithm=training.algorithm,
            )
    finally:
        stop.restore()
        training.close()
    micro = cfg.ppo.micro_batch_size or cfg.ppo.minibatch_size
    return {
        "rollout": rollout_reads,
        "update": update_reads,
        "forwards": cfg.ppo.frames_per_env + 1,
        "micro_batches": cfg.ppo.epochs * len(batch) // micro,
        "optimizer_steps": cfg.ppo.epochs * len(batch) // cfg.ppo.minibatch_size,
        "metrics": metrics,
    }
