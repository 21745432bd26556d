"""The throughput and memory model: hand-computed counts, torch's own FLOP counter on the real
packed scorer, parameter counts of the real architectures, calibration, and the CLI."""

from __future__ import annotations

import dataclasses
import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from helpers_tiny import one_torch_thread, tiny_causal_lm, tiny_seq2seq_lm  # noqa: F401
from torch.utils.flop_counter import FlopCounterMode

from glam import scaling
from glam.config import AdapterConfig
from glam.policy.adapters import apply_lora
from glam.scaling import (
    MODEL_PRESETS,
    ModelShape,
    WorkloadConfig,
    backward_flops,
    calibrate,
    estimate_memory,
    forward_flops,
    project,
    step_flops,
)
from glam.scoring import TrunkCut, score_candidates, tokenize_candidates
from glam.trunk import layer_stack, trainable_layers

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "estimate_throughput.py"
SMOLLM2_CONFIG = Path.home() / ".cache" / "glam" / "models" / "smollm2-135m" / "config.json"

# A causal model small enough to count by hand: 1 layer, hidden d=4, MLP f=8 (gated), 2 heads of
# width 2 sharing 1 key/value head, vocabulary 10.
TINY = ModelShape(
    name="tiny",
    kind="causal",
    num_layers=1,
    hidden_size=4,
    intermediate_size=8,
    num_heads=2,
    num_kv_heads=1,
    head_dim=2,
    vocab_size=10,
)
# Prompt of 3 tokens, 2 candidates of 1 token, value head straight from hidden to 1.
TINY_RUN = WorkloadConfig(
    prompt_tokens=3,
    candidates=2,
    candidate_tokens=1,
    envs=2,
    frames_per_env=2,
    epochs=1,
    minibatch_size=4,
    micro_batch_size=2,
    lora_rank=1,
    lora_targets=("q", "v"),
    value_hidden_sizes=(),
)


def test_tiny_causal_flops_by_hand() -> None:
    # The packed row: T = (P - 1) + C * W = 2 + 2 = 4 tokens.
    # Multiply-accumulates per token of the layer's matrices:
    #   q 4x4 = 16, k 4x2 = 8, v 4x2 = 8, o 4x4 = 16, gate/up/down 4x8 = 32 each -> 144
    #   linear = 2 FLOPs x 144 x 4 tokens = 1152
    # Attention, dense over the row: 4 x (2 heads x 2) x 4 queries x 4 keys = 256
    # LM head at the C * W = 2 candidate positions only: 2 x 4 x 10 x 2 = 160
    # Value head 4 -> 1 once per prompt: 2 x 4 = 8
    # LoRA r=1 on q (4 -> 4: 1 x 8 = 8 MACs) and v (4 -> 2: 1 x 6 = 6 MACs): 2 x 14 x 4 = 112
    forward = forward_flops(TINY, TINY_RUN)
    assert (forward.linear, forward.attention, forward.lm_head) == (1152, 256, 160)
    assert (forward.value_head, forward.lora) == (8, 112)
    assert forward.total == 1688
    # LoRA backward: frozen linear and LM head pay the input gradient only (1x), attention,
    # LoRA and the value head both gradients (2x): 1152 + 160 + 2 x (256 + 112 + 8) = 2064.
    assert backward_flops(forward, TINY_RUN) == 2064
    # Full fine-tuning: no LoRA (forward 1576), everything 2x: 2 x 1576 = 3152.
    full = dataclasses.replace(TINY_RUN, lora_rank=None)
    assert forward_flops(TINY, full).total == 1576
    assert backward_flops(forward_flops(TINY, full), full) == 3152
    # Gradient checkpointing recomputes the layers (linear + attention + LoRA = 1520).
    checkpointed = dataclasses.replace(TINY_RUN, gradient_checkpointing=True)
    assert backward_flops(forward, checkpointed) == 2064 + 1520

    # Per frame: rollout = forward x (1 + 1/frames_per_env) = 1688 x 1.5 = 2532;
    # update = 1 epoch x (1688 + 2064) = 3752; total 6284; per update x 4 frames = 25136.
    flops = step_flops(TINY, TINY_RUN)
    assert (flops.rollout_per_frame, flops.update_per_frame) == (2532, 3752)
    assert (flops.per_frame, flops.per_update) == (6284, 25136)
    # bf16 recomputes old log-probs by default: one more forward; 2 epochs: 2 x 3752 + 1688.
    bf16 = dataclasses.replace(TINY_RUN, epochs=2, precision="bf16")
    assert step_flops(TINY, bf16).update_per_frame == 2 * 3752 + 1688
    off = dataclasses.replace(bf16, recompute_logprobs=False)
    assert step_flops(TINY, off).update_per_frame == 2 * 3752


