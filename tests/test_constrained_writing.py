"""Constrained written actions (`generate.constrain=actions`, `glam.decoding.AnswerTrie`): every
answer is an action word, the log-probability of a sampled answer is the constrained
distribution's (renormalised over the allowed tokens at each step) computed by brute force, the
same in the rollout and in the update, and a writer at temperature 1 draws every action. With
`generate.answer=think` (`ThoughtThenAnswer`) a free thought comes first, and only what follows
"ACTION:" is constrained.

.venv/bin/python -m pytest tests/test_constrained_writing.py
"""

from __future__ import annotations

import math

import pytest
import torch
from helpers_tiny import one_torch_thread, tiny_causal_lm  # noqa: F401 (fixture)

from glam.config import AdapterConfig, ModelConfig, PolicyConfig
from glam.decoding import AnswerTrie, ThoughtThenAnswer, sample_answers, score_answers
from glam.policy.generation_config import GenerationConfig
from glam.policy.writer import WritingActorCritic, read_answer

NAV = ["turn left", "turn right", "go forward"]
PROMPT = (
    "Possible action of the agent: turn left, turn right, go forward\n"
    "Goal of the agent: go to the red ball\nObservation 0: You see a red ball 2 steps forward,\n"
    "Action 0:"
)


def test_the_trie_allows_continuations_and_the_end_only_after_a_whole_answer() -> None:
    trie = AnswerTrie([[5, 6], [5, 6, 7], [8]], stop_ids=[0])
    assert trie.allowed([]) == [5, 8]
    assert trie.allowed([5]) == [6]
    assert trie.allowed([5, 6]) == [0, 7]  # a whole answer that another one goes on from
    assert trie.allowed([8]) == [0]
    assert trie.allowed([8, 0]) == [] and trie.allowed([9]) == []
    assert trie.longest == 4
    mask = trie.mask(torch.tensor([[5, 6], [8, 0]]), vocab=10)
    assert mask[0].nonzero().flatten().tolist() == [0, 7] and not mask[1].any()
    teacher = trie.teacher_mask(torch.tensor([[5, 6, 0]]), vocab=10)
    assert [row.nonzero().flatten().tolist() for row in teacher[0]] == [[5, 8], [6], [0, 7]]
    with pytest.raises(ValueError, match="at least one answer"):
        AnswerTrie([[]], stop_ids=[0])


def test_a_thought_is_free_until_the_marker_then_the_trie_decides() -> None:
    trie = AnswerTrie([[5, 6], [8]], stop_ids=[0])
    think = ThoughtThenAnswer([10, 11], trie, budget=8, stop_ids=[0])
    assert think.longest == 5  # the marker's 2 tokens and "5 6 <end>"
    assert think.allowed([]) is None and think.allowed([1, 2]) is None  # a thought
    assert think.allowed([1, 10]) is None  # a marker begun may still be dropped
    assert think.allowed([1, 2, 3]) == [10]  # 5 tokens left: only the room for the rest
    assert think.allowed([1, 2, 3, 10]) == [11]
    assert think.allowed([1, 10, 11]) == [5, 8] and think.allowed([10, 11, 5, 6]) == [0]
    assert think.allowed([10, 11, 8, 0]) == []
    mask = think.mask(torch.tensor([[1, 2], [10, 11]]), vocab=12)
    assert mask[0].all() == False and mask[0, 1:].all() and not mask[0, 0]  # noqa: E712  the end
    assert mask[1].nonzero().flatten().tolist() == [5, 8]
    teacher = think.teacher_mask(torch.tensor([[1, 10, 11, 8]]), vocab=12)
    assert torch.equal(teacher[0, 3], think.mask(torch.tensor([[1, 10, 11]]), 12)[0])
    with pytest.raises(ValueError, match="more than the 4"):
        ThoughtThenAnswer([10, 11], trie, budget=4, stop_ids=[0])


def _dense_constrained(constraint, logits, answers, keep) -> torch.Tensor:
    """The naive form of `constrain_teacher`: the `(B, T, vocab)` mask of every position's
    allowed tokens, -inf elsewhere; rows outside `keep` or allowing nothing left as they are."""
    allowed = constraint.teacher_mask(answers.masked_fill(~keep, 0), logits.shape[-1])
    allowed &= keep[:, :, None]
    return logits.masked_fill(~allowed & allowed.any(-1, keepdim=True), float("-inf"))


