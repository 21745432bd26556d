"""Loading a saved policy folder safely: no code shipped in it runs unless the user allows it,
and a missing, truncated or malformed file is one clear error that names it."""

from __future__ import annotations

import dataclasses
import json
import re
import shutil
import sys
from pathlib import Path

import pytest
import torch
import transformers.dynamic_module_utils
from helpers_tiny import (
    ACTION_WORDS,
    one_torch_thread,  # noqa: F401  (autouse fixture: one torch thread)
    save_tiny_model,
    tiny_causal_lm,
)

from glam.config import AdapterConfig, ModelConfig, PolicyConfig
from glam.eval.builders import build_agent
from glam.eval.config import AgentConfig
from glam.policy import CheckpointError, LLMActorCritic
from glam.policy.llm_policy import SETTINGS_BEFORE_THEIR_FIELD

SMALL_HEADS = PolicyConfig(value_hidden_sizes=[16, 16])
FULL = ModelConfig(name_or_path="tiny", lora=AdapterConfig(enabled=False))

SHIPPED_CODE = """\
from pathlib import Path

Path({marker!r}).write_text("the checkpoint's own code ran")
raise ImportError("code shipped inside a test checkpoint")
"""
"""What a hostile checkpoint runs at import: it leaves a marker file behind."""


def checkpoint_with_code(root: Path, model_type: str = "llama") -> tuple[Path, Path]:
    """A full-weights policy folder whose model names a Python file beside it (`auto_map`) and
    whose `glam_policy.json` asks for `trust_remote_code`; returns (policy folder, marker)."""
    model, tokenizer = tiny_causal_lm("llama")
    policy = LLMActorCritic.from_model(model, tokenizer, FULL, SMALL_HEADS, ACTION_WORDS)
    folder = policy.save_pretrained(root / "checkpoints" / "update_000001" / "policy")
    (folder.parent / "trainer_state.json").write_text("{}")
    (root / "checkpoints" / "latest").write_text("update_000001\n")
    marker = root / "marker.txt"
    model_folder = folder / "model"
    (model_folder / "shipped_code.py").write_text(SHIPPED_CODE.format(marker=str(marker)))
    config = json.loads((model_folder / "config.json").read_text())
    config["model_type"] = model_type
    config["auto_map"] = {
        "AutoConfig": "shipped_code.ShippedConfig",
        "AutoModelForCausalLM": "shipped_code.ShippedModel",
        "AutoTokenizer": ["shipped_code.ShippedTokenizer", None],
    }
    (model_folder / "config.json").write_text(json.dumps(config))
    meta = json.loads((folder / "glam_policy.json").read_text())
    meta["model"]["trust_remote_code"] = True  # the file's wish, which must not count
    (folder / "glam_policy.json").write_text(json.dumps(meta))
    return folder, marker


@pytest.fixture
def modules_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """transformers copies model code to a modules cache before importing it: keep it in tmp."""
    monkeypatch.setattr(
        transformers.dynamic_module_utils, "HF_MODULES_CACHE", str(tmp_path / "modules")
    )
    monkeypatch.setattr(sys, "path", list(sys.path))


# --------------------------------------------------------------------------------------------
# Code shipped in a checkpoint
# --------------------------------------------------------------------------------------------


def test_code_in_a_checkpoint_runs_only_when_the_user_allows_it(tmp_path, modules_cache):
    folder, marker = checkpoint_with_code(tmp_path)
    # The json asks for trust_remote_code: ignored. A llama loads with transformers' own code.
    policy = LLMActorCritic.from_pretrained(folder)
    assert not marker.exists()
    assert type(policy.model).__module__.startswith("transformers.models.llama")
    assert policy.model_cfg.trust_remote_code is False
    assert policy(["Goal of the agent: go to the red ball\nAction 0:"]).logits.shape == (1, 6)

    # The evaluation agent of the checkpoint's run, of the checkpoint and of the policy folder.
    for path in (tmp_path, folder.parent, folder):
        build_agent(AgentConfig(kind="checkpoint", path=str(path), device="cpu"), greedy=True)
    assert not marker.exists()

    # The marker is a real witness: allowing the code runs it (and its ImportError surfaces).
    with pytest.raises(ImportError, match="shipped inside a test checkpoint"):
        LLMActorCritic.from_pretrained(folder, trust_remote_code=True)
    assert marker.exists()


