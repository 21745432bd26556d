"""How well a judge's labels agree with the oracle's, on messages the agent really meets.

`collect_messages` plays seeded episodes of BabyAI levels with BabyAI's bot, taking a random
action instead of the bot's with probability `noise` (the bot alone would only meet the events
of a perfect run: no failures, no bumps), and keeps the distinct (mission, event) messages;
`draw` picks some of them at random. `agreement` compares two labellings: the fraction equal,
the base rate, what a constant labeller would score, Cohen's kappa, balanced accuracy, and the
ROC AUC of the judge's margins (whether its preferences rank helpful events first, whatever
its threshold).
"""

from __future__ import annotations

import contextlib
import io
import random
from collections.abc import Sequence
from typing import Any

from minigrid.utils.baby_ai_bot import BabyAIBot

import babyai_text
from babyai_text.events import TEMPLATES
from glam.eval.stats import wilson_interval
from glam.oni.annotator import Message

__all__ = ["DEFAULT_LEVELS", "agreement", "collect_messages", "draw", "event_kind"]

DEFAULT_LEVELS = (
    "BabyAI-UnlockPickup-v0",
    "BabyAI-Unlock-v0",
    "BabyAI-KeyCorridorS3R1-v0",
    "BabyAI-PickupLoc-v0",
    "BabyAI-PutNextLocal-v0",
    "BabyAI-OpenDoorsOrderN2-v0",
    "BabyAI-GoToLocal-v0",
)


def collect_messages(
    levels: Sequence[str], *, episodes_per_level: int, noise: float = 0.3, seed: int = 0
) -> list[Message]:
    """The distinct messages of `episodes_per_level` episodes of each level, in the order met."""
    rng = random.Random(seed)
    seen: dict[Message, None] = {}
    for level in levels:
        env = babyai_text.make(level)
        for episode in range(episodes_per_level):
            obs, _ = env.reset(seed=seed * 10**6 + episode)
            mission = obs["mission"]
            try:
                with contextlib.redirect_stdout(io.StringIO()):
                    bot = BabyAIBot(env.unwrapped)
            except (AssertionError, AttributeError):
                bot = None  # an instruction the bot does not know: random actions only
            done = False
            while not done:
                action = None
                if bot is not None and rng.random() >= noise:
                    with contextlib.suppress(Exception):  # the bot gives up by raising
                        action = int(bot.replan())
                if action is None or action not in env.action_space_def.minigrid_actions:
                    index = rng.randrange(len(env.action_words))
                else:
                    index = env.action_space_def.minigrid_actions.index(action)
                _, _, terminated, truncated, info = env.step(index)
                done = terminated or truncated
                for event in info["events"]:
                    seen.setdefault((mission, event), None)
        env.close()
    return list(seen)


def draw(messages: Sequence[Message], count: int, *, seed: int = 0) -> list[Message]:
    """`count` of `messages` drawn at random (all of them if fewer)."""
    if len(messages) <= count:
        return list(messages)
    return random.Random(seed).sample(list(messages), count)


def event_kind(event: str) -> str:
    """The English template of `babyai_text.events` the event was written from
    ("you pick up the red key" -> "you pick up {obj}"); the event itself if none fits."""
    templates = sorted((t["en"] for t in TEMPLATES.values()), key=len, reverse=True)
    for template in templates:
        head, has_object, tail = template.partition("{obj}")
        if (has_object and event.startswith(head) and event.endswith(tail)) or event == template:
            return template
    return event


def _auc(scores: Sequence[float], labels: Sequence[float]) -> float:
    """P(score of a positive > score of a negative), ties counting half; nan without both."""
    positives = [s for s, y in zip(scores, labels, strict=True) if y > 0.5]
    negatives = [s for s, y in zip(scores, labels, strict=True) if y <= 0.5]
    if not positives or not negatives:
        return float("nan")
    wins = sum((p > n) + 0.5 * (p == n) for p in positives for n in negatives)
    return wins / (len(positives) * len(negatives))


def agreement(
    reference: Sequence[float], judged: Sequence[float], margins: Sequence[float] | None = None
) -> dict[str, Any]:
    """The measures of the module docstring; `reference` is the oracle's labels."""
    n = len(reference)
    if n == 0 or len(judged) != n:
        raise ValueError(
            f"need as many judged labels as reference labels (>0), got {len(judged)} and {n}"
        )
    ref = [y > 0.5 for y in reference]
    got = [y > 0.5 for y in judged]
    equal = sum(a == b for a, b in zip(ref, got, strict=True))
    base = sum(ref) / n
    judged_rate = sum(got) / n
    tp = sum(a and b for a, b in zip(ref, got, strict=True))
    tn = sum(not a and not b for a, b in zip(ref, got, strict=True))
    expected = base * judged_rate + (1 - base) * (1 - judged_rate)
    kappa = (equal / n - expected) / (1 - expected) if expected < 1 else float("nan")
    tpr = tp / sum(ref) if sum(ref) else float("nan")
    tnr = tn / (n - sum(ref)) if n - sum(ref) else float("nan")
    return {
        "messages": n,
        "agreement": equal / n,
        "agreement_ci": list(wilson_interval(equal, n)),
        "base_rate": base,
        "judged_positive_rate": judged_rate,
        "constant_agreement": max(base, 1 - base),
        "cohen_kappa": kappa,
        "true_positive_rate": tpr,
        "true_negative_rate": tnr,
        "balanced_accuracy": (tpr + tnr) / 2,
        "margin_auc": _auc(margins, reference) if margins is not None else float("nan"),
    }