def test_tiny_encoder_decoder_flops_by_hand() -> None:
    shape = dataclasses.replace(
        TINY, kind="encoder_decoder", num_encoder_layers=1, num_kv_heads=2, tie_embeddings=False
    )
    run = dataclasses.replace(TINY_RUN, lora_rank=None)
    # Encoder over P = 3 tokens; decoder over D = C * W = 2 tokens.
    #   encoder matrices per token: q, k, v, o 4x4 = 64 + MLP 96 = 160 MACs -> 2 x 160 x 3 = 960
    #   decoder per token: self q, k, v, o 64 + cross q, o 32 + MLP 96 = 192 -> 2 x 192 x 2 = 768
    #   cross k, v over the 3 encoder states: 2 x (16 + 16) x 3 = 192           linear = 1920
    #   attention: encoder 4 x 4 x 3 x 3 = 144, decoder self 4 x 4 x 2 x 2 = 64,
    #   cross 4 x 4 x 2 x 3 = 96                                                attention = 304
    #   LM head at 2 positions: 160; value head: 8
    forward = forward_flops(shape, run)
    assert (forward.linear, forward.attention, forward.lm_head) == (1920, 304, 160)
    assert forward.total == 1920 + 304 + 160 + 8
    # Weights: shared embedding and untied head 2 x 40, encoder 4 x 16 + 96 = 160,
    # decoder 160 + cross 64 = 224.
    assert scaling.count_parameters(shape) == 80 + 160 + 224


def test_tiny_memory_by_hand() -> None:
    memory = estimate_memory(TINY, TINY_RUN)
    # Weights: embeddings 40 (tied) + layer 144 = 184 parameters, fp32. LoRA: q 8 + v 6 = 14;
    # value head 4 weights + 1 bias = 5; LoRA and head stay fp32: (184 + 19) x 4 = 812 bytes.
    assert (memory.parameters, memory.trainable_parameters) == (184, 19)
    assert memory.weights == 812
    # Gradients and Adam's two moments of the 19 trainable parameters: 76 and 152 bytes.
    assert (memory.gradients, memory.optimizer) == (76, 152)
    # Saved activations per token of the layer: norms 4 x 4 = 16, q/k/v/attention output
    # (2 x 2 + 2 x 1) x 2 = 12, probabilities 2 heads x 4 keys = 8, MLP 4 x 8 = 32 -> 68;
    # x 4 tokens x 4 bytes = 1088. Mask 4 x 4 x (4 + 1) = 80. Logits 2 positions x 10 x 8 = 160.
    assert memory.activations_per_transition == 1088 + 80 + 160
    assert (memory.micro_batch, memory.activations) == (2, 2 * 1328)
    # K/V of the packed row: 2 x (1 x 2) x 4 tokens x 4 bytes = 64; with a copy of the 2-token
    # context per candidate: 2 x 2 x (2 x 2 + 2) x 4 = 96.
    assert (memory.kv_per_prompt, memory.kv_per_prompt_copied) == (64, 96)

    full = estimate_memory(TINY, dataclasses.replace(TINY_RUN, lora_rank=None))
    assert (full.gradients, full.optimizer) == ((184 + 5) * 4, 2 * (184 + 5) * 4)
    bf16 = estimate_memory(TINY, dataclasses.replace(TINY_RUN, lora_rank=None, precision="bf16"))
    # bf16 base weights; the head stays fp32; AdamW keeps state in the parameters' dtypes.
    assert (bf16.weights, bf16.gradients, bf16.optimizer) == (388, 388, 776)
    assert bf16.activations_per_transition == 272 * 2 + 4 * 4 * 3 + 160
    # ZeRO-2 over 2 devices halves gradients and moments, and the micro-batch follows the
    # local minibatch (4 / 2 = 2).
    zero2 = estimate_memory(TINY, dataclasses.replace(TINY_RUN, lora_rank=None), 2, zero_stage=2)
    assert (zero2.gradients, zero2.optimizer, zero2.weights) == (378, 756, full.weights)
    assert estimate_memory(TINY, TINY_RUN, 2, zero_stage=3).weights == 812 / 2


