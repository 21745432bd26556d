"""Exact log-likelihood of text actions under a causal or encoder-decoder language model.

The score of a candidate action `a` after a prompt `p` is the sum over the candidate's tokens of
`log_softmax(logits)` at the positions that predict them: `log P(a | p)`. The original GLAM code
summed raw logits instead, which is not a log-probability (candidates with more tokens, or tokens
with large logits, win regardless of the model's distribution); this module does not repeat that.
`normalization="token"` divides by the number of scored tokens, `"word"` by the number of words
(as TWOSOME does), so longer actions are not penalised for their length.

Tokenisation at the boundary (causal models)
--------------------------------------------
The candidate is joined to the prompt as text, with one space unless the prompt already ends in
whitespace (`"...Action 2:" + " " + "turn left"`; a chat prompt ending in a newline gets no extra
space), and the joint text is tokenised. When the prompt's own tokens are a prefix of the joint
tokens, the rest are the candidate's tokens: exactly the tokens the model would produce after the
prompt, leading space included (" turn" is one token for byte-level BPE tokenizers). If a BPE merge
crosses the boundary instead (the joint text tokenises differently at the prompt's end), the
candidate falls back to the tokens of its joined text on its own (`" " + candidate`, or the
candidate alone after whitespace), with a warning; GLAM prompts end in ":" and never hit this. A tokenizer that appends EOS to every text (rare for causal models)
has that EOS dropped from prompts. Encoder-decoder models read the prompt in the encoder (with the
tokenizer's special tokens, e.g. T5's `</s>`) and score the candidate's own tokens in the decoder,
after the decoder start token. `append_eos=True` adds the EOS token to every candidate, so that
"pick up" is not credited with the probability of "pick up the key"; it is off by default.

Speed
-----
The naive way runs one full forward per (prompt, candidate) pair: with 6 actions and 240-token
prompts, 6 times the prompt work. Here each batch is ONE forward pass in which every prompt is
encoded once and all of its candidates attend to it:

- causal: a row holds `[context | slot 1 | slot 2 | ...]`, where the context is the prompt
  without its last token and each candidate's slot is `[last prompt token, c_1, ..., c_{n-1}]`;
  slot position k predicts `c_{k+1}`. A 4-D attention mask lets every slot see the context and
  its own earlier tokens only, and position ids continue from the prompt's end in every slot, so
  each slot computes exactly what the naive forward computes for that candidate. This is the
  KV-cache reuse of Lamorel-style scorers without materialising a copy of the cache per candidate
  (B*C copies of a 240-token cache would be ~2 GB at B=32 for a 135M model), and it needs no
  cache object at all, so it works unchanged with gradients and with gradient checkpointing
  (which disables caches in training). Feeding the last prompt token again in each slot costs
  one token per candidate and makes the layout independent of the padding side; logits are
  computed only over the slots (`logits_to_keep`), never over the prompt. Short prompts share a
  row (`pack_rows`: the same mask keeps them apart and positions restart for each), so a batch
  of prompts of 120 to 400 tokens is not padded to 400 tokens each.
- encoder-decoder: the encoder runs once per prompt; the decoder reads all candidates of a prompt
  packed side by side, `[start, c_1, ..., c_{n-1}]` per slot, with a block-diagonal causal mask.
  T5's relative position bias depends only on distances inside a slot, so this is exact too, and
  cross-attention keys are projected once per prompt rather than once per candidate. (Prompts
  are padded to the longest one here; encoder rows are not shared.) Decoders with learned
  absolute positions (BART, Marian) cannot share a row: they decode one row per candidate from
  the same encoder pass, with the encoder padded on the right.

The same pass returns the prompt's final hidden state (the last prompt token for causal models,
the first decoder position for encoder-decoder ones) for the value head, at no extra cost.

The frozen trunk
----------------
With a `TrunkCut` (LoRA on the top layers only, `glam.trunk`), a pass also returns, per prompt,
the hidden states entering the lowest adapted layer at each of its real positions, in a fixed
order that does not depend on the batch: the context's tokens, then each candidate's slot (its
length, padding left out); for an encoder-decoder model, the encoder's output at the prompt's
tokens. Given those back, a pass of the same prompts in any other batch (the PPO update's
micro-batches) scatters them into its own layout and runs only the layers above the cut.
`score_actions_naive` is the per-candidate reference the tests and the benchmark compare against.
"""

from __future__ import annotations

import inspect
import warnings
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor, nn
from transformers import PreTrainedModel, PreTrainedTokenizerBase
from transformers.modeling_outputs import BaseModelOutput

from glam.trunk import keep_layer_input, run_from_layer

NORMALIZATIONS = ("sum", "token", "word")
PACKED_ATTENTION = ("sdpa", "eager")
"""Attention implementations that accept the custom 4-D masks the packed layout needs."""


# --------------------------------------------------------------------------------------------
# Inputs
# --------------------------------------------------------------------------------------------


def unwrap_model(model: nn.Module) -> PreTrainedModel:
    """The transformers model inside a peft wrapper (LoRA layers stay injected and active)."""
    get_base_model = getattr(model, "get_base_model", None)
    return get_base_model() if callable(get_base_model) else model


def model_kind(model: nn.Module) -> str:
    """`"causal"` or `"encoder_decoder"`; a clear error for any other kind of model."""
    model = unwrap_model(model)
    config = getattr(model, "config", None)
    if config is not None and getattr(config, "is_encoder_decoder", False):
        return "encoder_decoder"
    can_generate = getattr(model, "can_generate", None)
    if config is not None and callable(can_generate) and can_generate():
        return "causal"
    raise ValueError(
        f"{type(model).__name__} is neither a causal language model nor an encoder-decoder model "
        "(no language-modelling head to score text actions with); load it with "
        "AutoModelForCausalLM or AutoModelForSeq2SeqLM"
    )


