"""ONI: the oracle, the count decay, the reward models, the asynchronous annotator (newest
first, each message once, never waited for, failures detected), the HTTP backend on a real
server on 127.0.0.1, and ONI inside training runs.

.venv/bin/python -m pytest tests/test_oni.py
"""

from __future__ import annotations

import csv
import json
import multiprocessing
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import gymnasium as gym
import pytest
import torch
from accelerate import Accelerator
from gymnasium import spaces
from helpers_couplings import SMALL_SYMBOLIC, WALL_CLOCK_METRICS, server, tiny_folder
from helpers_oni import Gated, failing, failing_at_start
from helpers_tiny import one_torch_thread

from babyai_text import get_action_space
from glam.baselines.symbolic import build_symbolic_policy
from glam.couplings import coupling_hooks
from glam.llm.server import ChatServer
from glam.oni.agreement import agreement, collect_messages, draw
from glam.oni.annotator import (
    CONTENT_FREE,
    Annotator,
    AnnotatorError,
    JudgeLabeller,
    Message,
    Pair,
    PairwiseJudge,
    PreferenceLabeller,
    RandomLabeller,
    build_labeller,
)
from glam.oni.config import OniConfig
from glam.oni.hook import OniEnv, OniHook, labels_path, read_labels
from glam.oni.oracle import mission_objects, oracle_label
from glam.oni.rewards import ClassifierReward, RankingReward, RetrievalReward, decayed
from glam.ppo.entry import run_training
from glam.ppo.trainer import train
from glam.run_config import compose_run
from glam.runs.checkpoint import check_checkpoint
from glam.runs.folder import latest_checkpoint
from glam.teach.scorers import LocalScorer, OpenAIScorer

__all__ = ["one_torch_thread", "server", "tiny_folder"]  # fixtures (one thread: autouse)


def _metrics(run_dir: Path) -> list[dict[str, str]]:
    with (run_dir / "metrics.csv").open() as file:
        return list(csv.DictReader(file))


def _wait_for(condition, seconds: float = 60.0) -> None:  # noqa: ANN001
    deadline = time.monotonic() + seconds
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {seconds} s")
        time.sleep(0.02)


def _poll_until(annotator: Annotator, count: int, seconds: float = 60.0) -> list[list[Message]]:
    """Poll until `count` labels came; what each poll returned."""
    batches: list[list[Message]] = []
    deadline = time.monotonic() + seconds
    while sum(map(len, batches)) < count:
        labels = annotator.poll()
        if labels:
            batches.append([message for message, _ in labels])
        if time.monotonic() > deadline:
            raise AssertionError(f"{sum(map(len, batches))} of {count} labels in {seconds} s")
        time.sleep(0.01)
    return batches


# --- The oracle, the decay, the reward models ---------------------------------------------------


@pytest.mark.parametrize(
    ("mission", "event", "label"),
    [
        ("pick up the purple box", "you pick up the yellow key", 1.0),
        ("pick up the purple box", "you unlock the yellow door", 1.0),
        ("pick up the purple box", "you open the yellow door", 1.0),
        ("pick up the purple box", "you pick up the purple box", 1.0),
        ("pick up the purple box", "you pick up the red box", 0.0),
        ("pick up the purple box", "you close the yellow door", 0.0),
        ("pick up the purple box", "you drop the yellow key", 0.0),
        ("pick up the purple box", "the yellow door is locked", 0.0),
        ("pick up the purple box", "you bump into the wall", 0.0),
        ("pick up a ball", "you pick up the grey ball", 1.0),
        ("put the red ball next to the green box", "you drop the red ball", 1.0),
        ("put the red ball next to the green box", "you drop the green box", 0.0),
        ("go to the red ball", "you open the red box", 0.0),
        ("go to the red ball", "nothing happens", 0.0),
    ],
)
def test_the_oracle_labels_progress(mission: str, event: str, label: float) -> None:
    assert oracle_label(mission, event) == label