def test_calibration_round_trip() -> None:
    shape = MODEL_PRESETS["flan-t5-large"]
    run = WorkloadConfig(lora_rank=None, precision="amp-bf16")
    flops = step_flops(shape, run)
    measured = 73.5
    calibration = calibrate(flops, measured, peak_flops=312e12, devices=8)
    assert calibration.achieved_flops == pytest.approx(flops.per_update / measured, rel=1e-12)
    assert calibration.mfu == pytest.approx(flops.per_update / measured / (8 * 312e12))
    projection = project(flops, 312e12, devices=8, mfu=calibration.mfu, frames=1_500_000)
    assert projection.seconds_per_update == pytest.approx(measured, rel=1e-12)
    updates = 1_500_000 / run.frames_per_update
    assert projection.hours == pytest.approx(updates * measured / 3600, rel=1e-12)
    assert projection.env_steps_per_s == pytest.approx(run.frames_per_update / measured)
    # The same run on twice the devices, at the same MFU, is twice as fast.
    faster = project(flops, 312e12, devices=16, mfu=calibration.mfu, frames=1_500_000)
    assert faster.seconds_per_update == pytest.approx(measured / 2)
    # A whole run's hours give its mean seconds per update: 20 h / (1.5M / 1280) updates.
    assert scaling.seconds_per_update_from_hours(20, 1_500_000, 1280) == pytest.approx(61.44)
    assert scaling.cpu_peak_tflops(2, 2.8, 64) == pytest.approx(0.3584)
    with pytest.raises(ValueError, match="mfu must be in"):
        project(flops, 312e12, devices=8, mfu=1.5, frames=10)


def _meta_model_matrices(model_class, config) -> int:
    """Weights of a model built on the meta device, minus norms, biases and T5's position
    buckets (what `count_parameters` leaves out)."""
    with torch.device("meta"):
        model = model_class(config)
    matrices = sum(
        p.numel()
        for name, p in model.named_parameters()
        if p.ndim == 2 and "relative_attention_bias" not in name
    )
    if getattr(model, "shared", None) is not None and model.lm_head.weight is model.shared.weight:
        # transformers 5 builds every T5 with its LM head tied, and unties it on loading a
        # checkpoint that holds a different head, as Flan-T5's does ("tie_word_embeddings":
        # false in its config.json): the loaded model has its own head.
        matrices += model.lm_head.weight.numel()
    return matrices


def test_preset_parameter_counts_match_the_real_architectures() -> None:
    from transformers import LlamaConfig, LlamaForCausalLM, T5Config, T5ForConditionalGeneration

    llama = LlamaConfig(
        hidden_size=2048,
        intermediate_size=8192,
        num_hidden_layers=16,
        num_attention_heads=32,
        num_key_value_heads=8,
        head_dim=64,
        vocab_size=128256,
        tie_word_embeddings=True,
    )
    flan_t5_large = T5Config(
        d_model=1024,
        d_ff=2816,
        d_kv=64,
        num_layers=24,
        num_decoder_layers=24,
        num_heads=16,
        vocab_size=32128,
        feed_forward_proj="gated-gelu",
    )
    for name, model_class, config, tied in (
        ("llama-1b-like", LlamaForCausalLM, llama, True),
        ("flan-t5-large", T5ForConditionalGeneration, flan_t5_large, False),
    ):
        shape = MODEL_PRESETS[name]
        # As in the hub's config.json (transformers 5 rewrites T5's flag in memory).
        as_on_hub = {**config.to_dict(), "tie_word_embeddings": tied}
        assert scaling.shape_from_hf_config(as_on_hub, name=name) == shape
        assert scaling.count_parameters(shape) == _meta_model_matrices(model_class, config)
    # The paper's "780M": 783.0M weight matrices and embeddings.
    assert scaling.count_parameters(MODEL_PRESETS["flan-t5-large"]) == 783_024_128


@pytest.mark.skipif(not SMOLLM2_CONFIG.is_file(), reason="run `make models` (prepare_models.py)")
def test_smollm2_preset_is_the_embedded_model() -> None:
    from transformers import LlamaConfig, LlamaForCausalLM

    config = json.loads(SMOLLM2_CONFIG.read_text())
    shape = scaling.shape_from_hf_config(config, name="smollm2-135m")
    assert shape == MODEL_PRESETS["smollm2-135m"]
    assert scaling.resolve_shape(str(SMOLLM2_CONFIG.parent)) == dataclasses.replace(
        shape, name=str(SMOLLM2_CONFIG.parent)
    )
    expected = _meta_model_matrices(LlamaForCausalLM, LlamaConfig(**config))
    assert scaling.count_parameters(shape) == expected == 134_479_872


PROMPTS = ["Goal of the agent: go to the red ball\nObservation 0: You see a wall\nAction 0:"]
CANDIDATES = [["turn left", "go forward", "drop"]]


def _measured_flops(model, tokenizer) -> tuple[int, int]:
    """torch's count of one packed scoring forward, then of the backward of its scores."""
    with FlopCounterMode(display=False) as counter:
        scores = score_candidates(model, tokenizer, PROMPTS, CANDIDATES).scores
    forward = counter.get_total_flops()
    with FlopCounterMode(display=False) as counter:
        scores.sum().backward()
    return forward, counter.get_total_flops()


