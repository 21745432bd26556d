"""BALROG's BabyAI protocol: the preset, the dialogue, the answers, and the model behind HTTP.

The HTTP tests talk to real servers on 127.0.0.1 that the tests start: `scripts/serve_openai.py`
(a subprocess serving a tiny random model), a server that accepts connections and never answers,
and a busy one that answers 503 before it answers. Every request loop is bounded.

.venv/bin/python -m pytest tests/test_balrog.py
"""

from __future__ import annotations

import json
import re
import select
import socket
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import replace
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import numpy as np
import pytest
import requests
import torch
from helpers_tiny import one_torch_thread, save_tiny_model, tiny_causal_lm  # noqa: F401

import babyai_text
from glam.config import CONFIG_DIR, compose_config
from glam.eval.agents import ActRequest
from glam.eval.builders import build_agent
from glam.eval.config import AgentConfig, EvalConfig, GenerationConfig, PostTrainingTestsConfig
from glam.eval.episodes import run_suite
from glam.eval.generation import BALROG_SETTINGS, BalrogDialogue, GenerationAgent
from glam.eval.harness import evaluate
from glam.eval.stats import balrog_progress
from glam.eval.suites import SUITES
from glam.llm.chat import ChatClient, ChatClientError, Completion
from glam.llm.config import ClientConfig
from glam.llm.local import LocalChatClient, render_chat
from glam.llm.remote import OpenAIChatClient
from glam.llm.server import ChatServer, RequestError

ROOT = Path(__file__).resolve().parents[1]
LEVEL = "BabyAI-MixedTrainLocal-v0"
WORDS = ("turn left", "turn right", "go forward", "pick up", "drop", "toggle")
FEEDBACK = (
    "\n\nYour previous output did not contain a valid action. Defaulted to action: go forward"
    "\n\nObservation:\n"
)


class ScriptedClient(ChatClient):
    """Answers from a script, in order, and keeps every conversation it was asked."""

    model_id = "scripted"

    def __init__(self, answers: Sequence[str]) -> None:
        self.script = list(answers)
        self.asked: list[list[dict[str, str]]] = []

    def complete(self, conversations, seeds=None, slots=None) -> list[Completion]:
        self.asked += [list(c) for c in conversations]
        return [Completion(self.script.pop(0), "stop", 0, 0) for _ in conversations]


# ---------------------------------------------------------------------------------------------
# The preset equals BALROG's settings
# ---------------------------------------------------------------------------------------------


def test_preset_settings_equal_balrogs_table() -> None:
    preset = compose_config("balrog", [], PostTrainingTestsConfig, CONFIG_DIR / "eval")
    for setting in BALROG_SETTINGS:
        section, *path = setting.key.split(".")
        value = getattr(preset, section)
        for name in path:
            value = getattr(value, name)
        assert value == setting.value, setting.key
    assert preset.agent.protocol == "generation" and preset.eval.suites == ["no_change"]
    # Where our value is not BALROG's, the table says why.
    differ = {s.balrog_key for s in BALROG_SETTINGS if s.balrog_value != s.value}
    assert differ == {"tasks.babyai_tasks", "client.max_retries", "client.base_url"}
    assert all(s.note for s in BALROG_SETTINGS if s.balrog_key in differ)
    # docs/evaluation.md shows the same table.
    docs = (ROOT / "docs" / "evaluation.md").read_text()
    for setting in BALROG_SETTINGS:
        row = next((line for line in docs.splitlines() if f"`{setting.balrog_key}`" in line), "")
        assert f"`{setting.key}`" in row, setting.balrog_key


def test_distractors_leave_only_what_the_task_needs() -> None:
    needs = {"goto": 1, "pickup": 1, "open": 1, "putnext": 2}
    counts: dict[int | None, Counter[tuple[str, int]]] = {}
    for distractors in (0, 2, None):
        env = babyai_text.make(LEVEL, distractors=distractors)
        counts[distractors] = Counter()
        for seed in range(40):
            info = env.reset(seed=seed)[1]
            grid = env.unwrapped.grid.grid
            objects = sum(o is not None and o.type not in ("wall", "door") for o in grid)
            counts[distractors][info["task_type"], objects] += 1
    for task, objects in counts[0]:
        assert objects == needs.get(task, 2), task  # the sequences need two objects
    assert {(t, n - 2) for t, n in counts[2]} == {(t, n) for t, n in counts[0]}
    assert {n for _, n in counts[None]} == {8}  # the level's own: 8 objects whatever the task
    with pytest.raises(ValueError, match="distractors must be an integer >= 0"):
        babyai_text.make(LEVEL, distractors=-1).reset(seed=0)
    cfg = PostTrainingTestsConfig(
        agent=AgentConfig(kind="random"),
        eval=EvalConfig(level="BabyAI-GoToLocal-v0", distractors=0, progress_bar=False),
    )
    with pytest.raises(ValueError, match="eval.distractors is for the GLAM levels"):
        evaluate(cfg)


