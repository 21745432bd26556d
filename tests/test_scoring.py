"""The packed scorer equals the naive per-candidate forward, and its tokenisation is the model's."""

from __future__ import annotations

import warnings

import pytest
import torch
from helpers_tiny import (
    ACTION_WORDS,
    one_torch_thread,  # noqa: F401  (autouse fixture: one torch thread)
    tiny_causal_lm,
    tiny_seq2seq_lm,
    tiny_tokenizer,
)
from transformers import LlamaConfig, LlamaModel

from glam.policy.adapters import enable_gradient_checkpointing
from glam.policy.prompts import chat_prompt, glam_prompt
from glam.scoring import (
    model_kind,
    pack_rows,
    prompt_hidden_states,
    score_actions,
    score_actions_naive,
    score_candidates,
    tokenize_candidates,
)

TOLERANCE = 1e-4

OBSERVATIONS = [
    ["You see a wall 2 steps forward", "You see a red ball 1 step left and 2 steps forward"],
    ["You carry a blue key", "You see a wall 1 step right"],
    ["You see a closed yellow door 3 steps left and 2 steps forward"],
]
# Ragged on purpose: prompts of different lengths, and 6, 2 and 3 candidates.
PROMPTS = [
    glam_prompt("go to the red ball", ACTION_WORDS, OBSERVATIONS, ["turn left", "go forward"]),
    glam_prompt("pick up the blue key", ACTION_WORDS, OBSERVATIONS[:1], []),
    glam_prompt("open the yellow door", ACTION_WORDS, OBSERVATIONS[1:], ["toggle"]),
    glam_prompt("go to the red box", ACTION_WORDS[:3], [[]], []),
]
CANDIDATES = [ACTION_WORDS, ["pick up", "turn left"], ["toggle", "drop", "go forward"], ["drop"]]

BUILDERS = {
    "llama": lambda: tiny_causal_lm("llama"),
    "llama-eager": lambda: tiny_causal_lm("llama", attn_implementation="eager"),
    "gpt2": lambda: tiny_causal_lm("gpt2"),
    # Gemma 3: local layers that see 8 positions back, under a global one (tests/test_gemma.py)
    "gemma3": lambda: tiny_causal_lm("gemma3"),
    "t5": lambda: tiny_seq2seq_lm(),
    "bart": lambda: tiny_seq2seq_lm("bart"),  # absolute decoder positions: one row per candidate
}


@pytest.fixture(scope="module", params=sorted(BUILDERS))
def tiny(request):
    return BUILDERS[request.param]()


def max_difference(a: list[torch.Tensor], b: list[torch.Tensor]) -> float:
    assert [len(x) for x in a] == [len(x) for x in b]
    return max(float((x - y).abs().max()) for x, y in zip(a, b, strict=True))


@pytest.mark.parametrize("padding_side", ["left", "right"])
def test_packed_scores_equal_naive_forward(tiny, padding_side):
    model, tokenizer = tiny
    tokenizer.padding_side = padding_side
    with torch.no_grad():
        packed = score_actions(model, tokenizer, PROMPTS, CANDIDATES)
        naive = score_actions_naive(model, tokenizer, PROMPTS, CANDIDATES)
    assert [len(s) for s in packed] == [6, 2, 3, 1]
    assert max_difference(packed, naive) < TOLERANCE
    # The check means something only if candidates' scores are far apart.
    assert float(packed[0].max() - packed[0].min()) > 1.0


@pytest.mark.parametrize("normalization", ["sum", "token", "word"])
@pytest.mark.parametrize("append_eos", [False, True])
def test_normalizations_and_eos_equal_naive(tiny, normalization, append_eos):
    model, tokenizer = tiny
    with torch.no_grad():
        packed = score_actions(
            model, tokenizer, PROMPTS, CANDIDATES, normalization, append_eos=append_eos
        )
        naive = score_actions_naive(
            model, tokenizer, PROMPTS, CANDIDATES, normalization, append_eos=append_eos
        )
    assert max_difference(packed, naive) < TOLERANCE


def test_token_and_word_normalization_divide_the_sum():
    model, tokenizer = tiny_causal_lm("gpt2")
    kind = model_kind(model)
    tokens = tokenize_candidates(tokenizer, PROMPTS, CANDIDATES, encoder_decoder=kind != "causal")
    with torch.no_grad():
        total, per_token, per_word = (
            torch.cat(score_actions(model, tokenizer, PROMPTS, CANDIDATES, n))
            for n in ("sum", "token", "word")
        )
    torch.testing.assert_close(per_token, total / tokens.candidate_lengths)
    words = torch.tensor([len(a.split()) for actions in CANDIDATES for a in actions])
    torch.testing.assert_close(per_word, total / words)


