"""The annotator: labels the agent's event messages in its own process; the learner never waits.

The learner `submit`s each message once; the annotator's process keeps the messages not yet
labelled and labels the newest first, `oni.batch_size` at a time, with one of the labellers:

- `JudgeLabeller` (`oni.backend=local` or `openai`): a language model's preference for "yes"
  over "no" after `JUDGE_PROMPT` (the goal and the event), beyond its bias measured on
  content-free events (`oni.calibrate`), scored in-process by
  `glam.teach.scorers.LocalScorer` or by an OpenAI-compatible endpoint (`OpenAIScorer`);
- `OracleLabeller` (`oni.backend=oracle`): the task's own notion of progress
  (`glam.oni.oracle`), a control;
- `RandomLabeller` (`oni.backend=random`, and `yes` at rate 1): "yes" at a fixed rate whatever
  the event says, the control for the labels' content: with ONI's count decay any event bonus
  is an exploration bonus, and a judge's lift counts only beyond what these give.

With `oni.reward_model=ranking` (Motif's reward model) the items are `Pair`s of messages of one
goal and a label is a preference: `PairwiseJudge` asks the language model which of the two
events helps more (both orders, so that neither position wins by itself);
`PreferenceLabeller` derives it from a labeller of single messages for the controls.

The learner `poll`s without blocking. An annotator that fails (its labeller raised, its process
died) or hangs (no answer for `oni.hang_timeout` seconds while messages are pending) raises
`AnnotatorError` at the next poll; `close` stops the process (and a process whose learner died
stops by itself: no orphan).
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import multiprocessing
import os
import queue
import time
import traceback
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from glam.oni.config import OniConfig
from glam.oni.oracle import oracle_label
from glam.ppo.hooks import HookError
from glam.teach.scorers import SubgoalScorer, build_scorer

__all__ = [
    "JUDGE_PROMPT",
    "Annotator",
    "AnnotatorError",
    "AnnotatorStats",
    "JudgeLabeller",
    "Labeller",
    "Message",
    "OracleLabeller",
    "PAIR_PROMPT",
    "Pair",
    "PairwiseJudge",
    "PreferenceLabeller",
    "RandomLabeller",
    "build_labeller",
]

Message = tuple[str, str]
"""(goal, event): what is labelled. The goal is the episode's mission: in BabyAI whether an
event helps depends on it ("you pick up the red box" when the mission is the blue box)."""
Pair = tuple[Message, Message]
"""Two messages of one goal (`oni.reward_model=ranking`); the label is the preference for the
first: 1.0 it helps more, 0.0 the second does, 0.5 neither."""

JUDGE_PROMPT = (
    "An agent moves in a grid world of rooms, doors, keys, balls and boxes.\n"
    "The agent's goal: {goal}.\n"
    "What just happened: {event}.\n"
    "Question: does this bring the agent closer to its goal? Answer yes or no.\n"
    "Answer:"
)
"""The judging prompt; the label is 1 when the judge scores " yes" above " no" after it."""
ANSWERS = ("yes", "no")
PAIR_PROMPT = (
    "An agent moves in a grid world of rooms, doors, keys, balls and boxes.\n"
    "The agent's goal: {goal}.\n"
    "Event 1: {first}.\n"
    "Event 2: {second}.\n"
    "Question: which event brings the agent closer to its goal? Answer 1 or 2.\n"
    "Answer:"
)
"""The comparing prompt of `PairwiseJudge` (Motif asks its annotator to compare two captions)."""
PAIR_ANSWERS = ("1", "2")
CONTENT_FREE = ("N/A", "[MASK]", "")
"""Events that say nothing, whose margins measure the judge's bias (`JudgeLabeller`)."""

HEALTH_CHECK_SECONDS = 1.0
"""The learner looks at the annotator's process at most this often (when no labels came)."""


class AnnotatorError(HookError):
    """The annotator failed, died or hung; the run stops (its last checkpoint is kept)."""


class Labeller(ABC):
    """Labels messages: 1.0 helpful, 0.0 not."""

    @abstractmethod
    def label(self, messages: Sequence[Message]) -> list[float]:
        """One label per message."""

    def close(self) -> None:  # noqa: B027 (nothing to release by default)
        """Release the model or the connections."""


