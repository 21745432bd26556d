"""The actor-critic: heads, LoRA per architecture, the value variants, checkpoints."""

from __future__ import annotations

import json
import shutil
from dataclasses import asdict

import pytest
import torch
from helpers_tiny import (
    ACTION_WORDS,
    one_torch_thread,  # noqa: F401  (autouse fixture: one torch thread)
    save_tiny_model,
    tiny_causal_lm,
    tiny_seq2seq_lm,
)
from peft import PeftModel

from glam.config import AdapterConfig, EnvConfig, ModelConfig, PolicyConfig
from glam.policy import ActionHeads, LLMActorCritic, ValueHead, glam_prompt
from glam.policy.adapters import default_lora_targets
from glam.scoring import prompt_hidden_states, score_candidates

OBSERVATIONS = [["You see a wall 2 steps forward", "You see a red ball 1 step left"], ["drop"]]
PROMPTS = [
    glam_prompt("go to the red ball", ACTION_WORDS, OBSERVATIONS, ["turn left"]),
    glam_prompt("pick up the blue key", ACTION_WORDS, OBSERVATIONS[:1], []),
]
CANDIDATES = [ACTION_WORDS, ["pick up", "turn left"]]
SMALL_HEADS = PolicyConfig(value_hidden_sizes=[16, 16], temperature=1.0)
"""Temperature 1 (GLAM's, not the default): the logits are the candidates' scores."""
LORA = ModelConfig(name_or_path="tiny", lora=AdapterConfig(enabled=True, r=4, alpha=8))
FULL = ModelConfig(name_or_path="tiny", lora=AdapterConfig(enabled=False))


def lora_policy(arch: str = "llama", policy_cfg: PolicyConfig = SMALL_HEADS) -> LLMActorCritic:
    model, tokenizer = tiny_seq2seq_lm() if arch == "t5" else tiny_causal_lm(arch)
    return LLMActorCritic.from_model(model, tokenizer, LORA, policy_cfg, ACTION_WORDS)


def perturb_adapter(policy: LLMActorCritic) -> None:
    """LoRA starts as the identity (B = 0); give it weights that change the model."""
    with torch.no_grad():
        for name, parameter in policy.model.named_parameters():
            if "lora_B" in name:
                parameter.normal_(std=0.5, generator=torch.Generator().manual_seed(1))


# --------------------------------------------------------------------------------------------
# Heads
# --------------------------------------------------------------------------------------------


def test_heads_shapes_and_fp32():
    hidden = torch.randn(5, 12, dtype=torch.bfloat16)
    value = ValueHead(12, (8, 8), "sigmoid")
    heads = ActionHeads(12, 6, (8,), "relu")
    assert value(hidden).shape == (5,) and value(hidden).dtype == torch.float32
    assert heads(hidden).shape == (5, 6)
    linears = [m for m in value.modules() if isinstance(m, torch.nn.Linear)]
    assert [m.out_features for m in linears] == [8, 8, 1]
    assert sum(isinstance(m, torch.nn.Sigmoid) for m in value.modules()) == 2


def test_heads_run_in_fp32_under_autocast():
    """Accelerate's `mixed_precision: bf16` runs the policy's forward under autocast, which
    would compute the heads' linear layers in bf16."""
    hidden = torch.randn(5, 12, dtype=torch.bfloat16)
    for head in (ValueHead(12, (8, 8), "sigmoid"), ActionHeads(12, 6, (8,), "relu")):
        with torch.no_grad():
            expected = head(hidden)
            with torch.autocast("cpu", dtype=torch.bfloat16):
                output = head(hidden)
        assert output.dtype == torch.float32
        torch.testing.assert_close(output, expected, rtol=0, atol=0)


def test_heads_refuse_bad_settings():
    with pytest.raises(ValueError, match="activation='swish'"):
        ValueHead(12, (8,), "swish")
    with pytest.raises(ValueError, match="num_actions"):
        ActionHeads(12, 0, (8,), "relu")


