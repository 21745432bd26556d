"""Where an update's time and memory go: seconds per phase (`time/<phase>_s` metrics) and the
process's peak memory (`memory/peak_rss_mib`); in a multi-process run, those of the main process.

The phases of one update: the rollout's policy forwards (`rollout_forward`) and env steps with
the buffer's bookkeeping (`env_step`); the update's forwards with the loss (`forward`), backwards
(`backward`), gradient clipping and optimizer steps (`optimizer`), the forward that
recomputes the old log-probs when the rollout ran in another precision (`recompute`), and the
split of the first micro-batch's gradient into its policy and value parts (`diagnostics`,
`glam.ppo.diagnostics`).

On a CPU every phase ends when its work ends. On a GPU kernels run asynchronously: a phase is
charged when the host waits on it, which the trainer does at each `.item()` (every micro-batch's
loss check), so `forward` may carry some of the previous `backward`; the sum stays exact.
"""

from __future__ import annotations

import contextlib
import resource
import sys
import time
from collections import defaultdict
from collections.abc import Iterator

PHASES = (
    "rollout_forward",
    "env_step",
    "recompute",
    "diagnostics",
    "forward",
    "backward",
    "optimizer",
)


class PhaseClock:
    """Wall seconds per phase since the last `take`."""

    def __init__(self) -> None:
        self._seconds: dict[str, float] = defaultdict(float)

    @contextlib.contextmanager
    def phase(self, name: str) -> Iterator[None]:
        if name not in PHASES:
            raise ValueError(f"unknown phase {name!r}; phases: {', '.join(PHASES)}")
        start = time.perf_counter()
        try:
            yield
        finally:
            self._seconds[name] += time.perf_counter() - start

    def take(self) -> dict[str, float]:
        """The seconds of every phase as `time/<phase>_s` metrics, and start again from zero."""
        metrics = {f"time/{name}_s": self._seconds.get(name, 0.0) for name in PHASES}
        self._seconds.clear()
        return metrics


def peak_rss_mib() -> float:
    """The process's peak resident memory so far, in MiB (host memory: a GPU's is not in it)."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / 2**20 if sys.platform == "darwin" else peak / 1024  # bytes on macOS, KiB else
