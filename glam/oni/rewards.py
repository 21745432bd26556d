"""ONI's reward models: from the annotator's labels to `r_llm(message)`, and the count decay.

- `RetrievalReward`: a table of the labelled messages; a message not labelled yet is worth 0.
- `ClassifierReward`: a small text classifier fitted online on the labels (a bag of hashed
  word features of the goal and the event, and of the words they share, into an MLP); every
  message gets `P(helpful)`, including those never labelled.
- `RankingReward`: Motif's reward model: a score fitted (Bradley-Terry) to the annotator's
  preferences between two messages of one goal; a message's reward is its rank among the
  messages met, 0 below a quantile.
- `NoReward`: 0 for every message (plain RL).

`decayed(reward, count, beta)` is ONI's `r / N_episode(message) ** beta`.
"""

from __future__ import annotations

import math
import zlib
from abc import ABC, abstractmethod
from collections.abc import Sequence

import torch
from torch import nn

from glam.oni.config import OniConfig

__all__ = [
    "ClassifierReward",
    "NoReward",
    "Pair",
    "RankingReward",
    "RetrievalReward",
    "RewardModel",
    "build_reward_model",
    "decayed",
    "message_features",
]

Message = tuple[str, str]
"""(goal, event), as `glam.oni.annotator.Message`."""
Pair = tuple[Message, Message]
"""Two messages of one goal, as `glam.oni.annotator.Pair`: its label is the preference for the
first (1.0 the first helps more, 0.0 the second, 0.5 neither)."""

FEATURE_BUCKETS = 4096
"""Hashed feature slots of the classifier (crc32, the same in every process and run)."""


def decayed(reward: float, count: int, beta: float) -> float:
    """ONI's count decay: the `count`-th occurrence (1, 2, ...) in an episode of a message
    worth `reward` adds `reward / count ** beta`."""
    if count < 1:
        raise ValueError(f"a message's count in its episode starts at 1, got {count}")
    return reward / count**beta


class RewardModel(ABC):
    """`r_llm` of a message, learnt from the annotator's labels."""

    learns_from_pairs: bool = False
    """True: the annotator is asked for preferences between `Pair`s of messages, and `add`
    takes those (`RankingReward`); False: labels of single messages."""
    metric_names: tuple[str, ...] = ()
    """The metrics `fit` returns when it fits: every update reports them (blank until then),
    so that metrics.csv, whose columns are those of its first row, has them."""

    @abstractmethod
    def add(self, labels: Sequence[tuple[Message, float]]) -> None:
        """Take newly received labels (of pairs when `learns_from_pairs`)."""

    @abstractmethod
    def reward(self, message: Message) -> float:
        """The message's intrinsic reward before the count decay, in [0, 1]."""

    def fit(self) -> dict[str, float]:
        """Learn from the labels received so far (after an update); returns metrics."""
        return {}


class NoReward(RewardModel):
    """No intrinsic reward."""

    def add(self, labels: Sequence[tuple[Message, float]]) -> None:
        pass

    def reward(self, message: Message) -> float:
        return 0.0


class RetrievalReward(RewardModel):
    """The label of the message itself, 0 until it arrives."""

    def __init__(self) -> None:
        self.table: dict[Message, float] = {}

    def add(self, labels: Sequence[tuple[Message, float]]) -> None:
        self.table.update((message, float(label)) for message, label in labels)

    def reward(self, message: Message) -> float:
        return self.table.get(message, 0.0)


def message_features(message: Message) -> list[int]:
    """Hashed feature ids of a message: the goal's words, the event's words and word pairs,
    and the event's words that also occur in the goal (so "you pick up the red box" can be
    told apart under "pick up the red box" and "pick up the blue box")."""
    goal, event = message
    goal_words = goal.lower().replace(",", " ").split()
    event_words = event.lower().replace(",", " ").split()
    shared = set(goal_words) & set(event_words)
    names = (
        [f"g:{w}" for w in goal_words]
        + [f"e:{w}" for w in event_words]
        + [f"e2:{a}_{b}" for a, b in zip(event_words, event_words[1:], strict=False)]
        + [f"s:{w}" for w in event_words if w in shared]
    )
    return [zlib.crc32(name.encode()) % FEATURE_BUCKETS for name in names]


