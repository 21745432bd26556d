"""Labellers for ONI's annotator tests; module-level, so the annotator's spawned process can
import them (`Annotator(cfg, make_labeller=...)` pickles the factory)."""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from glam.oni.annotator import Labeller, Message
from glam.oni.config import OniConfig


class GatedLabeller(Labeller):
    """Writes each batch it is given to `log` (a JSON line), labels every message 1.0, and holds
    its first batch until the file `gate` exists."""

    def __init__(self, log: Path, gate: Path) -> None:
        self.log, self.gate, self.first = log, gate, True

    def label(self, messages: Sequence[Message]) -> list[float]:
        with self.log.open("a") as out:
            out.write(json.dumps([list(m) for m in messages]) + "\n")
        while self.first and not self.gate.exists():
            time.sleep(0.02)
        self.first = False
        return [1.0] * len(messages)


@dataclass
class Gated:
    """`make_labeller` of a `GatedLabeller` (picklable)."""

    log: Path
    gate: Path

    def __call__(self, cfg: OniConfig) -> Labeller:
        return GatedLabeller(self.log, self.gate)


class FailingLabeller(Labeller):
    def label(self, messages: Sequence[Message]) -> list[float]:
        raise RuntimeError("the judge's GPU fell off the bus")


def failing(cfg: OniConfig) -> Labeller:
    """`make_labeller` of a labeller that raises at its first batch."""
    return FailingLabeller()


def failing_at_start(cfg: OniConfig) -> Labeller:
    """`make_labeller` that cannot build its labeller."""
    raise FileNotFoundError("no judging model at /nowhere")