class OracleLabeller(Labeller):
    """`glam.oni.oracle`'s rule."""

    def label(self, messages: Sequence[Message]) -> list[float]:
        return [oracle_label(goal, event) for goal, event in messages]


class RandomLabeller(Labeller):
    """1.0 with probability `rate`, drawn once per message from a hash of `seed` and the
    message: a relabelled or resumed message gets the same answer, and no answer depends on
    what the event says (so `rate=1` says "yes" to everything)."""

    def __init__(self, rate: float, seed: int = 0) -> None:
        if not 0.0 <= rate <= 1.0:
            raise ValueError(f"a random labeller's rate must be in [0, 1], got {rate}")
        self.rate = rate
        self.seed = seed

    def uniform(self, message: Message) -> float:
        """The message's draw in [0, 1): the same in every process and run."""
        goal, event = message
        digest = hashlib.blake2b(f"{self.seed}\0{goal}\0{event}".encode(), digest_size=8)
        return int.from_bytes(digest.digest(), "big") / 2.0**64

    def label(self, messages: Sequence[Message]) -> list[float]:
        return [float(self.uniform(message) < self.rate) for message in messages]


class JudgeLabeller(Labeller):
    """A language model as the judge: 1.0 when its margin `log P(" yes") - log P(" no")` after
    `JUDGE_PROMPT` is above its bias.

    With `calibrate` (contextual calibration, Zhao et al. 2021), the bias is the judge's mean
    margin for the same goal with the content-free events of `CONTENT_FREE` (what it answers
    when nothing happened at all); without, it is 0. A small model can say "no" (or "yes") to
    everything while still ranking helpful events above the others: calibration keeps that
    ranking and moves the threshold to where its answers carry information.
    """

    def __init__(self, scorer: SubgoalScorer, *, calibrate: bool = True) -> None:
        self.scorer = scorer
        self.calibrate = calibrate
        self._bias: dict[str, float] = {}

    def margins(self, messages: Sequence[Message]) -> list[float]:
        """`log P(yes) - log P(no)` per message."""
        if not messages:
            return []
        prompts = [JUDGE_PROMPT.format(goal=goal, event=event) for goal, event in messages]
        scores = self.scorer.log_likelihoods(prompts, [list(ANSWERS)] * len(prompts))
        return [float(score[0] - score[1]) for score in scores]

    def bias(self, goal: str) -> float:
        """The threshold of the goal's margins (0 without `calibrate`)."""
        if not self.calibrate:
            return 0.0
        if goal not in self._bias:
            margins = self.margins([(goal, event) for event in CONTENT_FREE])
            self._bias[goal] = sum(margins) / len(margins)
        return self._bias[goal]

    def preferences(self, messages: Sequence[Message]) -> list[float]:
        """Each message's margin minus its goal's bias: > 0 is a "yes"."""
        return [
            margin - self.bias(goal)
            for (goal, _), margin in zip(messages, self.margins(messages), strict=True)
        ]

    def label(self, messages: Sequence[Message]) -> list[float]:
        return [float(margin > 0) for margin in self.preferences(messages)]

    def close(self) -> None:
        self.scorer.close()


class PreferenceLabeller(Labeller):
    """Preferences from a labeller of single messages: 1.0 when only the first message of a
    pair is helpful, 0.0 when only the second, 0.5 when both or neither (the oracle's and the
    controls' preferences)."""

    def __init__(self, labeller: Labeller) -> None:
        self.labeller = labeller

    def label(self, pairs: Sequence[Pair]) -> list[float]:  # type: ignore[override]
        flat = self.labeller.label([message for pair in pairs for message in pair])
        return [0.5 + 0.5 * (flat[2 * i] - flat[2 * i + 1]) for i in range(len(pairs))]

    def close(self) -> None:
        self.labeller.close()


