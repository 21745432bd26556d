"""The teacher beyond the symbolic loop: scored through an OpenAI-compatible server on
127.0.0.1 (the same numbers as in-process), an LLM teacher inside a training run, and the
teacher alone as an agent of the evaluation harness.

.venv/bin/python -m pytest tests/test_teach_remote.py
"""

from __future__ import annotations

import csv
import socket
from pathlib import Path

import pytest
import requests
import torch
from accelerate import Accelerator
from helpers_couplings import server, tiny_folder
from helpers_tiny import one_torch_thread, tiny_seq2seq_lm

from glam.baselines.symbolic import build_symbolic_policy
from glam.config import AdapterConfig, EnvConfig, ModelConfig, PolicyConfig, PPOConfig, TrainConfig
from glam.couplings import coupling_hooks
from glam.eval.config import AgentConfig, EvalConfig, PostTrainingTestsConfig
from glam.eval.harness import evaluate
from glam.llm.chat import ChatClientError
from glam.llm.local import LocalChatClient
from glam.llm.server import ChatServer
from glam.ppo.trainer import train
from glam.run_config import TrainingRunConfig, compose_run
from glam.teach.config import TeachConfig
from glam.teach.hook import build_teacher
from glam.teach.scorers import LocalScorer, OpenAIScorer

__all__ = ["one_torch_thread", "server", "tiny_folder"]  # fixtures (one thread: autouse)

PROMPTS = [
    "Goal: go to the red ball\nYou see: a red ball, a blue key\nYou carry: nothing\nNext subgoal:",
    "Goal: pick up the green box\nYou see: nothing\nYou carry: a blue key\nNext subgoal:",
    "Situation ending in a newline\n",
]
CANDIDATES = [
    ["go to the red ball", "go to the blue key", "pick up the blue key", "explore"],
    ["drop", "explore"],
    ["turn left", "go forward"],
]


def test_served_scores_equal_in_process_scores(tiny_folder: Path, server: ChatServer) -> None:
    local = LocalScorer.load(str(tiny_folder)).log_likelihoods(PROMPTS, CANDIDATES)
    remote_scorer = OpenAIScorer(server.url, timeout=30, max_retries=0)
    assert remote_scorer.endpoint.model_id == "tiny"  # the first model the server lists
    remote = remote_scorer.log_likelihoods(PROMPTS, CANDIDATES)
    remote_scorer.close()
    for here, there, candidates in zip(local, remote, CANDIDATES, strict=True):
        assert there.shape == (len(candidates),)
        assert torch.allclose(here, there, atol=1e-4, rtol=0), (here, there)
    assert len({round(float(s), 3) for s in local[0]}) == 4  # the scores do differ


def test_echoed_log_probabilities_are_openai_s_format(server: ChatServer) -> None:
    body = {"prompt": "go to the red ball", "max_tokens": 0, "echo": True, "logprobs": 2}
    answer = requests.post(f"{server.url}/completions", json=body, timeout=30).json()
    (choice,) = answer["choices"]
    logprobs = choice["logprobs"]
    assert choice["text"] == "go to the red ball" and answer["object"] == "text_completion"
    n = len(logprobs["tokens"])
    assert n == len(logprobs["token_logprobs"]) == len(logprobs["text_offset"]) > 2
    assert logprobs["token_logprobs"][0] is None and logprobs["top_logprobs"][0] is None
    assert logprobs["text_offset"] == sorted(logprobs["text_offset"])
    for t in range(1, n):
        # The actual token's log-probability is among the top ones; the best two are there.
        top = logprobs["top_logprobs"][t]
        assert top[logprobs["tokens"][t]] == pytest.approx(logprobs["token_logprobs"][t])
        assert 2 <= len(top) <= 3 and all(v <= 0 for v in top.values())
    assert answer["usage"]["prompt_tokens"] == n


def test_the_server_refuses_what_it_does_not_score(server: ChatServer) -> None:
    url = f"{server.url}/completions"
    context = server.client.model.config.max_position_embeddings
    scoring = {"prompt": "go to", "max_tokens": 0, "echo": True, "logprobs": 0}
    for change, status, text in [
        ({"max_tokens": 5}, 400, "only scores prompts"),
        ({"echo": False}, 400, "only scores prompts"),
        ({"logprobs": None}, 400, "logprobs must be an integer"),
        ({"prompt": []}, 400, "prompt must be a non-empty text"),
        ({"prompt": [17, 4]}, 400, "prompt must be a non-empty text"),
        ({"model": "gpt-4o"}, 404, "model 'gpt-4o' is not served here"),
        ({"prompt": "go to " * (context + 1)}, 400, f"past 'tiny''s context of {context}"),
    ]:
        refused = requests.post(url, json={**scoring, **change}, timeout=30)
        assert refused.status_code == status, change
        assert text in refused.json()["error"]["message"]


def test_an_encoder_decoder_model_is_refused() -> None:
    client = LocalChatClient(*tiny_seq2seq_lm("t5"), model_id="t5")
    with ChatServer(client, port=0) as served:
        served.start()
        scorer = OpenAIScorer(served.url, timeout=30, max_retries=0)
        with pytest.raises(ChatClientError, match="HTTP 400.*not a causal language model"):
            scorer.log_likelihoods(PROMPTS[:1], CANDIDATES[:1])
        scorer.close()


def test_a_server_that_is_not_running_is_a_clear_error() -> None:
    with socket.socket() as free:
        free.bind(("127.0.0.1", 0))
        port = free.getsockname()[1]
    with pytest.raises(ChatClientError, match=r"failed 2 time\(s\).*teach.base_url"):
        OpenAIScorer(f"http://127.0.0.1:{port}/v1", timeout=5, max_retries=1, delay=0.01)


