"""ONI in the PPO loop: each env's events earn an intrinsic reward, the annotator labels them
asynchronously, the reward model learns from the labels.

`OniHook` is a `glam.ppo.hooks.TrainerHook`:

- `wrap_env`: every env becomes an `OniEnv`, whose step reward is `extrinsic_coef * r_env +
  intrinsic_coef * sum_m r_llm(m) / N_episode(m) ** beta` over the step's events m (with the
  episode's mission as their goal), the counts starting afresh each episode;
- `start`: the annotator's process starts (`glam.oni.annotator.Annotator`);
- `after_step`: messages never seen are sent (once each), labels that arrived are taken; the
  learner never waits;
- `after_update`: the reward model fits the labels (`classification`), and the update's row
  gets the `oni/` metrics: labels sent, received and pending, the annotator's throughput and
  latency, the intrinsic and extrinsic reward per episode;
- `close`: the annotator's process stops.

The rollout buffer sees the mixed reward (what PPO learns from); the env's success is the
task's. Every label received is appended at once to `<run folder>/oni/labels_rank<r>.jsonl`
(`{"goal", "event", "label"}` per line): what the judge said stays with the run, and a resumed
run starts from those labels (its messages are not sent again; the classifier refits on them).

With `oni.reward_model=ranking` (Motif's reward model) the annotator compares instead of labels:
each new message is paired with `oni.ranking_pairs` earlier messages of its goal (drawn with the
run's seed) and each pair is sent for a preference; the file's lines then also hold the second
event (`"other"`), and the label is the preference for the first.
"""

from __future__ import annotations

import dataclasses
import json
import math
import random
from collections import Counter
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, SupportsFloat, TextIO

import gymnasium as gym
import numpy as np
import torch

from babyai_text import TextEnvWrapper
from glam.oni.annotator import Annotator, Message, Pair
from glam.oni.config import OniConfig
from glam.oni.rewards import RewardModel, build_reward_model, decayed
from glam.ppo.hooks import TrainerHook

if TYPE_CHECKING:
    from glam.ppo.setup import Training

__all__ = ["OniEnv", "OniHook", "labels_path", "read_labels"]


class OniEnv(TextEnvWrapper):
    """A `babyai_text.TextEnv` whose rewards include ONI's intrinsic reward (see the module
    docstring); `info["oni"]` holds the step's `intrinsic` (before `intrinsic_coef`) and
    `extrinsic` rewards."""

    def __init__(self, env: gym.Env, hook: OniHook) -> None:
        super().__init__(env)
        self.hook = hook
        self.counts: Counter[Message] = Counter()
        """Occurrences of each message in the current episode."""
        self._goal = ""
        self._intrinsic = self._extrinsic = 0.0

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[dict[str, Any], dict[str, Any]]:
        obs, info = self.env.reset(seed=seed, options=options)
        self._goal = obs["mission"]
        self.counts.clear()
        self._intrinsic = self._extrinsic = 0.0
        return obs, info

    def step(
        self, action: int | str
    ) -> tuple[dict[str, Any], SupportsFloat, bool, bool, dict[str, Any]]:
        obs, reward, terminated, truncated, info = self.env.step(action)
        cfg = self.hook.cfg
        intrinsic = 0.0
        for event in info["events"]:
            message = (self._goal, event)
            self.counts[message] += 1
            intrinsic += decayed(self.hook.reward(message), self.counts[message], cfg.beta)
        self._intrinsic += intrinsic
        self._extrinsic += float(reward)
        if terminated or truncated:
            self.hook.episode_ended(self._intrinsic, self._extrinsic)
        mixed = cfg.extrinsic_coef * float(reward) + cfg.intrinsic_coef * intrinsic
        info = {**info, "oni": {"intrinsic": intrinsic, "extrinsic": float(reward)}}
        return obs, mixed, terminated, truncated, info