def _workload(tokenizer, encoder_decoder: bool, lora_rank: int | None) -> WorkloadConfig:
    tokens = tokenize_candidates(tokenizer, PROMPTS, CANDIDATES, encoder_decoder=encoder_decoder)
    return WorkloadConfig(
        prompt_tokens=int(tokens.prompt_lengths[0]),
        candidates=len(CANDIDATES[0]),
        candidate_tokens=int(tokens.candidate_lengths.max()),
        lora_rank=lora_rank,
        value_hidden_sizes=(),
    )


@pytest.mark.parametrize("lora_rank", [None, 2])
@pytest.mark.parametrize("kind", ["causal", "encoder_decoder"])
def test_counts_match_torch_flop_counter_on_the_packed_scorer(
    kind: str, lora_rank: int | None
) -> None:
    """The real `score_candidates` (eager attention, so that every product is an aten matmul
    the counter sees) against the model: forward and full fine-tuning backward exactly; LoRA's
    backward high by exactly the first layer's terms the module docstring names."""
    builder = tiny_causal_lm if kind == "causal" else tiny_seq2seq_lm
    model, tokenizer = builder(attn_implementation="eager")
    shape = scaling.shape_from_hf_config(model.config.to_dict())
    run = _workload(tokenizer, kind == "encoder_decoder", lora_rank)
    if lora_rank is None:
        model.requires_grad_(True)
    else:
        model = apply_lora(model, AdapterConfig(r=lora_rank))
    forward, backward = _measured_flops(model, tokenizer)

    expected = forward_flops(shape, run)
    assert forward == expected.total - expected.value_head
    modelled = backward_flops(expected, run) - 2 * expected.value_head
    if lora_rank is None:
        assert backward == modelled
        return
    # Layers that read the frozen embeddings (the causal layer 0; T5's first encoder layer and
    # its first decoder self-attention) need no input gradient for q, k, v nor for LoRA's A,
    # and no gradient for the keys (k is not adapted) in Q.K^T.
    d, r, width = shape.hidden_size, lora_rank, shape.attention_width
    kv_width = shape.kv_width
    if kind == "causal":
        stacks = [(scaling._row_tokens(run), scaling._row_tokens(run))]
    else:
        decoder = run.candidates * run.candidate_tokens
        stacks = [(run.prompt_tokens, run.prompt_tokens), (decoder, decoder)]
    first_layer = sum(
        2 * d * (width + 2 * kv_width) * tokens  # q, k, v input gradients
        + 2 * r * d * tokens * 2  # LoRA A input gradients of q and v
        + 2 * width * tokens * keys  # Q.K^T's gradient for K
        for tokens, keys in stacks
    )
    assert modelled - backward == first_layer
    assert first_layer / modelled < 0.15  # 2 layers here; 1/num_layers of this in general


# The same layer twice: LoRA (or a full fine-tuning) on the top layer only, K=1 of 2.
TINY2 = dataclasses.replace(TINY, num_layers=2)
TOP1 = dataclasses.replace(TINY_RUN, tuned_layers=1)


def test_top_layer_flops_by_hand() -> None:
    # Per layer, as in the 1-layer test: linear 1152, attention 256, LoRA on q and v 112; LM
    # head 160, value head 8. LoRA on layer 1 only: the rollout's forward runs both layers,
    # LoRA in one: 2 x 1152 + 2 x 256 + 160 + 112 + 8 = 3096.
    uncached = step_flops(TINY2, TOP1)
    assert uncached.forward.total == 3096
    assert uncached.forward.lora == 112
    # Nothing below layer 1 requires a gradient: the backward runs layer 1 and the heads only,
    # frozen linear and LM head 1x, attention, LoRA and value head 2x:
    # 1152 + 160 + 2 x (256 + 112 + 8) = 2064, the 1-layer model's backward.
    assert uncached.backward == 2064
    # Without the cache the update's forward is the whole model's: 1 epoch x (3096 + 2064).
    assert uncached.update_forward == uncached.forward
    assert uncached.update_per_frame == 3096 + 2064
    assert uncached.rollout_per_frame == 3096 * 1.5
    # With it, the update's forwards run layer 1 and the heads from the kept states:
    # 1152 + 256 + 160 + 112 + 8 = 1688; the rollout is unchanged.
    cached = step_flops(TINY2, dataclasses.replace(TOP1, cache_trunk=True))
    assert cached.update_forward.total == 1688
    assert (cached.backward, cached.rollout_per_frame) == (2064, 3096 * 1.5)
    assert cached.update_per_frame == 1688 + 2064
    # The recompute (bf16) is one more forward from the kept states: 2 x 3752 + 1688.
    bf16 = dataclasses.replace(TOP1, cache_trunk=True, epochs=2, precision="bf16")
    assert step_flops(TINY2, bf16).update_per_frame == 2 * (1688 + 2064) + 1688
    # Against LoRA on both layers: forward 2 x (1152 + 256 + 112) + 160 + 8 = 3208, backward
    # 2 x 1152 + 160 + 2 x (2 x 256 + 2 x 112 + 8) = 3952.
    every = step_flops(TINY2, TINY_RUN)
    assert (every.forward.total, every.backward) == (3208, 3952)

    # A full fine-tuning of layer 1 only (model.trained_layers=1): its weights pay both
    # gradients, the frozen LM head the input gradient only: 2 x 1152 + 160 + 2 x (256 + 8).
    trained = dataclasses.replace(TINY_RUN, lora_rank=None, tuned_layers=1, cache_trunk=True)
    flops = step_flops(TINY2, trained)
    assert flops.backward == 2 * 1152 + 160 + 2 * (256 + 8)
    assert flops.update_forward.total == 1152 + 256 + 160 + 8
    # A list of indices: the same layer as K=1.
    indices = dataclasses.replace(TOP1, tuned_layers=[1], cache_trunk=True)
    assert step_flops(TINY2, indices) == cached