def test_the_update_constrains_the_answers_without_a_dense_mask_as_with_one() -> None:
    """`constrain_teacher` (lists of allowed ids, the marker found once per row) against the
    dense `teacher_mask`: the same logits for answers that think, write the marker by accident
    or run out of room, stop, and pad."""
    trie = AnswerTrie([[5, 6], [5, 6, 7], [8]], stop_ids=[0])
    think = ThoughtThenAnswer([10, 11], trie, budget=9, stop_ids=[0])
    generator = torch.Generator().manual_seed(0)
    for constraint in (trie, think):
        answers = torch.tensor(
            [
                [1, 10, 11, 5, 6, 0, 3, 3, 3],  # a thought, the marker, an answer, padding
                [10, 2, 10, 11, 8, 0, 0, 0, 0],  # a marker begun and dropped, then the marker
                [3, 4, 3, 4, 10, 11, 5, 6, 7],  # out of room: the marker then the longest answer
                [5, 6, 7, 0, 1, 1, 1, 1, 1],  # a trie answer straight away
                [8, 0, 9, 9, 9, 9, 9, 9, 9],
            ]
        )
        keep = torch.ones_like(answers, dtype=torch.bool)
        keep[0, 6:] = keep[3, 4:] = keep[4, 2:] = False
        for _ in range(3):
            logits = torch.randn((*answers.shape, 12), generator=generator)
            fast = constraint.constrain_teacher(logits, answers, keep)
            assert torch.equal(fast, _dense_constrained(constraint, logits, answers, keep))
        assert constraint.teacher_allowed(answers) == [
            [constraint.allowed(row[:step]) for step in range(len(row))] for row in answers.tolist()
        ]


def _brute_force_logprob(
    model, prompt: torch.Tensor, answer: list[int], trie, temperature: float, stops=()
) -> float:
    """Each token by its own forward of prompt + the answer so far, the softmax over the tokens
    the constraint allows there (all but the `stops` where it says None: a thought)."""
    total = 0.0
    for step, token in enumerate(answer):
        ids = torch.cat([prompt, torch.tensor(answer[:step], dtype=torch.long)])[None]
        with torch.no_grad():
            logits = model(input_ids=ids).logits[0, -1].double() / temperature
        allowed = trie.allowed(answer[:step])
        if allowed is None:
            allowed = [i for i in range(len(logits)) if i not in stops]
        total += float(logits[token] - torch.logsumexp(logits[allowed], 0))
    return total