def test_settings_that_do_not_fit_the_generation_protocol_are_refused() -> None:
    generation = AgentConfig(protocol="generation")
    with pytest.raises(ValueError, match="eval.greedy is the scoring protocol's"):
        PostTrainingTestsConfig(agent=generation, eval=EvalConfig(greedy=True))
    with pytest.raises(ValueError, match="eval.nbr_obs is the scoring protocol's"):
        PostTrainingTestsConfig(agent=generation, eval=EvalConfig(nbr_obs=3))
    with pytest.raises(ValueError, match="backend=openai plays the served model"):
        PostTrainingTestsConfig(eval=EvalConfig(client=ClientConfig(backend="openai")))
    with pytest.raises(ValueError, match="client.base_url='localhost:8080' is not an http"):
        ClientConfig(base_url="localhost:8080")
    with pytest.raises(ValueError, match="agent_type='react' is not one of"):
        GenerationConfig(agent_type="react")


# ---------------------------------------------------------------------------------------------
# The dialogue and the answers
# ---------------------------------------------------------------------------------------------


def test_dialogue_keeps_balrogs_window_and_wording() -> None:
    dialogue = BalrogDialogue("naive", max_history=2)
    dialogue.add_observation(["You see a wall 1 step forward", "You carry a red key"])
    dialogue.add_answer("turn left", "turn left", invalid=False)
    dialogue.add_observation(["You see a red ball 2 steps left"])
    dialogue.add_answer("I would rather dance", "go forward", invalid=True)
    dialogue.add_observation(["You see a red ball 1 step left"])
    messages = dialogue.messages("go to the red ball", WORDS)
    first = messages[0]["content"]
    assert first.startswith(
        "You are an agent playing a simple navigation game. Your goal is to go to the red ball. "
    )
    assert "\n\nturn left: turn to the left,\nturn right: turn to the right,\n" in first
    assert first.endswith(
        "toggle: manipulate the object in front of you.\n\nIn a moment I will "
        "present you an observation.\n\nTips:\n- Once the desired object you "
        "want to interact or pickup in front of you, you can use the 'toggle' "
        "action to interact with it.\n- It doesn't make sense to repeat the same "
        "action over and over if the observation doesn't change.\n\nPLAY!"
    )
    # 2 turns kept: 2 observations and 2 actions; the first observation is gone.
    assert messages[1:] == [
        {"role": "assistant", "content": "turn left"},
        {"role": "user", "content": "Obesrvation:\na red ball 2 steps left"},
        {"role": "assistant", "content": "I would rather dance"},
        {
            "role": "user",
            "content": "Current Observation:\n\n"
            + FEEDBACK
            + "a red ball 1 step left\n\nYou can only output one of the above actions at a "
            "time, and always have to output an action until the episode terminates.\nAction:",
        },
    ]


def _decide(agent_type: str, answers: list[str]) -> tuple[list, ScriptedClient]:
    client = ScriptedClient(answers)
    agent = GenerationAgent("scripted", client, agent_type=agent_type)
    request = ActRequest(
        prompts=[""] * len(answers),
        action_words=WORDS,
        envs=[None] * len(answers),
        slots=list(range(len(answers))),
        new_episode=[True] * len(answers),
        rngs=[np.random.default_rng(k) for k in range(len(answers))],
        messages=[[{"role": "user", "content": "x"}]] * len(answers),
    )
    return agent.act(request), client