def test_top_layer_encoder_decoder_flops_by_hand() -> None:
    # 1 encoder and 1 decoder layer as in the encoder-decoder test; the decoder's layer trained
    # in full (model.trained_layers=1), the encoder frozen.
    shape = dataclasses.replace(
        TINY, kind="encoder_decoder", num_encoder_layers=1, num_kv_heads=2, tie_embeddings=False
    )
    run = dataclasses.replace(TINY_RUN, lora_rank=None, tuned_layers=1, cache_trunk=True)
    flops = step_flops(shape, run)
    # The update runs from the encoder's output: the decoder's matrices 768 + cross k, v 192,
    # its attention 64 + 96, the LM head 160, the value head 8.
    assert flops.update_forward.total == 768 + 192 + 64 + 96 + 160 + 8
    assert flops.update_forward.cross_kv == 192
    # Backward: the decoder's weights 2x; cross k and v read the frozen encoder's states, so
    # they pay their weight gradient only (1x); LM head 1x; attention and value head 2x.
    assert flops.backward == 2 * 768 + 192 + 160 + 2 * (64 + 96 + 8)
    # The rollout runs the encoder too: 1920 + 304 + 160 + 8, as in the test above.
    assert flops.forward.total == 1920 + 304 + 160 + 8
    # The cache keeps the encoder's output: 3 prompt tokens x hidden 4 x 4 bytes = 48 per
    # transition, for the 2 envs x 2 frames of the update.
    memory = estimate_memory(shape, run)
    assert (memory.trunk_cache_per_transition, memory.trunk_cache) == (48, 4 * 48)


def test_top_layer_memory_by_hand() -> None:
    cached = estimate_memory(TINY2, dataclasses.replace(TOP1, cache_trunk=True))
    # Weights: embeddings 40 + 2 layers x 144 = 328; LoRA on layer 1's q and v 14, value head 5:
    # (328 + 19) x 4 bytes. Gradients and Adam's moments of the 19 trainable parameters.
    assert (cached.parameters, cached.trainable_parameters) == (328, 19)
    assert cached.weights == (328 + 19) * 4
    assert (cached.gradients, cached.optimizer) == (76, 152)
    # Activations of layer 1 only, as the 1-layer model's: 1088 + mask 80 + logits 160.
    assert cached.activations_per_transition == 1088 + 80 + 160
    # The kept states: T = 4 positions x hidden 4 x 4 bytes = 64 per transition, 2 envs x 2
    # frames = 4 transitions; held by the update and by the rollout that fills them.
    assert (cached.trunk_cache_per_transition, cached.trunk_cache) == (64, 256)
    uncached = estimate_memory(TINY2, TOP1)
    assert uncached.trunk_cache == 0
    assert uncached.activations_per_transition == cached.activations_per_transition
    assert cached.update_total == uncached.update_total + 256
    assert cached.rollout_total == uncached.rollout_total + 256
    # Every layer with LoRA: both layers' activations and LoRA parameters.
    every = estimate_memory(TINY2, TINY_RUN)
    assert every.activations_per_transition == 2 * 1088 + 80 + 160
    assert every.trainable_parameters == 2 * 14 + 5
    # A full fine-tuning of layer 1: its 144 weights and the value head train.
    trained = dataclasses.replace(TINY_RUN, lora_rank=None, tuned_layers=1)
    full = estimate_memory(TINY2, trained)
    assert full.trainable_parameters == 144 + 5
    assert (full.gradients, full.optimizer) == ((144 + 5) * 4, 2 * (144 + 5) * 4)