def test_the_random_labeller_says_yes_at_its_rate_whatever_the_event() -> None:
    messages = [(f"pick up the box {i % 7}", f"event {i}") for i in range(4000)]
    labels = RandomLabeller(0.51, seed=1).label(messages)
    # 4000 draws at 0.51: a standard deviation of 0.0079, so 0.51 +- 0.03 fails once in 10^4
    assert abs(sum(labels) / len(labels) - 0.51) < 0.03
    assert RandomLabeller(0.51, seed=1).label(messages) == labels  # the same in every process
    assert RandomLabeller(0.51, seed=2).label(messages) != labels  # a seed labels differently
    assert set(RandomLabeller(1.0).label(messages)) == {1.0}
    assert set(RandomLabeller(0.0).label(messages)) == {0.0}
    assert set(build_labeller(OniConfig(backend="yes")).label(messages)) == {1.0}
    random = build_labeller(OniConfig(backend="random", random_rate=0.25, random_seed=3))
    assert isinstance(random, RandomLabeller) and (random.rate, random.seed) == (0.25, 3)
    with pytest.raises(ValueError, match=r"oni.random_rate must be in \[0, 1\], got 1.5"):
        OniConfig(backend="random", random_rate=1.5)


def test_the_random_labeller_draws_from_the_run_seed_unless_told() -> None:
    annotator = SimpleNamespace()
    cfg = OniConfig(reward_model="retrieval", backend="random")
    assert OniHook(cfg, seed=7, make_annotator=annotator).cfg.random_seed == 7
    cfg = OniConfig(reward_model="retrieval", backend="random", random_seed=0)
    assert OniHook(cfg, seed=7, make_annotator=annotator).cfg.random_seed == 0


def test_mission_objects() -> None:
    assert mission_objects("put the red ball next to a box") == [("red", "ball"), (None, "box")]
    assert mission_objects("open the door") == [(None, "door")]


def test_count_decay() -> None:
    assert decayed(1.0, 1, 3.0) == 1.0
    assert decayed(1.0, 2, 3.0) == 1 / 8
    assert decayed(0.5, 3, 1.0) == pytest.approx(0.5 / 3)
    assert decayed(1.0, 5, 0.0) == 1.0
    with pytest.raises(ValueError, match="starts at 1"):
        decayed(1.0, 0, 3.0)


def test_retrieval_reward_is_the_label_and_zero_before() -> None:
    model = RetrievalReward()
    a, b = ("pick up the red box", "you pick up the red box"), ("go", "nothing happens")
    assert model.reward(a) == 0.0
    model.add([(a, 1.0), (b, 0.0)])
    assert (model.reward(a), model.reward(b)) == (1.0, 0.0)
    assert model.reward(("other", "message")) == 0.0


def _toy_labels(goal_colors: Sequence[str]) -> list[tuple[Message, float]]:
    """Key pick-ups help, the goal's box helps, other boxes and failures do not."""
    labels = []
    for goal_color in goal_colors:
        goal = f"pick up the {goal_color} box"
        for color in ("red", "green", "blue", "purple", "yellow", "grey"):
            labels.append(((goal, f"you pick up the {color} key"), 1.0))
            labels.append(((goal, f"you pick up the {color} box"), float(color == goal_color)))
            labels.append(((goal, f"you bump into the {color} ball"), 0.0))
        labels.append(((goal, "nothing happens"), 0.0))
    return labels


def test_the_classifier_fits_toy_labels_and_rewards_unseen_messages() -> None:
    model = ClassifierReward(steps=200, lr=1e-2, seed=0)
    train_labels = _toy_labels(["red", "blue", "purple", "yellow"])
    model.add(train_labels)
    probe = ("pick up the red box", "you pick up the red key")
    assert model.reward(probe) == 0.0  # not fitted yet
    metrics = model.fit()
    assert metrics["oni/classifier_train_accuracy"] == 1.0
    assert model.fit() == {}  # no new labels: no new fit
    for message, label in train_labels:
        assert (model.reward(message) > 0.5) == (label == 1.0), message
    # goals never labelled: key pick-ups and bumps generalise
    assert model.reward(("pick up the green box", "you pick up the grey key")) > 0.8
    assert model.reward(("pick up the grey box", "you bump into the red ball")) < 0.2
    # the same seed fits the same classifier
    again = ClassifierReward(steps=200, lr=1e-2, seed=0)
    again.add(train_labels)
    again.fit()
    assert again.reward(probe) == model.reward(probe)


def _pairs_of(messages: Sequence[Message]) -> list[Pair]:
    """Every pair of two messages of one goal, each way round once."""
    return [(a, b) for i, a in enumerate(messages) for b in messages[i + 1 :] if a[0] == b[0]]