# --------------------------------------------------------------------------------------------
# Scoring policy
# --------------------------------------------------------------------------------------------


def test_scoring_policy_logits_are_the_candidate_scores():
    policy = lora_policy()
    output = policy(PROMPTS, CANDIDATES)
    with torch.no_grad():
        expected = score_candidates(policy.model, policy.tokenizer, PROMPTS, CANDIDATES)
    assert output.logits.shape == (2, 6) and output.values.shape == (2,)
    torch.testing.assert_close(output.logits[output.mask], expected.scores[expected.mask])
    assert output.mask.sum(1).tolist() == [6, 2]
    probabilities = output.dist.probs
    torch.testing.assert_close(probabilities.sum(1), torch.ones(2))
    assert (probabilities[~output.mask] == 0).all()
    assert torch.isfinite(output.dist.entropy()).all()


def test_temperature_divides_the_scores_and_survives_a_round_trip(tmp_path):
    policy = lora_policy(policy_cfg=PolicyConfig(value_hidden_sizes=[16, 16], temperature=4.0))
    with torch.no_grad():
        output = policy(PROMPTS, CANDIDATES)
        scores = score_candidates(policy.model, policy.tokenizer, PROMPTS, CANDIDATES).scores
    torch.testing.assert_close(output.logits[output.mask], scores[output.mask] / 4.0)
    assert (output.dist.probs[~output.mask] == 0).all()
    # Flatter than the untempered policy: higher entropy on every prompt.
    assert (output.dist.entropy() > torch.distributions.Categorical(logits=scores).entropy()).all()
    policy.save_pretrained(tmp_path / "policy", include_base=True)
    assert LLMActorCritic.from_pretrained(tmp_path / "policy").policy_cfg.temperature == 4.0
    with pytest.raises(ValueError, match="policy.temperature must be > 0"):
        PolicyConfig(temperature=0.0)


@pytest.mark.parametrize("arch", ["t5", "gpt2"])
def test_dropout_is_off_in_train_mode_unless_kept(arch):
    """PPO compares a train-mode forward with an eval-mode one: dropout would make it noise."""
    model, tokenizer = tiny_seq2seq_lm() if arch == "t5" else tiny_causal_lm(arch)
    assert any(isinstance(m, torch.nn.Dropout) and m.p > 0 for m in model.modules())
    policy = LLMActorCritic.from_model(model, tokenizer, LORA, SMALL_HEADS, ACTION_WORDS)
    policy.train()
    with torch.no_grad():
        first, second = policy(PROMPTS, CANDIDATES), policy(PROMPTS, CANDIDATES)
        policy.eval()
        evaluated = policy(PROMPTS, CANDIDATES)
    torch.testing.assert_close(first.logits, second.logits, rtol=0, atol=0)
    torch.testing.assert_close(first.logits, evaluated.logits)
    # Kept on request: two train-mode forwards then differ.
    model, tokenizer = tiny_seq2seq_lm() if arch == "t5" else tiny_causal_lm(arch)
    keep = ModelConfig(name_or_path="tiny", lora=LORA.lora, disable_dropout=False)
    policy = LLMActorCritic.from_model(model, tokenizer, keep, SMALL_HEADS, ACTION_WORDS)
    policy.train()
    with torch.no_grad():
        assert not torch.equal(
            policy(PROMPTS, CANDIDATES).logits, policy(PROMPTS, CANDIDATES).logits
        )


