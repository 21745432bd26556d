"""A policy that writes its action: reading answers, sampling and scoring them, the KV cache.

The sampled tokens' log-probabilities must be those of a teacher-forced forward of the same
tokens (PPO's first ratio is 1 only then), with and without the key-value cache kept across
turns; the cache must give a full forward's logits, and a misplaced cache must not.

.venv/bin/python -m pytest tests/test_writer.py -x -q
"""

from __future__ import annotations

import copy
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from helpers_tiny import one_torch_thread, tiny_causal_lm  # noqa: F401 (fixture)

from glam.config import AdapterConfig, ModelConfig, PolicyConfig
from glam.decoding import _CACHE, TurnCache, _past, sample_answers, score_answers
from glam.eval.generation import BalrogDialogue as EvalDialogue
from glam.policy.balrog import BalrogDialogue, feedback_sentence
from glam.policy.generation_config import GenerationConfig
from glam.policy.writer import Answers, WritingActorCritic, read_answer

NAV = ["turn left", "turn right", "go forward"]
PROMPTS = [
    "Possible action of the agent: turn left, turn right, go forward\n"
    "Goal of the agent: go to the red ball\nObservation 0: You see a red ball 2 steps forward,\n"
    "Action 0:",
    "Goal of the agent: open the grey door\nObservation 0: You see a wall 1 step right,\nAction 0:",
    "You see",
]


def _ids(tokenizer, texts: list[str]) -> list[torch.Tensor]:
    return [torch.tensor(tokenizer(text)["input_ids"]) for text in texts]


def _stop(tokenizer, *words: str) -> torch.Tensor:
    stop = torch.zeros(len(tokenizer), dtype=torch.bool)
    stop[tokenizer.eos_token_id] = True
    for word in words:
        stop[tokenizer.convert_tokens_to_ids(word)] = True
    return stop


# --------------------------------------------------------------------------------------------
# Reading answers
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "answer", "expected"),
    [
        (" turn left", "action", 0),
        ("Turn Left.", "action", 0),
        ("**go forward**", "action", 2),
        ("  turn   right \n", "action", 1),
        ("turn left, then go forward", "action", None),
        ("left", "action", None),
        ("", "action", None),
        ("The ball is ahead.\nACTION: go forward", "think", 2),
        ("First turn left. ACTION: turn left, ACTION: turn right", "think", 1),
        ("ACTION: fly", "think", None),
        ("go forward", "think", 2),  # BALROG's cot reading: no ACTION, the whole cleaned text
    ],
)
def test_answers_are_read_into_actions(text: str, answer: str, expected: int | None) -> None:
    assert read_answer(text, NAV, answer) == expected


def test_the_feedback_is_balrogs_notice_and_eval_reads_the_same_dialogue() -> None:
    assert feedback_sentence("go forward") == (
        "Your previous output did not contain a valid action. Defaulted to action: go forward"
    )
    assert EvalDialogue is BalrogDialogue  # one protocol, shared by training and evaluation
    dialogue = BalrogDialogue("naive")
    dialogue.add_observation(["You see a red ball 2 steps forward"])
    dialogue.add_answer("fly away", "go forward", invalid=True)
    dialogue.add_observation(["You see a red ball 1 step forward"])
    last = dialogue.messages("go to the red ball", NAV)[-1]["content"]
    assert feedback_sentence("go forward") in last