def test_the_ranking_model_learns_the_oracles_preferences_and_ranks_held_out_pairs() -> None:
    """Motif's reward model, fitted to preferences from the annotator (the oracle's, through
    the labeller the annotator runs), orders pairs of goals it never saw as the oracle does."""
    annotator = build_labeller(OniConfig(reward_model="ranking", backend="oracle"))
    assert isinstance(annotator, PreferenceLabeller)
    train_pairs = _pairs_of([m for m, _ in _toy_labels(["red", "blue", "purple", "yellow"])])
    model = RankingReward(steps=60, lr=3e-2, threshold=0.5, seed=0)
    model.add(list(zip(train_pairs, annotator.label(train_pairs), strict=True)))
    assert model.reward(("pick up the red box", "you pick up the red key")) == 0.0  # not fitted
    metrics = model.fit()
    assert metrics["oni/ranking_train_accuracy"] == 1.0
    assert model.fit() == {}  # no new preferences: no new fit
    held_out = [
        (a, b)
        for a, b in _pairs_of([m for m, _ in _toy_labels(["green", "grey"])])
        if oracle_label(*a) != oracle_label(*b)  # the oracle prefers one of the two
    ]
    scores = model.scores([m for pair in held_out for m in pair])
    right = [
        (float(scores[2 * i] - scores[2 * i + 1]) > 0) == (oracle_label(*a) > oracle_label(*b))
        for i, (a, b) in enumerate(held_out)
    ]
    # 2 goals x 7 helpful x 12 other messages; chance is 1/2 (0.946 measured with this seed)
    assert len(right) == 168 and sum(right) / len(right) > 0.85
    # rewards are win rates in (0, 1), 0 below 0.5: a key pick-up pays, a bump does not
    goal = "pick up the green box"
    key, wall = (goal, "you pick up the grey key"), (goal, "you bump into the wall")
    assert 0.5 <= model.reward(key) < 1.0
    assert model.win_rate(wall) < 0.5 and model.reward(wall) == 0.0


class ScriptedScorer:
    """A judge whose log P(" 1") - log P(" 2") is 2.0 plus 1.0 when event 1 holds "key": it
    leans towards answering "1" whatever it reads, and prefers keys."""

    def log_likelihoods(self, prompts: Sequence[str], candidates: Any) -> list[torch.Tensor]:
        first = [p.split("Event 1: ")[1].split("\n")[0] for p in prompts]
        return [torch.tensor([2.0 + ("key" in e), 0.0]) for e in first]

    def close(self) -> None:
        pass


def test_the_pairwise_judge_cancels_its_leaning_towards_the_first_answer() -> None:
    judge = PairwiseJudge(ScriptedScorer())
    goal = "pick up the red box"
    key, wall, ball = (
        (goal, "you pick up the red key"),
        (goal, "you bump into the wall"),
        (
            goal,
            "you bump into the ball",
        ),
    )
    assert judge.margins([(key, wall), (wall, key), (wall, ball)]) == [0.5, -0.5, 0.0]
    assert judge.label([(key, wall), (wall, key), (wall, ball)]) == [1.0, 0.0, 0.5]


# --- The env and the hook, with an annotator in this process ------------------------------------


class ScriptedEnv(gym.Env):
    """A stand-in for `babyai_text.TextEnv` whose steps report scripted events."""

    def __init__(self, script: list[list[str]], *, done_at: int = 99) -> None:
        self.script, self.done_at = script, done_at
        self.action_space_def = get_action_space("default")
        self.action_words = self.action_space_def.words
        self.action_space = spaces.Discrete(len(self.action_words))
        self.observation_space = spaces.Dict({})
        self.language, self.mission, self.task_type = "en", "pick up the red box", "pickup"
        self.t = 0

    def reset(self, *, seed: int | None = None, options: Any = None) -> tuple[dict, dict]:
        self.t = 0
        return {"mission": self.mission}, {"events": []}

    def step(self, action: Any) -> tuple[dict, float, bool, bool, dict]:
        events = self.script[self.t % len(self.script)]
        self.t += 1
        done = self.t >= self.done_at
        return {"mission": self.mission}, 0.5 * done, done, False, {"events": events}


class InProcessAnnotator:
    """The annotator's interface, labelling by the oracle at the next poll; records submits."""

    def __init__(self, cfg: OniConfig) -> None:
        self.submitted: list[list[Message]] = []
        self.queued: list[Message] = []
        self.closed = False
        self.labeller = build_labeller(cfg)  # the oracle (its preferences for `ranking`)

        class Stats:
            sent = received = positive = 0
            busy_seconds = latency_seconds = 0.0

        self.stats = Stats()

    def submit(self, messages: Sequence[Message]) -> None:
        self.submitted.append(list(messages))
        self.queued.extend(messages)
        self.stats.sent += len(messages)

    def poll(self) -> list[tuple[Message, float]]:
        labels = list(zip(self.queued, self.labeller.label(self.queued), strict=True))
        self.queued = []
        self.stats.received += len(labels)
        return labels

    def wait_for_answer(self, timeout: float) -> list[tuple[Message, float]]:
        return self.poll()

    def close(self) -> None:
        self.closed = True