def _check_inputs(
    prompts: Sequence[str], candidates: Sequence[Sequence[str]], normalization: str
) -> None:
    if normalization not in NORMALIZATIONS:
        raise ValueError(f"normalization={normalization!r} is not one of {list(NORMALIZATIONS)}")
    if isinstance(prompts, str) or isinstance(candidates, str):
        raise TypeError("prompts must be a list of strings and candidates a list of lists")
    if len(prompts) == 0:
        raise ValueError("prompts is empty: score at least one prompt")
    if len(prompts) != len(candidates):
        raise ValueError(
            f"prompts and candidates have different lengths ({len(prompts)} prompts, "
            f"{len(candidates)} candidate lists): give one list of candidates per prompt"
        )
    for i, actions in enumerate(candidates):
        if isinstance(actions, str):
            raise TypeError(f"candidates[{i}] is a string; it must be a list of action strings")
        if len(actions) == 0:
            raise ValueError(f"candidates[{i}] is empty: every prompt needs at least one action")
        for j, action in enumerate(actions):
            if not action.strip():
                raise ValueError(f"candidates[{i}][{j}] is an empty action string")


@dataclass
class CandidateTokens:
    """The tokens of a batch of prompts and of their candidates, as padded tensors.

    Candidates are flattened over prompts: candidate n belongs to prompt `prompt_index[n]` and is
    its `slot_index[n]`-th action.
    """

    prompt_ids: Tensor
    """(B, Lp) prompt tokens, right-padded."""
    prompt_lengths: Tensor
    """(B,) number of real tokens of each prompt."""
    candidate_ids: Tensor
    """(N, W) the tokens each candidate is scored on, right-padded."""
    candidate_lengths: Tensor
    """(N,) number of scored tokens of each candidate."""
    word_counts: Tensor
    """(N,) number of words of each candidate (for `normalization="word"`)."""
    prompt_index: Tensor
    """(N,) the prompt each candidate belongs to."""
    slot_index: Tensor
    """(N,) the position of each candidate in its prompt's list."""
    counts: Tensor
    """(B,) number of candidates of each prompt."""

    @property
    def max_candidates(self) -> int:
        return int(self.counts.max())


def separator(prompt: str) -> str:
    """What joins a candidate to its prompt: one space, unless the prompt ends in whitespace."""
    return "" if not prompt or prompt[-1].isspace() else " "


def appends_eos(tokenizer: PreTrainedTokenizerBase) -> bool:
    """Whether the tokenizer appends an EOS token to every text (T5-like): no part of a prompt."""
    if tokenizer.eos_token_id is None:
        return False
    with_special = tokenizer("a", add_special_tokens=True)["input_ids"]
    without = tokenizer("a", add_special_tokens=False)["input_ids"]
    return len(with_special) > len(without) and with_special[-1] == tokenizer.eos_token_id


def _encode(
    tokenizer: PreTrainedTokenizerBase, texts: list[str], add_special_tokens: bool
) -> tuple[Tensor, Tensor]:
    encoded = tokenizer(
        texts,
        add_special_tokens=add_special_tokens,
        padding=True,
        padding_side="right",
        return_tensors="pt",
    )
    return encoded["input_ids"], encoded["attention_mask"].sum(1)


def _append_eos(ids: Tensor, lengths: Tensor, eos_id: int | None) -> tuple[Tensor, Tensor]:
    if eos_id is None:
        raise ValueError("append_eos=True but the tokenizer has no eos_token")
    ids = torch.nn.functional.pad(ids, (0, 1)).scatter(1, lengths[:, None], eos_id)
    return ids, lengths + 1


def _gather_columns(ids: Tensor, start: Tensor, width: int) -> Tensor:
    """ids[n, start[n] : start[n] + width], clamped at the last column (callers mask the tail)."""
    columns = (start[:, None] + torch.arange(width)).clamp(max=max(ids.shape[1] - 1, 0))
    return ids.gather(1, columns)