# --------------------------------------------------------------------------------------------
# Sampling and scoring
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("arch", ["llama", "gpt2", "gemma3"])
def test_sampled_log_probs_equal_a_teacher_forced_forward(arch: str) -> None:
    model, tokenizer = tiny_causal_lm(arch)
    prompts = _ids(tokenizer, PROMPTS)
    torch.manual_seed(0)
    sampled = sample_answers(
        model, prompts, max_new_tokens=6, temperature=0.7, stop=_stop(tokenizer), pad_id=0
    )
    logprobs, entropy, hidden = score_answers(
        model, prompts, sampled.tokens, sampled.lengths, temperature=0.7, pad_id=0
    )
    torch.testing.assert_close(logprobs, sampled.logprobs, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(entropy, sampled.entropy, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(hidden, sampled.prompt_hidden, rtol=1e-5, atol=1e-5)
    # The temperature is part of the distribution: scored at 1, the same tokens differ.
    at_one, _, _ = score_answers(
        model, prompts, sampled.tokens, sampled.lengths, temperature=1.0, pad_id=0
    )
    assert (at_one - sampled.logprobs).abs().max() > 1e-2


def test_an_answer_ends_with_its_stop_token_and_padding_counts_for_nothing() -> None:
    model, tokenizer = tiny_causal_lm()
    prompts = _ids(tokenizer, PROMPTS)
    # Stop at frequent tokens so that answers end at different lengths.
    vocab = tokenizer.get_vocab()
    common = [token for token in vocab if token.startswith("Ġ")][:60]
    stop = _stop(tokenizer, *common)
    torch.manual_seed(3)
    sampled = sample_answers(model, prompts, max_new_tokens=8, temperature=1.0, stop=stop, pad_id=0)
    lengths = sampled.lengths.tolist()
    assert len(set(lengths)) > 1 and sampled.stopped.any()
    for row, n, ended in zip(sampled.tokens, lengths, sampled.stopped.tolist(), strict=True):
        assert bool(stop[row[n - 1]]) == ended  # the stop token is the answer's last
        assert not stop[row[: n - 1]].any()
        assert (row[n:] == 0).all()
    after = torch.arange(sampled.tokens.shape[1]) >= sampled.lengths[:, None]
    assert (sampled.logprobs[after] == 0).all() and (sampled.logprobs[~after] < 0).all()
    # Garbage after an answer's end changes nothing of its score.
    noisy = sampled.tokens.masked_fill(after, 7)
    clean, _, _ = score_answers(
        model, prompts, sampled.tokens, sampled.lengths, temperature=1.0, pad_id=0
    )
    dirty, _, _ = score_answers(model, prompts, noisy, sampled.lengths, temperature=1.0, pad_id=0)
    assert torch.equal(clean, dirty)


def _turns(model, tokenizer, cache: TurnCache | None) -> list:
    """Three turns of a dialogue that only grows, each seeded the same way."""
    prompts = _ids(tokenizer, PROMPTS)
    results = []
    for turn in range(3):
        torch.manual_seed(10 + turn)
        sampled = sample_answers(
            model,
            prompts,
            max_new_tokens=5,
            temperature=1.0,
            stop=_stop(tokenizer),
            pad_id=0,
            cache=cache,
        )
        results.append(sampled)
        more = tokenizer(
            f"\nObservation {turn + 1}: You see a wall,\nAction {turn + 1}:",
            add_special_tokens=False,
        )
        prompts = [
            torch.cat(
                [ids, sampled.tokens[i, : sampled.lengths[i]], torch.tensor(more["input_ids"])]
            )
            for i, ids in enumerate(prompts)
        ]
    return results


def test_the_turn_cache_gives_the_tokens_and_log_probs_of_a_full_forward() -> None:
    model, tokenizer = tiny_causal_lm()
    cache = TurnCache()
    cached, full = _turns(model, tokenizer, cache), _turns(model, tokenizer, None)
    first = torch.tensor([len(ids) for ids in _ids(tokenizer, PROMPTS)])
    # Turn 2 reads at least turn 1's prompt from the cache (and the answer tokens fed back).
    assert cached[0].reused.sum() == 0 and (cached[1].reused >= first).all()
    assert (cached[2].reused > cached[1].reused).all()
    reused, total = cache.take_counts()
    assert 0 < reused < total
    for a, b in zip(cached, full, strict=True):
        assert torch.equal(a.tokens, b.tokens) and torch.equal(a.lengths, b.lengths)
        torch.testing.assert_close(a.logprobs, b.logprobs, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(a.prompt_hidden, b.prompt_hidden, rtol=1e-5, atol=1e-5)


def test_cached_keys_give_a_full_forwards_logits_and_a_misplaced_cache_does_not() -> None:
    model, tokenizer = tiny_causal_lm()
    (ids,) = _ids(tokenizer, PROMPTS[:1])
    full = model(input_ids=ids[None]).logits[0, -1]

    def logits_after(cache_ids: torch.Tensor, claimed: torch.Tensor) -> torch.Tensor:
        """Logits at the prompt's end, reading `claimed`'s keys from a forward of `cache_ids`."""
        cache = TurnCache()
        torch.manual_seed(0)
        sample_answers(
            model,
            [cache_ids],
            max_new_tokens=1,
            temperature=1.0,
            stop=_stop(tokenizer),
            pad_id=0,
            cache=cache,
        )
        cache.rows[0].ids = claimed
        reused = torch.tensor([cache.reusable(0, ids)])
        past = _past(cache, reused, int(reused[0]), torch.device("cpu"))
        n = int(reused[0])
        positions = torch.arange(n, len(ids))[None]
        return model(input_ids=ids[None, n:], position_ids=positions, **{_CACHE: past}).logits[
            0, -1
        ]

    head = ids[:-3]
    torch.testing.assert_close(logits_after(head, head), full, rtol=1e-5, atol=1e-5)
    # The keys of the head without its first token, claimed as the head's first tokens: a cache
    # one token short (every position shifted) must not pass for the real one.
    wrong = logits_after(head[1:], head[:-1])
    assert (wrong - full).abs().max() > 1e-3


# --------------------------------------------------------------------------------------------
# The policy
# --------------------------------------------------------------------------------------------


def _writer(tmp_path: Path | None = None, **generation: object) -> WritingActorCritic:
    model, tokenizer = tiny_causal_lm()
    model_cfg = ModelConfig(
        name_or_path="tiny", lora=AdapterConfig(enabled=True), autocast_bf16=False
    )
    policy = WritingActorCritic.from_model(
        model,
        tokenizer,
        model_cfg,
        PolicyConfig(value_hidden_sizes=[16], value_activation="tanh"),
        NAV,
    )
    policy.generation = GenerationConfig(**{"max_new_tokens": 4, **generation})
    return policy


def test_the_writer_writes_reads_and_scores_its_answers(tmp_path: Path) -> None:
    policy = _writer().eval()
    torch.manual_seed(0)
    written = policy(PROMPTS)
    answers = written.answers
    assert isinstance(answers, Answers) and len(answers) == len(PROMPTS)
    expected = [read_answer(text, NAV) for text in answers.texts]
    assert answers.actions.tolist() == [3 if e is None else e for e in expected]
    assert torch.equal(written.dist.sample(), answers.actions)
    policy.train()
    scored = policy(PROMPTS, answers)
    old = written.dist.log_prob(answers.actions)
    torch.testing.assert_close(scored.dist.log_prob(answers.actions), old, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(scored.values, written.values, rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match="the actions its answers named"):
        scored.dist.log_prob((answers.actions + 1) % 3)
    # The folder keeps the generation settings; the restored policy scores the same.
    policy.generation = GenerationConfig(max_new_tokens=5, temperature=0.5, answer="think")
    folder = policy.save_pretrained(tmp_path / "policy", include_base=True)
    restored = WritingActorCritic.from_pretrained(folder)
    assert restored.generation == policy.generation
    again = restored.train()(PROMPTS, answers)
    torch.testing.assert_close(again.token_logprobs, policy(PROMPTS, answers).token_logprobs)


def test_action_answers_stop_at_a_newline_and_think_answers_do_not() -> None:
    policy = _writer()
    newline = policy.tokenizer.convert_tokens_to_ids("Ċ")
    eos = policy.tokenizer.eos_token_id
    assert policy.stop_tokens()[newline] and policy.stop_tokens()[eos]
    thinking = _writer(answer="think")
    assert not thinking.stop_tokens()[newline] and thinking.stop_tokens()[eos]


def test_training_mode_forgets_the_kept_keys() -> None:
    policy = _writer().eval()
    policy(PROMPTS)
    assert policy.turn_cache.rows and policy.turn_cache.nbytes > 0
    policy.train()
    assert not policy.turn_cache.rows


# --------------------------------------------------------------------------------------------
# The evaluation harness plays a writing checkpoint
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("prompt_format", ["glam", "balrog"])
def test_the_harness_plays_a_writing_policy_in_its_prompt_format(
    tmp_path: Path, prompt_format: str
) -> None:
    from dataclasses import replace

    from glam.eval.builders import build_agent
    from glam.eval.config import AgentConfig
    from glam.eval.episodes import run_suite
    from glam.eval.suites import SUITES
    from glam.eval.writing_agent import WritingAgent

    policy = _writer()
    policy.policy_cfg = replace(policy.policy_cfg, prompt_format=prompt_format)
    folder = policy.save_pretrained(tmp_path / "policy", include_base=True)
    agent = build_agent(
        AgentConfig(kind="checkpoint", path=str(folder), device="cpu"), greedy=False
    )
    assert isinstance(agent, WritingAgent)

    def play() -> list:
        run = run_suite(
            agent,
            SUITES["no_change"],
            level="BabyAI-GoToRedBallNoDists-v0",
            episodes=3,
            num_envs=2,
            seed_base=10**12,
            nbr_obs=1,
            action_space="nav",
            max_steps=4,
        )
        return [(e.seed, e.length, e.invalid_actions, e.success) for e in run.episodes]

    act, played = agent.act, []
    agent.act = lambda request: played.extend(act(request)) or played[-len(request.prompts) :]
    first = play()
    assert [seed for seed, *_ in first] == [10**12, 10**12 + 1, 10**12 + 2]
    # A random model's answers are not actions: each step counted invalid, played as in
    # training (generate.invalid_action=noop): the no-op, never "go forward".
    assert all(invalid == length for _, length, invalid, _ in first)
    assert played and all(d.invalid and d.action is None for d in played)
    assert play() == first  # the episodes' own RNGs seed the writing
    if prompt_format == "glam":  # the report says how many answers named no action
        from glam.eval.config import EvalConfig, PostTrainingTestsConfig
        from glam.eval.harness import evaluate

        eval_cfg = EvalConfig(
            level="BabyAI-GoToRedBallNoDists-v0",
            action_space="nav",
            suites=["no_change"],
            episodes=2,
            num_envs=2,
            max_steps=3,
            output_dir=str(tmp_path / "eval"),
            progress_bar=False,
        )
        agent_cfg = AgentConfig(kind="checkpoint", path=str(folder), device="cpu")
        _, paths = evaluate(PostTrainingTestsConfig(agent=agent_cfg, eval=eval_cfg))
        assert "no_change: 100.0% of the written answers named no action" in paths["md"].read_text()


@pytest.mark.parametrize("agent_type", ["naive", "cot"])
def test_a_writing_checkpoint_plays_balrogs_protocol_with_its_adapter(
    tmp_path: Path, agent_type: str
) -> None:
    """agent.protocol=generation: the checkpoint's model, adapter folded in, answers BALROG's
    dialogue through the harness, which writes BALROG's results; the adapter's answers are not
    the base model's, so the run plays the trained weights."""
    from glam.eval.builders import build_agent
    from glam.eval.config import AgentConfig, EvalConfig, PostTrainingTestsConfig
    from glam.eval.config import GenerationConfig as DialogueConfig
    from glam.eval.episodes import run_suite
    from glam.eval.generation import GenerationAgent
    from glam.eval.harness import evaluate
    from glam.eval.suites import SUITES
    from glam.llm.config import ClientConfig

    policy = _writer()  # trained in GLAM's format: BALROG's dialogue is new to it
    with torch.no_grad():  # a trained adapter: its B matrices away from their initial 0
        for name, weights in policy.model.named_parameters():
            if "lora_B" in name:
                weights.normal_(0.0, 0.5, generator=torch.Generator().manual_seed(0))
    env = {"name": "BabyAI-GoToRedBallNoDists-v0", "nbr_obs": 1, "action_space": "nav"}
    folder = policy.save_pretrained(tmp_path / "policy", include_base=True, training_env=env)
    dialogue = DialogueConfig(agent_type=agent_type, max_history=2)
    client = ClientConfig(max_tokens=6)
    writing = {"protocol": "generation", "device": "cpu"}
    checkpoint = AgentConfig(kind="checkpoint", path=str(folder), **writing)
    base = AgentConfig(kind="zero_shot", model=str(folder / "base"), **writing)

    def play(cfg: AgentConfig) -> GenerationAgent:
        agent = build_agent(cfg, greedy=False, generation=dialogue, client=client)
        assert isinstance(agent, GenerationAgent)
        run_suite(
            agent,
            SUITES["no_change"],
            level=env["name"],
            episodes=2,
            num_envs=2,
            seed_base=10**12,
            nbr_obs=1,
            action_space="nav",
            max_steps=2,
        )
        return agent

    trained = play(checkpoint)
    assert trained.trained_action_space == "nav" and len(trained.answers) >= 2
    assert trained.answers != play(base).answers
    results, paths = evaluate(
        PostTrainingTestsConfig(
            agent=checkpoint,
            eval=EvalConfig(
                level=env["name"],
                episodes=2,
                num_envs=2,
                max_steps=3,
                generation=dialogue,
                client=client,
                output_dir=str(tmp_path / "eval"),
                progress_bar=False,
            ),
        )
    )
    assert results["protocol"] == "generation"
    assert results["label"].startswith("checkpoint-generation:")
    record = results["suites"]["no_change"]
    assert (record["prompt_format"], record["action_space"]) == ("balrog", "nav")
    usage = results["generation"]
    steps = sum(json.loads(line)["length"] for line in paths["episodes"].read_text().splitlines())
    assert usage["answers"] == steps > 2 and usage["completion_tokens"] <= 6 * steps
    # Each turn after an episode's first read its slot's last turn from the cache.
    assert 0 < usage["cached_prompt_tokens"] < usage["prompt_tokens"]
    assert "## BALROG's form" in paths["md"].read_text()
    assert f"agent {agent_type}, 2 turns" in paths["md"].read_text()


def test_the_generation_benchmark_refuses_bad_options_before_it_plays(tmp_path: Path) -> None:
    script = Path(__file__).resolve().parents[1] / "scripts" / "bench_generation.py"
    for options, message in (
        (["--envs", "0"], "argument --envs: must be >= 1, got 0"),
        (["--model", "tiny-random-llama", "--out", str(tmp_path)], "is a folder"),
    ):
        done = subprocess.run(
            [sys.executable, str(script), *options], capture_output=True, text=True, timeout=120
        )
        assert done.returncode == 2 and message in done.stderr, done.stderr[-2000:]


def test_the_answer_probe_counts_what_a_policy_and_its_base_write(tmp_path: Path) -> None:
    """scripts/probe_answers.py: every answer is counted once, as an action or as none, for the
    policy and, from a checkpoint, its base with the adapter off; bad options stop it first."""
    script = Path(__file__).resolve().parents[1] / "scripts" / "probe_answers.py"
    policy = _writer()
    policy.save_pretrained(tmp_path / "checkpoint" / "policy", include_base=True)
    out = tmp_path / "probe.json"
    command = [sys.executable, str(script), "--checkpoint", str(tmp_path / "checkpoint")]
    options = ["--envs", "2", "--samples", "3", "--orders", "all", "--out", str(out)]
    done = subprocess.run(command + options, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    rows = json.loads(out.read_text())["rows"]
    assert len(rows) == 6 * 2  # every order of the three actions, the policy and its base
    assert {row["variant"] for row in rows} == {"policy", "base (adapter off)"}
    for row in rows:
        assert row["answers"] == sum(row["counts"].values()) == 2 * 3
        assert list(row["counts"]) == [*NAV, "(no action)"]
        assert sum(row["shares"].values()) == pytest.approx(1.0)
    for options, message in (
        (["--orders", "all", "--prompt-format", "chat"], "use --prompt-format glam"),
        (["--temperature", "0"], "--temperature must be > 0"),
        (["--action-space", "default"], "are not --action-space's"),
    ):
        done = subprocess.run(command + options, capture_output=True, text=True, timeout=300)
        assert done.returncode == 2 and message in done.stderr, done.stderr[-2000:]


def test_keys_kept_with_the_adapter_on_are_not_read_with_it_off() -> None:
    """The turn cache knows which weights kept its keys: the base model (inside
    `disable_adapter()`) after the adapted one writes what a fresh base writes."""
    policy = _writer().eval()
    with torch.no_grad():  # an adapter away from the identity: it changes the answers
        for name, weights in policy.model.named_parameters():
            if "lora_B" in name:
                weights.normal_(0.0, 0.5, generator=torch.Generator().manual_seed(0))
    fresh = copy.deepcopy(policy)
    prompts = ["Goal of the agent: go to the red ball\nObservation 0: a wall\nAction 0:"] * 3

    def base_answers(writer: WritingActorCritic) -> Answers:
        torch.manual_seed(4)
        with torch.no_grad(), writer.model.disable_adapter():
            return writer(prompts).answers

    torch.manual_seed(4)
    with torch.no_grad():
        adapted = policy(prompts).answers  # fills the cache with the adapter's keys
    assert len(policy.turn_cache.rows) == 3
    kept, expected = base_answers(policy), base_answers(fresh)
    assert kept.texts == expected.texts
    torch.testing.assert_close(kept.logprobs, expected.logprobs, rtol=1e-5, atol=1e-5)
    assert not torch.allclose(adapted.logprobs[:, 0], expected.logprobs[:, 0], atol=1e-3)