def test_resuming_a_run_does_not_run_the_checkpoints_code(tmp_path, modules_cache):
    from glam.ppo.setup import build_policy
    from glam.run_config import TrainingRunConfig

    folder, marker = checkpoint_with_code(tmp_path)
    build_policy(TrainingRunConfig(), folder.parent)  # `train.resume=true` restores it so
    assert not marker.exists()


def test_evaluation_forwards_the_users_trust_remote_code(tmp_path, modules_cache):
    folder, marker = checkpoint_with_code(tmp_path)
    cfg = AgentConfig(kind="checkpoint", path=str(folder), device="cpu")
    cfg.trust_remote_code = True  # `agent.trust_remote_code=true` once the schema has it
    with pytest.raises(ImportError, match="shipped inside a test checkpoint"):
        build_agent(cfg, greedy=True)
    assert marker.exists()


def test_a_model_that_needs_its_code_is_refused_naming_the_setting(tmp_path, modules_cache):
    folder, marker = checkpoint_with_code(tmp_path, model_type="glam_shipped_model")
    settings = r"trust_remote_code=True .*agent\.trust_remote_code=true"
    with pytest.raises(CheckpointError, match=settings):
        LLMActorCritic.from_pretrained(folder)
    with pytest.raises(CheckpointError, match=settings):
        build_agent(AgentConfig(kind="checkpoint", path=str(folder), device="cpu"), greedy=True)
    assert not marker.exists()


def test_saved_settings_do_not_record_trust_remote_code(tmp_path):
    model, tokenizer = tiny_causal_lm("llama")
    trusting = ModelConfig(name_or_path="tiny", lora=FULL.lora, trust_remote_code=True)
    policy = LLMActorCritic.from_model(model, tokenizer, trusting, SMALL_HEADS, ACTION_WORDS)
    folder = policy.save_pretrained(tmp_path / "policy")
    assert "trust_remote_code" not in json.loads((folder / "glam_policy.json").read_text())["model"]
    restored = LLMActorCritic.from_pretrained(folder, trust_remote_code=True)
    assert restored.model_cfg.trust_remote_code is True  # the caller's value, kept for saving


# --------------------------------------------------------------------------------------------
# Missing, truncated and malformed files
# --------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def saved(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """One policy folder of each kind: LoRA adapter with its base, and full weights."""
    root = tmp_path_factory.mktemp("saved")
    base = save_tiny_model(root / "tiny", "llama")
    lora = ModelConfig(name_or_path=str(base), lora=AdapterConfig(r=4, alpha=8))
    policy = LLMActorCritic.from_config(lora, SMALL_HEADS, ACTION_WORDS)
    adapter = policy.save_pretrained(root / "adapter", include_base=True)
    model, tokenizer = tiny_causal_lm("llama")
    full = LLMActorCritic.from_model(model, tokenizer, FULL, SMALL_HEADS, ACTION_WORDS)
    return {"adapter": adapter, "full": full.save_pretrained(root / "full")}


def _truncate(file: Path) -> None:
    data = file.read_bytes()
    file.write_bytes(data[: len(data) - 100])


def _garbage(file: Path) -> None:
    file.write_bytes(b"\x00\xff this is not what the file should hold" * 3)


def _drop_key(key: str):
    def drop(file: Path) -> None:
        meta = json.loads(file.read_text())
        del meta[key]
        file.write_text(json.dumps(meta))

    return drop


def _other_heads(file: Path) -> None:
    from safetensors.torch import save_file

    save_file({"value_head.net.0.weight": torch.zeros(3, 3)}, file)


