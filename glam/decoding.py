"""Answers sampled token by token, and the same answers scored teacher-forced, by a causal LM.

A policy that writes its action (`glam.policy.writer`) needs two computations that must agree:

- `sample_answers` (the rollout): after each prompt, draw tokens from `softmax(logits / T)` (no
  top-k or top-p cut) until a stop token or `max_new_tokens`, keeping each drawn token's
  log-probability and the entropy of the distribution it was drawn from;
- `score_answers` (the update): one forward of prompt + answer with gradients, giving each
  answer token's log-probability under the same tempered distribution.

Both lay a batch out the same way, prompts left-padded so that they all end in the same column
and the answers after them, with position ids that skip the padding: row i computes what it would
compute alone. A sampled token's log-probability therefore equals the teacher-forced one up to
float rounding (fp32: within 1e-5, tests/test_writer.py), and PPO's first ratio is 1.

The answer ends with its stop token (end-of-text, or a newline where the caller asks), which is
part of the answer: the model chose to stop there, and that choice is trained like any other
token. Tokens after it are padding, masked out of every sum.

Constrained answers (`AnswerTrie`): where only some answers may be written (the action words),
each step's distribution is `softmax(logits / T)` renormalised over the tokens that continue an
allowed answer (the end of the answer only after a whole one), in the rollout and in the update
alike (`allowed=` of both functions), so a sampled answer's log-probability is still the
teacher-forced one, and every answer names an action. A `think` answer (`ThoughtThenAnswer`)
reasons freely first, and only what follows its "ACTION:" is constrained so; the marker itself is
forced when the answer's room would otherwise run out.

Keys and values across turns (`TurnCache`): an episode's next prompt usually starts with its last
one (BALROG's dialogue only grows), so the cache keeps, per batch row (per env slot for the chat
client of `glam.llm.local`), the tokens a forward read and their keys and values, and the next
call reads only what comes after their longest common prefix with the new prompt. The keys of a
causal model at position k depend on tokens 0..k only, so reusing them is exact; rows are
re-assembled left-padded, with the padding between a row's cached part and its new tokens masked
out.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch
from torch import Tensor, nn
from transformers import DynamicCache
from transformers.modeling_outputs import CausalLMOutputWithPast

from glam.scoring import TrunkCut
from glam.trunk import run_from_layer

__all__ = [
    "AnswerConstraint",
    "AnswerTrie",
    "SampledAnswers",
    "ThoughtThenAnswer",
    "TurnCache",
    "answer_spans",
    "sample_answers",
    "score_answers",
    "token_entropy",
]


# The keyword (and output field) of a forward's keys and values: `cache` in recent transformers,
# `past_key_values` before (5.17, on the GPU machines of docs/gpu.md).
_CACHE = "cache" if "cache" in CausalLMOutputWithPast.__dataclass_fields__ else "past_key_values"


def token_entropy(logprobs: Tensor) -> Tensor:
    """Entropy of each distribution `(..., vocab)` given as log-probabilities (tokens with
    probability 0, log-probability -inf, add nothing)."""
    probs = logprobs.exp()
    # -inf replaced before the product: a where() around `probs * logprobs` would still send
    # its gradient, 0 * -inf, through the masked entries as NaN.
    return -(probs * torch.where(probs > 0, logprobs, 0.0)).sum(-1)


class _Constraint:
    """What a constraint on the answers shares: `allowed(prefix)` lists the tokens that may follow
    a prefix (None: any token but a stop token), `mask(tokens, vocab)` says it for each row of
    answers drawn so far; the update asks again at every position of the answers written
    (`constrain_teacher`, without a `(B, T, vocab)` mask; `teacher_mask` is its dense form)."""

    stop_ids: list[int]

    def allowed(self, prefix: Sequence[int]) -> list[int] | None:
        raise NotImplementedError

    def mask(self, tokens: Tensor, vocab: int) -> Tensor:
        """`(B, vocab)` bool: the tokens allowed after each row of `tokens` `(B, t)`."""
        mask = torch.zeros((tokens.shape[0], vocab), dtype=torch.bool)
        for row, prefix in enumerate(tokens.tolist()):
            allowed = self.allowed(prefix)
            if allowed is None:
                mask[row] = True
                mask[row, self.stop_ids] = False
            else:
                mask[row, allowed] = True
        return mask

    def teacher_allowed(self, answers: Tensor) -> list[list[list[int] | None]]:
        """At each position of `answers` `(B, T)`, what `allowed` says after the tokens before it
        (what it said when each token was drawn)."""
        return [[self.allowed(row[:step]) for step in range(len(row))] for row in answers.tolist()]

    def teacher_mask(self, answers: Tensor, vocab: int) -> Tensor:
        """`(B, T, vocab)` bool: at each position of `answers` `(B, T)`, the tokens allowed after
        the ones before it. Dense: `constrain_teacher` applies it without building it."""
        return torch.stack(
            [self.mask(answers[:, :step], vocab) for step in range(answers.shape[1])], 1
        )

    def constrain_teacher(self, logits: Tensor, answers: Tensor, keep: Tensor) -> Tensor:
        """`logits` `(B, T, vocab)` of the written `answers` `(B, T)` with the tokens each
        position does not allow at -inf: `_constrained(logits, teacher_mask(answers) & keep)`
        without the `(B, T, vocab)` mask (4 GB for 64 answers of 256 tokens over Gemma 3's
        262,144 tokens). Positions outside `keep` `(B, T)` bool, and those that allow nothing (an
        answer already ended), are left as they are."""
        allowed = self.teacher_allowed(answers.masked_fill(~keep.cpu(), 0))
        listed, cells, free = [], [], []
        for b, (row, kept) in enumerate(zip(allowed, keep.tolist(), strict=True)):
            for t, ids in enumerate(row):
                if not kept[t]:
                    continue
                if ids is None:
                    free.append((b, t))
                elif ids:
                    listed.append((b, t))
                    cells.extend((b, t, i) for i in ids)
        out, device = logits.clone(), logits.device
        if listed:
            b, t, i = torch.tensor(cells, device=device).T
            values = logits[b, t, i]
            rows, steps = torch.tensor(listed, device=device).T
            out[rows, steps] = float("-inf")
            out[b, t, i] = values
        if free:
            rows, steps = torch.tensor(free, device=device).T
            stops = torch.tensor(self.stop_ids, device=device)
            out[rows[:, None], steps[:, None], stops[None, :]] = float("-inf")
        return out


class AnswerTrie(_Constraint):
    """The answers a constrained writer may give, as token ids: each of `answers` (an action
    word's tokenisations), then one of `stop_ids`. `mask(tokens)` says, for each row of answers
    drawn so far, which tokens may come next.

    An answer that is the prefix of another may stop or go on. Every path ends in a stop token,
    so a writer that draws only allowed tokens writes a whole answer (given the room).
    """

    def __init__(self, answers: Sequence[Sequence[int]], stop_ids: Sequence[int]) -> None:
        if not answers or any(len(answer) == 0 for answer in answers):
            raise ValueError("a constrained writer needs at least one answer, none of them empty")
        if not stop_ids:
            raise ValueError("a constrained writer needs a token that ends an answer")
        self.stop_ids = sorted({int(i) for i in stop_ids})
        self.next: dict[tuple[int, ...], set[int]] = {}
        """Prefix -> the tokens that may follow it."""
        for answer in answers:
            ids = tuple(int(i) for i in answer)
            for end in range(len(ids)):
                self.next.setdefault(ids[:end], set()).add(ids[end])
            self.next.setdefault(ids, set()).update(self.stop_ids)
        self.longest = max(len(answer) for answer in answers) + 1
        """Tokens of the longest answer with its stop token: the room a writer needs."""

    def allowed(self, prefix: Sequence[int]) -> list[int]:
        """The tokens that may follow `prefix` (none after a stop token or outside the trie)."""
        return sorted(self.next.get(tuple(int(i) for i in prefix), ()))


class ThoughtThenAnswer(_Constraint):
    """The answers of a constrained `think` writer: a free thought, then `marker` (the tokens of
    "ACTION:"), then an answer of `trie` (an action word and its end), all within `budget`
    tokens. Same interface as `AnswerTrie` (`mask`, `teacher_mask`, `longest`).

    While the answer's tokens do not contain `marker`, any token but a stop token may come (a
    thought cannot end the answer before its action), until only the room for the rest of the
    marker and the longest answer is left: then the marker's next token is the only one
    allowed, token by token. After the marker, `trie` decides. A thought that writes the marker
    by itself moves on to the action at once; the model may also spell "ACTION:" in other
    tokens, which reads as thought.
    """

    def __init__(
        self, marker: Sequence[int], trie: AnswerTrie, budget: int, stop_ids: Sequence[int]
    ) -> None:
        if not marker:
            raise ValueError("a thought-then-answer writer needs the marker's tokens")
        self.marker = [int(i) for i in marker]
        self.trie = trie
        self.stop_ids = sorted({int(i) for i in stop_ids})
        self.longest = len(self.marker) + trie.longest
        """Tokens of the marker and the longest answer with its end: the room a writer needs."""
        if self.longest > budget:
            raise ValueError(
                f"the marker and the longest answer take {self.longest} tokens, more than the "
                f"{budget} an answer may have"
            )
        self.budget = budget

    def _marker_end(self, prefix: Sequence[int]) -> int | None:
        """Where the first whole marker in `prefix` ends, or None."""
        width = len(self.marker)
        for end in range(width, len(prefix) + 1):
            if list(prefix[end - width : end]) == self.marker:
                return end
        return None

    def allowed(self, prefix: Sequence[int]) -> list[int] | None:
        """The tokens that may follow `prefix`; None: any token but a stop token (a thought)."""
        prefix = [int(i) for i in prefix]
        end = self._marker_end(prefix)
        if end is not None:
            return self.trie.allowed(prefix[end:])
        return self._before_marker(len(prefix), prefix)

    def _before_marker(self, length: int, prefix: list[int]) -> list[int] | None:
        """`allowed` for a prefix of `length` tokens without the whole marker, of which `prefix`
        holds at least the last `len(marker) - 1`."""
        written = self._marker_started(prefix)
        if self.budget - length <= len(self.marker) - written + self.trie.longest:
            return [self.marker[written]]  # only the room for the rest is left
        return None

    def _marker_started(self, prefix: list[int]) -> int:
        """How many of the marker's first tokens `prefix` ends with (fewer than all)."""
        for count in range(len(self.marker) - 1, 0, -1):
            if prefix[-count:] == self.marker[:count]:
                return count
        return 0

    def teacher_allowed(self, answers: Tensor) -> list[list[list[int] | None]]:
        """`allowed` at every position, in one pass along each row (the marker found once, not
        searched for again in every prefix)."""
        width, found = len(self.marker), []
        for row in answers.tolist():
            along, end = [], None
            for step in range(len(row)):
                if end is None and step >= width and row[step - width : step] == self.marker:
                    end = step
                if end is not None:
                    along.append(self.trie.allowed(row[end:step]))
                else:  # the tail is all `_marker_started` and `allowed` read of the prefix
                    along.append(self._before_marker(step, row[max(0, step - width) : step]))
            found.append(along)
        return found