def test_policy_gradients_reach_adapter_and_heads_but_not_the_base():
    policy = lora_policy()
    perturb_adapter(policy)
    output = policy(PROMPTS, CANDIDATES)
    loss = -output.dist.log_prob(torch.tensor([2, 1])).sum() + output.values.square().sum()
    loss = loss - 0.01 * output.dist.entropy().sum()
    loss.backward()
    trainable = dict(policy.named_parameters())
    assert all(p.requires_grad for p in policy.trainable_parameters())
    names = [n for n, p in trainable.items() if p.requires_grad]
    assert names and all("lora_" in n or "_head" in n for n in names)
    assert all(torch.isfinite(trainable[n].grad).all() for n in names)
    assert any(float(trainable[n].grad.abs().sum()) > 0 for n in names if "lora_A" in n)
    assert float(policy.value_head.net[0].weight.grad.abs().sum()) > 0
    frozen = [p for n, p in trainable.items() if "lora_" not in n and "_head" not in n]
    assert all(p.grad is None for p in frozen)


@pytest.mark.parametrize(
    ("arch", "targets"),
    [("llama", {"q_proj", "v_proj"}), ("gpt2", {"c_attn"}), ("t5", {"q", "v"})],
)
def test_lora_targets_per_architecture(arch, targets):
    policy = lora_policy(arch)
    assert isinstance(policy.model, PeftModel)
    assert set(default_lora_targets(policy.model.get_base_model())) == targets
    adapted = {
        name.split(".")[-1]
        for name, module in policy.model.named_modules()
        if hasattr(module, "lora_A") and len(module.lora_A) > 0
    }
    assert adapted == targets
    output = policy(PROMPTS, CANDIDATES)
    assert torch.isfinite(output.logits[output.mask]).all()


def test_full_fine_tuning_trains_every_weight():
    model, tokenizer = tiny_causal_lm("gpt2")
    policy = LLMActorCritic.from_model(model, tokenizer, FULL, SMALL_HEADS, ACTION_WORDS)
    assert not isinstance(policy.model, PeftModel)
    assert len(policy.trainable_parameters()) == len(list(policy.parameters()))


def test_value_from_base_ignores_the_adapter_and_sends_it_no_gradient():
    policy = lora_policy(policy_cfg=PolicyConfig(value_hidden_sizes=[16], value_from_base=True))
    before = policy(PROMPTS, CANDIDATES)
    perturb_adapter(policy)
    after = policy(PROMPTS, CANDIDATES)
    torch.testing.assert_close(after.values, before.values)
    assert float((after.logits - before.logits)[after.mask].detach().abs().max()) > 1e-3
    after.values.sum().backward()
    assert all(p.grad is None for n, p in policy.named_parameters() if "lora_" in n)
    with torch.no_grad(), policy.model.disable_adapter():
        base_hidden = prompt_hidden_states(policy.model, policy.tokenizer, PROMPTS)
    torch.testing.assert_close(after.values, policy.value_head(base_hidden))


def test_shared_value_reads_the_scoring_pass_hidden_state():
    policy = lora_policy()
    perturb_adapter(policy)
    output = policy(PROMPTS, CANDIDATES)
    hidden = prompt_hidden_states(policy.model, policy.tokenizer, PROMPTS)
    torch.testing.assert_close(output.values, policy.value_head(hidden), atol=1e-5, rtol=1e-5)


def test_value_from_base_needs_an_adapter():
    model, tokenizer = tiny_causal_lm("gpt2")
    with pytest.raises(ValueError, match="has no adapter"):
        LLMActorCritic(model, tokenizer, PolicyConfig(value_from_base=True), ACTION_WORDS)


def test_action_heads_policy():
    policy_cfg = PolicyConfig(head="action_heads", value_hidden_sizes=[16], temperature=1.0)
    policy = lora_policy("t5", policy_cfg)
    output = policy(PROMPTS)  # candidates default to the action words
    assert output.logits.shape == (2, 6) and output.mask.all()
    hidden = prompt_hidden_states(policy.model, policy.tokenizer, PROMPTS)
    torch.testing.assert_close(output.logits, policy.action_heads(hidden))
    with pytest.raises(ValueError, match="one output per action word"):
        policy(PROMPTS, CANDIDATES)
    with pytest.raises(ValueError, match="2 prompts, 1 candidate lists"):
        policy(PROMPTS, [ACTION_WORDS])
    with pytest.raises(ValueError, match="needs the action words"):
        LLMActorCritic(policy.model, policy.tokenizer, policy_cfg, [])