def _hook(run_dir: Path, **settings: Any) -> OniHook:
    settings = {"reward_model": "retrieval", "backend": "oracle", **settings}
    hook = OniHook(OniConfig(**settings), make_annotator=InProcessAnnotator)
    hook.start(SimpleNamespace(accelerator=SimpleNamespace(process_index=0), run_dir=run_dir))
    return hook


def test_the_env_mixes_rewards_and_decays_counts_within_an_episode(tmp_path: Path) -> None:
    hook = _hook(tmp_path, extrinsic_coef=2.0, intrinsic_coef=0.1, beta=3.0)
    key = "you pick up the yellow key"
    env = OniEnv(ScriptedEnv([[key], [], [key, "you bump into the wall"]], done_at=4), hook)
    env.reset(seed=0)
    _, reward, _, _, info = env.step(0)
    assert reward == 0.0 and info["oni"] == {"intrinsic": 0.0, "extrinsic": 0.0}  # not labelled
    hook.exchange()  # the label arrives
    assert hook.reward_model.reward(("pick up the red box", key)) == 1.0
    _, reward, *_ = env.step(0)  # no event
    assert reward == 0.0
    _, reward, _, _, info = env.step(0)  # the key's 2nd occurrence: 1 / 2**3
    assert info["oni"]["intrinsic"] == pytest.approx(1 / 8)
    assert reward == pytest.approx(0.1 / 8)
    _, reward, terminated, _, info = env.step(0)  # 3rd occurrence, and the episode ends
    assert terminated and info["oni"]["intrinsic"] == pytest.approx(1 / 27)
    assert reward == pytest.approx(2.0 * 0.5 + 0.1 / 27)
    assert hook._update_sums == pytest.approx([1, 1 / 8 + 1 / 27, 0.5])
    env.reset(seed=1)  # counts start afresh
    _, reward, _, _, info = env.step(0)
    assert info["oni"]["intrinsic"] == 1.0 and reward == pytest.approx(0.1)
    assert (env.action_words, env.mission, env.task_type) == (
        get_action_space("default").words,
        "pick up the red box",
        "pickup",
    )


def test_the_hook_sends_each_message_once_and_keeps_the_labels(tmp_path: Path) -> None:
    hook = _hook(tmp_path)
    events = ["you pick up the yellow key", "nothing happens"]
    envs = [OniEnv(ScriptedEnv([[e] for e in events] * 3, done_at=3), hook) for _ in range(3)]
    for env in envs:
        env.reset(seed=0)
    for _ in range(6):
        for env in envs:
            _, _, done, _, _ = env.step(0)
            if done:
                env.reset(seed=0)
        hook.exchange()
    sent = [m for batch in hook.annotator.submitted for m in batch]
    assert sorted(sent) == sorted(("pick up the red box", e) for e in events)
    hook.close()
    assert hook.annotator.closed
    saved = read_labels(labels_path(tmp_path))
    assert sorted(saved) == sorted((m, oracle_label(*m)) for m in sent)
    with labels_path(tmp_path).open("a") as file:
        file.write('{"goal": "cut sho')  # a crash in the middle of a line
    again = _hook(tmp_path)  # a resumed run: the labels are back, nothing is sent again
    assert again.reloaded == 2 and again.seen == set(sent)
    assert again.reward_model.reward(("pick up the red box", events[0])) == 1.0


def test_the_hook_pairs_new_messages_with_earlier_ones_of_their_goal(tmp_path: Path) -> None:
    hook = _hook(tmp_path, reward_model="ranking", ranking_pairs=2)
    goal = "pick up the red box"
    events = ["you bump into the wall", "you pick up the yellow key", "nothing happens"]
    env = OniEnv(ScriptedEnv([[e] for e in events] * 2, done_at=99), hook)
    env.reset(seed=0)
    for _ in range(6):
        env.step(0)
        hook.exchange()
    sent = [item for batch in hook.annotator.submitted for item in batch]
    # the first event has no partner; the second is paired with it, the third with both
    assert sorted(sent) == sorted(
        [
            ((goal, events[1]), (goal, events[0])),
            ((goal, events[2]), (goal, events[0])),
            ((goal, events[2]), (goal, events[1])),
        ]
    )
    assert hook.after_update is not None and hook.reward_model.fit()["oni/ranking_loss"] >= 0
    hook.close()
    saved = read_labels(labels_path(tmp_path))
    assert {"other"} <= set(json.loads(labels_path(tmp_path).read_text().splitlines()[0]))
    assert dict(saved)[((goal, events[1]), (goal, events[0]))] == 1.0  # the key is preferred
    again = _hook(tmp_path, reward_model="ranking")  # resumed: the pairs are back
    assert again.reloaded == 3 and again.seen == {(goal, e) for e in events}
    assert sorted(again._events_by_goal[goal]) == sorted(events)


