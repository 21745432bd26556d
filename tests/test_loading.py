"""Model loading: local folders (causal and T5), clear errors, the embedded model offline."""

from __future__ import annotations

import huggingface_hub.constants
import pytest
import torch
from helpers_tiny import (
    one_torch_thread,  # noqa: F401  (autouse fixture: one torch thread)
    save_tiny_model,
    tiny_causal_lm,
    tiny_seq2seq_lm,
)
from transformers import (
    GPT2LMHeadModel,
    LlamaForCausalLM,
    T5ForConditionalGeneration,
    ViTConfig,
    ViTModel,
)

import glam
from glam.models.loading import ModelNotFoundError

TEXT = "Goal of the agent: go to the red ball\nAction 0:"


@pytest.mark.parametrize(
    ("arch", "model_class"),
    [("llama", LlamaForCausalLM), ("gpt2", GPT2LMHeadModel), ("t5", T5ForConditionalGeneration)],
)
def test_local_folder_loads_the_same_model(tmp_path, arch, model_class):
    folder = save_tiny_model(tmp_path / arch, arch)
    model, tokenizer = glam.load_model(str(folder))
    assert isinstance(model, model_class)
    original, original_tokenizer = tiny_seq2seq_lm() if arch == "t5" else tiny_causal_lm(arch)
    ids = tokenizer(TEXT, return_tensors="pt").input_ids
    assert ids.tolist() == original_tokenizer(TEXT, return_tensors="pt").input_ids.tolist()
    extra = {"decoder_input_ids": ids[:, :3]} if arch == "t5" else {}
    with torch.no_grad():
        torch.testing.assert_close(model(ids, **extra).logits, original(ids, **extra).logits)
    assert tokenizer.pad_token is not None and model.config.pad_token_id is not None


def test_dtype_option(tmp_path):
    folder = save_tiny_model(tmp_path / "gpt2", "gpt2")
    model, _ = glam.load_model(str(folder), dtype="bfloat16")
    assert model.dtype == torch.bfloat16
    with pytest.raises(ValueError, match="dtype='fp8' is not one of"):
        glam.load_model(str(folder), dtype="fp8")


def test_pretrained_false_keeps_only_the_input_embeddings(tmp_path):
    folder = save_tiny_model(tmp_path / "llama", "llama")
    fresh, _ = glam.load_model(str(folder), pretrained=False)
    original, _ = tiny_causal_lm("llama")
    embeddings = fresh.get_input_embeddings().weight
    torch.testing.assert_close(embeddings, original.get_input_embeddings().weight)
    layer, original_layer = fresh.model.layers[0].mlp, original.model.layers[0].mlp
    assert not torch.allclose(layer.up_proj.weight, original_layer.up_proj.weight)


@pytest.fixture
def offline_hub(monkeypatch):
    """Hub look-ups fail at once (conftest sets HF_HUB_OFFLINE too; this holds on its own)."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)


def test_unresolvable_spec_lists_everything_tried(tmp_path, offline_hub):
    missing = tmp_path / "no-such-model"
    with pytest.raises(ModelNotFoundError) as caught:
        glam.load_model(str(missing))
    message = str(caught.value)
    assert f"could not resolve model spec {str(missing)!r}" in message
    assert "embedded model names ['gemma3-270m', 'smollm2-135m']: no match" in message
    assert "does not exist" in message
    assert "hub id" in message


def test_folder_without_config_is_named(tmp_path):
    (tmp_path / "empty").mkdir()
    with pytest.raises(ModelNotFoundError, match="exists but has no config.json"):
        glam.load_model(str(tmp_path / "empty"))


def test_model_without_language_modelling_head_is_refused(tmp_path):
    config = ViTConfig(
        hidden_size=16, num_hidden_layers=1, num_attention_heads=2, intermediate_size=32
    )
    ViTModel(config).save_pretrained(tmp_path / "vit")
    with pytest.raises(ValueError, match="neither a causal LM nor an encoder-decoder"):
        glam.load_model(str(tmp_path / "vit"))


@pytest.mark.slow
def test_embedded_model_loads_offline_and_continues_text(offline_hub):
    model, tokenizer = glam.load_model("smollm2-135m")
    assert isinstance(model, LlamaForCausalLM) and model.dtype == torch.float32
    inputs = tokenizer("The capital of France is", return_tensors="pt")
    with torch.no_grad():
        generated = model.generate(**inputs, max_new_tokens=6, do_sample=False)
    continuation = tokenizer.decode(generated[0, inputs.input_ids.shape[1] :])
    assert continuation.strip()
    assert "Paris" in continuation