def test_gradient_checkpointing_and_bf16_autocast():
    model, tokenizer = tiny_causal_lm("llama")
    reference = LLMActorCritic(model, tokenizer, SMALL_HEADS, ACTION_WORDS)
    with torch.no_grad():
        expected = reference(PROMPTS, CANDIDATES)
    model_cfg = ModelConfig(name_or_path="tiny", gradient_checkpointing=True)
    policy = LLMActorCritic.from_model(model, tokenizer, model_cfg, SMALL_HEADS, ACTION_WORDS)
    policy.value_head.load_state_dict(reference.value_head.state_dict())
    base = policy.model.get_base_model()  # transformers 5.17 has the second name only
    assert getattr(base, "is_activation_checkpointing", None) or base.is_gradient_checkpointing
    policy.train()
    output = policy(PROMPTS, CANDIDATES)
    torch.testing.assert_close(output.logits[output.mask], expected.logits[expected.mask])
    output.values.sum().backward()

    bf16_cfg = ModelConfig(name_or_path="tiny", autocast_bf16=True)
    bf16 = LLMActorCritic(model, tokenizer, SMALL_HEADS, ACTION_WORDS, model_cfg=bf16_cfg).eval()
    bf16.value_head.load_state_dict(reference.value_head.state_dict())
    with torch.no_grad():
        rounded = bf16(PROMPTS, CANDIDATES)
    assert rounded.logits.dtype == torch.float32 and rounded.values.dtype == torch.float32
    difference = (rounded.logits - expected.logits)[expected.mask].abs()
    assert 0 < float(difference.max()) < 0.05 * float(expected.logits[expected.mask].abs().max())


@pytest.mark.parametrize("head", ["scoring", "action_heads"])
def test_policy_heads_are_fp32_under_the_launchers_bf16_autocast(head):
    policy = lora_policy(policy_cfg=PolicyConfig(head=head, value_hidden_sizes=[16, 16]))
    candidates = CANDIDATES if head == "scoring" else None
    inputs = {}  # the hidden state each head receives
    for name in ("value_head", "action_heads"):
        if getattr(policy, name) is not None:
            getattr(policy, name).register_forward_pre_hook(
                lambda _, args, name=name: inputs.__setitem__(name, args[0])
            )
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        output = policy(PROMPTS, candidates)
    assert output.values.dtype == torch.float32 and output.logits.dtype == torch.float32
    with torch.no_grad():  # the fp32 heads, outside autocast, on the same hidden state
        values = policy.value_head.net(inputs["value_head"].float()).squeeze(-1)
        torch.testing.assert_close(output.values, values, rtol=0, atol=0)
        if head == "action_heads":
            logits = policy.action_heads.net(inputs["action_heads"].float())
            logits = logits / policy.policy_cfg.temperature
            torch.testing.assert_close(output.logits, logits, rtol=0, atol=0)


@pytest.mark.parametrize("head", ["scoring", "action_heads"])
def test_the_launchers_bf16_autocast_reaches_the_language_model(head):
    """With `model.autocast_bf16` off, an outer autocast (Accelerate's `mixed_precision: bf16`)
    stays in force around the language model, which then computes in bf16; the values and
    logits stay fp32 (the heads switch autocast off for themselves)."""
    policy = lora_policy(policy_cfg=PolicyConfig(head=head, value_hidden_sizes=[16, 16]))
    assert not policy.model_cfg.autocast_bf16
    candidates = CANDIDATES if head == "scoring" else None
    seen: list[torch.dtype] = []  # output dtypes of the language model's linear layers
    for module in policy.model.modules():
        if isinstance(module, torch.nn.Linear):
            module.register_forward_hook(lambda _, __, output: seen.append(output.dtype))
    with torch.no_grad():
        policy(PROMPTS, candidates)
    assert seen and set(seen) == {torch.float32}  # no outer autocast: fp32 as loaded
    seen.clear()
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        output = policy(PROMPTS, candidates)
    assert seen and set(seen) == {torch.bfloat16}
    assert output.values.dtype == torch.float32 and output.logits.dtype == torch.float32