def test_scores_are_log_probabilities_not_raw_logits():
    """The original GLAM summed raw logits; a log-probability is <= 0 and differs from that."""
    model, tokenizer = tiny_causal_lm("llama")
    prompt, action = PROMPTS[1], "turn left"
    tokens = tokenize_candidates(tokenizer, [prompt], [[action]], encoder_decoder=False)
    n_prompt, n_action = int(tokens.prompt_lengths[0]), int(tokens.candidate_lengths[0])
    sequence = torch.cat([tokens.prompt_ids[0, :n_prompt], tokens.candidate_ids[0, :n_action]])
    with torch.no_grad():
        logits = model(sequence[None]).logits[0, n_prompt - 1 : n_prompt - 1 + n_action]
        (score,) = score_actions(model, tokenizer, [prompt], [[action]])
    targets = tokens.candidate_ids[0, :n_action, None]
    by_hand = logits.log_softmax(-1).gather(1, targets).sum()
    raw_logit_sum = logits.gather(1, targets).sum()
    assert float(score[0]) <= 0
    assert abs(float(score[0] - by_hand)) < TOLERANCE
    assert abs(float(score[0] - raw_logit_sum)) > 1.0


@pytest.mark.parametrize("padding_side", ["left", "right"])
def test_gradients_equal_naive_forward(tiny, padding_side):
    model, tokenizer = tiny
    tokenizer.padding_side = padding_side
    parameters = [p for p in model.parameters() if p.requires_grad]

    def gradient_of(scorer):
        scores = scorer(model, tokenizer, PROMPTS, CANDIDATES)
        assert all(s.requires_grad for s in scores)
        # Weight each score differently so that a swapped candidate would show.
        loss = sum((s * torch.arange(1.0, len(s) + 1)).sum() for s in scores)
        return torch.autograd.grad(loss, parameters, allow_unused=True)

    packed, naive = gradient_of(score_actions), gradient_of(score_actions_naive)
    for p, g_packed, g_naive in zip(parameters, packed, naive, strict=True):
        if g_naive is None:
            assert g_packed is None or float(g_packed.abs().max()) == 0
            continue
        scale = float(g_naive.abs().max()) + 1.0
        assert float((g_packed - g_naive).abs().max()) / scale < TOLERANCE, p.shape


def test_gradient_checkpointing_in_training_mode_keeps_scores_exact():
    """Checkpointing disables caches in training; the packed pass needs none."""
    model, tokenizer = tiny_causal_lm("llama")
    with torch.no_grad():
        expected = score_actions_naive(model, tokenizer, PROMPTS, CANDIDATES)
    enable_gradient_checkpointing(model)
    model.train()
    scores = score_actions(model, tokenizer, PROMPTS, CANDIDATES)
    assert max_difference([s.detach() for s in scores], expected) < TOLERANCE
    sum(s.sum() for s in scores).backward()
    assert model.model.layers[0].self_attn.q_proj.weight.grad.abs().sum() > 0


@pytest.mark.parametrize("padding_side", ["left", "right"])
def test_prompt_hidden_state_is_the_last_prompt_token_or_first_decoder_position(tiny, padding_side):
    model, tokenizer = tiny
    tokenizer.padding_side = padding_side
    with torch.no_grad():
        from_scoring = score_candidates(model, tokenizer, PROMPTS, CANDIDATES).prompt_hidden
        from_prompt_pass = prompt_hidden_states(model, tokenizer, PROMPTS)
        expected = []
        for prompt in PROMPTS:
            ids = tokenizer(prompt, return_tensors="pt").input_ids
            if model_kind(model) == "causal":
                expected.append(model(ids, output_hidden_states=True).hidden_states[-1][0, -1])
            else:
                start = torch.tensor([[model.config.decoder_start_token_id]])
                outputs = model(input_ids=ids, decoder_input_ids=start, output_hidden_states=True)
                expected.append(outputs.decoder_hidden_states[-1][0, 0])
    torch.testing.assert_close(from_scoring, torch.stack(expected), atol=TOLERANCE, rtol=0)
    torch.testing.assert_close(from_prompt_pass, torch.stack(expected), atol=TOLERANCE, rtol=0)