def test_answers_are_read_as_balrog_reads_them() -> None:
    naive, _ = _decide("naive", [" turn left\n", "Turn left.", "pick up", "", "I go forward"])
    assert [(d.action, d.invalid, d.answer) for d in naive] == [
        (0, False, "turn left"),  # surrounding spaces go (BALROG's client strips)
        (2, True, "Turn left."),  # case and punctuation count: invalid, "go forward" played
        (3, False, "pick up"),
        (2, True, ""),
        (2, True, "I go forward"),
    ]
    assert all(d.reasoning is None for d in naive)
    plans = [
        "The ball is left.\nACTION: turn left.",
        "Step 1: go. ACTION: pick up ACTION: toggle!",
        "ACTION: turn_left",
        "no action here",
    ]
    cot, _ = _decide("cot", plans)
    assert [(d.action, d.invalid, d.answer) for d in cot] == [
        (0, False, "turn left"),
        (5, False, "toggle"),  # the last ACTION: counts
        (2, True, "turnleft"),  # only letters, spaces and colons are kept
        (2, True, "no action here"),
    ]
    assert [d.reasoning for d in cot] == plans


def test_feedback_reaches_the_next_prompt() -> None:
    """An invalid answer is played as "go forward", kept in the dialogue as said, and the next
    observation starts with BALROG's notice; with feedback off, no notice."""
    for feedback in (True, False):
        client = ScriptedClient(["dance", "turn left", "turn left"])
        agent = GenerationAgent("s", client, feedback_on_invalid_action=feedback)
        run = run_suite(
            agent, SUITES["no_change"], level=LEVEL, episodes=1, num_envs=1,
            seed_base=10**9, nbr_obs=16, max_steps=3,
        )  # fmt: skip
        assert run.episodes[0].invalid_actions == 1 and run.episodes[0].length == 3
        first, second, third = client.asked
        assert second[-2] == {"role": "assistant", "content": "dance"}
        current = second[-1]["content"]
        assert current.startswith("Current Observation:\n\n" + FEEDBACK) == feedback
        # The notice stays with that observation in the history, and is not repeated.
        assert third[-3]["content"].startswith("Obesrvation:\n" + FEEDBACK) == feedback
        assert "did not contain a valid action" not in third[-1]["content"]
        assert sum("did not contain" in m["content"] for m in third) == int(feedback)
        assert [m["role"] for m in third] == ["user", "user"] + ["assistant", "user"] * 2


def test_cot_keeps_its_latest_plan() -> None:
    plans = [f"Plan {k}. ACTION: turn left" for k in range(3)] + ["ACTION: drop"]
    client = ScriptedClient(plans)
    agent = GenerationAgent("s", client, agent_type="cot", max_cot_history=1)
    run_suite(
        agent, SUITES["no_change"], level=LEVEL, episodes=1, num_envs=1, seed_base=10**9,
        nbr_obs=16, max_steps=4,
    )  # fmt: skip
    last = client.asked[-1]
    said = [m["content"] for m in last if m["role"] == "assistant"]
    assert said == ["turn left", "turn left", "Previous plan:\n" + plans[2]]
    assert last[-1]["content"].endswith("in the form of: ACTION: <action>")


def test_balrog_standard_error_by_hand() -> None:
    # BALROG's paper: Llama-3.2-1B-it at 6.00 ± 3.36 on BabyAI: 3 successes in 50 episodes.
    progress, error = balrog_progress([1.0] * 3 + [0.0] * 47)
    assert progress == pytest.approx(6.0) and error == pytest.approx(3.3586, abs=1e-4)
    # 1 of 4: mean 25%, sqrt(0.25 * 0.75) / sqrt(4) = 21.65% (n, not n - 1, under the root).
    assert balrog_progress([1.0, 0.0, 0.0, 0.0]) == pytest.approx((25.0, 21.6506), abs=1e-4)
    assert balrog_progress([1.0]) == (100.0, 0.0)


# ---------------------------------------------------------------------------------------------
# The in-process client
# ---------------------------------------------------------------------------------------------


