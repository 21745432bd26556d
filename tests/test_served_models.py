"""Every client path against a server this project did not write: llama-cpp-python's
OpenAI-compatible server (`python -m llama_cpp.server`) serving the embedded SmolLM2's GGUF file.

The scorer (teacher, planner, annotator, scored chooser) finds the server's dialect at its
first call and scores as in-process within llama.cpp's quantised arithmetic; the chat clients
(code writer, chat chooser, chat critic, BALROG's agent) get answers through it.

Not part of `make test`: llama-cpp-python builds llama.cpp when it installs (28 min 32 s on
this project's 2-core CPU, load average 4-9, 2026-11-26). Run them with

    make test-servers      # installs llama-cpp-python[server]==0.3.36, then runs this file
    GLAM_TEST_LLAMA_CPP=1 .venv/bin/python -m pytest tests/test_served_models.py -x -q
"""

from __future__ import annotations

import importlib.util
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import gymnasium as gym
import pytest
import requests
import torch
from helpers_tiny import one_torch_thread

import babyai_text
from glam.ask.config import AskConfig
from glam.ask.hook import AskHook
from glam.codeact.chat_critic import ChatCritic
from glam.codeact.env import CodedActionStats
from glam.codeact.planner import ChatChooser, MissionFamily, ScoredChooser
from glam.codeact.writer import ChatWriter
from glam.config import compose_config
from glam.eval.config import AgentConfig, EvalConfig, PostTrainingTestsConfig
from glam.eval.harness import evaluate
from glam.llm.config import ClientConfig
from glam.llm.remote import OpenAIChatClient
from glam.oni.annotator import Annotator, JudgeLabeller
from glam.oni.config import OniConfig
from glam.teach.config import TeachConfig
from glam.teach.hook import build_teacher
from glam.teach.scorers import LocalScorer, OpenAIScorer

__all__ = ["one_torch_thread"]  # autouse fixture

ROOT = Path(__file__).resolve().parents[1]
pytestmark = [
    pytest.mark.llama_cpp,
    pytest.mark.skipif(
        os.environ.get("GLAM_TEST_LLAMA_CPP") != "1"
        or importlib.util.find_spec("llama_cpp") is None,
        reason="needs llama-cpp-python's server (it builds llama.cpp on install: 28.5 min here) "
        "and GLAM_TEST_LLAMA_CPP=1: `make test-servers`",
    ),
]

TOLERANCE = 0.75
"""Largest |served - in-process| score allowed: llama.cpp computes with the Q4_1 weights and
8-bit activations, the in-process model with the same weights de-quantised to fp32; on 32
GLAM prompts x 6 actions the gap was at most 0.498, 0.084 at the median (docs/oni.md)."""

PROMPT = (
    "Possible action of the agent: turn left, turn right, go forward\n"
    "Goal of the agent: go to the red ball\n"
    "Observation 0: You see a red ball 2 steps forward,\nAction 0:"
)
FAMILY = MissionFamily(
    "BabyAI-GoToLocal-v0",
    ("go to the red ball", "go to the blue key"),
    ("turn left", "turn right", "go forward", "pick up", "drop", "toggle"),
)


def _free_port() -> int:
    with socket.socket() as free:
        free.bind(("127.0.0.1", 0))
        return free.getsockname()[1]


def _serve(n_ctx: int, log_folder: Path) -> Iterator[str]:
    """llama-cpp-python serving the embedded model's GGUF on a free port, one thread; its
    base URL."""
    gguf = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "compare_served_scores.py"), "--gguf-path"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    port = _free_port()
    log = (log_folder / "server.log").open("w")
    command = [sys.executable, "-m", "llama_cpp.server", "--model", gguf, "--port", str(port)]
    command += ["--n_threads", "1", "--n_ctx", str(n_ctx), "--model_alias", "smollm2"]
    process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}/v1"
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                if requests.get(f"{url}/models", timeout=5).ok:
                    break
            except requests.ConnectionError:
                pass
            assert process.poll() is None, "llama_cpp.server stopped (see its log)"
            assert time.monotonic() < deadline, "llama_cpp.server did not answer in 120 s"
            time.sleep(0.5)
        yield url
    finally:
        process.terminate()
        process.wait(timeout=30)
        log.close()


@pytest.fixture(scope="module")
def llama_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The scoring server: n_ctx 512 holds any scored text here, and each answer with
    log-probabilities costs llama-cpp-python a log-softmax over its whole n_ctx x vocabulary
    buffer (about 10 s a request at 2048 on this CPU under load, 0.3 s at 512)."""
    yield from _serve(512, tmp_path_factory.mktemp("llama_scores"))


@pytest.fixture(scope="module")
def llama_chat_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The chat server: the code writer's prompt (the API's documentation) is ~1,000 tokens."""
    yield from _serve(2048, tmp_path_factory.mktemp("llama_chat"))


@pytest.fixture(scope="module")
def in_process() -> LocalScorer:
    return LocalScorer.load("smollm2-135m", device="cpu")


# ---- the scorer, and what scores through it ---------------------------------------------------


