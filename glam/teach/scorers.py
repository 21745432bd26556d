"""Log-likelihoods of candidate subgoals after a situation text: the LLM teacher's only question."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence

import torch

from glam.scoring import score_actions

__all__ = ["LocalScorer", "SubgoalScorer"]


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
        from glam.models.loading import load_model

        model, tokenizer = load_model(spec)
        return cls(model, tokenizer, batch_size=batch_size)