def test_trunk_cache_applies_where_the_trainer_says() -> None:
    shape = dataclasses.replace(TINY, num_layers=3)
    full = dataclasses.replace(TINY_RUN, lora_rank=None)
    for run, problem in (
        (dataclasses.replace(TINY_RUN, tuned_layers=2), None),
        (dataclasses.replace(TINY_RUN, tuned_layers=(1, 2)), None),
        (TINY_RUN, "LoRA adapts the lowest layer"),
        (dataclasses.replace(TINY_RUN, tuned_layers=3), "LoRA adapts the lowest layer"),
        (dataclasses.replace(TINY_RUN, tuned_layers=(0, 2)), "LoRA adapts the lowest layer"),
        (full, "the whole model is fine-tuned"),
        (dataclasses.replace(full, tuned_layers=3), "trained_layers includes the lowest layer"),
        (dataclasses.replace(full, tuned_layers=1), None),
    ):
        said = scaling.trunk_cache_problem(shape, run)
        assert said is None if problem is None else problem in said
    # An encoder-decoder model keeps the encoder's output: any decoder layers will do.
    t5 = dataclasses.replace(shape, kind="encoder_decoder", num_encoder_layers=1, num_kv_heads=2)
    assert scaling.trunk_cache_problem(t5, dataclasses.replace(TINY_RUN, tuned_layers=3)) is None
    assert "the encoder is trained" in scaling.trunk_cache_problem(t5, TINY_RUN)
    with pytest.raises(ValueError, match="cache_trunk=True, but LoRA adapts the lowest layer"):
        step_flops(shape, dataclasses.replace(TINY_RUN, cache_trunk=True))
    with pytest.raises(ValueError, match="model.lora.layers=4: tiny has 3 layers"):
        step_flops(shape, dataclasses.replace(TINY_RUN, tuned_layers=4))
    with pytest.raises(ValueError, match=r"model.trained_layers=\[3\]: tiny's layers are"):
        estimate_memory(shape, dataclasses.replace(full, tuned_layers=[3]))
    with pytest.raises(ValueError, match="an index is repeated"):
        WorkloadConfig(tuned_layers=(2, 2))


@pytest.mark.parametrize("cached", [False, True])
@pytest.mark.parametrize("kind", ["causal", "encoder_decoder"])
def test_top_layer_counts_match_torch_flop_counter(kind: str, cached: bool) -> None:
    """LoRA on the top layer of 2 (`model.lora.layers=1`): the update's forward, from the kept
    states (`glam.trunk.run_from_layer` under `score_candidates`) or the whole model, exactly;
    the backward, which stops at the adapted layer, high by exactly the terms whose inputs need
    no gradient there."""
    builder = tiny_causal_lm if kind == "causal" else tiny_seq2seq_lm
    model, tokenizer = builder(attn_implementation="eager")
    shape = scaling.shape_from_hf_config(model.config.to_dict())
    lora_rank = 2
    run = dataclasses.replace(
        _workload(tokenizer, kind == "encoder_decoder", lora_rank),
        tuned_layers=1,
        cache_trunk=cached,
    )
    model = apply_lora(model, AdapterConfig(r=lora_rank, layers=1))
    base = model.get_base_model()
    if kind == "causal":
        _, stack = layer_stack(base)
        cut = TrunkCut(layers=stack, first=trainable_layers(stack)[0])
        assert cut.first == 1
    else:
        cut = TrunkCut()  # the encoder's output is kept
    trunk = None
    if cached:
        with torch.no_grad():
            trunk = score_candidates(model, tokenizer, PROMPTS, CANDIDATES, trunk_cut=cut).trunk
    with FlopCounterMode(display=False) as counter:
        scores = score_candidates(
            model, tokenizer, PROMPTS, CANDIDATES, trunk_cut=cut if cached else None, trunk=trunk
        ).scores
    forward = counter.get_total_flops()
    with FlopCounterMode(display=False) as counter:
        scores.sum().backward()
    backward = counter.get_total_flops()

    flops = step_flops(shape, run)
    assert forward == flops.update_forward.total - flops.update_forward.value_head
    if cached:
        assert forward < flops.forward.total - flops.forward.value_head
    modelled = flops.backward - 2 * flops.update_forward.value_head
    # In the adapted layer (the lowest the backward reaches) the self-attention's q, k, v and
    # LoRA's A on q and v read states that need no gradient, nor does K in Q.K^T (k is not
    # adapted); the model counts their input gradients, as it does the first layer's. T5's
    # cross-attention adds LoRA's A on v and K in Q.K^T, which read the frozen encoder's states.
    d, r = shape.hidden_size, lora_rank
    width, kv_width = shape.attention_width, shape.kv_width
    tokens = scaling._row_tokens(run) if kind == "causal" else run.candidates * run.candidate_tokens
    unneeded = (
        2 * d * (width + 2 * kv_width) * tokens + 2 * r * d * tokens * 2 + 2 * width * tokens**2
    )
    if kind == "encoder_decoder":
        unneeded += 2 * r * d * run.prompt_tokens + 2 * width * tokens * run.prompt_tokens
    assert modelled - backward == unneeded