def tokenize_candidates(
    tokenizer: PreTrainedTokenizerBase,
    prompts: Sequence[str],
    candidates: Sequence[Sequence[str]],
    *,
    encoder_decoder: bool,
    append_eos: bool = False,
) -> CandidateTokens:
    """Tokenise prompts and candidates as the scorer sees them (see the module docstring)."""
    prompts = list(prompts)
    counts = torch.tensor([len(actions) for actions in candidates])
    prompt_index = torch.repeat_interleave(torch.arange(len(prompts)), counts)
    offsets = torch.cumsum(counts, 0) - counts
    slot_index = torch.arange(len(prompt_index)) - offsets[prompt_index]
    flat = [action for actions in candidates for action in actions]
    word_counts = torch.tensor([len(action.split()) for action in flat])

    prompt_ids, prompt_lengths = _encode(tokenizer, prompts, add_special_tokens=True)
    if encoder_decoder:
        candidate_ids, candidate_lengths = _encode(tokenizer, flat, add_special_tokens=False)
    else:
        joint = [
            p + separator(p) + a
            for p, actions in zip(prompts, candidates, strict=True)
            for a in actions
        ]
        joint_ids, joint_lengths = _encode(tokenizer, joint, add_special_tokens=True)
        if appends_eos(tokenizer):  # the EOS is the last real token: shorten to drop it
            prompt_lengths, joint_lengths = prompt_lengths - 1, joint_lengths - 1
        starts = prompt_lengths[prompt_index]
        candidate_lengths = joint_lengths - starts
        width = max(int(candidate_lengths.max()), 1)
        candidate_ids = _gather_columns(joint_ids, starts, width)
        # The prompt's tokens must be a prefix of the joint tokens, or a BPE merge crossed the
        # boundary and the joint suffix is not a continuation of the prompt the model was given.
        prefix_width = prompt_ids.shape[1]
        joint_prefix = _gather_columns(joint_ids, torch.zeros_like(starts), prefix_width)
        in_prompt = torch.arange(prefix_width) < starts[:, None]
        differs = ((joint_prefix != prompt_ids[prompt_index]) & in_prompt).any(1)
        broken = differs | (candidate_lengths <= 0)
        if bool(broken.any()):
            candidate_ids, candidate_lengths = _retokenize_alone(
                tokenizer, prompts, flat, prompt_index, broken, candidate_ids, candidate_lengths
            )
        candidate_ids = candidate_ids.masked_fill(
            torch.arange(candidate_ids.shape[1]) >= candidate_lengths[:, None], 0
        )
    if bool((candidate_lengths <= 0).any()):
        n = int((candidate_lengths <= 0).nonzero()[0, 0])
        raise ValueError(f"candidate {flat[n]!r} tokenises to no tokens")
    if bool((prompt_lengths <= 0).any()):
        i = int((prompt_lengths <= 0).nonzero()[0, 0])
        raise ValueError(f"prompts[{i}] tokenises to no tokens: there is nothing to condition on")
    if append_eos:
        candidate_ids, candidate_lengths = _append_eos(
            candidate_ids, candidate_lengths, tokenizer.eos_token_id
        )
    return CandidateTokens(
        prompt_ids=prompt_ids,
        prompt_lengths=prompt_lengths,
        candidate_ids=candidate_ids,
        candidate_lengths=candidate_lengths,
        word_counts=word_counts,
        prompt_index=prompt_index,
        slot_index=slot_index,
        counts=counts,
    )


def _retokenize_alone(
    tokenizer: PreTrainedTokenizerBase,
    prompts: list[str],
    flat: list[str],
    prompt_index: Tensor,
    broken: Tensor,
    candidate_ids: Tensor,
    candidate_lengths: Tensor,
) -> tuple[Tensor, Tensor]:
    rows = broken.nonzero()[:, 0]
    texts = [separator(prompts[int(prompt_index[n])]) + flat[n] for n in rows.tolist()]
    warnings.warn(
        f"{len(texts)} candidate(s) merge with the end of their prompt when tokenised together "
        f"(e.g. {texts[0]!r}); scoring them on their own tokens instead. End prompts with a "
        "character that does not merge with the following word (GLAM prompts end with ':').",
        stacklevel=3,
    )
    alone_ids, alone_lengths = _encode(tokenizer, texts, add_special_tokens=False)
    width = max(candidate_ids.shape[1], alone_ids.shape[1])
    candidate_ids = torch.nn.functional.pad(candidate_ids, (0, width - candidate_ids.shape[1]))
    alone_ids = torch.nn.functional.pad(alone_ids, (0, width - alone_ids.shape[1]))
    candidate_ids[rows] = alone_ids
    candidate_lengths = candidate_lengths.clone()
    candidate_lengths[rows] = alone_lengths
    return candidate_ids, candidate_lengths


# --------------------------------------------------------------------------------------------
# Packed scoring: one forward per batch
# --------------------------------------------------------------------------------------------


@dataclass
class CandidateScores:
    """Scores of a batch of candidates, padded to a rectangle, and the prompts' hidden states."""

    scores: Tensor
    """(B, C_max) candidate scores; -inf where a prompt has fewer than C_max candidates."""
    mask: Tensor
    """(B, C_max) True where a candidate exists."""
    prompt_hidden: Tensor
    """(B, H) final hidden state of the last prompt token (causal) or first decoder position."""
    counts: Tensor
    """(B,) number of candidates of each prompt."""
    trunk: list[Tensor] | None = None
    """Each prompt's trunk states `(tokens, H)`, when asked for (`score_candidates`)."""

    def as_list(self) -> list[Tensor]:
        """One 1-D tensor of scores per prompt, of that prompt's number of candidates."""
        return [row[:n] for row, n in zip(self.scores, self.counts.tolist(), strict=True)]


def _slots(tokens: CandidateTokens, batch_size: int) -> tuple[Tensor, Tensor]:
    """Candidate tokens laid out as (B, C_max, W) slots, and their lengths (B, C_max), 0 = none."""
    width = tokens.candidate_ids.shape[1]
    slots = tokens.candidate_ids.new_zeros(batch_size, tokens.max_candidates, width)
    slots[tokens.prompt_index, tokens.slot_index] = tokens.candidate_ids
    lengths = tokens.candidate_lengths.new_zeros(batch_size, tokens.max_candidates)
    lengths[tokens.prompt_index, tokens.slot_index] = tokens.candidate_lengths
    return slots, lengths


def _additive_mask(allowed: Tensor, dtype: torch.dtype) -> Tensor:
    """(B, L, L) boolean -> (B, 1, L, L) additive float mask, the form eager and sdpa both take."""
    mask = torch.zeros(allowed.shape, dtype=dtype, device=allowed.device)
    return mask.masked_fill(~allowed, torch.finfo(dtype).min)[:, None]