def test_local_client_is_seeded_and_greedy_at_temperature_zero() -> None:
    model, tokenizer = tiny_causal_lm()
    conversation = [{"role": "user", "content": "go to the red ball"}]
    sampled = LocalChatClient(model, tokenizer, model_id="tiny", max_tokens=6, batch_size=1)
    first = sampled.complete([conversation] * 3, seeds=[1, 2, 1])
    assert first == sampled.complete([conversation] * 3, seeds=[1, 2, 1])
    assert first[0] == first[2] and first[0].text != first[1].text
    assert {c.finish_reason for c in first} <= {"stop", "length"}
    greedy = LocalChatClient(model, tokenizer, model_id="tiny", temperature=0, max_tokens=6)
    text = tokenizer.apply_chat_template(conversation, tokenize=False, add_generation_prompt=True)
    ids = tokenizer(text, return_tensors="pt", add_special_tokens=False)
    expected = model.generate(**ids, max_new_tokens=6, do_sample=False, pad_token_id=0)
    (answer,) = greedy.complete([conversation], seeds=[7])
    assert answer.text == tokenizer.decode(expected[0, ids["input_ids"].shape[1] :],
                                           skip_special_tokens=True)  # fmt: skip
    assert answer.prompt_tokens == ids["input_ids"].shape[1]
    long = [{"role": "user", "content": "turn left " * 2000}]
    with pytest.raises(ChatClientError, match="fills the model's context of 1024 tokens"):
        greedy.complete([long])


def _dialogues(
    client: LocalChatClient, slots: list[int] | None, swap_at: int | None = None
) -> tuple[list[list[Completion]], list[list[list[int]]]]:
    """Four turns of BALROG's dialogue in two env slots (3 observations kept, so the window
    slides at the fourth), each answer recorded as BALROG records it. Turn `swap_at` is asked
    with the slots swapped. Returns each turn's completions and prompt token ids."""
    missions = ["go to the red ball", "open the grey door"]
    views = [["You see a red ball 1 step left"], ["You see a wall 1 step right"]]
    dialogues = [BalrogDialogue(max_history=3) for _ in missions]
    completions, prompts = [], []
    for turn in range(4):
        conversations = []
        for dialogue, mission, view in zip(dialogues, missions, views, strict=True):
            dialogue.add_observation([f"You see a wall {turn + 2} steps forward", *view])
            conversations.append(dialogue.messages(mission, WORDS))
        asked = slots[::-1] if slots is not None and turn == swap_at else slots
        answers = client.complete(conversations, seeds=[turn, 100 + turn], slots=asked)
        for dialogue, answer in zip(dialogues, answers, strict=True):
            dialogue.add_answer(answer.text.strip(), "go forward", invalid=True)
        completions.append(answers)
        texts = [render_chat(client.tokenizer, turns) for turns in conversations]
        prompts.append(client.tokenizer(texts, add_special_tokens=False)["input_ids"])
    return completions, prompts


def _common_prefix(a: list[int], b: list[int]) -> int:
    return next(
        (k for k, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b))
    )


@pytest.mark.parametrize(("temperature", "batch_size"), [(0.0, 0), (1.0, 1)])
def test_the_local_client_reuses_a_slots_last_turn_and_answers_as_without_it(
    temperature: float, batch_size: int
) -> None:
    """BALROG's dialogue grows within an episode: a slot's turn computes only the tokens after
    what it shares with the slot's last one, and the answers are those of full forwards."""
    model, tokenizer = tiny_causal_lm()

    def client() -> LocalChatClient:
        return LocalChatClient(
            model, tokenizer, model_id="tiny", temperature=temperature, max_tokens=6,
            batch_size=batch_size,
        )  # fmt: skip

    full, prompts = _dialogues(client(), slots=None)
    cached, same_prompts = _dialogues(client(), slots=[0, 1])
    assert same_prompts == prompts
    assert [[replace(c, cached_tokens=0) for c in turn] for turn in cached] == full
    assert all(c.cached_tokens == 0 for turn in full for c in turn)
    # Each turn reuses exactly the tokens its prompt shares with the slot's last one (at most
    # all but the last, whose logits start the answer); the first turn has none to reuse.
    assert [c.cached_tokens for c in cached[0]] == [0, 0]
    for turn in (1, 2, 3):
        expected = [
            min(_common_prefix(now, before), len(now) - 1)
            for now, before in zip(prompts[turn], prompts[turn - 1], strict=True)
        ]
        assert [c.cached_tokens for c in cached[turn]] == expected
    # The reuse grows with the dialogue (all but the latest observation, whose header changes,
    # and the request after it), and falls back to the instruction when the window slides.
    reused = [[c.cached_tokens for c in turn] for turn in cached]
    assert all(0 < one < two and three < one for one, two, three in zip(*reused[1:], strict=True))
    computed = sum(c.prompt_tokens - c.cached_tokens for turn in cached for c in turn)
    assert computed < 0.6 * sum(c.prompt_tokens for turn in full for c in turn)


