"""The trainer's choice of precision (`model.autocast_bf16=null`) and its per-phase clock."""

from __future__ import annotations

import csv
import time
from pathlib import Path

import pytest
import torch
from accelerate import Accelerator
from omegaconf import OmegaConf
from test_ppo_trainer import tiny_config

from glam.models import precision
from glam.models.precision import bf16_is_native, resolve_autocast_bf16
from glam.ppo.timing import PHASES, PhaseClock
from glam.ppo.trainer import train

CPU = torch.device("cpu")


@pytest.mark.parametrize(
    ("capabilities", "native", "found"),
    [
        ({"avx512_bf16": True, "amx_bf16": False}, True, "AVX512-BF16"),
        ({"avx512_bf16": True, "amx_bf16": True}, True, "AMX-BF16"),
        ({"avx512_bf16": False, "amx_bf16": False, "avx2": True}, False, "neither"),
        ({}, False, "neither"),  # a torch that reports nothing
    ],
)
def test_bf16_is_native_reads_the_cpus_instructions(
    monkeypatch: pytest.MonkeyPatch, capabilities: dict, native: bool, found: str
) -> None:
    monkeypatch.setattr(precision.torch.cpu, "get_capabilities", lambda: capabilities)
    answer, why = bf16_is_native(CPU)
    assert answer is native and found in why


def test_an_explicit_setting_is_kept_whatever_the_hardware(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(precision.torch.cpu, "get_capabilities", lambda: {"avx512_bf16": True})
    assert resolve_autocast_bf16(False, CPU) == (False, "model.autocast_bf16=false")
    monkeypatch.setattr(precision.torch.cpu, "get_capabilities", lambda: {})
    assert resolve_autocast_bf16(True, CPU) == (True, "model.autocast_bf16=true")
    chosen, why = resolve_autocast_bf16(None, CPU)
    assert chosen is False and why.startswith("model.autocast_bf16=null (auto): this CPU has")


@pytest.mark.parametrize("native", [True, False])
def test_the_trainer_records_and_prints_its_choice(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture, native: bool
) -> None:
    monkeypatch.setattr(precision.torch.cpu, "get_capabilities", lambda: {"avx512_bf16": native})
    cfg = tiny_config(autocast_bf16=None)
    cfg.train.total_frames = 32
    cfg.train.progress_bar = False
    train(cfg, Accelerator(cpu=True), tmp_path)
    saved = OmegaConf.load(tmp_path / "config.yaml")
    assert saved.model.autocast_bf16 is native
    shown = "bf16 autocast" if native else "fp32"
    assert f"[glam] precision: {shown} (model.autocast_bf16=null (auto)" in capsys.readouterr().out
    # bf16 rollouts and updates differ in rounding: the old log-probs are recomputed then.
    with (tmp_path / "metrics.csv").open() as handle:
        (row,) = list(csv.DictReader(handle))
    assert (float(row["time/recompute_s"]) > 0) is native


def test_phase_clock_sums_each_phase_and_starts_again_after_take() -> None:
    clock = PhaseClock()
    for _ in range(2):
        with clock.phase("forward"):
            time.sleep(0.01)
    with clock.phase("backward"):
        pass
    taken = clock.take()
    assert list(taken) == [f"time/{name}_s" for name in PHASES]
    assert 0.02 <= taken["time/forward_s"] < 0.5 and taken["time/backward_s"] < 0.01
    assert taken["time/optimizer_s"] == 0.0
    assert set(clock.take().values()) == {0.0}
    with pytest.raises(ValueError, match="unknown phase 'sampling'"), clock.phase("sampling"):
        pass


def test_the_phases_of_an_update_fit_in_its_wall_time(tmp_path: Path) -> None:
    cfg = tiny_config()
    cfg.train.total_frames = 64
    cfg.train.progress_bar = False
    train(cfg, Accelerator(cpu=True), tmp_path)
    with (tmp_path / "metrics.csv").open() as handle:
        rows = list(csv.DictReader(handle))
    assert len(rows) == 2
    for row in rows:
        phases = {name: float(row[f"time/{name}_s"]) for name in PHASES}
        for name in ("rollout_forward", "env_step", "forward", "backward", "optimizer"):
            assert phases[name] > 0, name
        assert phases["recompute"] == 0  # fp32: the rollout's log-probs are the update's
        frames = 32  # 4 envs x 8 steps per update
        wall = frames / float(row["charts/rollout_fps"]) + frames / float(row["charts/update_fps"])
        assert sum(phases.values()) <= wall
        assert float(row["memory/peak_rss_mib"]) > 100
