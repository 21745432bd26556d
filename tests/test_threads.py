"""The torch threads a process takes on a CPU other work may share (glam.threads)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from glam import threads
from glam.threads import ThreadChoice, choose_threads, cpu_times, others_busy

STAT = """cpu  900 0 300 2000 100 0 0 0 0 0
cpu0 400 0 100 1000 50 0 0 0 0 0
cpu1 300 0 100 500 50 0 0 0 0 0
cpu2 200 0 100 500 0 0 0 0 0 0
intr 12345 0 0
ctxt 678
"""


def test_cpu_times_sums_the_named_cpus_with_idle_and_iowait_not_busy() -> None:
    # cpu0: busy 400 + 100, total 1550; cpu2: busy 200 + 100, total 800. The aggregate line
    # and cpu1 are left out.
    assert cpu_times([0, 2], STAT) == (800.0, 2350.0)
    assert cpu_times([5], STAT) == (0.0, 0.0)


def test_others_busy_takes_this_process_out_and_stays_in_range() -> None:
    hz = os.sysconf("SC_CLK_TCK")
    # Two CPUs over one second: 2 * hz ticks in all, 1.5 cores busy, 0.5 of them this process's.
    before, after = (100.0, 400.0), (100.0 + 1.5 * hz, 400.0 + 2 * hz)
    assert others_busy(before, after, own_seconds=0.5, cpus=2) == pytest.approx(1.0)
    assert others_busy(before, after, own_seconds=0.0, cpus=2) == pytest.approx(1.5)
    # Clock ticks and process times are counted apart: never below 0 or above the CPUs.
    assert others_busy(before, after, own_seconds=3.0, cpus=2) == 0.0
    assert others_busy(before, (100.0 + 9 * hz, 400.0 + 2 * hz), own_seconds=0.0, cpus=2) == 2.0
    assert others_busy(before, before, own_seconds=0.0, cpus=2) == 0.0


def test_a_setting_wins_then_omp_num_threads(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OMP_NUM_THREADS", "3")
    assert choose_threads(2, "train.torch_threads") == ThreadChoice(2, "train.torch_threads=2")
    assert choose_threads(None, "train.torch_threads") == ThreadChoice(3, "OMP_NUM_THREADS=3")
    assert choose_threads(0, "eval.torch_threads").threads == 3  # eval's 0: not set


@pytest.mark.parametrize(
    ("others", "expected"), [(0.0, 2), (0.3, 2), (0.7, 1), (1.0, 1), (2.0, 1), (6.0, 1)]
)
def test_without_a_setting_the_free_cores_are_taken(
    monkeypatch: pytest.MonkeyPatch, others: float, expected: int
) -> None:
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.setattr(threads, "usable_cpus", lambda: [0, 1])
    monkeypatch.setattr(threads, "measure_others_busy", lambda cpus: others)
    choice = choose_threads(None, "train.torch_threads")
    assert choice.threads == expected
    assert f"2 CPUs, {others:.1f} busy with other work" in choice.reason
    assert "train.torch_threads=N to pin it" in choice.reason


def test_without_proc_stat_the_load_average_stands_in(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OMP_NUM_THREADS", "not a number")
    monkeypatch.setattr(threads, "usable_cpus", lambda: [0, 1, 2, 3])
    monkeypatch.setattr(threads, "PROC_STAT", Path("/nonexistent/stat"))
    monkeypatch.setattr(os, "getloadavg", lambda: (2.2, 0.0, 0.0))
    choice = choose_threads(None, "clone.torch_threads")
    assert choice == ThreadChoice(
        2, "4 CPUs, 2.2 1-min load average; clone.torch_threads=N to pin it"
    )


@pytest.mark.skipif(not Path("/proc/stat").is_file(), reason="reads Linux's /proc/stat")
def test_a_busy_process_beside_this_one_is_measured() -> None:
    busy = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        time.sleep(0.5)  # running, past its start-up
        measured = threads.measure_others_busy(threads.usable_cpus(), seconds=1.0)
    finally:
        busy.kill()
        busy.wait()
    # At least most of one core: the loop (other tests may keep more cores busy).
    assert measured is not None and measured >= 0.7, measured