def test_pack_rows_shares_rows_without_overlap_or_overflow():
    lengths = torch.tensor([5, 2, 9, 3, 4, 0])
    for side in ("left", "right"):
        packing = pack_rows(lengths, side)
        # First fit, longest first: [9, 0] | [5, 4] | [3, 2], rows as long as the longest.
        assert packing.width == 9 and packing.num_rows == 3 and packing.groups_per_row == 2
        assert packing.row.tolist() == [1, 2, 0, 2, 1, 0]
        occupied = torch.zeros(packing.num_rows, packing.width, dtype=torch.int)
        for i, length in enumerate(lengths.tolist()):
            start = int(packing.offset[i])
            assert start >= 0 and start + length <= packing.width
            occupied[packing.row[i], start : start + length] += 1
        assert int(occupied.max()) == 1 and int(occupied.sum()) == int(lengths.sum())
        groups = {(int(r), int(g)) for r, g in zip(packing.row, packing.group, strict=True)}
        assert len(groups) == len(lengths)  # each prompt owns its own block of slots
    # The free columns of row [3, 2] come after its prompts (right) or before them (left).
    assert pack_rows(lengths, "right").offset[[3, 1]].tolist() == [0, 3]
    assert pack_rows(lengths, "left").offset[[3, 1]].tolist() == [4, 7]


def test_the_test_batch_shares_rows():
    """The exactness tests above only cover row sharing if the test prompts do share rows."""
    _, tokenizer = tiny_causal_lm("llama")
    tokens = tokenize_candidates(tokenizer, PROMPTS, CANDIDATES, encoder_decoder=False)
    packing = pack_rows(tokens.prompt_lengths - 1)
    assert packing.num_rows < len(PROMPTS) and packing.groups_per_row == 2


def test_padded_rectangle_marks_missing_candidates():
    model, tokenizer = tiny_causal_lm("gpt2")
    with torch.no_grad():
        result = score_candidates(model, tokenizer, PROMPTS, CANDIDATES)
    assert result.scores.shape == (4, 6)
    assert result.mask.sum(1).tolist() == [6, 2, 3, 1]
    assert torch.isneginf(result.scores[~result.mask]).all()
    assert torch.isfinite(result.scores[result.mask]).all()


# --------------------------------------------------------------------------------------------
# Boundary tokenisation
# --------------------------------------------------------------------------------------------


def test_candidate_keeps_its_leading_space_after_a_glam_prompt():
    tokenizer = tiny_tokenizer(add_bos=True)
    tokens = tokenize_candidates(tokenizer, [PROMPTS[0]], [["turn left"]], encoder_decoder=False)
    n = int(tokens.candidate_lengths[0])
    assert tokens.candidate_ids[0, :n].tolist() == tokenizer(" turn left").input_ids[1:]
    assert tokenizer.convert_ids_to_tokens(tokens.candidate_ids[0, :n])[0] == "Ġturn"
    # The prompt is scored exactly as tokenised alone (BOS included), and is a prefix of the
    # joint text's tokens.
    prompt_ids = tokenizer(PROMPTS[0]).input_ids
    assert tokens.prompt_ids[0, : int(tokens.prompt_lengths[0])].tolist() == prompt_ids


def test_no_space_is_added_after_a_chat_prompt():
    tokenizer = tiny_tokenizer()
    prompt = chat_prompt(tokenizer, "go to the red ball", ACTION_WORDS, OBSERVATIONS[:1], [])
    assert prompt.endswith("\n")
    tokens = tokenize_candidates(tokenizer, [prompt], [["turn left"]], encoder_decoder=False)
    n = int(tokens.candidate_lengths[0])
    assert tokens.candidate_ids[0, :n].tolist() == tokenizer("turn left").input_ids


def test_boundary_merge_falls_back_to_the_candidate_alone_with_a_warning():
    """A trailing space merges with the candidate's first word ("Ġ" + "turn" -> "Ġturn")."""
    model, tokenizer = tiny_causal_lm("gpt2")
    prompts = [PROMPTS[1] + " ", PROMPTS[2]]
    candidates = [["turn left", "drop"], ["toggle"]]
    with pytest.warns(UserWarning, match="merge with the end of their prompt"):
        tokens = tokenize_candidates(tokenizer, prompts, candidates, encoder_decoder=False)
    alone = tokenizer("turn left").input_ids  # "t", "ur", "n", " left": the model's surprise
    assert tokens.candidate_ids[0, : int(tokens.candidate_lengths[0])].tolist() == alone
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        packed = score_actions(model, tokenizer, prompts, candidates)
        naive = score_actions_naive(model, tokenizer, prompts, candidates)
    assert max_difference(packed, naive) < TOLERANCE