# --- The annotator's process --------------------------------------------------------------------


def test_the_annotator_labels_newest_first_and_the_learner_never_waits(tmp_path: Path) -> None:
    log, gate = tmp_path / "batches.jsonl", tmp_path / "gate"
    cfg = OniConfig(reward_model="retrieval", batch_size=2)
    annotator = Annotator(cfg, make_labeller=Gated(log, gate))
    try:
        a, b, c, d, e = [("goal", f"event {i}") for i in range(5)]
        annotator.submit([a])
        _wait_for(lambda: log.exists())  # the annotator holds a, its first batch
        for message in (b, c, d, e):
            annotator.submit([message])
        assert annotator.poll() == []  # nothing yet, and no waiting for it
        assert annotator.stats.pending == 5
        gate.touch()
        received = [m for batch in _poll_until(annotator, 5) for m in batch]
        logged = [[tuple(m) for m in json.loads(line)] for line in log.read_text().splitlines()]
        assert logged == [[a], [d, e], [b, c]]  # newest first, two at a time, each once
        assert received == [a, d, e, b, c]
        stats = annotator.stats
        assert (stats.sent, stats.received, stats.positive, stats.pending) == (5, 5, 5, 0)
        assert stats.latency_seconds > 0 and annotator.ready
    finally:
        annotator.close()
    assert not annotator.process.is_alive()


def test_the_oracle_annotator_labels_in_its_process() -> None:
    annotator = Annotator(OniConfig(reward_model="retrieval", backend="oracle"))
    messages = [("pick up the red box", "you pick up the red box"), ("go", "nothing happens")]
    try:
        annotator.submit(messages)
        _poll_until(annotator, 2)
        assert annotator.stats.positive == 1
    finally:
        annotator.close()


def test_an_annotator_whose_labeller_fails_stops_the_run_with_its_message() -> None:
    for make, message in ((failing, "fell off the bus"), (failing_at_start, "no judging model")):
        annotator = Annotator(OniConfig(reward_model="retrieval"), make_labeller=make)
        annotator.submit([("goal", "event")])
        with pytest.raises(AnnotatorError, match=message):
            _poll_until(annotator, 1)
        assert not annotator.process.is_alive()


def test_an_annotator_that_dies_or_hangs_is_detected(tmp_path: Path) -> None:
    cfg = OniConfig(reward_model="retrieval", hang_timeout=600.0)
    annotator = Annotator(cfg, make_labeller=Gated(tmp_path / "log", tmp_path / "never"))
    annotator.submit([("goal", "event")])
    _wait_for(lambda: (tmp_path / "log").exists())
    os.kill(annotator.process.pid, signal.SIGKILL)
    with pytest.raises(AnnotatorError, match="died"):
        _poll_until(annotator, 1)
    cfg = OniConfig(reward_model="retrieval", hang_timeout=1.0)
    annotator = Annotator(cfg, make_labeller=Gated(tmp_path / "log2", tmp_path / "never"))
    annotator.submit([("goal", "event")])
    with pytest.raises(AnnotatorError, match="hung"):
        _poll_until(annotator, 1)
    assert not annotator.process.is_alive()  # closed by the error


# --- The HTTP backend, on a server on 127.0.0.1 -------------------------------------------------


MESSAGES = [
    ("pick up the purple box", "you pick up the yellow key"),
    ("pick up the purple box", "you bump into the wall"),
    ("go to the red ball", "you open the red door"),
]


