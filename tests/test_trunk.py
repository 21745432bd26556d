"""The frozen trunk's cache: adapters on the top layers, the update run from the rollout's states.

- `model.lora.layers` puts LoRA on the top K (or listed) layers, of the decoder for T5/BART.
- A forward from the kept trunk states gives the full forward's logits and values, for
  decoder-only and encoder-decoder models, both heads and the value from the base, and does not
  run the layers below the cut.
- The PPO update from the cache equals the uncached update with the same adapters (loss, every
  gradient, the weights after two epochs of micro-batched steps); corrupted states move the loss.
- Where the cache does not apply, the policy says why; the trainer says what it decided.
"""

from __future__ import annotations

import copy
import csv
from pathlib import Path

import pytest
import torch
import yaml
from accelerate import Accelerator
from helpers_tiny import (
    ACTION_WORDS,
    one_torch_thread,  # noqa: F401  (autouse fixture: one torch thread)
    tiny_causal_lm,
    tiny_seq2seq_lm,
)

from glam.config import AdapterConfig, ConfigError, ModelConfig, PolicyConfig, PPOConfig
from glam.policy import LLMActorCritic, glam_prompt
from glam.policy.observations import TextObservations
from glam.ppo.buffer import Transitions
from glam.ppo.trainer import train
from glam.ppo.update import _chunk_loss, ppo_update
from glam.run_config import compose_run
from glam.runs.errors import SetupError
from glam.trunk import TrunkStates, layer_stack, trainable_layers

OBSERVATIONS = [
    ["You see a wall 2 steps forward", "You see a red ball 1 step left"],
    ["You see a blue key 3 steps forward"],
    ["You see a closed yellow door 3 steps left and 2 steps forward"],
]
PROMPTS = [
    glam_prompt("go to the red ball", ACTION_WORDS, [OBSERVATIONS[0]], []),
    glam_prompt("pick up the blue key", ACTION_WORDS, OBSERVATIONS[:2], ["turn left"]),
    glam_prompt("open the yellow door", ACTION_WORDS, OBSERVATIONS, ["drop", "toggle"]),
    glam_prompt("go to the blue key", ACTION_WORDS, OBSERVATIONS[1:2], []),
]
CANDIDATES = [ACTION_WORDS, ["pick up", "turn left"], ACTION_WORDS[:3], ACTION_WORDS[2:]]
HEADS = PolicyConfig(value_hidden_sizes=[16], temperature=1.0)


def top_layers_policy(
    arch: str, layers: object = 2, policy_cfg: PolicyConfig = HEADS
) -> LLMActorCritic:
    """A tiny policy of `arch` (4 layers; T5 and BART: 3 encoder and 3 decoder layers) with
    LoRA on `layers`, its adapter moved off the identity so that it changes the outputs."""
    if arch in ("t5", "bart"):
        model, tokenizer = tiny_seq2seq_lm(arch, num_layers=3)
    else:
        model, tokenizer = tiny_causal_lm(arch, num_layers=4)
    model_cfg = ModelConfig(name_or_path="tiny", lora=AdapterConfig(r=4, alpha=8, layers=layers))
    torch.manual_seed(0)
    policy = LLMActorCritic.from_model(model, tokenizer, model_cfg, policy_cfg, ACTION_WORDS)
    generator = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for name, parameter in policy.model.named_parameters():
            if "lora_B" in name:
                parameter.copy_(torch.randn(parameter.shape, generator=generator) * 0.5)
    return policy


# --------------------------------------------------------------------------------------------
# Where the adapters go
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("arch", "stack"),
    [
        ("llama", "model.layers"),
        ("gpt2", "transformer.h"),
        ("t5", "decoder.block"),
        ("bart", "model.decoder.layers"),
    ],
)
def test_layer_stack_is_the_decoders_layers(arch: str, stack: str) -> None:
    model = (tiny_seq2seq_lm(arch) if arch in ("t5", "bart") else tiny_causal_lm(arch))[0]
    assert layer_stack(model)[0] == stack


@pytest.mark.parametrize(
    ("arch", "layers", "adapted"),
    [("llama", 2, [2, 3]), ("llama", [0, 3], [0, 3]), ("gpt2", 1, [3]), ("t5", 2, [1, 2])],
)
def test_lora_layers_choose_the_adapted_layers(arch: str, layers: object, adapted: list) -> None:
    policy = top_layers_policy(arch, layers)
    base = policy.model.get_base_model()
    assert trainable_layers(layer_stack(base)[1]) == adapted
    if arch == "t5":  # the encoder's blocks have the same names, and no adapter
        assert not any(p.requires_grad for p in base.get_encoder().parameters())


