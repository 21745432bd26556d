"""Log-likelihoods of candidate subgoals after a situation text: the LLM teacher's only question."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence

import torch

from glam.config import AskConfig, TeachConfig
from glam.llm.chat import ChatClientError
from glam.llm.remote import OpenAIEndpoint
from glam.models.loading import load_model
from glam.scoring import score_actions, separator

__all__ = ["LocalScorer", "OpenAIScorer", "SubgoalScorer", "build_scorer"]


class SubgoalScorer(ABC):
    """`log P(candidate | prompt)` for each candidate of each prompt."""

    @abstractmethod
    def log_likelihoods(
        self, prompts: Sequence[str], candidates: Sequence[Sequence[str]]
    ) -> list[torch.Tensor]:
        """One 1-D tensor per prompt, a log-likelihood per candidate."""

    def close(self) -> None:  # noqa: B027 (nothing to release by default)
        """Release the model or the connections."""


class LocalScorer(SubgoalScorer):
    """A causal or encoder-decoder model in this process, scored by `glam.scoring` (one
    forward pass per batch of prompts, every candidate attending to its prompt).

    One prompt per forward by default: on 2 CPU cores, SmolLM2-135M scored the teacher's
    situations (44-token prompts, 6.6 candidates) in 0.17 s each one by one, 0.27 s each in
    batches of 8 (padding costs more than batching saves on a CPU).
    """

    def __init__(self, model: torch.nn.Module, tokenizer: object, *, batch_size: int = 1) -> None:
        self.model = model.eval()
        self.tokenizer = tokenizer
        self.batch_size = batch_size

    @torch.no_grad()
    def log_likelihoods(
        self, prompts: Sequence[str], candidates: Sequence[Sequence[str]]
    ) -> list[torch.Tensor]:
        scores: list[torch.Tensor] = []
        for start in range(0, len(prompts), self.batch_size):
            end = start + self.batch_size
            batch = score_actions(
                self.model,
                self.tokenizer,
                list(prompts[start:end]),
                [list(c) for c in candidates[start:end]],
            )
            scores.extend(score.float().cpu() for score in batch)
        return scores

    @classmethod
    def load(cls, spec: str, *, batch_size: int = 1) -> LocalScorer:
        """The model `spec` names (embedded name, local folder, .gguf file or hub id), fp32."""
        model, tokenizer = load_model(spec)
        return cls(model, tokenizer, batch_size=batch_size)


class OpenAIScorer(SubgoalScorer):
    """Scores from an OpenAI-compatible `/v1/completions` endpoint that echoes prompt
    log-probabilities (vLLM, `scripts/serve_openai.py`).

    Each (prompt, candidate) pair is sent as one text, the candidate joined to the prompt as
    `glam.scoring` joins them (one space unless the prompt ends in whitespace), with `echo=true,
    max_tokens=0, logprobs=0`; the candidate's score is the sum of `token_logprobs` of the tokens
    that start at or after the prompt's end (`text_offset`): the same tokens, and so the same
    number, as `LocalScorer` computes in-process with the same model. All pairs of a call go in
    one request.
    """

    def __init__(
        self,
        base_url: str,
        model_id: str = "",
        *,
        timeout: float = 60.0,
        max_retries: int = 4,
        delay: float = 2.0,
        setting: str = "teach",
    ) -> None:
        """Connect (see `glam.llm.remote.OpenAIEndpoint`; errors name the `<setting>.*` keys).

        Raises:
            ChatClientError: the server cannot be reached or is not OpenAI-compatible.
        """
        self.endpoint = OpenAIEndpoint(
            base_url,
            model_id=model_id,
            timeout=timeout,
            max_retries=max_retries,
            delay=delay,
            setting=setting,
        )

    def log_likelihoods(
        self, prompts: Sequence[str], candidates: Sequence[Sequence[str]]
    ) -> list[torch.Tensor]:
        starts = [len(p) for p, cands in zip(prompts, candidates, strict=True) for _ in cands]
        texts = [
            p + separator(p) + c
            for p, cands in zip(prompts, candidates, strict=True)
            for c in cands
        ]
        if not texts:
            return [torch.zeros(0) for _ in prompts]
        body = self.endpoint.post(
            "/completions",
            {
                "model": self.endpoint.model_id,
                "prompt": texts,
                "max_tokens": 0,
                "echo": True,
                "logprobs": 0,
                "temperature": 0,
            },
        )
        flat = [
            _candidate_score(choice, start, text)
            for choice, start, text in zip(_choices(body, len(texts)), starts, texts, strict=True)
        ]
        scores, at = [], 0
        for cands in candidates:
            scores.append(torch.tensor(flat[at : at + len(cands)], dtype=torch.float32))
            at += len(cands)
        return scores

    def close(self) -> None:
        self.endpoint.close()


def build_scorer(cfg: TeachConfig | AskConfig, setting: str) -> SubgoalScorer:
    """The scorer a config section names: `cfg.backend` `local` loads `cfg.model` in this
    process, `openai` connects to `cfg.base_url` (errors name the `<setting>.*` keys)."""
    if cfg.backend == "openai":
        return OpenAIScorer(
            cfg.base_url,
            cfg.model_id,
            timeout=cfg.timeout,
            max_retries=cfg.max_retries,
            setting=setting,
        )
    return LocalScorer.load(cfg.model)


def _choices(body: object, count: int) -> list[dict]:
    """The answer's choices in prompt order, checked to be `count` echoes with logprobs."""
    choices = body.get("choices") if isinstance(body, dict) else None
    if not isinstance(choices, list) or len(choices) != count:
        raise ChatClientError(
            f"/completions answered {len(choices) if isinstance(choices, list) else 'no'} "
            f"choices for {count} prompts: the server does not score echoed prompts"
        )
    return sorted(choices, key=lambda choice: choice.get("index", 0))


def _candidate_score(choice: dict, start: int, text: str) -> float:
    """Sum of the log-probabilities of the tokens from character `start` on."""
    logprobs = choice.get("logprobs") or {}
    offsets, values = logprobs.get("text_offset"), logprobs.get("token_logprobs")
    if not isinstance(offsets, list) or not isinstance(values, list) or not values:
        raise ChatClientError(
            "/completions answered without logprobs.text_offset and token_logprobs: the server "
            "does not echo prompt log-probabilities (vLLM and scripts/serve_openai.py do)"
        )
    picked = [v for offset, v in zip(offsets, values, strict=True) if offset >= start]
    if not picked or any(v is None for v in picked):
        raise ChatClientError(f"no scored token after the prompt in {text!r}")
    return float(sum(picked))