def test_the_http_judge_equals_the_local_judge(tiny_folder: Path, server: ChatServer) -> None:
    local = JudgeLabeller(LocalScorer.load(str(tiny_folder)))
    remote = JudgeLabeller(OpenAIScorer(server.url, timeout=30, max_retries=0, setting="oni"))
    here, there = local.preferences(MESSAGES), remote.preferences(MESSAGES)
    assert there == pytest.approx(here, abs=1e-4)
    assert remote.label(MESSAGES) == [float(m > 0) for m in here]
    cfg = OniConfig(reward_model="retrieval", backend="openai", base_url=server.url, timeout=30)
    annotator = Annotator(cfg)  # the same judge, from the annotator's process
    try:
        annotator.submit(MESSAGES)
        labels = dict((message, label) for batch in [annotator.poll()] for message, label in batch)
        deadline = time.monotonic() + 120
        while len(labels) < len(MESSAGES) and time.monotonic() < deadline:
            labels.update(annotator.poll())
            time.sleep(0.02)
        assert [labels[m] for m in MESSAGES] == [float(m > 0) for m in here]
    finally:
        annotator.close()


def test_an_unreachable_server_stops_the_annotator_naming_the_key() -> None:
    with socket.socket() as free:
        free.bind(("127.0.0.1", 0))
        port = free.getsockname()[1]
    cfg = OniConfig(
        reward_model="retrieval",
        backend="openai",
        base_url=f"http://127.0.0.1:{port}/v1",
        max_retries=0,
        timeout=5.0,
    )
    annotator = Annotator(cfg)
    annotator.submit([("goal", "event")])
    with pytest.raises(AnnotatorError, match="oni.base_url"):
        _poll_until(annotator, 1)


# --- In the trainer ----------------------------------------------------------------------------

LEVEL = ["env.name=BabyAI-UnlockPickup-v0", "env.action_space=default"]


def test_oni_settings_are_checked_and_name_the_coupling() -> None:
    with pytest.raises(ValueError, match="oni.reward_model='motif'"):
        OniConfig(reward_model="motif")
    with pytest.raises(ValueError, match="oni.ranking_pairs must be >= 1"):
        OniConfig(reward_model="ranking", ranking_pairs=0)
    with pytest.raises(ValueError, match="oni.backend='vllm'"):
        OniConfig(backend="vllm")
    with pytest.raises(ValueError, match="oni.intrinsic_coef"):
        OniConfig(intrinsic_coef=-1.0)
    with pytest.raises(ValueError, match="policy.kind=symbolic or llm"):
        compose_run("drrn", ["oni.reward_model=retrieval"])
    preset = compose_run("oni_symbolic")
    assert (preset.oni.reward_model, preset.oni.backend) == ("retrieval", "local")
    assert preset.env.name == "BabyAI-UnlockPickup-v0"
    assert [type(h) for h in coupling_hooks(preset)] == [OniHook]
    assert coupling_hooks(compose_run("oni_symbolic", ["oni.reward_model=none"])) == []


def test_oni_without_intrinsic_weight_trains_exactly_as_plain_ppo(tmp_path: Path) -> None:
    accelerator = Accelerator(cpu=True)
    runs = {}
    for name, preset, extra in (
        ("plain", "symbolic_ppo", []),
        ("oni", "oni_symbolic", ["oni.backend=oracle", "oni.intrinsic_coef=0"]),
    ):
        cfg = compose_run(
            preset, [*SMALL_SYMBOLIC, *LEVEL, *extra, f"train.output_dir={tmp_path / name}"]
        )
        hooks = coupling_hooks(cfg)
        train(cfg, accelerator, tmp_path / name, make_policy=build_symbolic_policy, hooks=hooks)
        runs[name] = _metrics(tmp_path / name)
    for plain, oni in zip(runs["plain"], runs["oni"], strict=True):
        assert {k for k in oni if not k.startswith("oni/")} == plain.keys()
        for key, value in plain.items():
            if not key.startswith(WALL_CLOCK_METRICS):
                assert oni[key] == value, key
    last = runs["oni"][-1]
    assert float(last["oni/messages_sent"]) > 0
    assert float(last["oni/labels_received"]) + float(last["oni/labels_pending"]) == float(
        last["oni/messages_sent"]
    )
    assert multiprocessing.active_children() == []  # the annotator stopped with the run


def _ready_annotator(cfg: OniConfig) -> Annotator:
    """An annotator whose process has started (before any message: polls return nothing)."""
    annotator = Annotator(cfg)
    _wait_for(lambda: annotator.poll() == [] and annotator.ready)
    return annotator