def test_an_openai_teacher_advises_as_the_local_one(tiny_folder: Path, server: ChatServer) -> None:
    """`teach.backend=openai` builds a teacher whose distributions are the in-process one's."""
    import gymnasium as gym

    import babyai_text  # noqa: F401 (registers the levels)

    space = (0, 1, 2, 3, 4, 5)
    remote = build_teacher(
        TeachConfig(teacher="llm", backend="openai", base_url=server.url, max_retries=0), space
    )
    local = build_teacher(TeachConfig(teacher="llm", model=str(tiny_folder)), space)
    assert isinstance(remote.scorer, OpenAIScorer) and isinstance(local.scorer, LocalScorer)
    envs = [gym.make("BabyAI-GoToLocal-v0") for _ in range(3)]
    for seed, env in enumerate(envs):
        env.reset(seed=seed)
    probs_remote, valid_remote = remote.distributions(envs, [0, 1, 2], [True] * 3)
    probs_local, valid_local = local.distributions(envs, [0, 1, 2], [True] * 3)
    assert torch.equal(valid_remote, valid_local) and bool(valid_local.all())
    assert torch.allclose(probs_remote, probs_local, atol=1e-4)
    assert remote.pop_counts().llm_calls == 3
    remote.close()


def _metrics(run: Path) -> list[dict[str, str]]:
    with (run / "metrics.csv").open() as f:
        return list(csv.DictReader(f))


def test_an_llm_teacher_teaches_inside_a_training_run(tiny_folder: Path, tmp_path: Path) -> None:
    """teach.teacher=llm through the trainer: the model is asked about the situations the
    student meets (each distinct one once), then not at all once the schedule ends."""
    cfg = compose_run(
        "teach_symbolic",
        [
            f"teach.model={tiny_folder}",
            "teach.off_after=2",
            "env.num_envs=4",
            "ppo.frames_per_env=16",
            "ppo.minibatch_size=32",
            "train.total_frames=192",
            "train.progress_bar=false",
            "train.torch_threads=1",
            f"train.output_dir={tmp_path}",
        ],
    )
    hooks = coupling_hooks(cfg)
    train(cfg, Accelerator(cpu=True), tmp_path, make_policy=build_symbolic_policy, hooks=hooks)
    rows = _metrics(tmp_path)
    assert len(rows) == 3
    first, second, third = ({k: float(v) for k, v in row.items() if v} for row in rows)
    assert (first["teach/coef"], second["teach/coef"], third["teach/coef"]) == (10.0, 9.1, 0.0)
    for row in (first, second):
        assert row["teach/states"] == 64 and row["teach/advice_fraction"] > 0.9
        assert row["teach/llm_calls"] + row["teach/cache_hits"] == 64
        assert row["teach/llm_calls"] >= 1
    assert third["teach/states"] == 0 and third["teach/llm_calls"] == 0


def test_the_bot_teacher_alone_solves_its_level(tmp_path: Path) -> None:
    """`agent.kind=teacher`: the teacher plays by itself; BabyAI's bot as teacher succeeds."""
    cfg = PostTrainingTestsConfig(
        agent=AgentConfig(kind="teacher", teacher="bot"),
        eval=EvalConfig(
            level="BabyAI-GoToLocal-v0",
            episodes=10,
            num_envs=5,
            greedy=True,
            output_dir=str(tmp_path),
            progress_bar=False,
        ),
    )
    results, paths = evaluate(cfg)
    record = results["suites"]["no_change"]
    assert results["label"] == "teacher:bot"
    assert record["episodes"] == 10 and record["success_rate"] == 1.0
    uniform = evaluate(
        PostTrainingTestsConfig(
            agent=AgentConfig(kind="teacher", teacher="uniform"),
            eval=EvalConfig(
                level="BabyAI-GoToLocal-v0",
                episodes=10,
                num_envs=5,
                greedy=True,
                max_steps=32,
                output_dir=str(tmp_path / "uniform"),
                progress_bar=False,
            ),
        )
    )[0]
    assert uniform["label"] == "teacher:uniform"
    assert uniform["suites"]["no_change"]["success_rate"] < 1.0


def test_a_language_model_student_learns_from_a_teacher_too(tmp_path: Path) -> None:
    """The student can be a text policy: the teacher's distribution over the prompt's actions
    (here the navigation actions) joins the LLM policy's loss the same way."""
    cfg = TrainingRunConfig(
        model=ModelConfig(name_or_path="tiny-random-llama", lora=AdapterConfig(enabled=False)),
        policy=PolicyConfig(value_hidden_sizes=[32], value_activation="tanh"),
        env=EnvConfig(
            name="BabyAI-GoToRedBallNoDists-v0", num_envs=4, nbr_obs=2, action_space="nav"
        ),
        ppo=PPOConfig(frames_per_env=8, minibatch_size=16, epochs=1),
        train=TrainConfig(total_frames=64, progress_bar=False, output_dir=str(tmp_path)),
        teach=TeachConfig(teacher="bot", off_after=1),
    )
    train(cfg, Accelerator(cpu=True), tmp_path, hooks=coupling_hooks(cfg))
    first, second = ({k: float(v) for k, v in row.items() if v} for row in _metrics(tmp_path))
    assert first["teach/coef"] == 10.0 and second["teach/coef"] == 0.0
    assert first["teach/states"] == 32 and first["teach/advice_fraction"] > 0.9
    # A random tiny model is far from the bot: the cross-entropy is that of a near-uniform
    # student over three actions against a sure teacher, about log 3.
    assert 0.5 < first["teach/ce"] < 3.0
    assert second["teach/states"] == 0