class _BagClassifier(nn.Module):
    def __init__(self, hidden: int, generator: torch.Generator) -> None:
        super().__init__()
        self.embed = nn.EmbeddingBag(FEATURE_BUCKETS, hidden, mode="sum")
        self.out = nn.Sequential(
            nn.ReLU(), nn.Linear(hidden, hidden), nn.ReLU(), nn.Linear(hidden, 1)
        )
        with torch.no_grad():
            for parameter in self.parameters():
                if parameter.dim() > 1:
                    bound = 1.0 / math.sqrt(parameter.shape[1])
                    parameter.uniform_(-bound, bound, generator=generator)
                else:
                    parameter.zero_()

    def forward(self, ids: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
        return self.out(self.embed(ids, offsets)).squeeze(-1)


class _FittedReward(RewardModel):
    """A reward model whose network (`_BagClassifier`) is fitted by `steps` Adam steps on
    minibatches of its examples after each update that brought new ones, while there are at
    most `max_examples`: the set-up and the step the classifier and the ranking model share."""

    def __init__(
        self, *, steps: int, max_examples: int, lr: float, hidden: int, batch_size: int, seed: int
    ) -> None:
        self.steps, self.max_examples, self.batch_size = steps, max_examples, batch_size
        self.generator = torch.Generator().manual_seed(seed)
        self.model = _BagClassifier(hidden, self.generator)
        self.optimizer = torch.optim.Adam(self.model.parameters(), lr=lr)
        self._new = 0
        self._cache: dict[Message, float] = {}
        self.fitted = False

    def _due(self, examples: int) -> bool:
        """Whether to fit now: new examples came, and not too many in all."""
        return bool(self._new and examples <= self.max_examples and self.steps)

    def _minibatch(self, examples: int) -> torch.Tensor:
        """The rows of one step: every example, or `batch_size` of them drawn with replacement."""
        if examples <= self.batch_size:
            return torch.arange(examples)
        return torch.randint(examples, (self.batch_size,), generator=self.generator)

    def _step(self, loss: torch.Tensor) -> float:
        self.optimizer.zero_grad()
        loss.backward()
        self.optimizer.step()
        return loss.item()


class ClassifierReward(_FittedReward):
    """`P(helpful | message)` from a classifier trained on the labels (see the module
    docstring): `steps` Adam steps on minibatches of the labels after each update that brought
    new ones, while there are at most `max_examples`."""

    metric_names = ("oni/classifier_loss", "oni/classifier_train_accuracy")

    def __init__(
        self,
        *,
        steps: int = 32,
        max_examples: int = 25_000,
        lr: float = 1e-2,
        hidden: int = 32,
        batch_size: int = 256,
        seed: int = 0,
    ) -> None:
        super().__init__(
            steps=steps, max_examples=max_examples, lr=lr, hidden=hidden,
            batch_size=batch_size, seed=seed,
        )  # fmt: skip
        self.messages: list[Message] = []
        self.labels: list[float] = []
        self._index: dict[Message, int] = {}

    def add(self, labels: Sequence[tuple[Message, float]]) -> None:
        for message, label in labels:
            if message in self._index:  # a relabel replaces the example
                self.labels[self._index[message]] = float(label)
                continue
            self._index[message] = len(self.messages)
            self.messages.append(message)
            self.labels.append(float(label))
            self._new += 1

    def reward(self, message: Message) -> float:
        if not self.fitted:
            return 0.0
        if message not in self._cache:
            self._cache[message] = float(self.probabilities([message])[0])
        return self._cache[message]

    @torch.no_grad()
    def probabilities(self, messages: Sequence[Message]) -> torch.Tensor:
        """`P(helpful)` of each message under the current classifier."""
        return torch.sigmoid(self.model(*_bag(messages)))

    def fit(self) -> dict[str, float]:
        if not self._due(len(self.messages)):
            return {}
        self._new = 0
        labels = torch.tensor(self.labels)
        losses = []
        for _ in range(self.steps):
            rows = self._minibatch(len(self.messages))
            logits = self.model(*_bag([self.messages[i] for i in rows.tolist()]))
            losses.append(
                self._step(nn.functional.binary_cross_entropy_with_logits(logits, labels[rows]))
            )
        self.fitted = True
        self._cache.clear()
        with torch.no_grad():
            accuracy = float(
                ((self.probabilities(self.messages) > 0.5).float() == labels).float().mean()
            )
        return {"oni/classifier_loss": losses[-1], "oni/classifier_train_accuracy": accuracy}


def _bag(
    messages: Sequence[Message], known: dict[Message, list[int]] | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """The messages' feature ids and offsets for `nn.EmbeddingBag` (those of `known` reused)."""
    known = known or {}
    features = [known[m] if m in known else message_features(m) for m in messages]
    offsets = torch.tensor([0] + [len(f) for f in features[:-1]]).cumsum(0)
    return torch.tensor([i for f in features for i in f], dtype=torch.long), offsets


class RankingReward(_FittedReward):
    """Motif's reward model: a score `s(message)` (the classifier's network: hashed words into
    an MLP, one output) fitted to pairwise preferences by Bradley-Terry, `P(a preferred to b) =
    sigmoid(s(a) - s(b))`; `steps` Adam steps on minibatches of the pairs after each update
    that brought new ones, while there are at most `max_examples`.

    Preferences fix a score only up to a shift, so a message's reward is its win rate: the
    mean over the messages met in the preferences of `sigmoid(s(message) - s(other))`, the
    model's probability that it is preferred to one of them, in (0, 1); and 0 below
    `threshold` (Motif's threshold: events that lose to most others earn nothing instead of a
    little each). A message never compared gets the win rate of its score too. (A rank among
    the messages met was tried first: when most messages are unhelpful and tie, a new one's
    rank among them is decided by score differences of no meaning.)
    """

    learns_from_pairs = True
    metric_names = ("oni/ranking_loss", "oni/ranking_train_accuracy")

    def __init__(
        self,
        *,
        steps: int = 32,
        max_examples: int = 25_000,
        lr: float = 1e-2,
        threshold: float = 0.5,
        hidden: int = 32,
        batch_size: int = 256,
        seed: int = 0,
    ) -> None:
        super().__init__(
            steps=steps, max_examples=max_examples, lr=lr, hidden=hidden,
            batch_size=batch_size, seed=seed,
        )  # fmt: skip
        self.threshold = threshold
        self.pairs: list[Pair] = []
        self.preferences: list[float] = []
        self._index: dict[Pair, int] = {}
        self.messages: dict[Message, list[int]] = {}
        """Every message of the pairs, in order of arrival (the population of the ranks), with
        its feature ids (hashed once: hashing is most of a step's time otherwise)."""
        self._population = torch.zeros(0)
        """The scores of the messages met, at the last fit."""

    def add(self, labels: Sequence[tuple[Pair, float]]) -> None:  # type: ignore[override]
        for pair, preference in labels:
            if pair in self._index:  # a relabel replaces the example
                self.preferences[self._index[pair]] = float(preference)
                continue
            self._index[pair] = len(self.pairs)
            self.pairs.append(pair)
            self.preferences.append(float(preference))
            for message in pair:
                if message not in self.messages:
                    self.messages[message] = message_features(message)
            self._new += 1

    @torch.no_grad()
    def scores(self, messages: Sequence[Message]) -> torch.Tensor:
        """`s(message)` of each message under the current model."""
        return self.model(*_bag(messages, self.messages))

    def win_rate(self, message: Message) -> float:
        """The mean probability that the message is preferred to a message met."""
        score = self.scores([message])
        return float(torch.sigmoid(score - self._population).mean())

    def reward(self, message: Message) -> float:
        if not self.fitted:
            return 0.0
        if message not in self._cache:
            rate = self.win_rate(message)
            self._cache[message] = rate if rate >= self.threshold else 0.0
        return self._cache[message]

    def fit(self) -> dict[str, float]:
        if not self._due(len(self.pairs)):
            return {}
        self._new = 0
        preferences = torch.tensor(self.preferences)
        losses = []
        for _ in range(self.steps):
            rows = self._minibatch(len(self.pairs))
            picked = [self.pairs[i] for i in rows.tolist()]
            first = self.model(*_bag([a for a, _ in picked], self.messages))
            second = self.model(*_bag([b for _, b in picked], self.messages))
            margins = first - second
            losses.append(
                self._step(
                    nn.functional.binary_cross_entropy_with_logits(margins, preferences[rows])
                )
            )
        self.fitted = True
        self._cache.clear()
        self._population = self.scores(list(self.messages))
        with torch.no_grad():
            margins = self.scores([a for a, _ in self.pairs]) - self.scores(
                [b for _, b in self.pairs]
            )
            decided = preferences != 0.5
            agree = (margins[decided] > 0) == (preferences[decided] > 0.5)
            accuracy = float(agree.float().mean()) if decided.any() else math.nan
        return {"oni/ranking_loss": losses[-1], "oni/ranking_train_accuracy": accuracy}


def build_reward_model(cfg: OniConfig, *, seed: int = 0) -> RewardModel:
    """The reward model `oni.reward_model` names."""
    if cfg.reward_model == "retrieval":
        return RetrievalReward()
    if cfg.reward_model == "ranking":
        return RankingReward(
            steps=cfg.classifier_steps,
            max_examples=cfg.classifier_max_examples,
            lr=cfg.classifier_lr,
            threshold=cfg.ranking_threshold,
            seed=seed,
        )
    if cfg.reward_model == "classification":
        return ClassifierReward(
            steps=cfg.classifier_steps,
            max_examples=cfg.classifier_max_examples,
            lr=cfg.classifier_lr,
            seed=seed,
        )
    return NoReward()
