"""Pieces the couplings' tests share (the teacher's, the planner's, the mediator's, ONI's): a
tiny symbolic run, a counting scorer, a tiny model and a server of it on 127.0.0.1.

from helpers_couplings import SMALL_SYMBOLIC, CountingScorer
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from helpers_tiny import save_tiny_model

from glam.llm.local import LocalChatClient
from glam.llm.server import ChatServer
from glam.models.loading import load_model
from glam.teach.scorers import SubgoalScorer

WALL_CLOCK_METRICS = (
    "charts/fps",
    "charts/rollout_fps",
    "charts/update_fps",
    "time/",
    "memory/",
    "elapsed_seconds",
)
"""Prefixes of the metrics that depend on the machine's speed and memory, not on the run's
arithmetic: two runs that must be identical differ there."""

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


@pytest.fixture(scope="module")
def tiny_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny llama saved in Hugging Face layout (import the fixture into a test module)."""
    return save_tiny_model(tmp_path_factory.mktemp("tiny") / "llama", "llama")


@pytest.fixture(scope="module")
def server(tiny_folder: Path) -> Iterator[ChatServer]:
    """The tiny model served on a free port of 127.0.0.1, from a background thread."""
    model, tokenizer = load_model(str(tiny_folder))
    with ChatServer(LocalChatClient(model, tokenizer, model_id="tiny"), port=0) as served:
        served.start()
        yield served
