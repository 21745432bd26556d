"""How well a student network learns BabyAI's bot's advice by supervised learning alone.

The teacher's distillation term asks the student to copy the bot on the states it visits
(`glam.teach`). This measures the ceiling of that term for a given number of states: label
states with the bot's advice, fit the student's network to them by cross-entropy (no PPO, no
reward), and count how often its most probable action is the bot's on states of other episodes.

`advice_states` plays episodes of a level, at each step following the bot's advice with
probability `follow` and taking a uniform action otherwise (the mix a student visits while it is
being taught), and keeps every state where the bot advises an action of the space, with

- the label: the bot's advice (`BotTeacher`, which keeps its map and plan over the episode and
  replans after the agent's actual action, as when it teaches);
- `in_view`: whether the agent sees an object the mission names (`mission_in_view`);
- `view_determined`: whether a bot built on this state alone, whose map is the current view,
  advises the same. Where it does, the advice is a function of what the student sees.

`imitate` fits a memoryless policy (the symbolic actor-critic, `symbolic.memory=false`) to the
labels, reporting held-out agreement after each epoch. A student with memory is not measured
here: its labels would have to be fitted along whole episodes.

    python scripts/imitate_bot.py --level BabyAI-GoToLocal-v0 --states 40000 --out runs/imitation
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from minigrid.utils.baby_ai_bot import BabyAIBot

from glam.eval.student_agreement import mission_in_view
from glam.teach.teacher import BotTeacher

__all__ = ["AdviceStates", "ImitationEpoch", "advice_states", "agreement", "imitate", "share"]


@dataclass(frozen=True)
class AdviceStates:
    """States labelled with the bot's advice (see the module docstring)."""

    images: torch.Tensor
    """`(N, 7, 7, 3)` minigrid codes of the agent's view."""
    missions: list[str]
    labels: torch.Tensor
    """`(N,)` the bot's advice, an index into the action space."""
    in_view: torch.Tensor
    """`(N,)` bool: the agent sees an object the mission names."""
    view_determined: torch.Tensor
    """`(N,)` bool: a bot knowing only the current view advises the same."""
    episodes: int
    """Episodes played to collect them."""

    def __len__(self) -> int:
        return len(self.labels)

    def select(self, rows: torch.Tensor) -> AdviceStates:
        """The states at `rows` (a `(k,)` index tensor)."""
        return AdviceStates(
            self.images[rows],
            [self.missions[i] for i in rows.tolist()],
            self.labels[rows],
            self.in_view[rows],
            self.view_determined[rows],
            self.episodes,
        )


def advice_states(
    env_factory: Callable[[], Any],
    count: int,
    *,
    seed: int,
    follow: float = 0.5,
    generator: np.random.Generator,
    progress: Any = None,
) -> AdviceStates:
    """Play seeded episodes (`seed`, `seed + 1`, ...) until `count` states are labelled.

    Args:
        env_factory: `() -> babyai_text.TextEnv`, the level and action space to play.
        follow: probability of taking the bot's advice at a step (else a uniform action).
        generator: draws the behaviour's choices.
        progress: an object with `update(n)` (a tqdm bar), told of each labelled state.
    """
    env = env_factory()
    space = tuple(env.action_space_def.minigrid_actions)
    images, missions, labels, in_view, view_determined = [], [], [], [], []
    episodes = 0
    try:
        while len(labels) < count:
            obs, _ = env.reset(seed=seed + episodes)
            episodes += 1
            teacher, new_episode, done = BotTeacher(space), True, False
            while not done and len(labels) < count:
                probs, valid = teacher.distributions([env], [0], [new_episode])
                new_episode = False
                advice = int(probs.argmax()) if valid.item() else None
                if advice is not None:
                    images.append(obs["image"])
                    missions.append(obs["mission"])
                    labels.append(advice)
                    in_view.append(bool(mission_in_view(env)))
                    view_determined.append(_fresh_advice(env) == space[advice])
                    if progress is not None:
                        progress.update(1)
                if advice is not None and generator.random() < follow:
                    action = advice
                else:
                    action = int(generator.integers(len(space)))
                teacher.record_actions([0], [action])
                obs, _, terminated, truncated, _ = env.step(action)
                done = terminated or truncated
    finally:
        env.close()
    return AdviceStates(
        torch.as_tensor(np.stack(images), dtype=torch.uint8),
        missions,
        torch.tensor(labels),
        torch.tensor(in_view),
        torch.tensor(view_determined),
        episodes,
    )


def _fresh_advice(env: Any) -> int | None:
    """The advice of a bot that knows only the current state (its map: the current view)."""
    try:
        return int(BabyAIBot(env.unwrapped).replan())
    except Exception:  # the bot gives up by raising (assertions, an unknown instruction)
        return None


@dataclass(frozen=True)
class ImitationEpoch:
    """After one epoch of supervised learning."""

    epoch: int
    loss: float
    """Mean cross-entropy over the epoch's minibatches."""
    train_agreement: float
    """Agreement with the labels on (up to 5,000 of) the training states."""
    agreement: float
    """Agreement on the held-out states."""
    agreement_in_view: float
    """On the held-out states where the mission's object is in view."""
    agreement_out_of_view: float
    """On the others."""


def agreement(policy: torch.nn.Module, states: AdviceStates) -> torch.Tensor:
    """`(N,)` bool: the policy's most probable action is the label."""
    was_training = policy.training
    policy.eval()
    agree = []
    with torch.no_grad():
        for start in range(0, len(states), 1024):
            rows = torch.arange(start, min(start + 1024, len(states)))
            part = states.select(rows)
            logits = policy(part.images, torch.zeros(len(rows), dtype=torch.long), part.missions)
            agree.append(logits.logits.argmax(-1).cpu() == part.labels)
    policy.train(was_training)
    return torch.cat(agree)


def imitate(
    policy: torch.nn.Module,
    train: AdviceStates,
    test: AdviceStates,
    *,
    epochs: int,
    lr: float = 1e-3,
    batch_size: int = 256,
    generator: torch.Generator | None = None,
) -> Iterator[ImitationEpoch]:
    """Fit `policy` (memoryless, taking `images, directions, missions`) to `train`'s labels by
    cross-entropy with Adam, yielding an `ImitationEpoch` after each epoch."""
    if getattr(policy, "memory_size", 0):
        raise ValueError("imitate fits a memoryless policy (states are shuffled, not episodes)")
    optimizer = torch.optim.Adam(policy.parameters(), lr=lr)
    train_sample = train.select(torch.arange(min(len(train), 5000)))
    policy.train()
    for epoch in range(1, epochs + 1):
        order = torch.randperm(len(train), generator=generator)
        losses = []
        for start in range(0, len(train), batch_size):
            batch = train.select(order[start : start + batch_size])
            directions = torch.zeros(len(batch), dtype=torch.long)
            logits = policy(batch.images, directions, batch.missions).logits
            loss = torch.nn.functional.cross_entropy(logits, batch.labels.to(logits.device))
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            losses.append(loss.item())
        held_out = agreement(policy, test)
        yield ImitationEpoch(
            epoch,
            float(np.mean(losses)),
            agreement(policy, train_sample).float().mean().item(),
            held_out.float().mean().item(),
            share(held_out[test.in_view]),
            share(held_out[~test.in_view]),
        )


def share(flags: torch.Tensor) -> float:
    """The share of True in a bool tensor; NaN when it is empty."""
    return flags.float().mean().item() if len(flags) else float("nan")