@pytest.mark.parametrize("arch", ["llama", "gpt2", "gemma3"])
def test_constrained_answers_and_their_log_probs_against_brute_force(
    arch: str,
    one_torch_thread,  # noqa: F811
) -> None:
    model, tokenizer = tiny_causal_lm(arch)
    words = [tokenizer(f" {word}", add_special_tokens=False)["input_ids"] for word in NAV]
    trie = AnswerTrie(words, stop_ids=[tokenizer.eos_token_id])
    stop = torch.zeros(len(tokenizer), dtype=torch.bool)
    stop[tokenizer.eos_token_id] = True
    prompts = [torch.tensor(tokenizer(PROMPT)["input_ids"])] * 6 + [
        torch.tensor(tokenizer("You see")["input_ids"])
    ]
    torch.manual_seed(0)
    sampled = sample_answers(
        model,
        prompts,
        max_new_tokens=trie.longest,
        temperature=0.8,
        stop=stop,
        pad_id=0,
        allowed=trie,
    )
    assert sampled.stopped.all()
    for row, prompt in enumerate(prompts):
        answer = sampled.tokens[row, : int(sampled.lengths[row])].tolist()
        assert answer[:-1] in words and answer[-1] == tokenizer.eos_token_id
        expected = _brute_force_logprob(model, prompt, answer, trie, 0.8)
        assert float(sampled.logprobs[row].sum()) == pytest.approx(expected, abs=1e-4)
    scored, entropy, _ = score_answers(
        model, prompts, sampled.tokens, sampled.lengths, temperature=0.8, pad_id=0, allowed=trie
    )
    torch.testing.assert_close(scored, sampled.logprobs, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(entropy, sampled.entropy, rtol=1e-5, atol=1e-5)
    # A forced token (the only one allowed) has probability 1 and entropy 0.
    forced = [
        s
        for s in range(sampled.tokens.shape[1])
        if len(trie.allowed(sampled.tokens[0, :s].tolist())) == 1 and s < int(sampled.lengths[0])
    ]
    for step in forced:
        assert float(sampled.logprobs[0, step]) == pytest.approx(0.0, abs=1e-6)
        assert float(sampled.entropy[0, step]) == pytest.approx(0.0, abs=1e-6)
    # Unconstrained, the same tokens score lower: the free distribution spreads over the vocab.
    free, _, _ = score_answers(
        model, prompts, sampled.tokens, sampled.lengths, temperature=0.8, pad_id=0
    )
    assert (free.sum(1) < scored.sum(1)).all()


def test_thought_then_action_against_brute_force(one_torch_thread) -> None:  # noqa: F811
    model, tokenizer = tiny_causal_lm("llama")
    words = [tokenizer(f" {word}", add_special_tokens=False)["input_ids"] for word in NAV]
    end = tokenizer.eos_token_id
    marker = tokenizer("ACTION:", add_special_tokens=False)["input_ids"]
    think = ThoughtThenAnswer(marker, AnswerTrie(words, stop_ids=[end]), budget=20, stop_ids=[end])
    stop = torch.zeros(len(tokenizer), dtype=torch.bool)
    stop[end] = True
    prompts = [torch.tensor(tokenizer(PROMPT)["input_ids"])] * 4
    torch.manual_seed(0)
    sampled = sample_answers(
        model, prompts, max_new_tokens=20, temperature=1.0, stop=stop, pad_id=0, allowed=think
    )
    assert sampled.stopped.all()
    for row, prompt in enumerate(prompts):
        answer = sampled.tokens[row, : int(sampled.lengths[row])].tolist()
        text = tokenizer.decode(answer, skip_special_tokens=True)
        assert read_answer(text, NAV, answer="think") is not None, text
        assert answer[-1] == end and len(answer) > think.longest  # a thought came first
        expected = _brute_force_logprob(model, prompt, answer, think, 1.0, stops=[end])
        assert float(sampled.logprobs[row].sum()) == pytest.approx(expected, abs=1e-4)
    scored, entropy, _ = score_answers(
        model, prompts, sampled.tokens, sampled.lengths, temperature=1.0, pad_id=0, allowed=think
    )
    torch.testing.assert_close(scored, sampled.logprobs, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(entropy, sampled.entropy, rtol=1e-5, atol=1e-5)


def _writer(**generation: object) -> WritingActorCritic:
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
    policy.generation = GenerationConfig(**{"max_new_tokens": 6, **generation})
    return policy


def _update_scores_as_drawn(policy: WritingActorCritic, written) -> None:
    """The update scores the rollout's answers as they were drawn: PPO's first ratio is 1."""
    answers = written.answers
    policy.train()
    scored = policy([PROMPT] * len(answers.actions), answers)
    torch.testing.assert_close(
        scored.dist.log_prob(answers.actions),
        written.dist.log_prob(answers.actions),
        rtol=1e-5,
        atol=1e-5,
    )


def test_a_constrained_writer_writes_every_action_and_only_actions(one_torch_thread) -> None:  # noqa: F811
    policy = _writer(constrain="actions").eval()
    torch.manual_seed(0)
    written = policy([PROMPT] * 64)
    answers = written.answers
    assert answers.valid.all()  # never the invalid index
    counts = torch.bincount(answers.actions, minlength=3).tolist()
    assert all(count > 0 for count in counts), counts
    assert [read_answer(text, NAV) for text in answers.texts] == answers.actions.tolist()
    _update_scores_as_drawn(policy, written)
    # The three actions' probabilities (each over its two spellings) sum to 1 at most.
    assert float(written.dist.log_prob(answers.actions).exp().max()) <= 1.0 + 1e-6


def test_the_free_tiny_writer_writes_invalid_answers_where_the_constrained_one_does_not(
    one_torch_thread,  # noqa: F811
) -> None:
    free = _writer().eval()
    torch.manual_seed(0)
    assert not free([PROMPT] * 32).answers.valid.all()  # a random model rarely writes an action


def test_a_constrained_thinker_writes_every_action_after_its_thought(
    one_torch_thread,  # noqa: F811
) -> None:
    # Room for a thought (the tiny tokenizer spells "ACTION:" in 7 tokens); temperature 1.
    policy = _writer(constrain="actions", answer="think", max_new_tokens=24).eval()
    torch.manual_seed(0)
    written = policy([PROMPT] * 48)
    answers = written.answers
    assert answers.valid.all()
    assert (answers.lengths > policy.answer_trie().longest).all()  # each thought before it
    assert all(count > 0 for count in torch.bincount(answers.actions, minlength=3).tolist())
    assert all("ACTION:" in text for text in answers.texts)
    assert [read_answer(t, NAV, "think") for t in answers.texts] == answers.actions.tolist()
    _update_scores_as_drawn(policy, written)


def test_constraints_that_cannot_hold_are_refused() -> None:
    thinker = _writer(constrain="actions", answer="think", max_new_tokens=4)
    with pytest.raises(ValueError, match='"ACTION:" and the longest action .*max_new_tokens=4'):
        thinker.answer_trie()
    with pytest.raises(ValueError, match="generate.constrain"):
        GenerationConfig(constrain="words")
    policy = _writer(constrain="actions", max_new_tokens=1)
    with pytest.raises(ValueError, match="more than generate.max_new_tokens=1"):
        policy.answer_trie()
    assert _writer().answer_trie() is None
    assert math.isfinite(_writer(constrain="actions").answer_trie().longest)


def test_the_constrained_loss_has_finite_gradients(one_torch_thread) -> None:  # noqa: F811
    """The tokens the constraint excludes have log-probability -inf: neither the answer's
    log-probability nor its entropy (PPO's bonus) may send NaN back through them."""
    model, tokenizer = tiny_causal_lm()
    words = [tokenizer(f" {word}", add_special_tokens=False)["input_ids"] for word in NAV]
    trie = AnswerTrie(words, stop_ids=[tokenizer.eos_token_id])
    prompts = [torch.tensor(tokenizer(PROMPT)["input_ids"])] * 2
    answers = torch.tensor([words[2] + [tokenizer.eos_token_id], words[0] + [0]])
    lengths = torch.tensor([len(words[2]) + 1, len(words[0])])
    logprobs, entropy, _ = score_answers(
        model, prompts, answers, lengths, temperature=1.0, pad_id=0, allowed=trie
    )
    (logprobs.sum() - 0.01 * entropy.sum()).backward()
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    assert grads and all(torch.isfinite(g).all() for g in grads)