def _packed_mask(
    model: PreTrainedModel, allowed: Tensor, position_ids: Tensor, device: torch.device
) -> Tensor | dict[str, Tensor]:
    """The causal layout's additive mask; for a model whose layers attend within a sliding
    window (Gemma 3's five local layers out of six), one mask per kind of layer, the local ones
    also cut to the window: transformers applies a model's window itself only to the masks it
    builds, never to a 4-D mask it is given. The window counts positions (a key `window` or
    more positions before the query is hidden), so each slot sees what the naive forward's
    same token sees."""
    config = model.config.get_text_config()
    kinds = set(getattr(config, "layer_types", None) or ())
    window = getattr(config, "sliding_window", None)
    mask = _additive_mask(allowed.to(device), model.dtype)
    if "sliding_attention" not in kinds or window is None:
        return mask
    distance = position_ids[:, :, None] - position_ids[:, None, :]
    local = _additive_mask((allowed & (distance < window)).to(device), model.dtype)
    return {kind: local if kind == "sliding_attention" else mask for kind in kinds}


def _decoder_structure(num_slots: int, width: int, device: torch.device) -> Tensor:
    """(L, L) block-diagonal causal mask: each decoder slot sees its own earlier positions."""
    position = torch.arange(num_slots * width, device=device)
    slot = position // width
    return (position[None, :] <= position[:, None]) & (slot[:, None] == slot[None, :])


def _token_scores(
    logits: Tensor, targets: Tensor, lengths: Tensor, word_counts: Tensor, normalization: str
) -> Tensor:
    """Sum (or mean) of log_softmax(logits) at the targets: (B, C, W, V) -> (B, C)."""
    logits = logits.float()
    target_logits = logits.gather(-1, targets[..., None]).squeeze(-1)
    token_logp = target_logits - torch.logsumexp(logits, dim=-1)  # (B, C, W)
    in_candidate = torch.arange(targets.shape[-1], device=targets.device) < lengths[..., None]
    totals = token_logp.masked_fill(~in_candidate, 0.0).sum(-1)
    if normalization == "token":
        totals = totals / lengths.clamp(min=1)
    elif normalization == "word":
        totals = totals / word_counts.clamp(min=1)
    return totals.masked_fill(lengths == 0, float("-inf"))


def _accepts(model: nn.Module, argument: str) -> bool:
    return argument in inspect.signature(model.forward).parameters


def _check_attention(model: PreTrainedModel) -> None:
    implementation = getattr(model.config, "_attn_implementation", "eager")
    if implementation not in PACKED_ATTENTION:
        raise ValueError(
            f"the packed candidate scorer needs custom 4-D attention masks, which "
            f"attn_implementation={implementation!r} does not take; load the model with "
            f"attn_implementation in {list(PACKED_ATTENTION)}"
        )


@dataclass
class RowPacking:
    """Where each prompt goes when several short prompts share one row of the batch."""

    row: Tensor
    """(B,) the row each prompt is placed in."""
    offset: Tensor
    """(B,) the column where its context starts in that row."""
    group: Tensor
    """(B,) its rank among the prompts of its row (which block of candidate slots it owns)."""
    num_rows: int
    groups_per_row: int
    width: int
    """Length of the context area of every row."""


def pack_rows(lengths: Tensor, padding_side: str = "right") -> RowPacking:
    """First-fit-decreasing packing of sequences of `lengths` into rows as long as the longest.

    Padding every prompt to the longest one wastes most of the compute when lengths vary (GLAM
    prompts of one batch span 120 to 400 tokens: 40-70% padding); sharing rows between short
    prompts brings that to a few percent without making any row longer. `padding_side` puts each
    row's free columns before its prompts (left) or after them (right).
    """
    width = int(lengths.max())
    fill: list[int] = []  # tokens used in each row so far
    row, offset, group = (torch.zeros_like(lengths) for _ in range(3))
    groups: list[int] = []
    # A loop over prompts (not tokens): bin packing decides the layout, tensors do the rest.
    for i in sorted(range(len(lengths)), key=lambda i: -int(lengths[i])):
        length = int(lengths[i])
        r = next((r for r, used in enumerate(fill) if used + length <= width), len(fill))
        if r == len(fill):
            fill.append(0)
            groups.append(0)
        row[i], offset[i], group[i] = r, fill[r], groups[r]
        fill[r] += length
        groups[r] += 1
    if padding_side == "left":
        offset = offset + (width - torch.tensor(fill))[row]
    return RowPacking(row, offset, group, len(fill), max(groups), width)


@dataclass
class TrunkCut:
    """Where a model's frozen trunk ends (`glam.trunk`): the rollout keeps the states there, the
    update runs from them."""

    layers: nn.ModuleList | None = None
    """Causal models: the model's layer stack (`glam.trunk.layer_stack`); None for an
    encoder-decoder model, whose trunk is its encoder (the state kept is the encoder's output)."""
    first: int = 0
    """Causal models: the lowest adapted layer; the state kept is its input."""


@dataclass
class CausalLayout:
    """The packed rows of a causal batch: `[contexts of the row's prompts | their candidate
    slots]` (the module docstring), and where each prompt's positions are in them."""

    input_ids: Tensor
    """(R, L) token of every position."""
    position_ids: Tensor
    """(R, L) position of every token in its own prompt (slots continue from its end)."""
    allowed: Tensor
    """(R, L, L) which key each query attends to."""
    row: Tensor
    """(B,) the row of each prompt."""
    group: Tensor
    """(B,) which block of candidate slots of its row each prompt owns."""
    context: int
    """Columns of the context area of every row; the slot area follows."""
    slot_area: tuple[int, int, int]
    """(groups per row, slots per group, slot width)."""
    token_row: Tensor
    """(T,) row of every real position, prompt by prompt, in the trunk order: the context's
    tokens, then each candidate's slot (its length only, padding left out)."""
    token_column: Tensor
    """(T,) column of the same positions."""
    token_counts: Tensor
    """(B,) how many of those positions belong to each prompt."""

    @property
    def kept(self) -> int:
        """Columns of the slot area, at the end of every row: logits are computed there only."""
        groups, num_slots, width = self.slot_area
        return groups * num_slots * width