def test_an_oni_run_rewards_labelled_events(tmp_path: Path) -> None:
    cfg = compose_run(
        "oni_symbolic",
        [
            *SMALL_SYMBOLIC,
            "oni.backend=oracle",
            "oni.reward_model=classification",
            "oni.intrinsic_coef=1.0",
            "train.total_frames=640",
            f"train.output_dir={tmp_path}",
        ],
    )
    hooks = [OniHook(cfg.oni, make_annotator=_ready_annotator)]  # a run shorter than a spawn
    train(cfg, Accelerator(cpu=True), tmp_path, make_policy=build_symbolic_policy, hooks=hooks)
    rows = _metrics(tmp_path)
    assert float(rows[-1]["oni/labels_received"]) > 0
    fitted = [row for row in rows if row.get("oni/classifier_train_accuracy")]
    assert fitted, "the classifier never fitted"
    assert 0.0 <= float(rows[-1]["oni/positive_fraction"]) <= 1.0


def test_an_oni_run_ranks_events_from_preferences(tmp_path: Path) -> None:
    """Motif's ranking model in a training run (the oracle's preferences, in this process)."""
    cfg = compose_run(
        "oni_symbolic",
        [
            *SMALL_SYMBOLIC,
            "oni.backend=oracle",
            "oni.reward_model=ranking",
            "oni.intrinsic_coef=1.0",
            "train.total_frames=640",
            f"train.output_dir={tmp_path}",
        ],
    )
    hooks = [OniHook(cfg.oni, make_annotator=InProcessAnnotator)]
    train(cfg, Accelerator(cpu=True), tmp_path, make_policy=build_symbolic_policy, hooks=hooks)
    rows = _metrics(tmp_path)
    assert float(rows[-1]["oni/labels_received"]) > 0  # preferences of pairs
    assert any(row.get("oni/ranking_train_accuracy") for row in rows), "never fitted"
    # blank before the first fit, but a column of metrics.csv from its first row on
    assert {"oni/ranking_loss", "oni/ranking_train_accuracy"} <= set(rows[0])
    assert any("other" in json.loads(line) for line in labels_path(tmp_path).open())


def test_a_hung_annotator_stops_the_run_and_keeps_its_checkpoints(tmp_path: Path) -> None:
    # The oracle labels its first batch, then sleeps: the next messages wait past the time-out.
    cfg = compose_run(
        "oni_symbolic",
        [
            *SMALL_SYMBOLIC,
            "oni.backend=oracle",
            "oni.delay=1000",
            "oni.hang_timeout=4",
            "train.total_frames=100000",
            "train.save_every=1",
            f"train.output_dir={tmp_path}",
        ],
    )

    def trainer(cfg, accelerator, run_dir, stop):  # noqa: ANN001, ANN202
        return train(
            cfg,
            accelerator,
            run_dir,
            stop=stop,
            make_policy=build_symbolic_policy,
            hooks=coupling_hooks(cfg),
        )

    status = run_training(cfg, trainer, config_name="oni_symbolic")
    assert status == 4
    last = latest_checkpoint(tmp_path)
    assert last is not None, "no checkpoint was written before the annotator hung"
    assert check_checkpoint(last).update >= 1  # complete and readable
    assert multiprocessing.active_children() == []