def test_workload_and_shape_checks() -> None:
    with pytest.raises(ValueError, match="LoRA target 'attn'"):
        WorkloadConfig(lora_targets=("q", "attn"))
    assert WorkloadConfig(lora_targets=("q_proj", "wo", "q")).lora_targets == ("q", "down")
    with pytest.raises(ValueError, match="precision='fp8'"):
        WorkloadConfig(precision="fp8")
    with pytest.raises(ValueError, match="multiple of num_kv_heads"):
        dataclasses.replace(TINY, num_kv_heads=3)
    with pytest.raises(ValueError, match="no gate projection"):
        forward_flops(
            dataclasses.replace(TINY, gated_mlp=False),
            dataclasses.replace(TINY_RUN, lora_targets=("gate",)),
        )
    with pytest.raises(ValueError, match="no fp32 peak"):
        scaling.HARDWARE_PRESETS["cpu"].peak_flops("fp32")
    assert scaling.HARDWARE_PRESETS["a100"].peak_flops("amp-bf16") == 312e12


# --------------------------------------------------------------------------------------------
# The script
# --------------------------------------------------------------------------------------------


def _script(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(SCRIPT), *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_script_prints_a_table_and_writes_json(tmp_path: Path) -> None:
    out = tmp_path / "estimate.json"
    done = _script(
        "--model", "flan-t5-large", "--full", "--devices", "8", "--mfu", "0.25", "--out", str(out)
    )
    assert done.returncode == 0, done.stderr
    result = json.loads(out.read_text())
    flops = step_flops(MODEL_PRESETS["flan-t5-large"], WorkloadConfig(lora_rank=None))
    assert result["flops"]["per_frame"] == pytest.approx(flops.per_frame)
    assert result["flops"]["rollout_per_frame"] == pytest.approx(flops.rollout_per_frame)
    [projection] = result["projections"]
    expected = project(flops, 19.5e12, devices=8, mfu=0.25, frames=1_500_000)
    assert projection["hours"] == pytest.approx(expected.hours)
    assert result["fits_in_memory"] is True
    assert result["optimizer_steps_per_update"] == 4 * 1280 // 64
    # The table shows the same figures.
    assert f"{flops.per_frame / 1e12:.4g} TFLOP" in done.stdout
    assert f"| 0.25 | 39 | {expected.seconds_per_update:.4g} " in done.stdout
    assert f"{expected.hours:.4g} |" in done.stdout
    assert "fits in 80 GiB" in done.stdout


def test_script_calibrates_from_a_measured_run(tmp_path: Path) -> None:
    # Measured with 4 envs on one device of 19.5 TFLOP/s; projected for 32 envs on 8.
    out = tmp_path / "calibrated.json"
    done = _script(
        "--model", "flan-t5-large", "--full", "--devices", "8",
        "--calibrate-seconds-per-update", "30", "--calibrate-peak-tflops", "19.5",
        "--calibrate-envs", "4", "--out", str(out),
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    result = json.loads(out.read_text())
    measured = step_flops(MODEL_PRESETS["flan-t5-large"], WorkloadConfig(lora_rank=None, envs=4))
    mfu = measured.per_update / 30 / 19.5e12
    assert result["calibration"]["mfu"] == pytest.approx(mfu)
    # Same MFU on 8x the devices for 8x the envs: the same 30 s per update.
    assert result["projections"][0]["seconds_per_update"] == pytest.approx(30)
    assert "MFU" in done.stdout and "Calibration" in done.stdout


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--mfu", "0.3", "--calibrate-seconds-per-update", "10"], "not both"),
        (["--hardware", "cpu"], "has no fp32 peak: give --peak-tflops, or --cpu-cores"),
    ],
)
def test_script_rejects_bad_arguments(args: list[str], message: str) -> None:
    done = _script(*args)
    assert done.returncode == 2
    assert message in done.stderr
    assert "Projection" not in done.stdout