def test_the_scorer_finds_the_forced_dialect_and_scores_as_in_process(
    llama_server: str, in_process: LocalScorer
) -> None:
    """llama-cpp-python echoes log-probabilities shifted by one token; the scorer says so and
    scores token by token under a logit bias instead."""
    scorer = OpenAIScorer(llama_server, timeout=60, max_retries=0)
    actions = [["turn left", "turn right", "go forward"]]
    served = scorer.log_likelihoods([PROMPT], actions)[0]
    local = in_process.log_likelihoods([PROMPT], actions)[0]
    assert scorer.dialect == "forced" and scorer.refused["echo_one"].startswith("shifted")
    assert float((served - local).abs().max()) < TOLERANCE
    assert int(served.argmax()) == int(local.argmax())
    scorer.close()


def test_the_teacher_the_planner_and_the_scored_chooser_score_through_the_server(
    llama_server: str,
) -> None:
    teacher = build_teacher(
        TeachConfig(teacher="llm", backend="openai", base_url=llama_server, max_retries=0),
        (0, 1, 2),
    )
    env = gym.make("BabyAI-GoToLocal-v0")
    env.reset(seed=0)
    probs, valid = teacher.distributions([env], [0], [True])
    assert bool(valid.all()) and float(probs.sum()) == pytest.approx(1.0, abs=1e-5)
    teacher.close()
    hook = AskHook(AskConfig(mode="always", backend="openai", base_url=llama_server))
    planner = hook.make_planner()
    mediated = babyai_text.make("BabyAI-GoToLocal-v0")
    mediated.reset(seed=0)
    assert planner.plan(mediated)  # the subgoals in score order
    hook.close()
    scorer = OpenAIScorer(llama_server, setting="codeact", max_retries=0)
    plan = ScoredChooser(scorer).choose(FAMILY, 2)
    assert len(plan.coded) == 2
    scorer.close()


def test_the_annotator_labels_through_the_server_in_its_process(
    llama_server: str, in_process: LocalScorer
) -> None:
    messages = [
        ("pick up the purple box", "you pick up the yellow key"),
        ("pick up the purple box", "you bump into the wall"),
    ]
    served = JudgeLabeller(OpenAIScorer(llama_server, setting="oni", max_retries=0))
    local = JudgeLabeller(in_process)
    assert served.margins(messages) == pytest.approx(local.margins(messages), abs=2 * TOLERANCE)
    cfg = OniConfig(reward_model="retrieval", backend="openai", base_url=llama_server)
    annotator = Annotator(cfg)
    try:
        annotator.submit(messages)
        labels: dict = {}
        deadline = time.monotonic() + 300
        while len(labels) < len(messages) and time.monotonic() < deadline:
            labels.update(annotator.poll())
            time.sleep(0.1)
        assert set(labels) == set(messages) and set(labels.values()) <= {0.0, 1.0}
    finally:
        annotator.close()


# ---- the chat clients --------------------------------------------------------------------------


def test_the_code_writer_the_chooser_and_the_critic_chat_through_the_server(
    llama_chat_server: str,
) -> None:
    """The paths work; the 135M model's code and choices are not expected to be good."""
    cfg = ClientConfig(backend="openai", base_url=llama_chat_server, max_tokens=96, max_retries=0)
    with OpenAIChatClient(cfg) as client:
        (draft,) = ChatWriter(client, seed=0).write(["explore"], FAMILY)
        assert draft.answer  # admitted or refused with its reason, never lost
        assert draft.admitted or draft.problem
        plan = ChatChooser(client, seed=0).choose(FAMILY, 2)
        assert plan.answer is not None and len(plan.coded) <= 2
        used = CodedActionStats()
        used.record("done", 3, 0.0, None)
        critic = ChatCritic(client, FAMILY, seed=0)
        decisions = critic.decide({"explore": used})
        assert decisions["explore"].verdict in ("keep", "drop", "rewrite")
        assert critic.answers and critic.answers[0]


def test_balrogs_agent_plays_through_the_server(llama_chat_server: str, tmp_path: Path) -> None:
    base = compose_config("balrog", [], PostTrainingTestsConfig, ROOT / "configs" / "eval")
    cfg = PostTrainingTestsConfig(
        agent=AgentConfig(kind="zero_shot", protocol="generation", device="cpu", batch_size=1),
        eval=EvalConfig(
            level=base.eval.level,
            episodes_per_task_type=1,
            distractors=base.eval.distractors,
            num_envs=5,
            max_steps=3,
            generation=base.eval.generation,
            client=ClientConfig(
                backend="openai", base_url=llama_chat_server, max_tokens=6, max_retries=0
            ),
            output_dir=str(tmp_path / "eval"),
            progress_bar=False,
        ),
    )
    results, _ = evaluate(cfg)
    usage = results["generation"]
    assert usage["model_id"] == "smollm2" and usage["answers"] == 15
    assert 0 < usage["completion_tokens"] <= 6 * 15
    assert results["suites"]["no_change"]["balrog"]["episodes_played"] == 5


def test_the_scorer_names_what_a_chat_only_server_lacks(llama_server: str) -> None:
    """Forcing a dialect the server does not speak correctly stops with what it got."""
    scorer = OpenAIScorer(llama_server, max_retries=0, dialect="prompt_logprobs")
    with pytest.raises(Exception, match="prompt_logprobs"):
        scorer.log_likelihoods([PROMPT], [["turn left"]])
    scorer.close()
    assert torch.get_num_threads() == 1
