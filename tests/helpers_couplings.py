"""Pieces the couplings' tests share (the teacher's, the planner's, the mediator's).

from helpers_couplings import SMALL_SYMBOLIC, CountingScorer
"""

from __future__ import annotations

import torch

from glam.teach.scorers import SubgoalScorer

SMALL_SYMBOLIC = [
    "symbolic.image_dim=8",
    "symbolic.instr_dim=8",
    "symbolic.hidden_dim=8",
    "env.num_envs=4",
    "ppo.frames_per_env=16",
    "ppo.minibatch_size=32",
    "ppo.epochs=1",
    "train.total_frames=192",
    "train.progress_bar=false",
]
"""Overrides of a symbolic run of a few seconds: 8 channels, 4 envs x 16 frames, 3 updates."""


class CountingScorer(SubgoalScorer):
    """Log-likelihoods 0, 1, 2... per candidate (the last candidate is the best); records every
    batch of prompts it is asked."""

    def __init__(self) -> None:
        self.asked: list[list[str]] = []

    def log_likelihoods(self, prompts, candidates):  # noqa: ANN001, ANN201
        self.asked.append(list(prompts))
        return [torch.arange(len(c), dtype=torch.float32) for c in candidates]