class PairwiseJudge(Labeller):
    """A language model's preference between the two events of a pair under their goal: its
    margin `log P(" 1") - log P(" 2")` after `PAIR_PROMPT`, minus the same with the events
    swapped, halved (a model that always answers " 1" prefers neither); 1.0 when positive
    (the first), 0.0 when negative, 0.5 when 0."""

    def __init__(self, scorer: SubgoalScorer) -> None:
        self.scorer = scorer

    def margins(self, pairs: Sequence[Pair]) -> list[float]:
        """The order-balanced margin of each pair (> 0: the first event helps more)."""
        if not pairs:
            return []
        prompts = [
            PAIR_PROMPT.format(goal=first[0], first=one[1], second=two[1])
            for first, second in pairs
            for one, two in ((first, second), (second, first))
        ]
        scores = self.scorer.log_likelihoods(prompts, [list(PAIR_ANSWERS)] * len(prompts))
        sides = [float(score[0] - score[1]) for score in scores]
        return [(sides[2 * i] - sides[2 * i + 1]) / 2 for i in range(len(pairs))]

    def label(self, pairs: Sequence[Pair]) -> list[float]:  # type: ignore[override]
        return [1.0 if m > 0 else 0.0 if m < 0 else 0.5 for m in self.margins(pairs)]

    def close(self) -> None:
        self.scorer.close()


def build_labeller(cfg: OniConfig) -> Labeller:
    """The labeller `oni.backend` names (the judging model is loaded or connected to here);
    with `oni.reward_model=ranking`, the one that prefers between the messages of pairs."""
    if cfg.reward_model == "ranking":
        if cfg.backend in ("local", "openai"):
            return PairwiseJudge(build_scorer(cfg, "oni"))
        return PreferenceLabeller(build_labeller(dataclasses.replace(cfg, reward_model="none")))
    if cfg.backend == "oracle":
        return OracleLabeller()
    if cfg.backend in ("random", "yes"):
        rate = cfg.random_rate if cfg.backend == "random" else 1.0
        return RandomLabeller(rate, seed=cfg.random_seed or 0)
    return JudgeLabeller(build_scorer(cfg, "oni"), calibrate=cfg.calibrate)


@dataclass
class AnnotatorStats:
    """The learner's counts of the annotator's work (since the start of the run)."""

    sent: int = 0
    received: int = 0
    positive: int = 0
    busy_seconds: float = 0.0
    """Seconds the annotator spent labelling (its sleeps, `oni.delay`, not counted)."""
    latency_seconds: float = 0.0
    """Sum over received labels of the seconds from `submit` to `poll`."""

    @property
    def pending(self) -> int:
        """Messages sent and not labelled yet."""
        return self.sent - self.received