# --------------------------------------------------------------------------------------------
# Checkpoints
# --------------------------------------------------------------------------------------------


def assert_same_output(a: LLMActorCritic, b: LLMActorCritic) -> None:
    with torch.no_grad():
        out_a, out_b = a(PROMPTS, CANDIDATES), b(PROMPTS, CANDIDATES)
    torch.testing.assert_close(out_a.logits[out_a.mask], out_b.logits[out_b.mask])
    torch.testing.assert_close(out_a.values, out_b.values)


def test_lora_checkpoint_round_trip(tmp_path):
    folder = save_tiny_model(tmp_path / "tiny", "llama")
    model_cfg = ModelConfig(name_or_path=str(folder), lora=AdapterConfig(r=4, alpha=8))
    policy = LLMActorCritic.from_config(model_cfg, SMALL_HEADS, ACTION_WORDS)
    perturb_adapter(policy)

    # Pretrained base named by the config: only the adapter and the heads are written.
    policy.save_pretrained(tmp_path / "adapter_only")
    files = {p.relative_to(tmp_path).as_posix() for p in tmp_path.rglob("*") if p.is_file()}
    assert {
        "adapter_only/glam_policy.json",
        "adapter_only/heads.safetensors",
        "adapter_only/adapter/adapter_model.safetensors",
    } <= files
    assert not (tmp_path / "adapter_only" / "base").exists()
    meta = json.loads((tmp_path / "adapter_only" / "glam_policy.json").read_text())
    assert meta["weights"] == "adapter" and meta["action_words"] == ACTION_WORDS
    assert meta["model"]["lora"]["r"] == 4
    restored = LLMActorCritic.from_pretrained(tmp_path / "adapter_only")
    assert isinstance(restored.model, PeftModel)
    assert any(p.requires_grad for n, p in restored.named_parameters() if "lora_" in n)
    assert_same_output(policy, restored)

    # With the base weights included, the checkpoint no longer needs the original folder.
    policy.save_pretrained(tmp_path / "with_base", include_base=True)
    shutil.rmtree(folder)
    assert_same_output(policy, LLMActorCritic.from_pretrained(tmp_path / "with_base"))
    files = {p.name for p in tmp_path.rglob("*") if p.is_file()}
    assert not any(name.endswith((".bin", ".pt", ".pth", ".pkl")) for name in files)

    # The adapter is plain peft: it loads onto the base model without glam.
    base, _ = tiny_causal_lm("llama")
    peft_model = PeftModel.from_pretrained(base, tmp_path / "adapter_only" / "adapter")
    with torch.no_grad():
        direct = score_candidates(peft_model, policy.tokenizer, PROMPTS, CANDIDATES).scores
        expected = score_candidates(policy.model, policy.tokenizer, PROMPTS, CANDIDATES).scores
    torch.testing.assert_close(direct, expected)