def test_lora_layers_past_the_top_are_refused() -> None:
    with pytest.raises(ValueError, match="model.lora.layers=5: the model has 4 layers"):
        top_layers_policy("llama", 5)
    with pytest.raises(ValueError, match=r"numbered 0 to 3"):
        top_layers_policy("llama", [2, 4])


@pytest.mark.parametrize(
    ("value", "message"),
    [("0", "at least 1"), ("[1,1]", "distinct"), ("[-1]", "distinct"), ("top", "give a number")],
)
def test_bad_lora_layers_stop_at_start_up(value: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        compose_run("tiny", [f"model.lora.layers={value}"])
    assert compose_run("tiny", ["model.lora.layers=[1,0]"]).model.lora.layers == [0, 1]


# --------------------------------------------------------------------------------------------
# The forward from the kept states
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("arch", "head", "value_from_base"),
    [
        ("llama", "scoring", False),
        ("llama", "action_heads", True),
        ("gpt2", "scoring", True),
        ("gemma3", "scoring", False),
        ("t5", "scoring", False),
        ("t5", "action_heads", True),
        ("bart", "scoring", False),
    ],
)
def test_the_forward_from_the_trunk_equals_the_full_forward(
    arch: str, head: str, value_from_base: bool
) -> None:
    cfg = PolicyConfig(
        value_hidden_sizes=[16], temperature=1.0, head=head, value_from_base=value_from_base
    )
    policy = top_layers_policy(arch, 2, cfg)
    candidates = CANDIDATES if head == "scoring" else [ACTION_WORDS] * len(PROMPTS)
    cut = policy.enable_trunk_cache()
    with torch.no_grad():
        kept = policy(PROMPTS, candidates)
    assert len(kept.trunk) == len(PROMPTS)
    assert all(isinstance(s, TrunkStates) for s in kept.trunk)
    assert (kept.trunk[0].base_hidden is not None) == value_from_base

    # Another batch (other order, other packing), as the update's micro-batches are.
    order = [3, 1, 0]
    prompts, cands = [PROMPTS[i] for i in order], [candidates[i] for i in order]
    below = _counting_calls(policy, cut)
    with torch.no_grad():
        cached = policy(prompts, cands, trunk=[kept.trunk[i] for i in order])
    assert below["calls"] == 0, "a layer below the cut ran"
    with torch.no_grad():
        full = policy(prompts, cands)
    assert below["calls"] > 0  # the counter does count
    mask = full.mask
    assert torch.equal(cached.mask, mask)
    # Scores of the tiny random models reach -80: fp32 rounding of another padding is ~1e-5.
    torch.testing.assert_close(cached.logits[mask], full.logits[mask], rtol=1e-6, atol=1e-5)
    torch.testing.assert_close(cached.values, full.values, rtol=1e-6, atol=1e-5)


def _counting_calls(policy: LLMActorCritic, cut) -> dict[str, int]:
    """Counts the calls of a weighted part (a norm, a projection) of the lowest layer (of the
    encoder for T5/BART)."""
    base = policy.model.get_base_model()
    calls = {"calls": 0}
    lowest = _encoder_layers(base)[0] if cut.layers is None else cut.layers[0]
    part = next(m for n, m in lowest.named_modules() if n and list(m.parameters(recurse=False)))

    def count(*_: object) -> None:
        calls["calls"] += 1

    part.register_forward_hook(count)
    return calls


def _encoder_layers(model) -> torch.nn.ModuleList:
    encoder = model.get_encoder()
    return next(m for m in encoder.modules() if isinstance(m, torch.nn.ModuleList) and len(m) == 3)


def test_states_for_other_prompts_are_refused() -> None:
    policy = top_layers_policy("llama")
    policy.enable_trunk_cache()
    with torch.no_grad():
        kept = policy(PROMPTS[:2], CANDIDATES[:2])
        with pytest.raises(ValueError, match="trunk states do not fit the prompts"):
            policy(PROMPTS[2:4], CANDIDATES[2:4], trunk=kept.trunk)