DAMAGES = [
    ("adapter", "glam_policy.json", Path.unlink, "file is missing"),
    ("adapter", "glam_policy.json", _garbage, "not valid JSON"),
    ("adapter", "glam_policy.json", _drop_key("weights"), "missing key 'weights'"),
    ("adapter", "heads.safetensors", Path.unlink, "file is missing"),
    ("adapter", "heads.safetensors", _truncate, r"truncated \(\d+ bytes, its header describes"),
    ("adapter", "heads.safetensors", _garbage, "truncated or not a safetensors file"),
    ("adapter", "heads.safetensors", _other_heads, "the heads do not load"),
    ("adapter", "adapter/adapter_model.safetensors", Path.unlink, "file is missing"),
    ("adapter", "adapter/adapter_model.safetensors", _truncate, "truncated"),
    ("adapter", "adapter/adapter_config.json", _garbage, "not valid JSON"),
    ("adapter", "base/model.safetensors", _truncate, "truncated"),
    ("adapter", "base/config.json", Path.unlink, "file is missing"),
    ("full", "model/model.safetensors", _truncate, "truncated"),
    ("full", "model/model.safetensors", Path.unlink, "file is missing"),
    ("full", "model/tokenizer.json", _garbage, "not valid JSON"),
]


@pytest.mark.parametrize(
    ("kind", "name", "damage", "problem"),
    DAMAGES,
    ids=[f"{kind}:{name}:{damage.__name__}" for kind, name, damage, _ in DAMAGES],
)
def test_a_damaged_file_is_a_checkpoint_error_naming_it(
    saved, tmp_path, kind, name, damage, problem
):
    folder = shutil.copytree(saved[kind], tmp_path / kind)
    LLMActorCritic.from_pretrained(folder)  # whole, it loads
    damage(folder / name)
    with pytest.raises(CheckpointError, match=f"{re.escape(str(folder / name))}: .*{problem}"):
        LLMActorCritic.from_pretrained(folder)


def test_a_missing_folder_is_a_checkpoint_error(tmp_path):
    with pytest.raises(CheckpointError, match="folder does not exist"):
        LLMActorCritic.from_pretrained(tmp_path / "nowhere")


# --------------------------------------------------------------------------------------------
# Folders saved by older versions
# --------------------------------------------------------------------------------------------

FIRST_FORMAT_FIELDS = {
    "policy": {
        "head",
        "normalization",
        "value_hidden_sizes",
        "value_activation",
        "value_from_base",
        "prompt_format",
        "append_eos",
    },
    "model": {
        "name_or_path",
        "dtype",
        "trust_remote_code",
        "pretrained",
        "lora",
        "gradient_checkpointing",
        "autocast_bf16",
    },
}
"""The settings the first `glam_policy.json` (format 1) recorded."""


def test_every_setting_added_since_the_first_format_says_what_older_files_meant() -> None:
    for section, schema in (("policy", PolicyConfig), ("model", ModelConfig)):
        added = {item.name for item in dataclasses.fields(schema)} - FIRST_FORMAT_FIELDS[section]
        assert added == set(SETTINGS_BEFORE_THEIR_FIELD[section]), section


def test_a_policy_saved_before_a_setting_existed_loads_as_it_was_trained(saved, tmp_path):
    """No `temperature` in the file: the policy was trained at 1, not at today's default 5."""
    folder = shutil.copytree(saved["full"], tmp_path / "old")
    current = LLMActorCritic.from_pretrained(folder).eval()
    assert current.policy_cfg.temperature == PolicyConfig().temperature == 5.0
    meta = json.loads((folder / "glam_policy.json").read_text())
    del meta["policy"]["temperature"], meta["model"]["disable_dropout"]
    (folder / "glam_policy.json").write_text(json.dumps(meta))

    old = LLMActorCritic.from_pretrained(folder).eval()
    assert old.policy_cfg.temperature == 1.0
    assert old.model_cfg.disable_dropout is False  # dropout was left on before the setting
    prompts = ["Goal of the agent: go to the red ball\nObservation 0: a wall\nAction 0:"]
    with torch.no_grad():
        scores = old(prompts, [list(ACTION_WORDS)]).logits
        tempered = current(prompts, [list(ACTION_WORDS)]).logits
    torch.testing.assert_close(scores, 5.0 * tempered)
