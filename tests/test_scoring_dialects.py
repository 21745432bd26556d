"""The scorer's log-probability dialects (`glam.teach.scorers.OpenAIScorer`) against a scripted
server on 127.0.0.1 that speaks one dialect at a time, with a model whose numbers are known.

The scripted "model" reads characters: every character is a token, and the token `c` has the
log-probability `-0.1 * (ord(c) % 7 + 1)` wherever it stands, so a candidate's score is worked
out by hand. Each dialect is found at the first call and scores exactly; an echo shifted by
one token (llama-cpp-python's) is refused and scored by forced tokens instead; a server that
offers none is a clear error.

.venv/bin/python -m pytest tests/test_scoring_dialects.py -x -q
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from glam.llm.chat import ChatClientError
from glam.scoring import separator
from glam.teach.scorers import OpenAIScorer


def logprob(char: str) -> float:
    return -0.1 * (ord(char) % 7 + 1)


class Scripted(ThreadingHTTPServer):
    """Speaks `mode`: echo (max_tokens 0 only), echo_one (max_tokens 1), shifted (an echo whose
    log-probabilities are the next token's, and llama-cpp-python's /extras and logit_bias),
    prompt_logprobs (vLLM's) or none; `lists`: whether a list of prompts is taken."""

    def __init__(self, mode: str, *, lists: bool = True) -> None:
        super().__init__(("127.0.0.1", 0), Handler)
        self.mode, self.lists, self.requests = mode, lists, []
        self.poison: object = None
        """Not None: every log-probability answered is this (NaN, a string...)."""


class Handler(BaseHTTPRequestHandler):
    server: Scripted

    def log_message(self, *args: object) -> None:
        pass

    def _send(self, status: int, body: object) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:  # noqa: N802
        self._send(200, {"data": [{"id": "scripted"}]})

    def do_POST(self) -> None:  # noqa: N802
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        self.server.requests.append((self.path, body))
        mode = self.server.mode
        if self.path.startswith("/extras/"):
            if mode != "shifted":
                return self._send(404, {"detail": "Not Found"})
            if self.path == "/extras/tokenize":
                return self._send(200, {"tokens": [ord(c) for c in body["input"]]})
            return self._send(200, {"text": "".join(chr(t) for t in body["tokens"])})
        prompts = body["prompt"]
        if isinstance(prompts, list) and not self.server.lists:
            return self._send(500, {"error": "one prompt a request"})
        prompts = prompts if isinstance(prompts, list) else [prompts]
        try:
            choices = [self._choice(i, text, body) for i, text in enumerate(prompts)]
        except ValueError as error:
            return self._send(400, {"error": {"message": str(error)}})
        if self.server.poison is not None:
            choices = [_poisoned(choice, self.server.poison) for choice in choices]
        self._send(200, {"choices": choices})

    def _choice(self, index: int, text: str, body: dict) -> dict:
        mode = self.server.mode
        if mode == "shifted" and "logit_bias" in body:  # a forced token
            (token,) = body["logit_bias"]
            char = chr(int(token))
            lp = logprob(char)
            logprobs = {"tokens": [char], "text_offset": [len(text)], "token_logprobs": [lp]}
            return {"index": index, "text": char, "logprobs": logprobs}
        if mode == "prompt_logprobs":
            if body.get("echo"):
                raise ValueError("echo is not supported")
            entries = [None] + [
                {str(ord(c)): {"logprob": logprob(c), "rank": 1, "decoded_token": c}} for c in text
            ]  # the first entry is the BOS token's
            return {"index": index, "text": "x", "prompt_logprobs": entries}
        if mode == "none" or not body.get("echo"):
            return {"index": index, "text": "x", "logprobs": None}
        if (mode == "echo") != (body.get("max_tokens") == 0):
            raise ValueError(f"max_tokens={body.get('max_tokens')} is not served")
        chars = list(text) + (["x"] if body["max_tokens"] else [])
        values = [logprob(c) for c in chars]
        tops = [{c: v} for c, v in zip(chars, values, strict=True)]
        if mode == "shifted":  # each position holds the next token's figures
            values = [*values[1:], -9.0]
            tops = [
                {**({chars[i + 1]: 0.0} if i + 1 < len(chars) else {}), c: v}
                for i, (c, v) in enumerate(zip(chars, values, strict=True))
            ]
        values[0] = None
        tops[0] = None
        logprobs = {
            "tokens": chars,
            "text_offset": list(range(len(chars))),
            "token_logprobs": values,
            "top_logprobs": tops,
        }
        answer = text + ("x" if body["max_tokens"] else "")
        return {"index": index, "text": answer, "logprobs": logprobs}


def _poisoned(choice: dict, value: object) -> dict:
    """`choice` with every log-probability replaced by `value` (the first stays null)."""
    logprobs = choice.get("logprobs")
    if logprobs:
        values = logprobs["token_logprobs"]
        logprobs["token_logprobs"] = [v if v is None else value for v in values]
    for entry in choice.get("prompt_logprobs") or []:
        for info in (entry or {}).values():
            info["logprob"] = value
    return choice


@pytest.fixture
def serve() -> Iterator:
    servers = []

    def start(mode: str, **settings: bool) -> tuple[Scripted, str]:
        server = Scripted(mode, **settings)
        threading.Thread(target=server.serve_forever, args=(0.02,), daemon=True).start()
        servers.append(server)
        return server, f"http://127.0.0.1:{server.server_port}/v1"

    yield start
    for server in servers:
        server.shutdown()
        server.server_close()


PROMPTS = ["Goal: go to the red ball\nAction 0:", "Goal: open the door\nAction 3:"]
ACTIONS = [["turn left", "go forward"], ["toggle", "pick up", "drop"]]


def by_hand(prompt: str, action: str) -> float:
    return sum(logprob(c) for c in separator(prompt) + action)


@pytest.mark.parametrize(
    ("mode", "lists", "dialect"),
    [
        ("echo_one", True, "echo_one"),
        ("echo", True, "echo"),
        ("prompt_logprobs", True, "prompt_logprobs"),
        ("shifted", False, "forced"),
        ("echo_one", False, "echo_one"),
    ],
)
def test_each_dialect_is_found_at_the_first_call_and_scores_by_hand(
    serve, mode: str, lists: bool, dialect: str
) -> None:
    server, url = serve(mode, lists=lists)
    scorer = OpenAIScorer(url, max_retries=0, delay=0.01)
    scores = scorer.log_likelihoods(PROMPTS, ACTIONS)
    for prompt, actions, got in zip(PROMPTS, ACTIONS, scores, strict=True):
        assert got.tolist() == pytest.approx([by_hand(prompt, a) for a in actions], abs=1e-5)
    assert scorer.dialect == dialect and scorer.batched == (lists and dialect != "forced")
    if mode == "shifted":
        assert scorer.refused["echo_one"].startswith("shifted")
    before = len(server.requests)
    scorer.log_likelihoods(PROMPTS[:1], ACTIONS[:1])  # found once: no probe again
    asked = [path for path, _ in server.requests[before:]].count("/v1/completions")
    if dialect == "forced":  # one request per token: " turn left" and " go forward"
        assert asked == len(" turn left") + len(" go forward")
    else:
        assert asked == (1 if scorer.batched else 2)
    scorer.close()


def test_a_server_without_prompt_log_probabilities_is_named_as_such(serve) -> None:
    _, url = serve("none")
    scorer = OpenAIScorer(url, max_retries=0, delay=0.01, setting="oni")
    with pytest.raises(ChatClientError) as raised:
        scorer.log_likelihoods(PROMPTS[:1], ACTIONS[:1])
    message = str(raised.value)
    assert "offers no prompt log-probabilities" in message
    for dialect in ("echo_one:", "echo:", "prompt_logprobs:", "forced:"):
        assert dialect in message
    assert "the chat clients still work" in message


@pytest.mark.parametrize("mode", ["echo_one", "prompt_logprobs", "shifted"])
@pytest.mark.parametrize("value", [float("nan"), float("-inf"), "-0.5", True])
def test_log_probabilities_that_are_not_finite_numbers_are_refused(
    serve, mode: str, value: object
) -> None:
    # Found with good numbers, then answered with bad ones: the answer is refused, naming the
    # server and the field, never summed into a score.
    server, url = serve(mode, lists=mode != "shifted")
    scorer = OpenAIScorer(url, max_retries=0, delay=0.01)
    scorer.log_likelihoods(PROMPTS[:1], ACTIONS[:1])
    server.poison = value
    field = "prompt_logprobs[].logprob" if mode == "prompt_logprobs" else "token_logprobs"
    with pytest.raises(ChatClientError) as raised:
        scorer.log_likelihoods(PROMPTS, ACTIONS)
    message = str(raised.value)
    assert message.startswith(url) and field in message and repr(value) in message
    assert "must be a finite number" in message and "\n" not in message


def test_a_server_answering_nan_from_the_start_offers_no_dialect(serve) -> None:
    server, url = serve("echo_one")
    server.poison = float("nan")
    with pytest.raises(ChatClientError) as raised:
        OpenAIScorer(url, max_retries=0, delay=0.01).log_likelihoods(PROMPTS[:1], ACTIONS[:1])
    message = str(raised.value)
    assert message.startswith(url) and "offers no prompt log-probabilities" in message
    assert "echo_one: /completions answered logprobs.token_logprobs = nan" in message