@pytest.mark.parametrize(
    ("arch", "layers", "lora", "why"),
    [
        ("llama", None, True, "adapts the lowest layer"),
        ("llama", [0, 3], True, "adapts the lowest layer"),
        ("llama", 2, False, "whole model is fine-tuned"),
        ("t5", None, True, "the encoder is trained: set model.lora.layers"),
    ],
)
def test_where_the_cache_does_not_apply_the_policy_says_why(
    arch: str, layers: object, lora: bool, why: str
) -> None:
    if lora:
        policy = top_layers_policy(arch, layers)
    else:
        model, tokenizer = tiny_causal_lm(arch, num_layers=4)
        cfg = ModelConfig(name_or_path="tiny", lora=AdapterConfig(enabled=False))
        policy = LLMActorCritic.from_model(model, tokenizer, cfg, HEADS, ACTION_WORDS)
    assert why in policy.trunk_cache_problem()
    with pytest.raises(ValueError, match=why):
        policy.enable_trunk_cache()
    assert policy.trunk_cut is None


def test_a_trained_embedding_below_the_adapters_is_a_reason() -> None:
    policy = top_layers_policy("llama")
    policy.model.get_base_model().get_input_embeddings().weight.requires_grad_(True)
    assert "embed_tokens" in policy.trunk_cache_problem()


def top_layers_full_policy(layers: object = 2, head: str = "scoring") -> LLMActorCritic:
    """A tiny 4-layer Llama fully fine-tuned on `layers` only (`model.trained_layers`)."""
    model, tokenizer = tiny_causal_lm("llama", num_layers=4)
    model_cfg = ModelConfig(
        name_or_path="tiny", lora=AdapterConfig(enabled=False), trained_layers=layers
    )
    torch.manual_seed(0)
    policy_cfg = PolicyConfig(value_hidden_sizes=[16], temperature=1.0, head=head)
    return LLMActorCritic.from_model(model, tokenizer, model_cfg, policy_cfg, ACTION_WORDS)


def test_full_fine_tuning_of_the_top_layers_trains_those_only_and_keeps_the_trunk() -> None:
    policy = top_layers_full_policy(2)
    trained = {n.split(".")[2] for n, p in policy.model.named_parameters() if p.requires_grad}
    assert trained == {"2", "3"}  # model.layers.2.*, model.layers.3.*: no embedding, no norm
    assert policy.trunk_cache_problem() is None
    assert policy.enable_trunk_cache().first == 2
    lowest = top_layers_full_policy([0, 3])
    assert "model.trained_layers includes the lowest layer" in lowest.trunk_cache_problem()
    with pytest.raises(ValueError, match="model.trained_layers=\\[7\\]"):
        top_layers_full_policy([7])


def test_trained_layers_are_for_full_fine_tuning_and_checked() -> None:
    with pytest.raises(ValueError, match="model.trained_layers=2 chooses the layers a full"):
        ModelConfig(trained_layers=2)
    with pytest.raises(ValueError, match="model.trained_layers=0: a number of top layers"):
        ModelConfig(lora=AdapterConfig(enabled=False), trained_layers=0)


@pytest.mark.parametrize("head", ["scoring", "action_heads"])
def test_a_full_fine_tuning_of_the_top_layers_updates_from_the_cache_as_without(
    head: str, tmp_path: Path
) -> None:
    uncached = top_layers_full_policy(2, head)
    cached = copy.deepcopy(uncached)
    cached.enable_trunk_cache()
    batch = _fixed_batch(cached, every_action=head == "action_heads")
    plain = Transitions(**{**batch.__dict__, "observations": batch.observations.with_trunk(None)})
    metrics_cached, weights_cached = _update(cached, batch)
    metrics_plain, weights_plain = _update(uncached, plain)
    initial = top_layers_full_policy(2, head).trainable_parameters()
    moved = max((w - i).abs().max().item() for w, i in zip(weights_cached, initial, strict=True))
    assert moved > 1e-3
    for a, b in zip(weights_cached, weights_plain, strict=True):
        assert (a - b).abs().max() <= 1e-5
    assert metrics_cached["losses/policy"] == pytest.approx(
        metrics_plain["losses/policy"], abs=1e-5
    )
    # The saved folder holds the whole model and restores which layers train.
    cached.save_pretrained(tmp_path / "policy")
    restored = LLMActorCritic.from_pretrained(tmp_path / "policy")
    assert [n for n, p in restored.named_parameters() if p.requires_grad] == [
        n for n, p in cached.named_parameters() if p.requires_grad
    ]