AnswerConstraint = AnswerTrie | ThoughtThenAnswer
"""What `sample_answers` and `score_answers` take as `allowed`."""


def _constrained(logits: Tensor, allowed: Tensor | None) -> Tensor:
    """`logits` with the tokens `allowed` (same shape, bool) does not allow at -inf; a row that
    allows nothing (an answer already ended) is left as it is (its tokens are padding)."""
    if allowed is None:
        return logits
    allowed = allowed.to(logits.device)
    return logits.masked_fill(~allowed & allowed.any(-1, keepdim=True), float("-inf"))


@dataclass
class _CachedRow:
    ids: Tensor
    """`(n,)` the tokens whose keys and values are kept."""
    layers: list[tuple[Tensor, Tensor]]
    """Per layer, keys and values `(heads, n, head_dim)`."""


@dataclass
class TurnCache:
    """Per batch row, the keys and values of the tokens the row's last forward read.

    A prompt reads and writes the cache row of its position in the batch (the env runner keeps
    env i at row i), or the row `sample_answers` is given for it (`cache_rows`: the chat client
    of `glam.llm.local` names each conversation's env slot). Any prompt may come in any row,
    since only the longest common prefix of the cached tokens and the new prompt is reused.
    Clear it whenever the weights change (`glam.policy.writer` does it when the policy goes into
    training mode).
    """

    rows: dict[int, _CachedRow] = field(default_factory=dict)
    reused_tokens: int = 0
    """Prompt tokens read from the cache since the last `take_counts`."""
    prompt_tokens: int = 0
    """Prompt tokens of every row since the last `take_counts`, reused or computed."""
    weights: object = None
    """What the kept keys were computed with, as the owner names it (`use_weights`)."""

    def clear(self) -> None:
        """Forget every row (the counts stay)."""
        self.rows.clear()

    def use_weights(self, weights: object) -> None:
        """Forget every row unless they were kept with `weights` (the owner's name for the
        weights it is about to use: a writing policy says whether its adapter is on)."""
        if weights != self.weights:
            self.rows.clear()
            self.weights = weights

    def reusable(self, row: int, ids: Tensor) -> int:
        """How many leading tokens of `ids` have cached keys in `row` (at most `len(ids) - 1`:
        the last prompt token is always computed, its logits start the answer)."""
        cached = self.rows.get(row)
        if cached is None:
            return 0
        n = min(len(cached.ids), len(ids) - 1)
        if n <= 0:
            return 0
        differs = (cached.ids[:n] != ids[:n]).nonzero()
        return int(differs[0, 0]) if len(differs) else n

    def take_counts(self) -> tuple[int, int]:
        """`(reused, prompt tokens)` since the last call, then zero them."""
        counts = (self.reused_tokens, self.prompt_tokens)
        self.reused_tokens = self.prompt_tokens = 0
        return counts

    @property
    def nbytes(self) -> int:
        """Bytes the kept keys and values take."""
        return sum(
            k.numel() * k.element_size() + v.numel() * v.element_size()
            for row in self.rows.values()
            for k, v in row.layers
        )