class OniHook(TrainerHook):
    """ONI joined to the PPO trainer (see the module docstring)."""

    def __init__(
        self,
        cfg: OniConfig,
        *,
        seed: int = 0,
        reward_model: RewardModel | None = None,
        make_annotator: Callable[[OniConfig], Annotator] = Annotator,
    ) -> None:
        """
        Args:
            cfg: the `oni` settings (`reward_model` other than `none`).
            seed: the classifier's initialisation and minibatches, and the random labeller's
                draws when `cfg.random_seed` is None.
            reward_model: built from `cfg` if None.
            make_annotator: starts the annotator (a test may give a slow or failing one).
        """
        if cfg.random_seed is None:
            cfg = dataclasses.replace(cfg, random_seed=seed)
        self.cfg = cfg
        self.reward_model = reward_model or build_reward_model(cfg, seed=seed)
        self._make_annotator = make_annotator
        self.annotator: Annotator | None = None
        self.seen: set[Message] = set()
        """Every message met so far (each is sent to the annotator once, or paired once)."""
        self._events_by_goal: dict[str, list[str]] = {}
        """`ranking`: the events met under each goal, the partners of a new message's pairs."""
        self._pair_rng = random.Random(seed)
        self._outbox: list[Message | Pair] = []
        self._update_sums = [0.0, 0.0, 0.0]  # episodes, intrinsic, extrinsic
        self._latency_before = 0.0
        self._received_before = 0
        self._labels_file: TextIO | None = None
        self.reloaded = 0
        """Labels read back from the run folder at start (a resumed run)."""

    def wrap_env(self, env: Any) -> Any:
        return OniEnv(env, self)

    def start(self, training: Training) -> None:
        self.accelerator = training.accelerator
        path = labels_path(training.run_dir, training.accelerator.process_index)
        if path.exists():
            labels = read_labels(path)
            self.reward_model.add(labels)
            for item, _ in labels:
                for message in item if isinstance(item[0], tuple) else (item,):
                    self._meet(message)
            self.reloaded = len(labels)
        path.parent.mkdir(parents=True, exist_ok=True)
        self._labels_file = path.open("a")
        self.annotator = self._make_annotator(self.cfg)

    def reward(self, message: Message) -> float:
        """`r_llm(message)` now (queued for labelling, or paired for comparing, if never seen)."""
        if message not in self.seen:
            if self.reward_model.learns_from_pairs:
                self._outbox.extend(self._pairs_for(message))
            else:
                self._outbox.append(message)
            self._meet(message)
        return self.reward_model.reward(message)

    def _meet(self, message: Message) -> None:
        if message not in self.seen:
            self.seen.add(message)
            self._events_by_goal.setdefault(message[0], []).append(message[1])

    def _pairs_for(self, message: Message) -> list[Pair]:
        """The new message against up to `oni.ranking_pairs` earlier events of its goal."""
        goal, _ = message
        earlier = self._events_by_goal.get(goal, [])
        partners = self._pair_rng.sample(earlier, min(self.cfg.ranking_pairs, len(earlier)))
        return [(message, (goal, event)) for event in partners]

    def episode_ended(self, intrinsic: float, extrinsic: float) -> None:
        """An env's episode ended with these sums of rewards (before the coefficients)."""
        self._update_sums[0] += 1
        self._update_sums[1] += intrinsic
        self._update_sums[2] += extrinsic

    def exchange(self) -> None:
        """Send the new messages, take the labels that arrived (never waits)."""
        if self.annotator is None:
            raise RuntimeError("OniHook.start was not called: no annotator")
        if self._outbox:
            self.annotator.submit(self._outbox)
            self._outbox = []
        labels = self.annotator.poll()
        if labels:
            self.reward_model.add(labels)
            self._save(labels)

    def _save(self, labels: Sequence[tuple[Message, float]]) -> None:
        if self._labels_file is None:
            return
        for item, label in labels:
            if isinstance(item[0], tuple):  # a pair of one goal: its preference
                (goal, event), (_, other) = item
                row = {"goal": goal, "event": event, "other": other, "label": label}
            else:
                goal, event = item
                row = {"goal": goal, "event": event, "label": label}
            self._labels_file.write(json.dumps(row) + "\n")
        self._labels_file.flush()

    def after_step(self, actions: torch.Tensor, rewards: np.ndarray, dones: np.ndarray) -> None:
        self.exchange()

    def after_update(
        self, training: Training, model: torch.nn.Module, metrics: dict[str, float]
    ) -> dict[str, float]:
        self.exchange()
        fitted = dict.fromkeys(self.reward_model.metric_names, math.nan)
        fitted |= self.reward_model.fit()
        stats = self.annotator.stats
        received_now = stats.received - self._received_before
        latency_now = stats.latency_seconds - self._latency_before
        self._received_before, self._latency_before = stats.received, stats.latency_seconds
        local = torch.tensor(
            [
                stats.sent,
                stats.received,
                stats.positive,
                stats.busy_seconds,
                received_now,
                latency_now,
                *self._update_sums,
            ],
            dtype=torch.float64,
        )
        self._update_sums = [0.0, 0.0, 0.0]
        total = training.accelerator.reduce(local.to(training.accelerator.device), "sum").cpu()
        sent, received, positive, busy, received_now, latency_now, episodes, intr, extr = (
            total.tolist()
        )
        return fitted | {
            "oni/labels_reloaded": float(self.reloaded),
            "oni/messages_sent": sent,
            "oni/labels_received": received,
            "oni/labels_pending": sent - received,
            "oni/positive_fraction": positive / received if received else math.nan,
            "oni/annotator_labels_per_s": received / busy if busy else math.nan,
            "oni/label_latency_s": latency_now / received_now if received_now else math.nan,
            "oni/intrinsic_per_episode": intr / episodes if episodes else math.nan,
            "oni/extrinsic_per_episode": extr / episodes if episodes else math.nan,
        }

    def finish(self, training: Training) -> None:
        """Wait (up to `oni.hang_timeout`) for the annotator's first answer if it has given
        none: a run shorter than the annotator's start-up ends as the loop would have, with the
        annotator's error (exit status 4), not with "done"."""
        if self.annotator is None:
            raise RuntimeError("OniHook.start was not called: no annotator")
        self.exchange()
        labels = self.annotator.wait_for_answer(self.cfg.hang_timeout)
        if labels:
            self.reward_model.add(labels)
            self._save(labels)

    def close(self) -> None:
        """Stop the annotator's process; close the labels file."""
        if self.annotator is not None:
            self.annotator.close()
        if self._labels_file is not None:
            self._labels_file.close()
            self._labels_file = None


def labels_path(run_dir: str | Path, rank: int = 0) -> Path:
    """Where process `rank` of a run keeps the labels it received."""
    return Path(run_dir) / "oni" / f"labels_rank{rank}.jsonl"


def read_labels(path: Path) -> list[tuple[Message | Pair, float]]:
    """The labels of a labels file (preferences of pairs where a line has `"other"`); a line
    cut short by a crash is skipped."""
    labels: list[tuple[Message | Pair, float]] = []
    for line in path.read_text().splitlines():
        try:
            row = json.loads(line)
            message = (row["goal"], row["event"])
            if "other" in row:
                labels.append(((message, (row["goal"], row["other"])), float(row["label"])))
            else:
                labels.append((message, float(row["label"])))
        except (json.JSONDecodeError, KeyError, TypeError, ValueError):
            continue
    return labels