# --------------------------------------------------------------------------------------------
# The PPO update from the cache
# --------------------------------------------------------------------------------------------


def _fixed_batch(policy: LLMActorCritic, every_action: bool = False) -> Transitions:
    """Eight transitions of the four prompts, with the rollout policy's log-probs and values
    (`every_action`: each with all the action words, as action heads need)."""
    prompts, candidates = PROMPTS * 2, CANDIDATES * 2
    if every_action:
        candidates = [list(ACTION_WORDS)] * len(prompts)
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        output = policy(prompts, candidates)
    counts = torch.tensor([len(c) for c in candidates])
    actions = (torch.rand(len(prompts), generator=generator) * counts).long()
    return Transitions(
        observations=TextObservations(prompts, candidates, output.trunk),
        actions=actions,
        logprobs=output.dist.log_prob(actions),
        values=output.values,
        advantages=torch.randn(len(prompts), generator=generator),
        returns=torch.randn(len(prompts), generator=generator),
    )


def _update(policy: LLMActorCritic, batch: Transitions) -> tuple[dict, list[torch.Tensor]]:
    """Two epochs of minibatches of 4 in micro-batches of 2, plain SGD (no Adam to magnify the
    rounding of near-zero gradients); the metrics and the trained weights after it."""
    accelerator = Accelerator(cpu=True)
    optimizer = torch.optim.SGD(policy.trainable_parameters(), lr=0.1)
    model, optimizer = accelerator.prepare(policy, optimizer)
    ppo = PPOConfig(minibatch_size=4, micro_batch_size=2, epochs=2)
    torch.manual_seed(3)  # the same minibatch order in both updates
    metrics = ppo_update(model, optimizer, batch, ppo, accelerator, recompute=False)
    return metrics, [p.detach().clone() for p in policy.trainable_parameters()]


@pytest.mark.parametrize("arch", ["llama", "t5"])
def test_the_update_from_the_cache_equals_the_uncached_update(arch: str) -> None:
    uncached = top_layers_policy(arch)
    cached = copy.deepcopy(uncached)
    cached.enable_trunk_cache()
    batch = _fixed_batch(cached)
    plain = Transitions(**{**batch.__dict__, "observations": batch.observations.with_trunk(None)})

    # The first micro-batch: the loss and every adapter and head gradient.
    chunk = torch.arange(3)
    ppo = PPOConfig()
    losses, grads = [], []
    for policy, transitions in ((cached, batch), (uncached, plain)):
        policy.train()
        loss, _ = _chunk_loss(policy, transitions.select(chunk), ppo, torch.device("cpu"))
        loss.backward()
        losses.append(loss.item())
        grads.append({n: p.grad.clone() for n, p in policy.named_parameters() if p.requires_grad})
        policy.zero_grad()
    assert grads[0].keys() == grads[1].keys()
    assert any("lora_A" in n for n in grads[0]) and any("value_head" in n for n in grads[0])
    assert abs(losses[0] - losses[1]) <= 1e-5
    for name, grad in grads[0].items():
        assert grad.abs().max() > 0 or "lora_A" in name, name  # B = 0 would hide A's gradient
        assert (grad - grads[1][name]).abs().max() <= 1e-5, name

    # Two epochs of steps: the second epoch runs the moved adapters from the same states.
    initial = [p.detach().clone() for p in cached.trainable_parameters()]
    metrics_cached, weights_cached = _update(cached, batch)
    metrics_plain, weights_plain = _update(uncached, plain)
    moved = max((w - i).abs().max().item() for w, i in zip(weights_cached, initial, strict=True))
    assert moved > 1e-3  # a hundred times the tolerance below
    for a, b in zip(weights_cached, weights_plain, strict=True):
        assert (a - b).abs().max() <= 1e-5
    for key in ("losses/policy", "losses/value", "losses/entropy", "losses/approx_kl"):
        # The random T5's policy moves far (approx. KL 45): compare its metrics relatively.
        assert metrics_cached[key] == pytest.approx(metrics_plain[key], rel=1e-5, abs=1e-5), key