class Annotator:
    """The learner's end of the annotator process (see the module docstring)."""

    def __init__(
        self, cfg: OniConfig, *, make_labeller: Callable[[OniConfig], Labeller] = build_labeller
    ) -> None:
        """Start the annotator's process (spawned: a fresh interpreter, no copy of the
        learner's model or threads); `make_labeller` runs there and must be picklable."""
        self.cfg = cfg
        context = multiprocessing.get_context("spawn")
        self._requests = context.Queue()
        self._results = context.Queue()
        self.process = context.Process(
            target=serve,
            args=(cfg, self._requests, self._results, make_labeller, os.getpid()),
            name="glam-oni-annotator",
            daemon=True,
        )
        self.process.start()
        self.stats = AnnotatorStats()
        self.ready = False
        self._sent_at: dict[Message, float] = {}
        self._last_answer = time.monotonic()
        self._last_check = 0.0
        self._closed = False

    def submit(self, messages: Sequence[Message]) -> None:
        """Send messages to label (the caller sends each once)."""
        if not messages:
            return
        now = time.monotonic()
        if not self.stats.pending:  # the hang clock starts when there is work
            self._last_answer = now
        for message in messages:
            self._sent_at[message] = now
        self.stats.sent += len(messages)
        self._requests.put(list(messages))

    def poll(self) -> list[tuple[Message, float]]:
        """The labels that arrived since the last poll (never waits).

        Raises:
            AnnotatorError: the annotator reported a failure, died, or hung.
        """
        labels: list[tuple[Message, float]] = []
        now = time.monotonic()
        while True:
            try:
                kind, payload, busy = self._results.get_nowait()
            except queue.Empty:
                break
            self._last_answer = now
            if kind == "error":
                self.close()
                raise AnnotatorError(
                    f"the ONI annotator failed (oni.backend={self.cfg.backend}): {payload}"
                )
            if kind == "ready":
                self.ready = True
                continue
            self.stats.busy_seconds += busy
            for message, label in payload:
                self.stats.latency_seconds += now - self._sent_at.pop(message, now)
                self.stats.positive += int(label > 0.5)
            self.stats.received += len(payload)
            labels.extend(payload)
        if not labels and now - self._last_check >= HEALTH_CHECK_SECONDS:
            self._last_check = now
            self._check_health(now)
        return labels

    def wait_for_answer(
        self, timeout: float, interval: float = 0.05
    ) -> list[tuple[Message, float]]:
        """Poll until the annotator has answered once (ready, and a label if any message was
        sent) or `timeout` seconds pass; return the labels that arrived.

        Raises:
            AnnotatorError: it failed or died (as `poll`), or gave no answer within `timeout`.
        """
        labels = self.poll()
        deadline = time.monotonic() + timeout
        while not self.ready or (self.stats.sent and not self.stats.received):
            if time.monotonic() > deadline:
                what = "started" if not self.ready else "labelled a message"
                self.close()
                raise AnnotatorError(
                    f"the ONI annotator has not {what} {timeout:g} s after the run's last update "
                    f"(oni.backend={self.cfg.backend}, {self.stats.pending} messages pending)"
                )
            time.sleep(interval)
            self._last_check = 0.0  # a health check at every poll: a dead process shows now
            labels += self.poll()
        return labels

    def _check_health(self, now: float) -> None:
        if self._closed:
            raise AnnotatorError("the ONI annotator was closed")
        if self.process.exitcode is not None:
            code = self.process.exitcode
            self.close()
            raise AnnotatorError(
                f"the ONI annotator's process died (exit code {code}) with "
                f"{self.stats.pending} messages pending"
            )
        waited = now - self._last_answer
        if self.stats.pending and waited > self.cfg.hang_timeout:
            self.close()
            raise AnnotatorError(
                f"the ONI annotator gave no answer for {waited:.0f} s with {self.stats.pending} "
                f"messages pending: hung (oni.hang_timeout={self.cfg.hang_timeout:g})"
            )

    def close(self) -> None:
        """Stop the annotator's process (asked first, then terminated, then killed)."""
        if self._closed:
            return
        self._closed = True
        if self.process.is_alive():
            with contextlib.suppress(OSError, ValueError):  # a queue already broken
                self._requests.put(None)
            self.process.join(timeout=5.0)
        if self.process.is_alive():
            self.process.terminate()
            self.process.join(timeout=5.0)
        if self.process.is_alive():
            self.process.kill()
            self.process.join()
        for channel in (self._requests, self._results):
            channel.cancel_join_thread()
            channel.close()


def serve(
    cfg: OniConfig,
    requests: Any,
    results: Any,
    make_labeller: Callable[[OniConfig], Labeller],
    learner_pid: int,
) -> None:
    """The annotator's process: label pending messages, newest first, until told to stop (a
    None request) or the learner is gone."""
    torch.set_num_threads(cfg.threads)
    try:
        labeller = make_labeller(cfg)
    except Exception as error:  # reported to the learner, which stops the run
        results.put(("error", _describe(error), 0.0))
        return
    results.put(("ready", None, 0.0))
    pending: list[Message] = []
    try:
        while True:
            try:
                request = requests.get(timeout=1.0) if not pending else requests.get_nowait()
                while request is not None:
                    pending.extend(request)
                    request = requests.get_nowait()
                return  # None: the learner closes the run
            except queue.Empty:
                pass
            if not pending:
                if os.getppid() != learner_pid:  # the learner died: do not linger
                    return
                continue
            batch = pending[-cfg.batch_size :]
            del pending[-len(batch) :]
            start = time.perf_counter()
            labels = labeller.label(batch)
            busy = time.perf_counter() - start
            if cfg.delay:
                time.sleep(cfg.delay)
            results.put(("labels", list(zip(batch, labels, strict=True)), busy))
    except Exception as error:
        results.put(("error", _describe(error), 0.0))
    finally:
        labeller.close()


def _describe(error: BaseException) -> str:
    """`ExceptionType: message`, to report across processes."""
    return traceback.format_exception_only(type(error), error)[-1].strip()