def causal_layout(
    tokens: CandidateTokens, slots: Tensor, slot_lengths: Tensor, padding_side: str
) -> CausalLayout:
    """Pack prompts and candidate slots into rows (on the CPU; see the module docstring).

    Every position carries the prompt it belongs to (`owner`, -1 for padding); a query sees a key
    of the same owner that is not after it, and, in the slot area, only keys of its own slot.
    """
    batch_size, num_slots, width = slots.shape
    prompt_ids, prompt_lengths = tokens.prompt_ids, tokens.prompt_lengths
    context_lengths = prompt_lengths - 1  # every prompt token but the last
    packing = pack_rows(context_lengths, padding_side)
    rows, context, groups = packing.num_rows, packing.width, packing.groups_per_row

    # Context area: scatter each prompt's tokens to (its row, its offset + j).
    owner_of_token = torch.repeat_interleave(torch.arange(batch_size), context_lengths)
    j = (
        torch.arange(len(owner_of_token))
        - (torch.cumsum(context_lengths, 0) - context_lengths)[owner_of_token]
    )
    at = (packing.row[owner_of_token], packing.offset[owner_of_token] + j)
    context_ids = prompt_ids.new_zeros(rows, context)
    context_ids[at] = prompt_ids[owner_of_token, j]
    context_positions = torch.zeros(rows, context, dtype=torch.long)
    context_positions[at] = j
    context_owner = torch.full((rows, context), -1)
    context_owner[at] = owner_of_token

    # Slot area: `groups` blocks of C slots; slot = [last prompt token, c_1, ..., c_{W-1}].
    last_token = prompt_ids.gather(1, context_lengths[:, None])  # (B, 1)
    slot_inputs = torch.cat([last_token[:, None].expand(-1, num_slots, 1), slots[..., :-1]], -1)
    slot_positions = (context_lengths[:, None, None] + torch.arange(width)).expand_as(slot_inputs)
    area = (rows, groups, num_slots, width)
    where = (packing.row, packing.group)
    slot_ids = slots.new_zeros(area)
    slot_ids[where] = slot_inputs
    slot_position_ids = torch.zeros(area, dtype=torch.long)
    slot_position_ids[where] = slot_positions
    slot_owner = torch.full(area, -1)
    slot_owner[where] = torch.arange(batch_size)[:, None, None]

    input_ids = torch.cat([context_ids, slot_ids.flatten(1)], 1)
    position_ids = torch.cat([context_positions, slot_position_ids.flatten(1)], 1)
    owner = torch.cat([context_owner, slot_owner.flatten(1)], 1)  # (R, L)
    length = input_ids.shape[1]
    column = torch.arange(length)
    slot_number = torch.where(column < context, -1, (column - context) // width)  # (L,)
    in_context = slot_number[None, :] < 0
    same_slot = slot_number[:, None] == slot_number[None, :]
    structure = (column[None, :] <= column[:, None]) & (in_context | same_slot)  # (L, L)
    same_owner = (owner[:, :, None] == owner[:, None, :]) & (owner[:, None, :] >= 0)
    # A padding query with nothing to see would give an all-masked row: let it see itself.
    allowed = (structure & same_owner) | torch.eye(length, dtype=torch.bool)

    # The trunk order of each prompt's real positions: context tokens, then candidate slots.
    prompt, candidate, k = (torch.arange(width) < slot_lengths[..., None]).nonzero().unbind(1)
    slot_column = context + (packing.group[prompt] * num_slots + candidate) * width + k
    order = torch.sort(torch.cat([owner_of_token, prompt]), stable=True).indices
    token_row = torch.cat([at[0], packing.row[prompt]])[order]
    token_column = torch.cat([at[1], slot_column])[order]
    token_counts = context_lengths + slot_lengths.sum(1)
    return CausalLayout(
        input_ids=input_ids,
        position_ids=position_ids,
        allowed=allowed,
        row=packing.row,
        group=packing.group,
        context=context,
        slot_area=(groups, num_slots, width),
        token_row=token_row,
        token_column=token_column,
        token_counts=token_counts,
    )


def _forward_causal(
    model: PreTrainedModel,
    tokens: CandidateTokens,
    slots: Tensor,
    slot_lengths: Tensor,
    padding_side: str,
    trunk_cut: TrunkCut | None = None,
    trunk: Sequence[Tensor] | None = None,
) -> tuple[Tensor, Tensor, list[Tensor] | None]:
    """Logits (B, C, W, V) at every slot position, the last prompt token's state (B, H), and,
    with `trunk_cut` and no `trunk`, each prompt's trunk states (`(tokens, H)` each).

    With `trunk` (the states a forward kept, one tensor per prompt), the layers below the cut
    are not run: the cut layer reads `trunk` at each prompt's positions instead.
    """
    device = model.device
    layout = causal_layout(tokens, slots, slot_lengths, padding_side)
    kept = layout.kept
    extra = {"logits_to_keep": kept} if _accepts(model, "logits_to_keep") else {}

    def forward() -> object:
        return model(
            input_ids=layout.input_ids.to(device),
            attention_mask=_packed_mask(model, layout.allowed, layout.position_ids, device),
            position_ids=layout.position_ids.to(device),
            output_hidden_states=-1,
            use_cache=False,
            **extra,
        )

    kept_trunk = None
    at = (layout.token_row.to(device), layout.token_column.to(device))
    if trunk is not None:
        states = _trunk_tensor(trunk, layout.token_counts, device)
        hidden = states.new_zeros(*layout.input_ids.shape, states.shape[-1])
        hidden[at] = states
        with run_from_layer(trunk_cut.layers, trunk_cut.first, hidden):
            outputs = forward()
    elif trunk_cut is not None:
        with keep_layer_input(trunk_cut.layers, trunk_cut.first) as inputs:
            outputs = forward()
        kept_trunk = list(inputs[0][at].split(layout.token_counts.tolist()))
    else:
        outputs = forward()
    groups, num_slots, width = layout.slot_area
    logits = outputs.logits[:, -kept:].unflatten(1, (groups, num_slots, width))
    row, group = layout.row.to(device), layout.group.to(device)
    first_slot = layout.context + group * num_slots * width  # the last prompt token, fed again
    hidden = outputs.hidden_states[-1][row, first_slot]
    return logits[row, group], hidden, kept_trunk


def _trunk_tensor(trunk: Sequence[Tensor], counts: Tensor, device: torch.device) -> Tensor:
    """The prompts' trunk states one after the other, checked against the positions they fill."""
    have = [len(states) for states in trunk]
    if have != counts.tolist():
        raise ValueError(
            f"the trunk states do not fit the prompts: {have} positions given, the prompts and "
            f"candidates have {counts.tolist()} (states kept for other prompts or another "
            "tokenizer?)"
        )
    return torch.cat(list(trunk)).to(device)


def _forward_encoder_decoder(
    model: PreTrainedModel,
    tokens: CandidateTokens,
    slots: Tensor,
    padding_side: str,
    keep_trunk: bool = False,
    trunk: Sequence[Tensor] | None = None,
) -> tuple[Tensor, Tensor, list[Tensor] | None]:
    """Logits (B, C, W, V) at every slot position, the first decoder position's state, and with
    `keep_trunk` each prompt's encoder output (`(tokens, H)` each; `trunk` given: the encoder is
    not run, its output is `trunk`).

    Packing slots side by side in one decoder row is exact only when the decoder has no absolute
    positions (T5's relative bias); other decoders (BART, Marian: learned positions) get one
    decoder row per candidate, reading the same encoder pass, and their encoder is padded on the
    right whatever `padding_side` says (left padding would shift its absolute positions).
    """
    device = model.device
    batch_size, num_slots, width = slots.shape
    start_id = _decoder_start_id(model)
    if not _relative_decoder_positions(model):
        padding_side = "right"

    encoder_ids, encoder_mask = _pad(tokens.prompt_ids, tokens.prompt_lengths, padding_side)
    encoded, kept_trunk = _encoder_states(model, encoder_ids, encoder_mask, keep_trunk, trunk)
    start = slots.new_full((batch_size, num_slots, 1), start_id)
    decoder_ids = torch.cat([start, slots[..., :-1]], -1).to(device)  # (B, C, W)
    if not _relative_decoder_positions(model):
        logits, hidden = _forward_decoder_rows(model, encoded, encoder_mask, decoder_ids)
        return logits, hidden, kept_trunk
    decoder_ids = decoder_ids.flatten(1)
    allowed = _decoder_structure(num_slots, width, device)[None].expand(batch_size, -1, -1)
    outputs = model(
        encoder_outputs=BaseModelOutput(last_hidden_state=encoded),
        attention_mask=encoder_mask.to(device),
        decoder_input_ids=decoder_ids,
        decoder_attention_mask=_additive_mask(allowed, model.dtype),
        output_hidden_states=-1,
        use_cache=False,
    )
    logits = outputs.logits.unflatten(1, (num_slots, width))
    hidden = outputs.decoder_hidden_states[-1][:, 0]
    return logits, hidden, kept_trunk


def _encoder_states(
    model: PreTrainedModel,
    encoder_ids: Tensor,
    encoder_mask: Tensor,
    keep_trunk: bool,
    trunk: Sequence[Tensor] | None,
) -> tuple[Tensor, list[Tensor] | None]:
    """The encoder's output (B, Lp, H) for padded prompts, run or read from `trunk` (each
    prompt's output at its real positions), and with `keep_trunk` that per-prompt form."""
    device = model.device
    real = encoder_mask.bool().to(device)
    counts = encoder_mask.sum(1)
    if trunk is not None:
        states = _trunk_tensor(trunk, counts, device)
        encoded = states.new_zeros(*encoder_ids.shape, states.shape[-1])
        encoded[real] = states
        return encoded, None
    encoded = model.get_encoder()(
        input_ids=encoder_ids.to(device), attention_mask=encoder_mask.to(device)
    ).last_hidden_state
    kept = list(encoded[real].detach().split(counts.tolist())) if keep_trunk else None
    return encoded, kept


def _relative_decoder_positions(model: PreTrainedModel) -> bool:
    """True for T5-family decoders, whose attention depends on relative positions only."""
    return getattr(model.config, "relative_attention_num_buckets", None) is not None


def _forward_decoder_rows(
    model: PreTrainedModel, encoded: Tensor, encoder_mask: Tensor, decoder_ids: Tensor
) -> tuple[Tensor, Tensor]:
    """One decoder row per candidate (positions from 0 in each), all reading the encoder output
    `encoded` (B, Lp, H) of their prompt."""
    device = model.device
    batch_size, num_slots, width = decoder_ids.shape
    rows = torch.arange(batch_size, device=device).repeat_interleave(num_slots)
    outputs = model(
        encoder_outputs=BaseModelOutput(last_hidden_state=encoded[rows]),
        attention_mask=encoder_mask.to(device)[rows],
        decoder_input_ids=decoder_ids.flatten(0, 1),
        output_hidden_states=-1,
        use_cache=False,
    )
    logits = outputs.logits.unflatten(0, (batch_size, num_slots))  # (B, C, W, V)
    hidden = outputs.decoder_hidden_states[-1].unflatten(0, (batch_size, num_slots))[:, 0, 0]
    return logits, hidden


def _decoder_start_id(model: PreTrainedModel) -> int:
    start_id = getattr(model.config, "decoder_start_token_id", None)
    if start_id is None:
        start_id = getattr(
            getattr(model, "generation_config", None), "decoder_start_token_id", None
        )
    if start_id is None:
        raise ValueError("the encoder-decoder model's config has no decoder_start_token_id")
    return int(start_id)


def _pad(ids: Tensor, lengths: Tensor, padding_side: str) -> tuple[Tensor, Tensor]:
    """Right-padded (B, L) ids -> ids padded on `padding_side`, and their attention mask."""
    width = ids.shape[1]
    columns = torch.arange(width)[None, :].expand(len(ids), width)
    if padding_side == "left":
        columns = columns - (width - lengths)[:, None]
    real = (columns >= 0) & (columns < lengths[:, None])
    return ids.gather(1, columns.clamp(min=0)).masked_fill(~real, 0), real.long()


def _resolve_padding_side(tokenizer: PreTrainedTokenizerBase, padding_side: str | None) -> str:
    side = padding_side or getattr(tokenizer, "padding_side", "right")
    if side not in ("left", "right"):
        raise ValueError(f"padding_side={side!r} is not 'left' or 'right'")
    return side


def score_candidates(
    model: nn.Module,
    tokenizer: PreTrainedTokenizerBase,
    prompts: Sequence[str],
    candidates: Sequence[Sequence[str]],
    normalization: str = "sum",
    *,
    append_eos: bool = False,
    padding_side: str | None = None,
    trunk_cut: TrunkCut | None = None,
    trunk: Sequence[Tensor] | None = None,
) -> CandidateScores:
    """Score every candidate of every prompt in one forward pass; also return prompt states.

    The lower-level form of `score_actions`: scores come as a (B, C_max) rectangle padded with
    -inf (ready for a `Categorical`), next to the prompts' final hidden states for a value head.
    `padding_side` (default: the tokenizer's) only changes the batch layout, never the result.
    Differentiable when grad is enabled.

    With `trunk_cut` (`glam.trunk`), the scores also keep each prompt's trunk states
    (`CandidateScores.trunk`); given those back as `trunk` (same prompts and candidates, in any
    batch), the forward skips the trunk and runs from them, to the same scores.
    """
    _check_inputs(prompts, candidates, normalization)
    kind = model_kind(model)
    model = unwrap_model(model)
    _check_attention(model)
    side = _resolve_padding_side(tokenizer, padding_side)
    tokens = tokenize_candidates(
        tokenizer,
        prompts,
        candidates,
        encoder_decoder=kind == "encoder_decoder",
        append_eos=append_eos,
    )
    slots, slot_lengths = _slots(tokens, len(prompts))  # (B, C, W), (B, C)
    if trunk is not None and trunk_cut is None:
        raise ValueError("trunk states were given without the trunk_cut they were kept at")
    if kind == "causal":
        logits, hidden, kept = _forward_causal(
            model, tokens, slots, slot_lengths, side, trunk_cut, trunk
        )
    else:
        logits, hidden, kept = _forward_encoder_decoder(
            model, tokens, slots, side, trunk_cut is not None, trunk
        )
    word_counts = torch.zeros_like(slot_lengths)
    word_counts[tokens.prompt_index, tokens.slot_index] = tokens.word_counts
    device = logits.device
    scores = _token_scores(
        logits, slots.to(device), slot_lengths.to(device), word_counts.to(device), normalization
    )
    return CandidateScores(
        scores=scores,
        mask=slot_lengths.to(device) > 0,
        prompt_hidden=hidden,
        counts=tokens.counts,
        trunk=kept,
    )


def score_actions(
    model: nn.Module,
    tokenizer: PreTrainedTokenizerBase,
    prompts: list[str],
    candidates: list[list[str]],
    normalization: str = "sum",
    *,
    append_eos: bool = False,
    padding_side: str | None = None,
) -> list[Tensor]:
    """Log-likelihood score of each candidate action after its prompt, for a batch of prompts.

    `candidates[i]` holds the action strings of `prompts[i]` ("turn left"; lists may differ in
    length). Returns B 1-D tensors, `len(candidates[i])` scores each: the sum over the candidate's
    tokens of log_softmax(logits) (`normalization="sum"`), or that sum divided by the number of
    tokens (`"token"`) or words (`"word"`). One batched forward for the whole batch: see the module
    docstring for the layout and the boundary tokenisation. Differentiable when grad is enabled.
    """
    return score_candidates(
        model,
        tokenizer,
        prompts,
        candidates,
        normalization,
        append_eos=append_eos,
        padding_side=padding_side,
    ).as_list()


# --------------------------------------------------------------------------------------------
# Prompt-only forward and the naive reference
# --------------------------------------------------------------------------------------------


def prompt_hidden_states(
    model: nn.Module,
    tokenizer: PreTrainedTokenizerBase,
    prompts: Sequence[str],
    *,
    padding_side: str | None = None,
) -> Tensor:
    """(B, H) final hidden state of each prompt, from one batched prompt-only forward.

    The last prompt token for causal models, the first decoder position (the decoder start token)
    for encoder-decoder ones: the same states `score_candidates` returns, for the action-heads
    policy and for a value computed with the adapter switched off.
    """
    return prompt_states(model, tokenizer, prompts, padding_side=padding_side)[0]


def prompt_states(
    model: nn.Module,
    tokenizer: PreTrainedTokenizerBase,
    prompts: Sequence[str],
    *,
    padding_side: str | None = None,
    trunk_cut: TrunkCut | None = None,
    trunk: Sequence[Tensor] | None = None,
) -> tuple[Tensor, list[Tensor] | None]:
    """`prompt_hidden_states`, and with `trunk_cut` each prompt's trunk states (its real
    positions, in order); given those back as `trunk`, the forward runs from them."""
    if isinstance(prompts, str) or len(prompts) == 0:
        raise ValueError("prompts must be a non-empty list of strings")
    if trunk is not None and trunk_cut is None:
        raise ValueError("trunk states were given without the trunk_cut they were kept at")
    kind = model_kind(model)
    model = unwrap_model(model)
    side = _resolve_padding_side(tokenizer, padding_side)
    ids, lengths = _encode(tokenizer, list(prompts), add_special_tokens=True)
    if kind == "causal" and appends_eos(tokenizer):
        lengths = lengths - 1
    if kind == "encoder_decoder" and not _relative_decoder_positions(model):
        side = "right"  # absolute positions: left padding would shift them
    input_ids, attention_mask = _pad(ids, lengths, side)
    device = model.device
    if kind == "encoder_decoder":
        encoded, kept = _encoder_states(
            model, input_ids, attention_mask, trunk_cut is not None, trunk
        )
        start = torch.full((len(prompts), 1), _decoder_start_id(model), device=device)
        outputs = model(
            encoder_outputs=BaseModelOutput(last_hidden_state=encoded),
            attention_mask=attention_mask.to(device),
            decoder_input_ids=start,
            output_hidden_states=-1,
            use_cache=False,
        )
        return outputs.decoder_hidden_states[-1][:, 0], kept
    position_ids = (attention_mask.cumsum(1) - 1).clamp(min=0)
    extra = {"logits_to_keep": 1} if _accepts(model, "logits_to_keep") else {}

    def forward() -> object:
        return model(
            input_ids=input_ids.to(device),
            attention_mask=attention_mask.to(device),
            position_ids=position_ids.to(device),
            output_hidden_states=-1,
            use_cache=False,
            **extra,
        )

    real = attention_mask.bool().to(device)
    kept = None
    if trunk is not None:
        states = _trunk_tensor(trunk, lengths, device)
        hidden = states.new_zeros(*input_ids.shape, states.shape[-1])
        hidden[real] = states
        with run_from_layer(trunk_cut.layers, trunk_cut.first, hidden):
            outputs = forward()
    elif trunk_cut is not None:
        with keep_layer_input(trunk_cut.layers, trunk_cut.first) as inputs:
            outputs = forward()
        kept = list(inputs[0][real].split(lengths.tolist()))
    else:
        outputs = forward()
    last = lengths - 1 if side == "right" else torch.full_like(lengths, input_ids.shape[1] - 1)
    hidden = outputs.hidden_states[-1]
    return hidden[torch.arange(len(prompts), device=device), last.to(device)], kept


def score_actions_naive(
    model: nn.Module,
    tokenizer: PreTrainedTokenizerBase,
    prompts: list[str],
    candidates: list[list[str]],
    normalization: str = "sum",
    *,
    append_eos: bool = False,
) -> list[Tensor]:
    """The reference: one unpadded full forward per (prompt, candidate) pair.

    Same tokens and same score as `score_actions`, computed the obvious way (the whole prompt
    again for every candidate, all logits). Slow by design; used by tests and the benchmark.
    """
    _check_inputs(prompts, candidates, normalization)
    kind = model_kind(model)
    model = unwrap_model(model)
    tokens = tokenize_candidates(
        tokenizer,
        prompts,
        candidates,
        encoder_decoder=kind == "encoder_decoder",
        append_eos=append_eos,
    )
    device = model.device
    pair_scores = []
    for n in range(len(tokens.prompt_index)):
        i = int(tokens.prompt_index[n])
        prompt = tokens.prompt_ids[i, : int(tokens.prompt_lengths[i])]
        target = tokens.candidate_ids[n, : int(tokens.candidate_lengths[n])]
        if kind == "causal":
            sequence = torch.cat([prompt, target])[None].to(device)
            logits = model(input_ids=sequence, use_cache=False).logits[0]
            logits = logits[len(prompt) - 1 : len(prompt) - 1 + len(target)]
        else:
            decoder_ids = torch.cat([torch.tensor([_decoder_start_id(model)]), target[:-1]])
            logits = model(
                input_ids=prompt[None].to(device),
                decoder_input_ids=decoder_ids[None].to(device),
                use_cache=False,
            ).logits[0]
        total = logits.float().log_softmax(-1).gather(1, target[:, None].to(device)).sum()
        if normalization == "token":
            total = total / len(target)
        elif normalization == "word":
            total = total / int(tokens.word_counts[n])
        pair_scores.append(total)
    per_pair = torch.stack(pair_scores)
    return list(per_pair.split(tokens.counts.tolist()))