def _load_script():
    """The command's options, projection and table, which the script only calls."""
    from glam import scaling_report

    return scaling_report


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--devices", "3"], "--devices 3 must be >= 1 and divide --envs (32)"),
        (["--model", "gpt-17"], "unknown model 'gpt-17'"),
        (["--mfu", "1.5"], "mfu must be in (0, 1]"),
        (["--lora-targets", "attn"], "LoRA target 'attn'"),
        (["--cpu-cores", "2", "--hardware", "cpu"], "needs all of --cpu-cores, --cpu-ghz"),
        (["--full", "--lora-rank", "4"], "not allowed with argument"),
        (
            ["--minibatch-size", "48"],
            "--minibatch-size 48 must divide the transitions per update, --envs x "
            "--frames-per-env = 1280, as the trainer requires",
        ),
        (["--calibrate-seconds-per-update", "0"], "--calibrate-seconds-per-update must be > 0"),
        (["--calibrate-hours", "-1"], "--calibrate-hours must be > 0, got -1"),
        (["--out", "."], "error: --out='.' is a folder: name a file"),
    ],
)
def test_script_errors_in_process(
    args: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    script = _load_script()
    with pytest.raises(SystemExit) as exit_info:
        sys.exit(script.main(args))
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err


def test_script_calibrates_on_the_projected_device_by_default(
    capsys: pytest.CaptureFixture[str],
) -> None:
    # A run of 1.5M frames in 20 hours on 8 devices, projected on the same 8 devices: 20 hours.
    script = _load_script()
    assert (
        script.main(["--devices", "8", "--calibrate-devices", "8", "--calibrate-hours", "20"]) == 0
    )
    output = capsys.readouterr().out
    assert "8 device(s) of 19.5 TFLOP/s peak" in output
    assert "| 20 |" in output


def test_script_cpu_peak_from_cores(capsys: pytest.CaptureFixture[str]) -> None:
    script = _load_script()
    args = ["--hardware", "cpu", "--cpu-cores", "2", "--cpu-ghz", "2.5", "--cpu-flops-per-cycle"]
    assert script.main([*args, "32", "--mfu", "0.5"]) == 0
    output = capsys.readouterr().out
    assert "peak 0.16 TFLOP/s per device (fp32)" in output
    assert "memory per device unknown" in output
    assert math.isclose(2 * 2.5e9 * 32, 0.16e12)


def test_script_reads_the_top_layers_and_the_cache(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    script = _load_script()
    out = tmp_path / "top4.json"
    assert script.main(["--lora-layers", "4", "--mfu", "0.2", "--out", str(out)]) == 0
    output = capsys.readouterr().out
    # ppo.cache_trunk unset: on, since LoRA leaves layers 0-25 frozen.
    assert "LoRA r=8 on q/v of layers 26-29 (of 0-29)" in output
    assert "cache on: the rollout keeps the input of layer 26" in output
    assert "the update runs layers 26-29 from it" in output
    result = json.loads(out.read_text())
    shape = MODEL_PRESETS["smollm2-135m"]
    flops = step_flops(shape, WorkloadConfig(tuned_layers=4, cache_trunk=True))
    assert result["flops"]["per_frame"] == pytest.approx(flops.per_frame)
    assert result["flops"]["update_forward"] == pytest.approx(flops.update_forward.total)
    assert result["trunk"] == {
        "tuned_layers": [26, 27, 28, 29],
        "cache": True,
        "cache_off_because": None,
    }
    # 32 envs x 40 frames of (P - 1 + C x W) = 251 positions x 576 x 4 bytes.
    assert result["memory_bytes"]["trunk_cache"] == 1280 * 251 * 576 * 4

    assert script.main(["--lora-layers", "4", "--no-cache-trunk", "--mfu", "0.2"]) == 0
    assert "trunk     cache off (--no-cache-trunk)" in capsys.readouterr().out
    assert script.main(["--mfu", "0.2"]) == 0
    assert "cache off (LoRA adapts the lowest layer" in capsys.readouterr().out
    assert script.main(["--full", "--trained-layers", "2", "--mfu", "0.2"]) == 0
    assert "full fine-tuning of layers 28-29 (of 0-29)" in capsys.readouterr().out
    assert script.main(["--model", "flan-t5-large", "--lora-layers", "4", "--mfu", "0.2"]) == 0
    output = capsys.readouterr().out
    assert "q/v of decoder layers 20-23 (of 0-23)" in output
    assert "keeps the encoder's output" in output


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--cache-trunk"], "--cache-trunk, but LoRA adapts the lowest layer"),
        (["--full", "--cache-trunk"], "--cache-trunk, but the whole model is fine-tuned"),
        (["--lora-layers", "31"], "model.lora.layers=31: smollm2-135m has 30 layers"),
        (["--full", "--lora-layers", "4"], "with --full, give --trained-layers"),
        (["--trained-layers", "4"], "chooses the layers a full fine-tuning trains (--full)"),
        (["--lora-layers", "top"], "'top': give K or comma-separated indices"),
    ],
)
def test_script_rejects_bad_layer_arguments(
    args: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    script = _load_script()
    with pytest.raises(SystemExit) as exit_info:
        sys.exit(script.main(args))
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err
