"""The in-process chat client: a Hugging Face model writes the answers in this process.

Conversations are rendered with the tokenizer's chat template (plain text joined by blank lines
for a tokenizer without one) and answered in batches through one `generate` call. Sampling is
from the whole softmax at the given temperature: no top-k or top-p cut, whatever the model's own
generation defaults say, as OpenAI's API defines the temperature.

Seeds: a batch is sampled under a torch seed drawn from the seeds of its conversations (the
global RNG state is restored afterwards). With `batch_size=1` each answer is drawn under its own
seed, exactly as `glam.llm.server` draws it for one request: the same seeds give the same answers
in-process and through the server. In larger batches the draws differ (left padding and the
shared RNG), from the same distribution.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

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
            batch_size: most conversations per `generate` call; 0: all at once.
        """
        self.model = model.eval()
        self.tokenizer = tokenizer
        self.model_id = model_id
        self.temperature = 1.0 if temperature is None else temperature
        self.max_tokens = max_tokens
        self.batch_size = batch_size

    def complete(
        self, conversations: Sequence[Sequence[Message]], seeds: Sequence[int] | None = None
    ) -> list[Completion]:
        return self.generate(
            conversations, temperature=self.temperature, max_tokens=self.max_tokens, seeds=seeds
        )

    def generate(
        self,
        conversations: Sequence[Sequence[Message]],
        *,
        temperature: float,
        max_tokens: int,
        seeds: Sequence[int] | None = None,
    ) -> list[Completion]:
        """`complete` with explicit sampling settings (the server passes each request's own).

        Raises:
            ChatClientError: a conversation that fills the model's whole context.
        """
        if seeds is not None and len(seeds) != len(conversations):
            raise ValueError(f"{len(seeds)} seeds for {len(conversations)} conversations")
        size = self.batch_size or len(conversations) or 1
        completions: list[Completion] = []
        for start in range(0, len(conversations), size):
            chunk = conversations[start : start + size]
            chunk_seeds = None if seeds is None else seeds[start : start + size]
            completions += self._generate_batch(chunk, temperature, max_tokens, chunk_seeds)
        return completions

    @torch.no_grad()
    def _generate_batch(
        self,
        conversations: Sequence[Sequence[Message]],
        temperature: float,
        max_tokens: int,
        seeds: Sequence[int] | None,
    ) -> list[Completion]:
        texts = [render_chat(self.tokenizer, messages) for messages in conversations]
        encoder_decoder = self.model.config.is_encoder_decoder
        # Decoder-only models continue the text: pad on the left so every prompt ends its row.
        self.tokenizer.padding_side = "right" if encoder_decoder else "left"
        # A chat template already writes the special tokens (BOS...): do not add them twice.
        batch = self.tokenizer(
            texts,
            return_tensors="pt",
            padding=True,
            add_special_tokens=not self.tokenizer.chat_template,
        ).to(self.model.device)
        prompt_tokens = batch["attention_mask"].sum(dim=1).tolist()
        max_new_tokens = self._room(batch["input_ids"].shape[1], max_tokens)
        sampling = (
            {"do_sample": True, "temperature": temperature, "top_k": 0, "top_p": 1.0}
            if temperature > 0
            else {"do_sample": False}
        )
        eos = self.model.generation_config.eos_token_id
        pad = self.tokenizer.pad_token_id
        cuda = [self.model.device] if self.model.device.type == "cuda" else []
        # Seeding inside fork_rng leaves the caller's RNG state (a training run's) untouched.
        with torch.random.fork_rng(devices=cuda):
            if seeds is not None:
                torch.manual_seed(_batch_seed(seeds))
            output = self.model.generate(
                **batch,
                max_new_tokens=max_new_tokens,
                repetition_penalty=1.0,
                eos_token_id=eos,
                pad_token_id=pad if pad is not None else eos,
                **sampling,
            )
        # Encoder-decoder outputs start with the decoder's start token, which is not generated.
        start = 1 if encoder_decoder else batch["input_ids"].shape[1]
        completions = []
        for row, n_prompt in zip(output[:, start:], prompt_tokens, strict=True):
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
        if context is None or self.model.config.is_encoder_decoder:
            return max_tokens
        if prompt_length >= context:
            raise ChatClientError(
                f"the conversation ({prompt_length} tokens) fills the model's context of "
                f"{context} tokens: keep fewer turns"
            )
        return min(max_tokens, context - prompt_length)

    def _ends(self, ids: list[int]) -> int | None:
        """Position of the first end-of-answer token in `ids`, or None (cut at the limit)."""
        eos = self.model.generation_config.eos_token_id
        stops = set(eos if isinstance(eos, list) else [eos]) - {None}
        return next((k for k, token in enumerate(ids) if token in stops), None)