def test_corrupted_trunk_states_move_the_loss() -> None:
    """The negative control: the update reads the states it is given."""
    policy = top_layers_policy("llama")
    policy.enable_trunk_cache()
    batch = _fixed_batch(policy).select(torch.arange(3))
    loss, _ = _chunk_loss(policy, batch, PPOConfig(), torch.device("cpu"))
    generator = torch.Generator().manual_seed(5)
    noisy = [
        TrunkStates(s.hidden + torch.randn(s.hidden.shape, generator=generator), s.base_hidden)
        for s in batch.observations.trunk
    ]
    batch.observations = batch.observations.with_trunk(noisy)
    corrupted, _ = _chunk_loss(policy, batch, PPOConfig(), torch.device("cpu"))
    assert abs(corrupted.item() - loss.item()) > 1e-3


# --------------------------------------------------------------------------------------------
# The trainer
# --------------------------------------------------------------------------------------------


def _tiny_run(tmp_path: Path, *overrides: str) -> tuple[Path, str]:
    cfg = compose_run(
        "tiny",
        ["train.total_frames=128", "train.save_every=0", "ppo.frames_per_env=16", *overrides],
    )
    run_dir = tmp_path / "run"
    cfg.train.output_dir = str(run_dir)
    train(cfg, Accelerator(cpu=True), run_dir)
    return run_dir, (run_dir / "config.yaml").read_text()


def test_the_trainer_runs_the_update_from_the_cache_and_says_so(tmp_path: Path, capsys) -> None:
    # bf16 autocast: the recomputed log-probs come from the cache too, so the first ratio of
    # every update is exactly 1.
    run_dir, config = _tiny_run(tmp_path, "model.lora.layers=1", "model.autocast_bf16=true")
    out = capsys.readouterr().out
    assert "[glam] trunk cache: on (the rollout keeps the input of layer 1 of 0-1" in out
    assert yaml.safe_load(config)["ppo"]["cache_trunk"] is True
    rows = list(csv.DictReader((run_dir / "metrics.csv").open()))
    assert len(rows) == 2
    for row in rows:
        assert float(row["debug/first_ratio_deviation"]) == 0.0
        # 64 transitions of ~25 positions of 64 fp32 numbers: about 0.4 MiB.
        assert 0.1 < float(row["memory/trunk_cache_mib"]) < 2


def test_a_run_that_fine_tunes_its_top_layer_keeps_the_trunk(tmp_path: Path, capsys) -> None:
    """NPAE's top-layers variant: no pretraining, the top layer and the heads fully trained."""
    _, config = _tiny_run(
        tmp_path,
        "model.lora.enabled=false",
        "model.trained_layers=1",
        "model.pretrained=false",
        "policy.head=action_heads",
    )
    assert (
        "[glam] trunk cache: on (the rollout keeps the input of layer 1" in capsys.readouterr().out
    )
    assert yaml.safe_load(config)["model"]["trained_layers"] == 1


def test_where_the_cache_does_not_apply_the_run_says_so_or_stops(tmp_path: Path, capsys) -> None:
    _, config = _tiny_run(tmp_path)  # the tiny preset adapts both of its layers
    assert "[glam] trunk cache: off (LoRA adapts the lowest layer" in capsys.readouterr().out
    assert yaml.safe_load(config)["ppo"]["cache_trunk"] is False
    with pytest.raises(SetupError, match="ppo.cache_trunk=true, but the whole model"):
        _tiny_run(tmp_path / "full", "model.lora.enabled=false", "ppo.cache_trunk=true")


def test_a_checkpoint_from_before_the_layers_key_resumes_and_a_changed_one_does_not(
    tmp_path: Path,
) -> None:
    """`check_same_run` compares setting by setting: a key the checkpoint's config lacks (it
    was written before `model.lora.layers` existed) is not a change; a changed rank is."""
    from omegaconf import OmegaConf

    from glam.runs.lifecycle import check_same_run

    cfg = compose_run("tiny")
    checkpoint = tmp_path / "update_000001"
    checkpoint.mkdir()
    (checkpoint / "trainer_state.json").write_text(
        '{"update": 1, "frames": 64, "episodes": 1, "elapsed_seconds": 1.0, "world_size": 1}'
    )
    saved = OmegaConf.to_container(OmegaConf.structured(cfg))
    del saved["model"]["lora"]["layers"]
    (checkpoint / "config.yaml").write_text(OmegaConf.to_yaml(saved))
    check_same_run(cfg, checkpoint, 1)
    cfg.model.lora.r = 4
    with pytest.raises(SetupError, match=r"model.lora.r: 8 -> 4"):
        check_same_run(cfg, checkpoint, 1)