def test_encoder_decoder_scores_the_candidate_tokens_in_the_decoder():
    tokenizer = tiny_tokenizer(add_eos=True)
    plain = tokenize_candidates(tokenizer, PROMPTS[:1], [["pick up"]], encoder_decoder=True)
    with_eos = tokenize_candidates(
        tokenizer, PROMPTS[:1], [["pick up"]], encoder_decoder=True, append_eos=True
    )
    words = tokenizer("pick up", add_special_tokens=False).input_ids
    assert plain.candidate_ids[0, : int(plain.candidate_lengths[0])].tolist() == words
    assert with_eos.candidate_ids[0, : int(with_eos.candidate_lengths[0])].tolist() == [
        *words,
        tokenizer.eos_token_id,
    ]
    # The encoder reads the prompt with the tokenizer's special tokens (T5 appends </s>).
    n = int(plain.prompt_lengths[0])
    assert plain.prompt_ids[0, n - 1] == tokenizer.eos_token_id


# --------------------------------------------------------------------------------------------
# Bad input
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("prompts", "candidates", "message"),
    [
        (["a:"], [[]], r"candidates\[0\] is empty"),
        (["a:", "b:"], [["drop"]], "different lengths"),
        ([], [], "prompts is empty"),
        (["a:"], [["drop", "  "]], r"candidates\[0\]\[1\] is an empty action"),
        (["a:"], ["drop"], "is a string"),
    ],
)
def test_bad_input_is_named(prompts, candidates, message):
    model, tokenizer = tiny_causal_lm("gpt2")
    with pytest.raises((ValueError, TypeError), match=message):
        score_actions(model, tokenizer, prompts, candidates)


def test_unknown_normalization_is_named():
    model, tokenizer = tiny_causal_lm("gpt2")
    with pytest.raises(ValueError, match="normalization='mean'"):
        score_actions(model, tokenizer, ["a:"], [["drop"]], normalization="mean")


def test_a_model_without_language_modelling_head_is_refused():
    tokenizer = tiny_tokenizer()
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
    )
    with pytest.raises(ValueError, match="neither a causal language model nor an encoder-decoder"):
        score_actions(LlamaModel(config), tokenizer, ["a:"], [["drop"]])


# --------------------------------------------------------------------------------------------
# The embedded model (real weights, real tokenizer)
# --------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def embedded():
    import glam

    model, tokenizer = glam.load_model("smollm2-135m")
    return model.eval(), tokenizer


@pytest.mark.slow
def test_embedded_model_packed_equals_naive_with_and_without_grad(embedded):
    model, tokenizer = embedded
    # Ragged (2, 2 and 1 actions), and the two short prompts share a row.
    prompts = [PROMPTS[0], PROMPTS[1], PROMPTS[3]]
    candidates = [["go forward", "turn right"], CANDIDATES[1], CANDIDATES[3]]
    tokens = tokenize_candidates(tokenizer, prompts, candidates, encoder_decoder=False)
    assert pack_rows(tokens.prompt_lengths - 1).num_rows == 2
    # Grad enabled, but only through the final norm, so the backward passes stay cheap.
    model.requires_grad_(False)
    norm = model.model.norm.weight
    norm.requires_grad_(True)
    try:
        naive = score_actions_naive(model, tokenizer, prompts, candidates)
        (naive_grad,) = torch.autograd.grad(sum(s.sum() for s in naive), norm)
        tokenizer.padding_side = "right"
        packed = score_actions(model, tokenizer, prompts, candidates)
        (grad,) = torch.autograd.grad(sum(s.sum() for s in packed), norm)
        tokenizer.padding_side = "left"
        with torch.no_grad():
            packed_left = score_actions(model, tokenizer, prompts, candidates)
    finally:
        model.requires_grad_(True)
    naive = [s.detach() for s in naive]
    assert max_difference([s.detach() for s in packed], naive) < TOLERANCE
    assert max_difference(packed_left, naive) < TOLERANCE
    torch.testing.assert_close(grad, naive_grad, atol=1e-3, rtol=1e-3)
    # A pretrained model finds actions plausible after "Action k:" (no -10-per-word penalty).
    assert all(float(s.max()) > -10 for s in naive)
