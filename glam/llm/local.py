"""The in-process chat client: a Hugging Face model writes the answers in this process.

Conversations are rendered with the tokenizer's chat template (plain text joined by blank lines
for a tokenizer without one) and answered in batches. Sampling is from the whole softmax at the
given temperature: no top-k or top-p cut, whatever the model's own generation defaults say, as
OpenAI's API defines the temperature. A decoder-only model writes through
`glam.decoding.sample_answers`, the code that writes a trained policy's answers in
training; an encoder-decoder one through `generate`.

Turns (decoder-only models): BALROG's dialogue only grows within an episode, so when the caller
names each conversation's slot (`complete(..., slots=...)`, the env slot that plays it) the
client keeps, per slot, the tokens its last answer read and wrote with their keys and values
(`glam.decoding.TurnCache`), and the slot's next conversation computes only what follows
their longest common prefix: a turn costs its new tokens. A conversation that does not extend the
slot's last one (a new episode, a window of turns that slid) reuses only the prefix they share,
down to none: a full forward. The keys of a causal model at position k depend on tokens 0..k
only, so the answers are those of a full forward up to float rounding (tests/test_balrog.py).
`Completion.cached_tokens` counts the prompt tokens read from the cache.

Seeds: a batch is sampled under a torch seed drawn from the seeds of its conversations (the
global RNG state is restored afterwards). With `batch_size=1` each answer is drawn under its own
seed, as `glam.llm.server` draws it for one request: the same seeds give the same answers
in-process and through the server (which keeps no turns; the cached keys differ from a full
forward's by float rounding only, which moves a draw only when it falls within that rounding of
the boundary between two tokens). In larger batches the draws differ (the shared RNG), from the
same distribution.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from glam.decoding import TurnCache, sample_answers
from glam.llm.chat import ChatClient, ChatClientError, Completion, Message

__all__ = ["LocalChatClient", "render_chat"]


def render_chat(tokenizer: PreTrainedTokenizerBase, messages: Sequence[Message]) -> str:
    """The text the model continues: its chat template with the assistant's turn opened, or,
    for a tokenizer without a template, the contents joined by blank lines."""
    if tokenizer.chat_template:
        return tokenizer.apply_chat_template(
            list(messages), tokenize=False, add_generation_prompt=True
        )
    return "\n\n".join(message["content"] for message in messages)


def _batch_seed(seeds: Sequence[int]) -> int:
    """One torch seed for a batch: the conversation's own seed when it is alone."""
    if len(seeds) == 1:
        return int(seeds[0])
    return int(np.random.SeedSequence([int(s) for s in seeds]).generate_state(1)[0])


