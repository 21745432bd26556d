"""How many torch threads a process takes on a CPU that other work may share.

torch's default is one intra-op thread per core, each spinning for a while at the end of every
parallel region before it sleeps (GNU OpenMP's wait policy). Alone, that is the fastest choice.
Beside other busy processes it collapses: a parallel region ends only when its last thread has
run, a thread waits for a core the other work holds, and the threads that finished spin on the
cores the others need. Measured on this project's 2-core CPU (docs/benchmarks.md, "Sharing the
CPU"): a short PPO update of the default preset took 9.8 s alone with two threads and 32.8 s
beside two busy single-thread processes (3.3x), where one thread took 23.5 s beside them.

So, unless told otherwise, a process takes the cores that are free when it starts:

- an explicit setting (`train.torch_threads=N`, `clone.torch_threads`, `eval.torch_threads`)
  wins, then `OMP_NUM_THREADS` (which `accelerate launch` and `torchrun` set per process, and
  which torch has already read);
- otherwise the CPUs this process may run on (its affinity) less the cores other processes
  kept busy over half a second (Linux's /proc/stat for those CPUs, this process's own time
  taken out; elsewhere the 1-minute load average), at least one.

The choice is made once, at the start: work that starts later still meets spinning threads
(pin `train.torch_threads=1`, or set `OMP_WAIT_POLICY=PASSIVE` before Python starts, when other
jobs are expected). Results can differ in the last bits between thread counts (another order of
fp32 sums), so a seeded rerun that must be bit-identical pins its count.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path

import torch

SAMPLE_SECONDS = 0.5
"""How long the other processes' CPU use is sampled before the choice."""

PROC_STAT = Path("/proc/stat")


@dataclass(frozen=True)
class ThreadChoice:
    """The torch threads chosen for this process, and why (for the run's log)."""

    threads: int
    reason: str

    def describe(self) -> str:
        return f"{self.threads} torch thread(s) ({self.reason})"


def usable_cpus() -> list[int]:
    """The CPUs this process may run on (its affinity; all of them where that is unknown)."""
    if hasattr(os, "sched_getaffinity"):
        return sorted(os.sched_getaffinity(0))
    return list(range(os.cpu_count() or 1))


def cpu_times(cpus: list[int], stat: str) -> tuple[float, float]:
    """(busy, total) clock ticks of `cpus` summed from the text of /proc/stat (idle and iowait
    are not busy)."""
    busy = total = 0.0
    wanted = {f"cpu{cpu}" for cpu in cpus}
    for line in stat.splitlines():
        name, *fields = line.split() or [""]
        if name not in wanted:
            continue
        ticks = [float(field) for field in fields[:8]]  # user .. steal; guests are within user
        idle = ticks[3] + (ticks[4] if len(ticks) > 4 else 0.0)
        total += sum(ticks)
        busy += sum(ticks) - idle
    return busy, total


def others_busy(
    before: tuple[float, float], after: tuple[float, float], own_seconds: float, cpus: int
) -> float:
    """Cores kept busy by other processes between two `cpu_times` samples, this process's own
    CPU seconds (`own_seconds`, over the same interval) taken out; in [0, cpus]."""
    busy, total = after[0] - before[0], after[1] - before[1]
    if total <= 0:
        return 0.0
    ticks_per_second = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
    interval = total / ticks_per_second / cpus  # wall seconds the sample covered
    others = (busy / ticks_per_second - own_seconds) / interval
    return min(max(others, 0.0), float(cpus))


def measure_others_busy(cpus: list[int], seconds: float = SAMPLE_SECONDS) -> float | None:
    """Cores of `cpus` other processes keep busy, sampled over `seconds` (None where
    /proc/stat cannot be read)."""
    try:
        first = cpu_times(cpus, PROC_STAT.read_text())
        own = _own_cpu_seconds()
        time.sleep(seconds)
        second = cpu_times(cpus, PROC_STAT.read_text())
        own = _own_cpu_seconds() - own
    except (OSError, ValueError, IndexError):
        return None
    if second[1] <= first[1]:
        return None
    return others_busy(first, second, own, len(cpus))


def _own_cpu_seconds() -> float:
    times = os.times()
    return times.user + times.system


def choose_threads(setting: int | None, setting_name: str) -> ThreadChoice:
    """The threads for this process: `setting` (None or 0: not set) or `OMP_NUM_THREADS`,
    else the cores free now (see the module's docstring)."""
    if setting:
        return ThreadChoice(setting, f"{setting_name}={setting}")
    from_env = os.environ.get("OMP_NUM_THREADS", "").strip()
    if from_env.isdigit() and int(from_env) > 0:
        return ThreadChoice(int(from_env), f"OMP_NUM_THREADS={from_env}")
    cpus = usable_cpus()
    others = measure_others_busy(cpus)
    source = "busy with other work"
    if others is None and hasattr(os, "getloadavg"):
        others, source = min(os.getloadavg()[0], float(len(cpus))), "1-min load average"
    if others is None:
        return ThreadChoice(len(cpus), f"{len(cpus)} CPUs; {setting_name}=N to pin it")
    threads = max(1, int(len(cpus) - others + 0.5))
    return ThreadChoice(
        threads,
        f"{len(cpus)} CPUs, {others:.1f} {source}; {setting_name}=N to pin it",
    )


def set_torch_threads(setting: int | None, setting_name: str) -> ThreadChoice:
    """Choose this process's torch threads (`choose_threads`) and set them."""
    choice = choose_threads(setting, setting_name)
    torch.set_num_threads(choice.threads)
    return choice