def test_a_conversation_that_does_not_extend_its_slots_last_turn_reuses_only_what_it_shares(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Negative control: asked in each other's slot at turn 2, the two episodes reuse only the
    tokens their prompts share and still answer as without the cache, while a cache that
    trusted the slot without comparing the tokens answers otherwise."""
    from glam.decoding import TurnCache

    model, tokenizer = tiny_causal_lm()

    def client() -> LocalChatClient:
        return LocalChatClient(model, tokenizer, model_id="tiny", max_tokens=6)

    full, prompts = _dialogues(client(), slots=None)
    swapped, _ = _dialogues(client(), slots=[0, 1], swap_at=1)
    assert [[replace(c, cached_tokens=0) for c in turn] for turn in swapped] == full
    others = zip(prompts[1], prompts[0][::-1], strict=True)  # each meets the other's last turn
    shared = [_common_prefix(now, before) for now, before in others]
    assert [c.cached_tokens for c in swapped[1]] == shared
    assert all(n < 0.3 * len(ids) for n, ids in zip(shared, prompts[1], strict=True))

    def blind(cache: TurnCache, row: int, ids: torch.Tensor) -> int:
        kept = cache.rows.get(row)
        return 0 if kept is None else min(len(kept.ids), len(ids) - 1)

    monkeypatch.setattr(TurnCache, "reusable", blind)
    wrong, _ = _dialogues(client(), slots=[0, 1], swap_at=1)
    assert [c.text for c in wrong[1]] != [c.text for c in full[1]]


# ---------------------------------------------------------------------------------------------
# The HTTP client against real servers on 127.0.0.1
# ---------------------------------------------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@pytest.fixture
def stalling_server() -> Iterator[tuple[str, list[socket.socket]]]:
    """A server that accepts every connection and never answers; yields (base URL, accepted)."""
    listener = socket.create_server(("127.0.0.1", 0))
    accepted: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        listener.settimeout(0.05)
        while not stop.is_set():
            try:
                accepted.append(listener.accept()[0])
            except TimeoutError:
                continue

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{listener.getsockname()[1]}/v1", accepted
    stop.set()
    thread.join()
    for connection in accepted:
        connection.close()
    listener.close()


def test_stalling_server_times_out_and_retries(stalling_server) -> None:
    url, accepted = stalling_server
    waits: list[float] = []
    cfg = ClientConfig(backend="openai", base_url=url, timeout=0.3, max_retries=2, delay=0.05)
    start = time.monotonic()
    with pytest.raises(ChatClientError, match=r"failed 3 time\(s\), last: no answer within 0.3 s"):
        OpenAIChatClient(cfg, sleep=waits.append)
    elapsed = time.monotonic() - start
    assert waits == [0.05, 0.1]  # back-off: delay, then twice the delay
    assert len(accepted) == 3  # one connection per try
    assert 0.9 <= elapsed < 5  # three time-outs of 0.3 s, no hang


class _BusyThenReady(BaseHTTPRequestHandler):
    """An OpenAI-compatible endpoint whose first two completions are HTTP 503."""

    protocol_version = "HTTP/1.1"
    posts = 0

    def do_GET(self) -> None:  # noqa: N802
        self._send(200, {"object": "list", "data": [{"id": "busy-model"}]})

    def do_POST(self) -> None:  # noqa: N802
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        type(self).posts += 1
        if body["model"] != "busy-model":
            self._send(404, {"error": {"message": f"no model {body['model']}"}})
        elif type(self).posts <= 2:
            self._send(503, {"error": {"message": "loading"}})
        else:
            message = {"role": "assistant", "content": f" turn left (seed {body['seed']})"}
            self._send(200, {"choices": [{"message": message, "finish_reason": "stop"}]})

    def _send(self, status: int, body: dict) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args) -> None:
        pass


def test_busy_server_is_retried_with_back_off_then_answers() -> None:
    _BusyThenReady.posts = 0
    server = ThreadingHTTPServer(("127.0.0.1", 0), _BusyThenReady)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}/v1"
    waits: list[float] = []
    try:
        cfg = ClientConfig(backend="openai", base_url=url, max_retries=3, delay=0.5)
        with OpenAIChatClient(cfg, sleep=waits.append) as client:
            assert client.model_id == "busy-model"  # the first model the server lists
            (answer,) = client.complete([[{"role": "user", "content": "hi"}]], seeds=[42])
        assert answer.text == " turn left (seed 42)" and _BusyThenReady.posts == 3
        assert waits == [0.5, 1.0]
        # Any other error fails at once, with the server's message.
        unknown = ClientConfig(backend="openai", base_url=url, model_id="other", delay=0.5)
        with (
            OpenAIChatClient(unknown, sleep=waits.append) as client,
            pytest.raises(ChatClientError, match="HTTP 404: no model other"),
        ):
            client.complete([[{"role": "user", "content": "hi"}]])
        assert waits == [0.5, 1.0]
    finally:
        server.shutdown()
        server.server_close()


class _OddServer(BaseHTTPRequestHandler):
    """An endpoint whose completions are odd: `answer` is the body sent, `drip` the seconds
    between its bytes (0: at once)."""

    protocol_version = "HTTP/1.1"
    answer: dict = {}
    drip = 0.0

    def do_GET(self) -> None:  # noqa: N802
        self._send({"object": "list", "data": [{"id": "odd-model"}]}, 0.0)

    def do_POST(self) -> None:  # noqa: N802
        self.rfile.read(int(self.headers["Content-Length"]))
        self._send(type(self).answer, type(self).drip)

    def _send(self, body: dict, drip: float) -> None:
        data = json.dumps(body).encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        try:
            for at in range(0, len(data), 1 if drip else len(data)):
                self.wfile.write(data[at : at + (1 if drip else len(data))])
                self.wfile.flush()
                time.sleep(drip)
        except OSError:  # the client gave up and closed the connection
            self.close_connection = True

    def log_message(self, *args) -> None:
        pass


@pytest.fixture
def odd_server() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _OddServer)
    threading.Thread(target=server.serve_forever, args=(0.02,), daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}/v1"
    server.shutdown()
    server.server_close()


def _ask(url: str, **cfg: object) -> str:
    settings = {"backend": "openai", "base_url": url, "max_retries": 0, **cfg}
    with OpenAIChatClient(ClientConfig(**settings)) as client:
        return client.complete([[{"role": "user", "content": "hi"}]])[0].text


def test_an_answer_dripped_a_byte_at_a_time_meets_the_deadline_of_the_whole_try(
    odd_server: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A timeout bounded each read, not the try: an answer dripped a byte at a time took ~33 s
    per request under a 2 s timeout."""
    message = {"role": "assistant", "content": "turn left " * 8}
    monkeypatch.setattr(_OddServer, "answer", {"choices": [{"message": message}]})
    monkeypatch.setattr(_OddServer, "drip", 0.02)  # about 2 s for the whole answer
    start = time.monotonic()
    with pytest.raises(ChatClientError, match="no complete answer within 0.4 s"):
        _ask(odd_server, timeout=0.4)
    assert time.monotonic() - start < 1.2


@pytest.mark.parametrize(
    ("choice", "usage", "problem"),
    [
        ({"content": [{"type": "text", "text": "hi"}]}, {}, "a message content that is not text"),
        ({"content": {"text": "hi"}}, {}, "a message content that is not text"),
        ({"content": "hi"}, {"prompt_tokens": "many"}, "token counts that are not counts"),
        ({"content": "hi"}, [3, 4], "a usage that is not an object"),
    ],
    ids=["content_parts", "content_object", "text_usage", "usage_list"],
)
def test_a_malformed_answer_is_a_client_error(
    odd_server: str, monkeypatch: pytest.MonkeyPatch, choice: dict, usage: object, problem: str
) -> None:
    """Non-text content came back as the answer (a list where text was expected) and a
    non-numeric usage was a raw ValueError."""
    answer = {"choices": [{"message": {"role": "assistant", **choice}}], "usage": usage}
    monkeypatch.setattr(_OddServer, "answer", answer)
    with pytest.raises(ChatClientError, match=problem):
        _ask(odd_server, timeout=5)


def test_unreachable_endpoint_is_a_clear_error_and_exit_2(tmp_path: Path) -> None:
    url = f"http://127.0.0.1:{_free_port()}/v1"  # nothing listens there
    cfg = ClientConfig(backend="openai", base_url=url, max_retries=1, delay=0.01)
    with pytest.raises(ChatClientError, match=r"cannot connect \(\[Errno 111\] Connection refused"):
        OpenAIChatClient(cfg)
    start = time.monotonic()
    result = subprocess.run(
        [
            sys.executable,
            str(ROOT / "scripts" / "zero_shot_generation.py"),
            "eval.client.backend=openai",
            f"eval.client.base_url={url}",
            "eval.client.max_retries=1",
            "eval.client.delay=0.1",
            f"eval.output_dir={tmp_path / 'eval'}",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 2, result.stderr
    assert "error: GET /models at " + url in result.stderr
    assert "Connection refused" in result.stderr and "Is the server running" in result.stderr
    assert not (tmp_path / "eval").exists()
    assert time.monotonic() - start < 60


# ---------------------------------------------------------------------------------------------
# In-process and through scripts/serve_openai.py: the same run
# ---------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def tiny_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_tiny_model(tmp_path_factory.mktemp("tiny") / "llama", "llama")


@pytest.fixture(scope="module")
def served(tiny_folder: Path) -> Iterator[str]:
    """scripts/serve_openai.py serving the tiny model on a free port; yields its base URL."""
    log = (tiny_folder.parent / "server.log").open("w")  # a file: a full pipe would block it
    process = subprocess.Popen(
        [
            sys.executable,
            str(ROOT / "scripts" / "serve_openai.py"),
            f"model={tiny_folder}",
            "model_id=tiny",
            "port=0",
            "torch_threads=1",
        ],
        stdout=subprocess.PIPE,
        stderr=log,
        text=True,
    )
    try:
        ready, _, _ = select.select([process.stdout], [], [], 90)
        line = process.stdout.readline() if ready else ""
        found = re.fullmatch(r"serving tiny at (http://127\.0\.0\.1:\d+/v1)\n", line)
        assert found, f"no server: {line!r} {process.poll()}"
        yield found.group(1)
    finally:
        process.terminate()
        process.wait(timeout=30)
        log.close()
    assert process.returncode == 0  # SIGTERM stops it cleanly


def _balrog_run(tiny_folder: Path, output_dir: Path, **client: object) -> tuple[dict, list]:
    base = compose_config("balrog", [], PostTrainingTestsConfig, CONFIG_DIR / "eval")
    cfg = PostTrainingTestsConfig(
        agent=AgentConfig(
            kind="zero_shot",
            model=str(tiny_folder),
            protocol="generation",
            device="cpu",
            batch_size=1,
        ),  # fmt: skip
        eval=EvalConfig(
            level=base.eval.level,
            episodes_per_task_type=1,
            distractors=base.eval.distractors,
            num_envs=5,
            max_steps=3,
            generation=base.eval.generation,
            client=ClientConfig(max_tokens=6, delay=0.1, **client),
            output_dir=str(output_dir),
            progress_bar=False,
        ),
    )
    results, paths = evaluate(cfg)
    episodes = [json.loads(line) for line in paths["episodes"].read_text().splitlines()]
    return results, episodes


def test_served_and_in_process_runs_agree(served: str, tiny_folder: Path, tmp_path: Path) -> None:
    """BALROG's protocol at temperature 1 through the server gives the in-process run's every
    episode (the same seeds draw the same answers, in-process through the turn cache), and
    reports BALROG's form beside ours."""
    local, local_episodes = _balrog_run(tiny_folder, tmp_path / "local")
    remote, remote_episodes = _balrog_run(
        tiny_folder, tmp_path / "remote", backend="openai", base_url=served
    )
    assert local_episodes == remote_episodes and len(local_episodes) == 5
    # In-process, each slot's turns after its first read their prefix from the turn cache.
    cached = local["generation"]["cached_prompt_tokens"]
    assert remote["generation"]["cached_prompt_tokens"] == 0 < cached
    assert local["generation"] == {
        **remote["generation"],
        "model_id": "llama",
        "cached_prompt_tokens": cached,
    }
    assert remote["generation"]["model_id"] == "tiny" and remote["label"].endswith(":tiny")
    usage = remote["generation"]
    assert usage["answers"] == sum(e["length"] for e in remote_episodes) == 15
    assert usage["completion_tokens"] <= 6 * 15 and usage["prompt_tokens"] > 15 * 300
    # A random model writes no action: every answer was replaced, and the report says so.
    record = remote["suites"]["no_change"]
    assert record["invalid_action_rate"] == 1.0 and record["prompt_format"] == "balrog"
    form = record["balrog"]
    assert set(form["tasks"]) == {"goto", "pickup", "open", "putnext", "pick_up_seq_go_to"}
    assert form["episodes_played"] == 5 and form["progression_percentage"] == 0.0
    markdown = (tmp_path / "remote" / "results.md").read_text()
    assert (
        "## BALROG's form" in markdown
        and "| no_change | pick_up_seq_go_to | 0.0 ± 0.0 |" in markdown
    )
    assert "agent naive, 16 turns, temperature 1.0, at most 6 tokens" in markdown


def test_server_refuses_what_it_cannot_answer(served: str) -> None:
    chat = f"{served}/chat/completions"
    message = [{"role": "user", "content": [{"type": "text", "text": "hi"}]}]
    answer = requests.post(chat, json={"messages": message, "max_tokens": 2}, timeout=30)
    assert answer.status_code == 200 and answer.json()["usage"]["completion_tokens"] <= 2
    for body, status, text in [
        ({"messages": message, "stream": True}, 400, "stream=True is not supported"),
        ({"messages": message, "model": "gpt-4o"}, 404, "model 'gpt-4o' is not served here"),
        ({"messages": [], "max_tokens": 2}, 400, "messages must be a non-empty list"),
        ({"messages": message, "temperature": -1}, 400, "temperature must be a number in"),
    ]:
        refused = requests.post(chat, json=body, timeout=30)
        assert refused.status_code == status and text in refused.json()["error"]["message"]
    assert requests.get(f"{served}/nope", timeout=30).status_code == 404


class _NoModel:
    """A served model that must never be asked: the requests below are refused before."""

    model_id = "no-model"

    def generate(self, *args: object, **kwargs: object) -> None:
        raise AssertionError("generated for a request that should have been refused")


def test_server_answers_400_to_a_seed_torch_cannot_take_and_to_a_negative_length() -> None:
    """A seed over 64 bits was answered 500 (torch's overflow inside generation), and a
    negative Content-Length hung until the handler's 120 s timeout."""
    with ChatServer(_NoModel(), port=0) as server:
        server.start()
        hi = [{"role": "user", "content": "hi"}]
        for seed in (2**64, -(2**63) - 1, 2**70):
            with pytest.raises(RequestError, match=r"seed must be an integer in \[-2\*\*63, "):
                server.chat_completion({"messages": hi, "seed": seed})
        host, port = server.httpd.server_address[:2]
        with socket.create_connection((host, port), timeout=5) as connection:
            connection.sendall(
                b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: -5\r\n\r\n"
            )
            reply = b""
            while chunk := connection.recv(65536):  # the server closes after an error
                reply += chunk
    assert reply.startswith(b"HTTP/1.1 400") and b"Content-Length is negative (-5)" in reply


class ProseClient(ChatClient):
    """A model that never names an action."""

    model_id = "prose"

    def complete(self, conversations, seeds=None, slots=None) -> list[Completion]:
        return [
            Completion("I would like to look around first.", "stop", 0, 0) for _ in conversations
        ]


def test_a_model_that_never_names_an_action_plays_the_constant_agents_episodes() -> None:
    """BALROG plays `go forward` for an invalid answer: such a model's results are those of
    `agent.kind=constant` (the control its scores are read against), episode for episode."""
    settings = {"level": LEVEL, "episodes": 0, "num_envs": 5, "seed_base": 10**9}
    runs = {}
    for name, agent in (
        ("prose", GenerationAgent("prose", ProseClient())),
        ("constant", build_agent(AgentConfig(kind="constant"), greedy=True)),
    ):
        runs[name] = run_suite(
            agent, SUITES["no_change"], nbr_obs=3, per_task_type=2, distractors=0, **settings
        ).episodes
    prose, constant = runs["prose"], runs["constant"]
    assert len(constant) == 10 and all(e.invalid_actions == e.length for e in prose)
    strip = lambda e: replace(e, invalid_actions=0)  # noqa: E731
    assert [strip(e) for e in prose] == constant
    assert {e.actions for e in constant} == {" ".join(["2"] * e.length) for e in constant}
    with pytest.raises(ValueError, match="agent.action=.jump. is not one of"):
        AgentConfig(kind="constant", action="jump")