def test_training_env_is_recorded_and_survives_a_resume(tmp_path):
    folder = save_tiny_model(tmp_path / "tiny", "llama")
    model_cfg = ModelConfig(name_or_path=str(folder), lora=AdapterConfig(r=4, alpha=8))
    env = EnvConfig(name="BabyAI-GoToRedBallNoDists-v0", nbr_obs=2, action_space="nav")
    policy = LLMActorCritic.from_config(model_cfg, SMALL_HEADS, ACTION_WORDS, training_env=env)
    policy.save_pretrained(tmp_path / "first")
    restored = LLMActorCritic.from_pretrained(tmp_path / "first")
    assert restored.training_env == asdict(env)
    # A resumed policy saved again without being told keeps its record.
    restored.save_pretrained(tmp_path / "second")
    assert LLMActorCritic.from_pretrained(tmp_path / "second").training_env == asdict(env)
    # The caller's env replaces the record: on resume, and as save_pretrained's argument.
    other = EnvConfig(name="BabyAI-GoToLocal-v0", nbr_obs=3, action_space="default")
    resumed = LLMActorCritic.from_pretrained(tmp_path / "second", training_env=other)
    assert resumed.training_env == asdict(other)
    restored.save_pretrained(tmp_path / "third", training_env=other)
    assert LLMActorCritic.from_pretrained(tmp_path / "third").training_env == asdict(other)
    # Built without one (or saved by an older version): no record.
    LLMActorCritic.from_config(model_cfg, SMALL_HEADS, ACTION_WORDS).save_pretrained(
        tmp_path / "fourth"
    )
    assert LLMActorCritic.from_pretrained(tmp_path / "fourth").training_env is None


def test_full_model_checkpoint_round_trip_with_action_heads(tmp_path):
    model, tokenizer = tiny_seq2seq_lm()
    policy_cfg = PolicyConfig(head="action_heads", value_hidden_sizes=[16])
    policy = LLMActorCritic.from_model(model, tokenizer, FULL, policy_cfg, ACTION_WORDS)
    with torch.no_grad():
        policy.action_heads.net[-1].bias.fill_(0.3)
    policy.save_pretrained(tmp_path)
    assert (tmp_path / "model" / "model.safetensors").is_file()
    restored = LLMActorCritic.from_pretrained(tmp_path)
    assert restored.policy_cfg == policy_cfg
    with torch.no_grad():
        out_a, out_b = policy(PROMPTS), restored(PROMPTS)
    torch.testing.assert_close(out_a.logits, out_b.logits)
    torch.testing.assert_close(out_a.values, out_b.values)


def test_npae_keeps_only_the_pretrained_embeddings(tmp_path):
    folder = save_tiny_model(tmp_path / "tiny", "gpt2")
    model_cfg = ModelConfig(name_or_path=str(folder), pretrained=False)
    policy = LLMActorCritic.from_config(
        model_cfg, PolicyConfig(head="action_heads", value_hidden_sizes=[16]), ACTION_WORDS
    )
    original, _ = tiny_causal_lm("gpt2")
    fresh = policy.model.get_base_model()
    torch.testing.assert_close(fresh.transformer.wte.weight, original.transformer.wte.weight)
    first_attention = fresh.transformer.h[0].attn.c_attn.weight
    assert not torch.allclose(first_attention, original.transformer.h[0].attn.c_attn.weight)
    assert policy(PROMPTS).logits.shape == (2, 6)


@pytest.mark.slow
def test_embedded_model_policy_with_lora_round_trip(tmp_path):
    """The real model: LoRA starts as the identity, and an adapter-only checkpoint restores."""
    policy_cfg = PolicyConfig(temperature=1.0)
    policy = LLMActorCritic.from_config(ModelConfig(), policy_cfg, ACTION_WORDS)
    policy.eval()
    prompts, candidates = PROMPTS[1:], CANDIDATES[1:]
    with torch.no_grad():
        output = policy(prompts, candidates)
        with policy.model.disable_adapter():
            base = score_candidates(policy.model, policy.tokenizer, prompts, candidates)
    torch.testing.assert_close(output.logits[output.mask], base.scores[base.mask])
    assert output.dist.probs[0, 0] > 0.05  # "pick up" is plausible for "pick up the blue key"
    perturb_adapter(policy)
    policy.save_pretrained(tmp_path)
    assert not (tmp_path / "base").exists()  # pretrained: reloaded from the embedded model
    restored = LLMActorCritic.from_pretrained(tmp_path).eval()
    with torch.no_grad():
        a, b = policy(prompts, candidates), restored(prompts, candidates)
    torch.testing.assert_close(a.logits[a.mask], b.logits[b.mask])
    torch.testing.assert_close(a.values, b.values)