@dataclass
class SampledAnswers:
    """What `sample_answers` drew for a batch of prompts."""

    tokens: Tensor
    """`(B, T)` long: each answer's tokens, its stop token included, then `pad_id`."""
    lengths: Tensor
    """`(B,)` tokens of each answer (its stop token included)."""
    logprobs: Tensor
    """`(B, T)` float32: log-probability of each drawn token under `softmax(logits / T)`; 0
    after the answer's end."""
    entropy: Tensor
    """`(B, T)` float32: entropy of the distribution each token was drawn from; 0 after."""
    stopped: Tensor
    """`(B,)` bool: the answer ended with a stop token (False: cut at `max_new_tokens`)."""
    prompt_hidden: Tensor
    """`(B, hidden)` the final hidden state at each prompt's last token (the value head's
    input)."""
    reused: Tensor
    """`(B,)` prompt tokens whose keys and values came from the `TurnCache`."""


def _left_pad(rows: Sequence[Tensor], width: int, value: int) -> tuple[Tensor, Tensor]:
    """`(B, width)` ids, each row right-aligned, and the mask of its real tokens."""
    ids = torch.full((len(rows), width), value, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for i, row in enumerate(rows):
        if len(row):
            ids[i, width - len(row) :] = row
            mask[i, width - len(row) :] = 1
    return ids, mask


def _positions(mask: Tensor, start: Tensor) -> Tensor:
    """Position ids of the real tokens of `mask` `(B, L)`, counting from `start` `(B,)`; 0 on
    padding (masked out, never read)."""
    return ((mask.cumsum(1) - 1).clamp(min=0) + start[:, None]) * mask


def _past(
    cache: TurnCache,
    reused: Tensor,
    width: int,
    device: torch.device,
    cache_rows: Sequence[int] | None = None,
) -> DynamicCache:
    """The reused keys and values of the batch's rows (row i's in cache row `cache_rows[i]`,
    default i) as one left-padded cache of `width` positions."""
    layers = []
    cache_rows = range(len(reused)) if cache_rows is None else cache_rows
    rows = {i: cache.rows[cache_rows[i]] for i in range(len(reused)) if reused[i] > 0}
    template = next(iter(rows.values())).layers
    for layer, (key0, value0) in enumerate(template):
        keys = key0.new_zeros((len(reused), key0.shape[0], width, key0.shape[2]))
        values = value0.new_zeros((len(reused), value0.shape[0], width, value0.shape[2]))
        for i, row in rows.items():
            n = int(reused[i])
            keys[i, :, width - n :] = row.layers[layer][0][:, :n]
            values[i, :, width - n :] = row.layers[layer][1][:, :n]
        layers.append((keys.to(device), values.to(device)))
    return DynamicCache(ddp_cache_data=layers)


def _keep(
    cache: TurnCache,
    past: DynamicCache,
    columns: list[Tensor],
    ids: list[Tensor],
    cache_rows: Sequence[int],
) -> None:
    """Store in cache row `cache_rows[i]` the keys and values of `past`'s row i at `columns[i]`,
    as those of `ids[i]`."""
    for i, (row_columns, row_ids) in enumerate(zip(columns, ids, strict=True)):
        layers = [
            (layer.keys[i][:, row_columns].detach(), layer.values[i][:, row_columns].detach())
            for layer in past.layers
        ]
        # The keys stay on the model's device.
        cache.rows[cache_rows[i]] = _CachedRow(row_ids.cpu(), layers)


@torch.no_grad()
def sample_answers(
    model: nn.Module,
    prompts: Sequence[Tensor],
    *,
    max_new_tokens: int,
    temperature: float,
    stop: Tensor,
    pad_id: int,
    cache: TurnCache | None = None,
    cache_rows: Sequence[int] | None = None,
    keep_going: Callable[[bool], bool] | None = None,
    greedy: bool = False,
    allowed: AnswerConstraint | None = None,
) -> SampledAnswers:
    """Draw one answer after each prompt (token ids `(n_i,)`, special tokens included).

    `stop` `(vocab,)` bool marks the tokens that end an answer. With `cache`, prompt i reuses
    the keys of its longest common prefix with the tokens of cache row `cache_rows[i]`
    (distinct rows; default i), and keeps this call's there for the next.
    `keep_going(any_row_still_writing)` decides whether to draw another token (default: while
    a row is still writing); a data-parallel caller makes it collective, so
    that every process runs the same number of forwards (ZeRO-3 gathers weights in each).
    `greedy` takes the likeliest token instead of drawing one (the log-probabilities stay the
    tempered distribution's). With `allowed`, only the tokens of its answers are drawn, from the
    distribution renormalised over them (the module docstring).
    """
    device = next(model.parameters()).device
    batch = len(prompts)
    rows = list(range(batch)) if cache_rows is None else [int(row) for row in cache_rows]
    if len(rows) != batch or len(set(rows)) != batch:
        raise ValueError(f"{batch} prompts need as many distinct cache rows, got {rows}")
    reused = torch.tensor(
        [
            cache.reusable(row, ids) if cache is not None else 0
            for row, ids in zip(rows, prompts, strict=True)
        ]
    )
    new = [ids[int(n) :] for ids, n in zip(prompts, reused, strict=True)]
    past_width, new_width = int(reused.max()), max(len(ids) for ids in new)
    input_ids, new_mask = _left_pad(new, new_width, pad_id)
    past_mask = (torch.arange(past_width) >= past_width - reused[:, None]).long()
    attention = torch.cat([past_mask, new_mask], 1).to(device)
    past = DynamicCache() if past_width == 0 else _past(cache, reused, past_width, device, rows)
    outputs = model(
        input_ids=input_ids.to(device),
        attention_mask=attention,
        position_ids=_positions(new_mask, reused).to(device),
        **{_CACHE: past},
        use_cache=True,
        output_hidden_states=True,
        logits_to_keep=1,
    )
    prompt_hidden = outputs.hidden_states[-1][:, -1]
    next_position = reused + new_mask.sum(1)  # (B,) position of each row's next token
    tokens = torch.full((batch, max_new_tokens), pad_id, dtype=torch.long)
    logprobs = torch.zeros((batch, max_new_tokens))
    entropy = torch.zeros((batch, max_new_tokens))
    writing = torch.ones(batch, dtype=torch.bool)
    stop = stop.to(device)
    fed = 0  # answer columns whose keys are in the cache
    for step in range(max_new_tokens):
        logits = outputs.logits[:, -1].float()
        if allowed is not None:
            logits = _constrained(logits, allowed.mask(tokens[:, :step], logits.shape[-1]))
        step_logprobs = (logits / temperature).log_softmax(-1)
        if greedy:
            drawn = step_logprobs.argmax(-1)
        else:
            drawn = torch.multinomial(step_logprobs.exp(), 1)[:, 0]
        active = writing.to(device)
        drawn = torch.where(active, drawn, pad_id)
        chosen = step_logprobs.gather(1, drawn[:, None])[:, 0]
        tokens[:, step] = drawn.cpu()
        logprobs[:, step] = torch.where(active, chosen, 0.0).cpu()
        entropy[:, step] = torch.where(active, token_entropy(step_logprobs), 0.0).cpu()
        writing &= ~stop[drawn].cpu()
        still = bool(writing.any())
        go_on = keep_going(still) if keep_going is not None else still
        if step == max_new_tokens - 1 or not go_on:
            break
        attention = torch.cat(
            [attention, torch.ones((batch, 1), dtype=attention.dtype, device=device)], 1
        )
        outputs = model(
            input_ids=drawn[:, None],
            attention_mask=attention,
            position_ids=next_position[:, None].to(device),
            **{_CACHE: getattr(outputs, _CACHE)},
            use_cache=True,
            logits_to_keep=1,
        )
        next_position = next_position + 1
        fed += 1
    lengths = _answer_lengths(tokens, writing, stop.cpu(), step + 1)
    if cache is not None:
        kept_columns, kept_ids = [], []
        for i in range(batch):
            answer_fed = min(fed, int(lengths[i]))
            start = past_width - int(reused[i])
            cols = torch.cat(
                [
                    torch.arange(start, past_width),
                    torch.arange(past_width + new_width - len(new[i]), past_width + new_width),
                    torch.arange(past_width + new_width, past_width + new_width + answer_fed),
                ]
            )
            kept_columns.append(cols.to(device))
            kept_ids.append(torch.cat([prompts[i], tokens[i, :answer_fed]]))
        _keep(cache, getattr(outputs, _CACHE), kept_columns, kept_ids, rows)
        cache.reused_tokens += int(reused.sum())
        cache.prompt_tokens += sum(len(ids) for ids in prompts)
    width = max(int(lengths.max()), 1)
    return SampledAnswers(
        tokens=tokens[:, :width],
        lengths=lengths,
        logprobs=logprobs[:, :width],
        entropy=entropy[:, :width],
        stopped=~writing,
        prompt_hidden=prompt_hidden,
        reused=reused,
    )


def _answer_lengths(tokens: Tensor, writing: Tensor, stop: Tensor, drawn: int) -> Tensor:
    """Tokens of each answer: up to and including its first stop token, else all `drawn`."""
    is_stop = stop[tokens[:, :drawn]]
    first = torch.where(is_stop.any(1), is_stop.float().argmax(1) + 1, drawn)
    return torch.where(writing, drawn, first)


def _answer_layout(
    prompts: Sequence[Tensor], answers: Tensor, lengths: Tensor, pad_id: int
) -> tuple[Tensor, Tensor, Tensor, int]:
    """`(input_ids, attention_mask, position_ids, width)` of prompt + answer rows: prompts
    left-padded to end in column `width - 1`, the answers after them, padding masked out."""
    width = max(len(ids) for ids in prompts)
    prompt_ids, prompt_mask = _left_pad(prompts, width, pad_id)
    answer_mask = (torch.arange(answers.shape[1]) < lengths[:, None]).long()
    input_ids = torch.cat([prompt_ids, answers.masked_fill(answer_mask == 0, pad_id)], 1)
    mask = torch.cat([prompt_mask, answer_mask], 1)
    return input_ids, mask, _positions(mask, torch.zeros(len(prompts), dtype=torch.long)), width


def answer_spans(prompts: Sequence[Tensor], lengths: Tensor) -> list[slice]:
    """Each row's real tokens among the columns of `score_answers`'s forward: its prompt, then
    its answer (the trunk states a writing policy keeps per row, `glam.policy.writer`)."""
    width = max(len(ids) for ids in prompts)
    return [
        slice(width - len(ids), width + int(n)) for ids, n in zip(prompts, lengths, strict=True)
    ]


def score_answers(
    model: nn.Module,
    prompts: Sequence[Tensor],
    answers: Tensor,
    lengths: Tensor,
    *,
    temperature: float,
    pad_id: int,
    cut: TrunkCut | None = None,
    trunk: Sequence[Tensor] | None = None,
    allowed: AnswerConstraint | None = None,
) -> tuple[Tensor, Tensor, Tensor]:
    """Teacher-forced log-probabilities of `answers` `(B, T)` (their first `lengths` tokens)
    after `prompts`, under `softmax(logits / temperature)`, in one forward.

    Given `trunk` (each row's states entering layer `cut.first`, at `answer_spans`'s columns)
    and its `cut`, the forward runs only the layers from `cut.first` up, from those states
    (`glam.trunk.run_from_layer`). With `allowed`, each token's distribution is the one
    `sample_answers` drew it from with the same `allowed`: renormalised over the tokens allowed
    after the answer's earlier tokens.

    Returns:
        `(logprobs, entropy, prompt_hidden)`: `(B, T)` per answer token (0 after its end), and
        `(B, hidden)` the final hidden state at each prompt's last token.
    """
    device = next(model.parameters()).device
    input_ids, mask, positions, width = _answer_layout(prompts, answers, lengths, pad_id)
    steps = answers.shape[1]
    replay = contextlib.nullcontext()
    if trunk is not None:
        if cut is None or cut.layers is None:
            raise ValueError("trunk states need the cut of a decoder-only model's layers")
        spans = answer_spans(prompts, lengths)
        if [len(states) for states in trunk] != [span.stop - span.start for span in spans]:
            raise ValueError("the trunk states are not those of these prompts and answers")
        hidden = trunk[0].new_zeros((len(prompts), input_ids.shape[1], trunk[0].shape[-1]))
        for i, (states, span) in enumerate(zip(trunk, spans, strict=True)):
            hidden[i, span] = states
        replay = run_from_layer(cut.layers, cut.first, hidden.to(device))
    with replay:
        outputs = model(
            input_ids=input_ids.to(device),
            attention_mask=mask.to(device),
            position_ids=positions.to(device),
            use_cache=False,
            output_hidden_states=True,
            logits_to_keep=steps + 1,
        )
    # Column width - 1 (each prompt's last token) predicts the first answer token.
    logits = outputs.logits[:, :steps].float()
    keep = mask[:, width:].to(device).bool()
    if allowed is not None:
        logits = allowed.constrain_teacher(logits, answers, keep)
    step_logprobs = (logits / temperature).log_softmax(-1)
    chosen = step_logprobs.gather(2, answers.to(device)[:, :, None])[:, :, 0]
    logprobs = torch.where(keep, chosen, 0.0)
    entropy = torch.where(keep, token_entropy(step_logprobs), 0.0)
    return logprobs, entropy, outputs.hidden_states[-1][:, width - 1]
