"""The adapter the demo ships (glam/data/demo_policy): it is the preset's adapter, its record
names the command, commit and figures that made it, and it plays the demo's held-out episodes
as the record says (the test fails if the file or the code that plays it drifts)."""

from __future__ import annotations

import json

import pytest
import torch

from glam.demo import DEMO_POLICY, PRESET, demo_policy, play, read_record, success_of
from glam.run_config import compose_run


@pytest.fixture(autouse=True)
def one_torch_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def test_the_adapter_is_the_presets_and_its_record_says_how_it_was_made() -> None:
    record = read_record()
    assert record["preset"] == PRESET
    assert record["command"].startswith("python scripts/train_language_agent.py ")
    assert "--config-name" not in record["command"]  # the default preset, as the record says
    assert len(record["commit"]) >= 7
    lora = compose_run(PRESET).model.lora
    adapter = json.loads((DEMO_POLICY / "adapter_config.json").read_text())
    assert adapter["r"] == lora.r and adapter["lora_alpha"] == lora.alpha
    assert len(adapter["layers_to_transform"]) == lora.layers
    assert sorted(adapter["target_modules"]) == ["q_proj", "v_proj"]
    assert record["config"]["model"]["lora"]["r"] == lora.r
    assert record["config"]["env"]["name"] == compose_run(PRESET).env.name
    assert record["frames"] == record["config"]["train"]["total_frames"]
    for name in ("untrained", "trained"):
        assert 0.0 <= record["demo"][name]["success_rate"] <= 1.0
    assert record["demo"]["trained"]["success_rate"] > record["demo"]["untrained"]["success_rate"]


def test_the_trained_policy_plays_the_recorded_success() -> None:
    record = read_record()["test"]
    found = success_of(play(demo_policy(trained=True), record["episodes"]))
    assert found["success_rate"] == pytest.approx(record["success_rate"])
    assert found["mean_length"] == pytest.approx(record["mean_length"])