def test_an_adapter_warm_starts_from_a_saved_one_of_the_same_shape(tmp_path):
    """`model.lora.init`: the saved adapter's weights, every one, and so the same scores; an
    adapter of another shape, or a folder without one, is refused."""
    from dataclasses import replace

    trained = lora_policy()
    perturb_adapter(trained)
    trained.model.save_pretrained(tmp_path / "bc")  # peft's format, as behavioural cloning's
    model, tokenizer = tiny_causal_lm("llama")
    warm = replace(LORA, lora=replace(LORA.lora, init=str(tmp_path / "bc")))
    started = LLMActorCritic.from_model(model, tokenizer, warm, SMALL_HEADS, ACTION_WORDS)
    saved = dict(trained.model.named_parameters())
    for name, parameter in started.model.named_parameters():
        if "lora_" in name:
            assert torch.equal(parameter, saved[name]), name
    with torch.no_grad():
        assert torch.allclose(
            started(PROMPTS, CANDIDATES).logits, trained(PROMPTS, CANDIDATES).logits, atol=1e-6
        )

    model, tokenizer = tiny_causal_lm("llama")
    other_rank = replace(warm, lora=replace(warm.lora, r=8))
    with pytest.raises(ValueError, match="its adapter has r=4, this run's 8"):
        LLMActorCritic.from_model(model, tokenizer, other_rank, SMALL_HEADS, ACTION_WORDS)
    model, tokenizer = tiny_causal_lm("llama")
    nothing = replace(warm, lora=replace(warm.lora, init=str(tmp_path)))
    with pytest.raises(FileNotFoundError, match="holds no adapter_config.json"):
        LLMActorCritic.from_model(model, tokenizer, nothing, SMALL_HEADS, ACTION_WORDS)


def test_running_norm_merges_batches_into_the_whole_datas_statistics():
    from glam.policy.heads import RunningNorm

    norm = RunningNorm(3)
    data = torch.randn(50, 3, generator=torch.Generator().manual_seed(0)) * 4 + 7
    assert torch.equal(norm(data.clone().requires_grad_()), data)  # no statistics yet: identity
    norm.eval()
    with torch.no_grad():
        for part in data.split([1, 7, 20, 22]):  # uneven batches, one of a single row
            norm(part)
    assert norm.count.item() == 50
    torch.testing.assert_close(norm.mean, data.double().mean(0))
    torch.testing.assert_close(norm.var, data.double().var(0, unbiased=False))
    norm.train()  # the update's forwards read the statistics without moving them
    out = norm(data)
    assert norm.count.item() == 50
    torch.testing.assert_close(out.mean(0), torch.zeros(3), atol=1e-5, rtol=0)
    torch.testing.assert_close(out.std(0, unbiased=False), torch.ones(3), atol=1e-4, rtol=0)


def test_a_normalised_value_head_keeps_its_statistics_in_a_checkpoint(tmp_path):
    folder = save_tiny_model(tmp_path / "tiny", "llama")
    model_cfg = ModelConfig(name_or_path=str(folder), lora=AdapterConfig(r=4, alpha=8))
    heads = PolicyConfig(value_hidden_sizes=[16], value_norm=True)
    policy = LLMActorCritic.from_config(model_cfg, heads, ACTION_WORDS)
    policy.eval()
    with torch.no_grad():
        values = policy(PROMPTS, CANDIDATES).values  # the rollout's forward: statistics move
    assert policy.value_head.norm.count.item() == len(PROMPTS)
    policy.save_pretrained(tmp_path / "policy")
    restored = LLMActorCritic.from_pretrained(tmp_path / "policy")
    assert restored.policy_cfg.value_norm
    torch.testing.assert_close(restored.value_head.norm.mean, policy.value_head.norm.mean)
    restored.train()  # the update's forward: the same statistics, the same values
    torch.testing.assert_close(restored(PROMPTS, CANDIDATES).values, values, atol=1e-5, rtol=0)