def test_a_run_shorter_than_the_annotators_failure_still_fails(tmp_path: Path) -> None:
    """One update with the judge's server unreachable: the run's end waits for the annotator's
    first answer, which is its error (exit status 4), not "done" with no label received."""
    with socket.socket() as free:
        free.bind(("127.0.0.1", 0))
        port = free.getsockname()[1]
    done = subprocess.run(
        [
            sys.executable,
            str(Path(__file__).parent.parent / "scripts" / "train_baseline.py"),
            "--config-name",
            "oni_symbolic",
            *SMALL_SYMBOLIC,
            "train.total_frames=64",  # one update
            "oni.backend=openai",
            f"oni.base_url=http://127.0.0.1:{port}/v1",
            "oni.max_retries=0",
            "oni.timeout=5",
            f"train.output_dir={tmp_path / 'run'}",
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 4, done.stdout[-1500:] + done.stderr[-1500:]
    assert "oni.base_url" in done.stderr and "done:" not in done.stdout
    assert latest_checkpoint(tmp_path / "run") is not None  # the finished update is kept


# --- The judge's agreement with the oracle ------------------------------------------------------


class MarginScorer:
    """Scores " yes" at the margin `margin(prompt)` above " no"."""

    def __init__(self, margin) -> None:  # noqa: ANN001
        self.margin = margin

    def log_likelihoods(self, prompts, candidates):  # noqa: ANN001, ANN201
        return [torch.tensor([self.margin(p), 0.0]) for p in prompts]

    def close(self) -> None:
        pass


def test_the_calibrated_judge_compares_with_its_content_free_margin() -> None:
    def margin(prompt: str) -> float:  # biased to "no"; less so for keys
        event = prompt.split("What just happened: ")[1].split(".\n")[0]
        return -1.0 if "key" in event else -3.0 if event in CONTENT_FREE else -4.0

    messages = [("pick up the red box", "you pick up the red key"), ("pick up", "nothing happens")]
    assert JudgeLabeller(MarginScorer(margin), calibrate=False).label(messages) == [0.0, 0.0]
    calibrated = JudgeLabeller(MarginScorer(margin))
    assert calibrated.label(messages) == [1.0, 0.0]
    assert calibrated.preferences(messages) == [2.0, -1.0]  # margin minus the goal's bias of -3
    assert calibrated.bias("pick up the red box") == -3.0


def test_agreement_measures_by_hand() -> None:
    result = agreement([1.0, 1.0, 0.0, 0.0], [1.0, 0.0, 0.0, 1.0], [2.0, -1.0, -3.0, 0.5])
    assert result["agreement"] == 0.5 and result["base_rate"] == 0.5
    assert result["judged_positive_rate"] == 0.5 and result["constant_agreement"] == 0.5
    assert result["cohen_kappa"] == 0.0 and result["balanced_accuracy"] == 0.5
    assert result["margin_auc"] == 0.75  # 3 of the 4 (positive, negative) pairs ranked right
    always_no = agreement([1.0, 0.0, 0.0, 0.0], [0.0] * 4)
    assert always_no["agreement"] == 0.75 == always_no["constant_agreement"]
    assert always_no["cohen_kappa"] == 0.0 and always_no["true_positive_rate"] == 0.0
    with pytest.raises(ValueError, match="as many"):
        agreement([1.0], [])


def test_collected_messages_are_distinct_seeded_and_hold_progress() -> None:
    level = ["BabyAI-UnlockPickup-v0"]
    messages = collect_messages(level, episodes_per_level=2, noise=0.3, seed=0)
    assert messages == collect_messages(level, episodes_per_level=2, noise=0.3, seed=0)
    assert len(set(messages)) == len(messages)
    assert all(goal.startswith("pick up the") and goal.endswith("box") for goal, _ in messages)
    bot_only = collect_messages(level, episodes_per_level=1, noise=0.0, seed=0)
    assert [oracle_label(*m) for m in bot_only].count(1.0) >= 3  # key, door, box
    assert draw(messages, 3, seed=0) == draw(messages, 3, seed=0) and len(draw(messages, 3)) == 3


def test_the_agreement_script_writes_its_tables(tiny_folder: Path, tmp_path: Path) -> None:
    script = [
        sys.executable,
        str(Path(__file__).parent.parent / "scripts" / "oni_label_agreement.py"),
    ]
    common = ["--levels", "BabyAI-UnlockPickup-v0", "--episodes-per-level", "1"]
    done = subprocess.run(
        [*script, *common, "--model", str(tiny_folder), "--messages", "4", "--out", str(tmp_path)],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stderr
    result = json.loads((tmp_path / "agreement.json").read_text())
    assert result["messages"] == 4 and result["calibrated"] is True
    assert len((tmp_path / "messages.jsonl").read_text().splitlines()) == 4
    assert "| event |" in (tmp_path / "agreement.md").read_text() and "| event |" in done.stdout
    bad = subprocess.run(
        [*script, "--levels", "BabyAI-Nowhere-v0", "--out", str(tmp_path / "bad")],
        capture_output=True,
        text=True,
    )
    assert bad.returncode == 2 and "BabyAI-Nowhere-v0" in bad.stderr


def test_oni_joins_a_language_model_policy(tmp_path: Path) -> None:
    """Any policy of the trainer: the tiny language-model preset, on UnlockPickup's actions."""
    cfg = compose_run(
        "tiny",
        [
            *LEVEL,
            "oni.reward_model=retrieval",
            "oni.backend=oracle",
            "env.num_envs=2",
            "ppo.frames_per_env=8",
            "ppo.minibatch_size=16",
            "ppo.epochs=1",
            "train.total_frames=32",
            "train.progress_bar=false",
            f"train.output_dir={tmp_path}",
        ],
    )
    hooks = coupling_hooks(cfg)
    assert [type(hook) for hook in hooks] == [OniHook]
    train(cfg, Accelerator(cpu=True), tmp_path, hooks=hooks)
    rows = _metrics(tmp_path)
    assert len(rows) == 2 and float(rows[-1]["oni/messages_sent"]) > 0
    assert multiprocessing.active_children() == []