class LocalChatClient(ChatClient):
    """A Hugging Face model (causal or encoder-decoder) answering in this process."""

    def __init__(
        self,
        model: PreTrainedModel,
        tokenizer: PreTrainedTokenizerBase,
        *,
        model_id: str,
        temperature: float | None = 1.0,
        max_tokens: int = 4096,
        batch_size: int = 0,
    ) -> None:
        """
        Args:
            model: the model; put in eval mode.
            tokenizer: its tokenizer (its chat template renders the conversations).
            model_id: name of the model in reports and in the server's answers.
            temperature: sampling temperature; 0 decodes greedily; None: 1.
            max_tokens: most tokens per answer (also capped by the model's context).
            batch_size: most conversations per forward; 0: all at once.
        """
        self.model = model.eval()
        self.tokenizer = tokenizer
        self.model_id = model_id
        self.temperature = 1.0 if temperature is None else temperature
        self.max_tokens = max_tokens
        self.batch_size = batch_size
        self.turn_cache = TurnCache()
        """Per slot, the keys and values of its last conversation and answer (causal models)."""
        self._stop: torch.Tensor | None = None

    def complete(
        self,
        conversations: Sequence[Sequence[Message]],
        seeds: Sequence[int] | None = None,
        slots: Sequence[int] | None = None,
    ) -> list[Completion]:
        return self.generate(
            conversations,
            temperature=self.temperature,
            max_tokens=self.max_tokens,
            seeds=seeds,
            slots=slots,
        )

    def generate(
        self,
        conversations: Sequence[Sequence[Message]],
        *,
        temperature: float,
        max_tokens: int,
        seeds: Sequence[int] | None = None,
        slots: Sequence[int] | None = None,
    ) -> list[Completion]:
        """`complete` with explicit sampling settings (the server passes each request's own).

        Raises:
            ChatClientError: a conversation that fills the model's whole context.
        """
        for name, values in (("seeds", seeds), ("slots", slots)):
            if values is not None and len(values) != len(conversations):
                raise ValueError(f"{len(values)} {name} for {len(conversations)} conversations")
        size = self.batch_size or len(conversations) or 1
        completions: list[Completion] = []
        for start in range(0, len(conversations), size):
            chunk = slice(start, start + size)
            completions += self._generate_batch(
                conversations[chunk],
                temperature,
                max_tokens,
                None if seeds is None else seeds[chunk],
                None if slots is None else slots[chunk],
            )
        return completions

    def close(self) -> None:
        self.turn_cache.clear()

    @torch.no_grad()
    def _generate_batch(
        self,
        conversations: Sequence[Sequence[Message]],
        temperature: float,
        max_tokens: int,
        seeds: Sequence[int] | None,
        slots: Sequence[int] | None,
    ) -> list[Completion]:
        texts = [render_chat(self.tokenizer, messages) for messages in conversations]
        cuda = [self.model.device] if self.model.device.type == "cuda" else []
        # Seeding inside fork_rng leaves the caller's RNG state (a training run's) untouched.
        with torch.random.fork_rng(devices=cuda):
            if seeds is not None:
                torch.manual_seed(_batch_seed(seeds))
            if self.model.config.is_encoder_decoder:
                return self._generate_seq2seq(texts, temperature, max_tokens)
            return self._sample(texts, temperature, max_tokens, slots)

    def _sample(
        self,
        texts: list[str],
        temperature: float,
        max_tokens: int,
        slots: Sequence[int] | None,
    ) -> list[Completion]:
        """A decoder-only model's answers, each slot's keys reused from its last turn."""
        # A chat template already writes the special tokens (BOS...): do not add them twice.
        encoded = self.tokenizer(texts, add_special_tokens=not self.tokenizer.chat_template)
        prompts = [torch.tensor(ids) for ids in encoded["input_ids"]]
        sampled = sample_answers(
            self.model,
            prompts,
            max_new_tokens=self._room(max(len(ids) for ids in prompts), max_tokens),
            temperature=temperature if temperature > 0 else 1.0,
            greedy=temperature == 0,
            stop=self._stop_tokens(),
            pad_id=self.tokenizer.pad_token_id or 0,  # masked out wherever it pads: any id
            cache=self.turn_cache if slots is not None else None,
            cache_rows=slots,
        )
        return [
            Completion(
                text=self.tokenizer.decode(tokens[: int(n)], skip_special_tokens=True),
                finish_reason="stop" if stopped else "length",
                prompt_tokens=len(ids),
                completion_tokens=int(n),
                cached_tokens=int(reused),
            )
            for tokens, n, stopped, ids, reused in zip(
                sampled.tokens,
                sampled.lengths,
                sampled.stopped.tolist(),
                prompts,
                sampled.reused,
                strict=True,
            )
        ]

    def _generate_seq2seq(
        self, texts: list[str], temperature: float, max_tokens: int
    ) -> list[Completion]:
        """An encoder-decoder model's answers, through `generate` (no turn cache)."""
        self.tokenizer.padding_side = "right"
        batch = self.tokenizer(
            texts,
            return_tensors="pt",
            padding=True,
            add_special_tokens=not self.tokenizer.chat_template,
        ).to(self.model.device)
        sampling = (
            {"do_sample": True, "temperature": temperature, "top_k": 0, "top_p": 1.0}
            if temperature > 0
            else {"do_sample": False}
        )
        eos = self.model.generation_config.eos_token_id
        pad = self.tokenizer.pad_token_id
        output = self.model.generate(
            **batch,
            max_new_tokens=max_tokens,
            repetition_penalty=1.0,
            eos_token_id=eos,
            pad_token_id=pad if pad is not None else eos,
            **sampling,
        )
        completions = []
        # The outputs start with the decoder's start token, which is not generated.
        for row, n_prompt in zip(
            output[:, 1:], batch["attention_mask"].sum(1).tolist(), strict=True
        ):
            ids = row.tolist()
            ended = self._ends(ids)
            generated = ids[: ended + 1] if ended is not None else ids
            completions.append(
                Completion(
                    text=self.tokenizer.decode(generated, skip_special_tokens=True),
                    finish_reason="stop" if ended is not None else "length",
                    prompt_tokens=int(n_prompt),
                    completion_tokens=len(generated),
                )
            )
        return completions

    def _room(self, prompt_length: int, max_tokens: int) -> int:
        """`max_tokens`, capped by what the model's context leaves after the prompt."""
        context = getattr(self.model.config, "max_position_embeddings", None)
        if context is None:
            return max_tokens
        if prompt_length >= context:
            raise ChatClientError(
                f"the conversation ({prompt_length} tokens) fills the model's context of "
                f"{context} tokens: keep fewer turns"
            )
        return min(max_tokens, context - prompt_length)

    def _eos_ids(self) -> set[int]:
        """The tokens that end an answer: the model's end-of-text ones."""
        eos = self.model.generation_config.eos_token_id
        return set(eos if isinstance(eos, list) else [eos]) - {None}

    def _stop_tokens(self) -> torch.Tensor:
        """`(vocab,)` bool: `_eos_ids` as `sample_answers` takes them."""
        if self._stop is None:
            vocab = max(len(self.tokenizer), self.model.config.vocab_size)
            self._stop = torch.zeros(vocab, dtype=torch.bool)
            self._stop[list(self._eos_ids())] = True
        return self._stop

    def _ends(self, ids: list[int]) -> int | None:
        """Position of the first end-of-answer token in `ids`, or None (cut at the limit)."""
        stops = self._eos_ids()
        return next((k for k, token in enumerate(ids) if token in stops), None)
